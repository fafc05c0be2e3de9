// Reference encode/decode for the narrow float types (fp16, bf16, fp8 e4m3/e5m2), used by
// the checker to write inputs and read results. Written for clarity, not speed.
#pragma once

#include <cstdint>

namespace weft::perf {

struct MiniFloatFormat {
  int exponent_bits;
  int mantissa_bits;
  // true: IEEE-style infinities and NaNs (all-ones exponent). false: the "fn" fp8 style of
  // e4m3, with no infinities and a single NaN mantissa (all ones), so the all-ones exponent
  // still holds normal numbers up to 448.
  bool ieee_specials;
};

inline constexpr MiniFloatFormat kFloat16Format{5, 10, true};
inline constexpr MiniFloatFormat kBfloat16Format{8, 7, true};
inline constexpr MiniFloatFormat kFloat8e4m3Format{4, 3, false};
inline constexpr MiniFloatFormat kFloat8e5m2Format{5, 2, true};

double minifloat_decode(MiniFloatFormat format, uint32_t bits);
// Rounds to nearest, ties to even. Overflow gives infinity (IEEE style) or NaN (e4m3).
uint32_t minifloat_encode(MiniFloatFormat format, double value);

}  // namespace weft::perf
