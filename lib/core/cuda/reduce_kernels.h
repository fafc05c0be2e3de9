// The CUDA reduction kernels' launcher: out = op(in[0], ..., in[n-1]) on a
// CUDA stream, for every dtype and op, with the element semantics of
// functors.h (equal, bit for bit, to the host kernels of lib/core/reduce).
// Plain C++: callers need no CUDA headers. Built only with WEFT_ENABLE_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "core/reduce/reduce.h"

namespace weft::cuda {

struct ReduceCall {
  weftDataType_t dtype = weftFloat32;
  reduce::Op op = reduce::Op::Sum;
  int n = 0;                            // inputs, 1..kMaxInputs (functors.h: 8)
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
// default stream) and returns at once. The grid is sized from the current
// device's SM count. Bad arguments: weftInvalidArgument naming the field;
// a CUDA failure: weftUnhandledCudaError with CUDA's message.
Status launch_reduce(const ReduceCall& call, void* stream);

}  // namespace weft::cuda
