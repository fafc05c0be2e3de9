#include "minifloat.h"

#include <algorithm>
#include <cmath>

namespace weft::perf {

namespace {

struct Layout {
  int bias;
  uint32_t max_exponent;  // all ones
  uint32_t mantissa_mask;
  uint32_t sign_bit;
};

Layout layout(MiniFloatFormat format) {
  return {(1 << (format.exponent_bits - 1)) - 1, (1u << format.exponent_bits) - 1,
          (1u << format.mantissa_bits) - 1, 1u << (format.exponent_bits + format.mantissa_bits)};
}

uint32_t nan_bits(MiniFloatFormat format) {
  Layout l = layout(format);
  // IEEE: quiet NaN (top mantissa bit); fn style: the only NaN pattern.
  uint32_t mantissa = format.ieee_specials ? 1u << (format.mantissa_bits - 1) : l.mantissa_mask;
  return (l.max_exponent << format.mantissa_bits) | mantissa;
}

}  // namespace

double minifloat_decode(MiniFloatFormat format, uint32_t bits) {
  Layout l = layout(format);
  const uint32_t exponent = (bits >> format.mantissa_bits) & l.max_exponent;
  const uint32_t mantissa = bits & l.mantissa_mask;
  const double sign = (bits & l.sign_bit) ? -1.0 : 1.0;
  if (exponent == l.max_exponent) {
    if (format.ieee_specials) return mantissa == 0 ? sign * INFINITY : NAN;
    if (mantissa == l.mantissa_mask) return NAN;
  }
  if (exponent == 0)  // subnormal: no implicit leading one
    return sign * std::ldexp(mantissa, 1 - l.bias - format.mantissa_bits);
  return sign * std::ldexp(mantissa + (1u << format.mantissa_bits),
                           static_cast<int>(exponent) - l.bias - format.mantissa_bits);
}

uint32_t minifloat_encode(MiniFloatFormat format, double value) {
  Layout l = layout(format);
  if (std::isnan(value)) return nan_bits(format);
  const uint32_t sign = std::signbit(value) ? l.sign_bit : 0;
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return sign;
  const uint32_t overflow =
      format.ieee_specials ? sign | (l.max_exponent << format.mantissa_bits) : nan_bits(format);
  if (std::isinf(magnitude)) return overflow;

  int frexp_exponent;
  std::frexp(magnitude, &frexp_exponent);
  // Unbiased exponent of the leading bit, clamped at the subnormal range.
  int exponent = std::max(frexp_exponent - 1, 1 - l.bias);
  // The quotient is exact (a power-of-two scaling); nearbyint rounds half to even.
  double significand = std::nearbyint(std::ldexp(magnitude, format.mantissa_bits - exponent));
  if (significand >= std::ldexp(1.0, format.mantissa_bits + 1)) {  // rounded up a binade
    significand /= 2;
    ++exponent;
  }
  const auto steps = static_cast<uint32_t>(significand);
  uint32_t biased = 0;
  uint32_t mantissa = steps;
  if (steps >> format.mantissa_bits) {  // normal
    biased = static_cast<uint32_t>(exponent + l.bias);
    mantissa = steps & l.mantissa_mask;
  }
  const uint32_t largest_exponent = format.ieee_specials ? l.max_exponent - 1 : l.max_exponent;
  if (biased > largest_exponent ||
      (!format.ieee_specials && biased == l.max_exponent && mantissa == l.mantissa_mask))
    return overflow;
  return sign | (biased << format.mantissa_bits) | mantissa;
}

}  // namespace weft::perf
