#include "core/reduce/reduce.h"

#include <strings.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/log.h"
#include "core/reduce/kernel_table.h"

namespace weft::reduce {

namespace {

struct DtypeInfo {
  size_t size;
  const char* name;
};
// Indexed by weftDataType_t.
constexpr DtypeInfo kDtypes[kNumDtypes] = {
    {1, "int8"}, {1, "uint8"}, {4, "int32"},  {4, "uint32"},   {8, "int64"},  {8, "uint64"},
    {2, "half"}, {4, "float"}, {8, "double"}, {2, "bfloat16"}, {1, "f8e4m3"}, {1, "f8e5m2"},
};

constexpr const char* kIsaNames[kNumIsas] = {"scalar", "avx2", "avx512"};

#if defined(__x86_64__)
// Not every compiler's __builtin_cpu_supports knows F16C: CPUID leaf 1 does.
bool cpu_has_f16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

bool cpu_runs(Isa isa) {
#if defined(__x86_64__)
  // The runtime also checks that the OS saves the AVX / AVX-512 registers.
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return avx2;
    case Isa::Avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return isa == Isa::Scalar;
#endif
}

const KernelTable& active_table() {
  static const KernelTable& table = kernels(active_isa());
  return table;
}

}  // namespace

size_t dtype_size(weftDataType_t dtype) {
  return dtype_valid(dtype) ? kDtypes[dtype].size : 0;
}

bool dtype_valid(weftDataType_t dtype) {
  return static_cast<unsigned>(dtype) < static_cast<unsigned>(kNumDtypes);
}

const char* dtype_name(weftDataType_t dtype) {
  return dtype_valid(dtype) ? kDtypes[dtype].name : "invalid";
}

void apply(weftDataType_t dtype, Op op, void* dst, const void* a, const void* b, size_t count) {
  if (!dtype_valid(dtype) || static_cast<unsigned>(op) >= static_cast<unsigned>(kNumOps)) return;
  active_table().apply[dtype][static_cast<int>(op)](dst, a, b, count);
}

void divide(weftDataType_t dtype, void* dst, const void* src, uint64_t divisor, size_t count) {
  if (!dtype_valid(dtype)) return;
  active_table().divide[dtype](dst, src, divisor, count);
}

void scale(weftDataType_t dtype, void* dst, const void* src, const void* scalar, size_t count) {
  if (!dtype_valid(dtype)) return;
  active_table().scale[dtype](dst, src, scalar, count);
}

const char* isa_name(Isa isa) {
  return static_cast<int>(isa) < kNumIsas ? kIsaNames[static_cast<int>(isa)] : "invalid";
}

bool isa_supported(Isa isa) {
  return cpu_runs(isa);
}

Isa best_isa() {
  static const Isa best = [] {
    Isa isa = Isa::Scalar;
    for (Isa candidate : {Isa::Avx2, Isa::Avx512}) {
      if (cpu_runs(candidate)) isa = candidate;
    }
    return isa;
  }();
  return best;
}

Isa choose_isa(const char* request, Isa best) {
  if (request == nullptr || request[0] == '\0') return best;
  // The table's choices for WEFT_REDUCE_ISA are kIsaNames, in order.
  const EnvVar& var = env_var("WEFT_REDUCE_ISA");
  std::string expected;
  if (std::optional<uint64_t> index = parse_env_value(var, request, &expected))
    return std::min(static_cast<Isa>(*index), best);
  WEFT_LOG(WARN, ENV, "%s", env_warning(var, request, expected, isa_name(best)).c_str());
  return best;
}

Isa active_isa() {
  static const Isa active = [] {
    Isa best = best_isa();
    std::optional<std::string> request = env_string("WEFT_REDUCE_ISA");
    Isa isa = choose_isa(request ? request->c_str() : nullptr, best);
    WEFT_LOG(INFO, INIT, "reduction kernels: %s (best on this CPU: %s)", isa_name(isa),
             isa_name(best));
    return isa;
  }();
  return active;
}

const KernelTable& kernels(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::Avx512:
      return kAvx512Kernels;
    case Isa::Avx2:
      return kAvx2Kernels;
#endif
    default:
      return kScalarKernels;
  }
}

}  // namespace weft::reduce
