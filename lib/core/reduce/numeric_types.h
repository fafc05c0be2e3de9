// Conversions between float and the narrow floating types, bit patterns held
// in uint16_t / uint8_t as they lie in memory. Float to narrow rounds to
// nearest, ties to even, including into subnormals.
//  - fp16 (IEEE binary16) and bf16: overflow gives +-inf; NaN stays a quiet
//    NaN with the payload's top bits (what x86 F16C does).
//  - fp8 e4m3 (E4M3FN: no inf, max 448, NaN 0x7f/0xff) and e5m2 (IEEE-like,
//    max 57344, has inf): beyond the largest finite value, infinities
//    included, saturate to +-max finite, as CUDA's default __nv_fp8
//    constructors do (__NV_SATFINITE), so that host and GPU results agree.
//    Hence e5m2 +-inf (0x7c/0xfc) come back from float as +-57344. NaN stays
//    NaN with its sign: e4m3 0x7f|sign, e5m2 quiet with the payload's top bit.
// Narrow to float is exact. NaNs come back quiet, except from bf16, which is
// widened by a plain shift.
#pragma once

#include <cstdint>

namespace weft::reduce {

inline constexpr float kFp8e4m3Max = 448.0f;
inline constexpr float kFp8e5m2Max = 57344.0f;

float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float fp8e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8e4m3(float value);
float fp8e5m2_to_float(uint8_t bits);
uint8_t float_to_fp8e5m2(float value);

}  // namespace weft::reduce
