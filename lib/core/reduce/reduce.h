// Host reduction kernels: element-wise combine, average finalisation and
// pre-multiplied scaling for every Weft data type. Vectorised for AVX2 and
// AVX-512 (chosen once at run time, forced with WEFT_REDUCE_ISA) with a
// portable scalar fallback; every variant returns bit-identical results.
// No allocation, no locks: the executor calls these on its hot path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/weft.h"

namespace weft::reduce {

enum class Op : uint8_t { Sum, Prod, Max, Min };
inline constexpr int kNumOps = 4;

size_t dtype_size(weftDataType_t dtype);  // 0 for invalid
bool dtype_valid(weftDataType_t dtype);
// nccl-tests names: int8 uint8 int32 uint32 int64 uint64 half float double
// bfloat16 f8e4m3 f8e5m2; "invalid" otherwise.
const char* dtype_name(weftDataType_t dtype);

// dst[i] = a[i] op b[i]; dst may alias a or b exactly; any alignment.
// Integers wrap (unsigned arithmetic). fp16/bf16/fp8 are computed in fp32 and
// rounded to nearest even (fp8 saturating, see numeric_types.h).
// NaN: every op propagates NaN (Max/Min included: either input NaN gives
// NaN), and every NaN result, here and in divide/scale, is the one quiet NaN
// of the type: fp32 0x7fc00000, fp64 0x7ff8000000000000, fp16 0x7e00, bf16
// 0x7fc0, e4m3 0x7f, e5m2 0x7e. Which NaN x86 returns depends on operand
// order, which compilers choose; this rule keeps every instruction set and
// compiler bit-identical. Max/Min of equal values (+0 and -0) return b[i].
// An invalid dtype writes nothing.
void apply(weftDataType_t dtype, Op op, void* dst, const void* a, const void* b, size_t count);

// Average finalisation: dst[i] = src[i] / divisor. Integers: C truncating
// division of the exact values (divisor 0 writes 0); fp16/bf16/fp8 in fp32
// then rounded; float/double native (the divisor converted to float/double).
void divide(weftDataType_t dtype, void* dst, const void* src, uint64_t divisor, size_t count);

// Pre-multiplied sum: dst[i] = src[i] * scalar, where *scalar is one value of
// dtype; same rules as apply(Op::Prod) with b[i] = *scalar.
void scale(weftDataType_t dtype, void* dst, const void* src, const void* scalar, size_t count);

}  // namespace weft::reduce
