// Narrow floating formats and their conversion to and from fp32 bit patterns,
// written once over lanes (lanes.h): the scalar functions in numeric_types.cc
// and every SIMD kernel run this same code, so they round identically.
// Integer arithmetic only: the result does not depend on MXCSR rounding or
// flush-to-zero modes. Internal linkage: see kernels.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/reduce/lanes.h"

namespace weft::reduce {
namespace {

struct FloatFormat {
  int exp_bits;
  int man_bits;
  bool has_inf;   // IEEE-like: exponent all ones is inf/NaN. Else (E4M3FN) only all ones is NaN.
  bool saturate;  // float -> narrow: beyond max finite (inf included) gives max finite.
  friend constexpr bool operator==(const FloatFormat&, const FloatFormat&) = default;
};

inline constexpr FloatFormat kFp16{5, 10, true, false};
inline constexpr FloatFormat kBf16{8, 7, true, false};
inline constexpr FloatFormat kFp8e4m3{4, 3, false, true};
inline constexpr FloatFormat kFp8e5m2{5, 2, true, true};

template <FloatFormat F>
using StorageOf = std::conditional_t<(1 + F.exp_bits + F.man_bits > 8), uint16_t, uint8_t>;

constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

template <FloatFormat F>
struct Layout {
  static constexpr int kBias = (1 << (F.exp_bits - 1)) - 1;
  static constexpr int kDrop = 23 - F.man_bits;  // fp32 mantissa bits the format lacks
  static constexpr uint32_t kSign = 1u << (F.exp_bits + F.man_bits);
  static constexpr uint32_t kMagMask = kSign - 1;
  static constexpr uint32_t kManMask = (1u << F.man_bits) - 1;
  static constexpr uint32_t kInf = ((1u << F.exp_bits) - 1) << F.man_bits;
  static constexpr uint32_t kMaxFinite = F.has_inf ? kInf - 1 : kMagMask - 1;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << 23;
  static constexpr float kSubnormalUnit = pow2(1 - kBias - F.man_bits);
};

// Narrow code (in 32-bit lanes) -> fp32 bits. Exact; NaNs come back quiet
// (as F16C does), except bf16's, which a shift leaves as they are.
template <FloatFormat F, int N>
inline Vec<uint32_t, N> decode(Vec<uint32_t, N> c) {
  using L = Layout<F>;
  using U = Vec<uint32_t, N>;
  if constexpr (F.exp_bits == 8) {
    return c << 16;  // bf16 is the top half of an fp32
  } else {
    U sign = (c & L::kSign) << (31 - F.exp_bits - F.man_bits);
    U mag = c & L::kMagMask;
    U normal = (mag << L::kDrop) + L::kRebias;
    // Subnormal: mantissa times the unit, an exact product that is an fp32
    // normal for these formats, so flush-to-zero cannot touch it.
    U sub = bitcast<U>(convert<Vec<float, N>>(bitcast<Vec<int32_t, N>>(mag)) * L::kSubnormalUnit);
    U r = select((mag >> F.man_bits) == 0u, sub, normal);
    if constexpr (F.has_inf) {
      U man = mag & L::kManMask;
      U special =
          (man << L::kDrop) | select(man != 0u, splat<U>(0x7fc00000u), splat<U>(0x7f800000u));
      r = select(mag >= L::kInf, special, r);
    } else {
      r = select(mag == L::kMagMask, splat<U>(0x7fc00000u), r);
    }
    return r | sign;
  }
}

// fp32 bits -> narrow code (in 32-bit lanes), round to nearest even.
template <FloatFormat F, int N>
inline Vec<uint32_t, N> encode(Vec<uint32_t, N> u) {
  using L = Layout<F>;
  using U = Vec<uint32_t, N>;
  if constexpr (F.exp_bits == 8) {
    // bf16 is the top half of an fp32: round at bit 16 with the sign in
    // place (only a NaN can carry into it); NaN: quiet, top payload kept.
    U r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return select((u & 0x7fffffffu) > 0x7f800000u, (u >> 16) | 0x40u, r);
  } else {
    U sign = (u >> 31) << (F.exp_bits + F.man_bits);
    U a = u & 0x7fffffffu;
    // In the format's normal range: round at the last kept mantissa bit (a
    // carry moves into the exponent, as it should), then rebias.
    constexpr uint32_t kHalfUlp = 1u << (L::kDrop - 1);
    U r = ((a + (kHalfUlp - 1) + ((a >> L::kDrop) & 1u)) >> L::kDrop) - (L::kRebias >> L::kDrop);
    // Below its smallest normal: shift the whole significand down to the
    // subnormal unit with the same rounding. Shifts stay in 1..31 in every
    // lane, used or not, so that none is undefined.
    constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - L::kBias) << 23;
    U exp = a >> 23;
    U sig = (a & 0x7fffffu) | select(exp != 0u, splat<U>(0x800000u), splat<U>(0u));
    U shift =
        static_cast<uint32_t>(151 - L::kBias - F.man_bits) - select(exp != 0u, exp, splat<U>(1u));
    shift = select(shift - 1u > 30u, splat<U>(31u), shift);
    U half = (splat<U>(1u) << (shift - 1u)) - 1u;
    U sub = (sig + half + ((sig >> shift) & 1u)) >> shift;
    r = select(a < kMinNormal, sub, r);
    constexpr uint32_t kLimit = F.saturate ? L::kMaxFinite : L::kInf;
    r = select(r > kLimit, splat<U>(kLimit), r);
    U nan;
    if constexpr (F.has_inf) {
      nan = ((a >> L::kDrop) & L::kManMask) | (L::kInf | (1u << (F.man_bits - 1)));
    } else {
      nan = splat<U>(L::kMagMask);
    }
    r = select(a > 0x7f800000u, nan, r);
    return r | sign;
  }
}

// The SIMD route for fp8, through the fp16 conversions of F16C. An fp8 value
// v is exactly the fp16 value v * kFp8InFp16: e5m2 is the top byte of an
// fp16, and e4m3's grid scaled by 2^-8 lies on fp16's, subnormals included.
template <FloatFormat F>
inline constexpr float kFp8InFp16 = F == kFp8e4m3 ? pow2(-8) : 1.0f;

// fp8 code -> fp16 pattern of v * kFp8InFp16 (16-bit lanes).
template <FloatFormat F, int N>
inline Vec<uint16_t, N> fp8_to_fp16_bits(Vec<uint16_t, N> c) {
  using H = Vec<uint16_t, N>;
  if constexpr (F == kFp8e5m2) {
    return c << 8;
  } else {
    H mag = c & 0x7f;
    return select(mag == 0x7f, splat<H>(0x7e00), H(mag << 7)) | H((c & 0x80) << 8);
  }
}

// fp16 pattern of v * kFp8InFp16 rounded to odd (truncated, last bit set when
// anything was dropped) -> fp8 code of v rounded to nearest even. Rounding to
// odd first keeps the information ties-to-even needs, since fp16 holds at
// least two more bits than fp8 everywhere in fp8's range.
template <FloatFormat F, int N>
inline Vec<uint16_t, N> fp16_odd_to_fp8(Vec<uint16_t, N> h) {
  using H = Vec<uint16_t, N>;
  using L = Layout<F>;
  constexpr int kDrop = 10 - F.man_bits;
  H mag = h & 0x7fff;
  H r = (mag + ((1 << (kDrop - 1)) - 1) + ((mag >> kDrop) & 1)) >> kDrop;
  r = select(r > L::kMaxFinite, splat<H>(L::kMaxFinite), r);
  H nan = F.has_inf ? H(mag >> kDrop) : splat<H>(L::kMagMask);  // e5m2: still quiet, same payload
  r = select(mag > 0x7c00, nan, r);
  return r | ((h >> 8) & 0x80);
}

}  // namespace
}  // namespace weft::reduce
