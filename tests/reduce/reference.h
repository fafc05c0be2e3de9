// Slow, independent references for the reduction tests: narrow floating
// values from the textbook formula and rounding by searching the nearest
// representable value, written without the library's conversion code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace weft::reduce::testing {

struct RefFormat {
  int exp_bits;
  int man_bits;
  bool has_inf;   // IEEE-like specials; else only all ones is NaN (E4M3FN)
  bool saturate;  // beyond max finite -> max finite (CUDA satfinite)
};
inline constexpr RefFormat kRefFp16{5, 10, true, false};
inline constexpr RefFormat kRefBf16{8, 7, true, false};
inline constexpr RefFormat kRefE4m3{4, 3, false, true};
inline constexpr RefFormat kRefE5m2{5, 2, true, true};

inline uint32_t ref_sign_bit(const RefFormat& f) {
  return 1u << (f.exp_bits + f.man_bits);
}
inline uint32_t ref_patterns(const RefFormat& f) {
  return ref_sign_bit(f) << 1;
}

inline bool ref_is_nan(const RefFormat& f, uint32_t bits) {
  uint32_t mag = bits & (ref_sign_bit(f) - 1);
  uint32_t exp_ones = ((1u << f.exp_bits) - 1) << f.man_bits;
  return f.has_inf ? mag > exp_ones : mag == ref_sign_bit(f) - 1;
}

// The value a pattern stands for (NaN for NaN patterns).
inline double ref_value(const RefFormat& f, uint32_t bits) {
  if (ref_is_nan(f, bits)) return NAN;
  int bias = (1 << (f.exp_bits - 1)) - 1;
  uint32_t exp = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  uint32_t man = bits & ((1u << f.man_bits) - 1);
  double v;
  if (f.has_inf && exp == (1u << f.exp_bits) - 1) {
    v = INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(man, 1 - bias - f.man_bits);
  } else {
    v = std::ldexp(man + (1u << f.man_bits), static_cast<int>(exp) - bias - f.man_bits);
  }
  return (bits & ref_sign_bit(f)) ? -v : v;
}

// Positive finite values in pattern order (which is value order).
inline std::vector<double> ref_positive_values(const RefFormat& f) {
  std::vector<double> values;
  for (uint32_t p = 0; p < ref_sign_bit(f); ++p) {
    double v = ref_value(f, p);
    if (!std::isfinite(v)) break;
    values.push_back(v);
  }
  return values;
}

// Round x to the format: nearest value, ties to the even pattern; overflow
// to inf (IEEE rule: as if the exponent went on) or to max finite
// (saturating). NaN: quiet, payload top bits kept (IEEE-like), or all ones.
inline uint32_t ref_encode(const RefFormat& f, const std::vector<double>& positive, float x) {
  uint32_t sign = std::signbit(x) ? ref_sign_bit(f) : 0;
  uint32_t inf_code = ((1u << f.exp_bits) - 1) << f.man_bits;
  if (std::isnan(x)) {
    if (!f.has_inf) return sign | (ref_sign_bit(f) - 1);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    uint32_t payload = (u >> (23 - f.man_bits)) & ((1u << f.man_bits) - 1);
    return sign | inf_code | (1u << (f.man_bits - 1)) | payload;
  }
  double a = std::fabs(static_cast<double>(x));
  uint32_t last = static_cast<uint32_t>(positive.size() - 1);
  if (a > positive[last]) {
    if (f.saturate) return sign | last;
    double beyond = 2 * positive[last] - positive[last - 1];  // the next step, as if unbounded
    // At the midpoint the tie goes to inf: the max's pattern is odd.
    return sign | (a >= (positive[last] + beyond) / 2 ? inf_code : last);
  }
  uint32_t lo = static_cast<uint32_t>(std::upper_bound(positive.begin(), positive.end(), a) -
                                      positive.begin()) -
                1;
  if (positive[lo] == a) return sign | lo;
  double below = a - positive[lo], above = positive[lo + 1] - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | (lo + 1);
  return sign | ((lo & 1) ? lo + 1 : lo);
}

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace weft::reduce::testing
