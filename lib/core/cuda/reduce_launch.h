// The CUDA reduction kernels' launcher: out = op(in[0], ..., in[n-1]) on a
// CUDA stream, for every dtype and op, with the element semantics of
// functors.h (equal, bit for bit, to the host kernels of lib/core/reduce).
// Plain C++: callers need no CUDA headers. The kernels (reduce_kernels.cu) are
// a fatbin embedded in the library, loaded once per CUDA context through the
// driver (cuModuleLoadData) and launched with cuLaunchKernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "core/reduce/reduce.h"

namespace weft::cuda {

inline constexpr int kReduceThreads = 256;
// Enough resident blocks per SM to hide memory latency; more only queue.
inline constexpr int kReduceBlocksPerSm = 4;

struct ReduceCall {
  weftDataType_t dtype = weftFloat32;
  reduce::Op op = reduce::Op::Sum;
  int n = 0;                            // inputs, 1..kMaxInputs (reduce_params.h: 8)
  const void* const* inputs = nullptr;  // device pointers (local or peer-mapped)
  void* output = nullptr;               // may alias an input exactly
  size_t count = 0;                     // elements
  // PreMulSum: every input is multiplied by one value of dtype first, read
  // from host memory at launch (scalar_host) or device memory at run time
  // (scalar_device); set exactly one.
  const void* scalar_host = nullptr;
  const void* scalar_device = nullptr;
  uint64_t divisor = 0;  // Avg: the result is divided by it; 0: not
};

// Enqueues the reduction on `stream` (a cudaStream_t; NULL is the legacy
// default stream of the current context) and returns at once. The grid is sized
// from the stream's device's SM count. Bad arguments: weftInvalidArgument naming the
// field; a driver failure (no driver, kernels that do not load): weftUnhandledCudaError
// with CUDA's message.
Status launch_reduce(const ReduceCall& call, void* stream);

// Whether this build carries the kernels (nvcc was found when it was built).
bool reduce_kernels_built();

}  // namespace weft::cuda
