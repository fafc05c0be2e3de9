// The per-instruction-set kernel tables behind reduce.h, and the choice among
// them. Tests and benchmarks use this to run one variant explicitly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/reduce/reduce.h"

namespace weft::reduce {

enum class Isa : uint8_t { Scalar, Avx2, Avx512 };  // ordered: each adds to the previous
inline constexpr int kNumIsas = 3;
inline constexpr int kNumDtypes = weftNumTypes;

struct KernelTable {
  using ApplyFn = void (*)(void* dst, const void* a, const void* b, size_t count);
  using DivideFn = void (*)(void* dst, const void* src, uint64_t divisor, size_t count);
  using ScaleFn = void (*)(void* dst, const void* src, const void* scalar, size_t count);
  using ToFloatFn = void (*)(float* dst, const void* src, size_t count);
  using FromFloatFn = void (*)(void* dst, const float* src, size_t count);

  ApplyFn apply[kNumDtypes][kNumOps];
  DivideFn divide[kNumDtypes];
  ScaleFn scale[kNumDtypes];
  // Bulk conversions with the kernels' own code; set for fp16, bf16 and the
  // fp8 types only.
  ToFloatFn to_float[kNumDtypes];
  FromFloatFn from_float[kNumDtypes];
};

// Defined in reduce_<isa>.cc.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512"
// Built in and runnable on this CPU (the OS saving the wide registers included).
bool isa_supported(Isa isa);
Isa best_isa();
// The variant a WEFT_REDUCE_ISA value asks for, clamped to best: null or
// empty gives best; an unknown name gives best and a warning.
Isa choose_isa(const char* request, Isa best);
// The variant apply/divide/scale use: choose_isa(WEFT_REDUCE_ISA, best_isa()),
// fixed at first use.
Isa active_isa();
// The table of a supported variant.
const KernelTable& kernels(Isa isa);

}  // namespace weft::reduce
