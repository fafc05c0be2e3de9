// __grid_constant__: the inputs are indexed by a loop variable, which would
// otherwise copy the whole parameter block to local memory.
// One kernel per dtype (12 instantiations): the op, PreMulSum and Avg are
// run-time parameters, uniform across the grid, so nvcc compiles few kernels
// and the branch costs nothing next to the memory traffic.
#include "core/cuda/reduce_kernels.h"

#include <cuda_runtime.h>

#include "core/cuda/functors.h"

namespace weft::cuda {

namespace {

constexpr int kThreads = 256;
// Enough resident blocks per SM to hide memory latency; more only queue.
constexpr int kBlocksPerSm = 4;

template <weftDataType_t D>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const __grid_constant__ ReduceParams p) {
  using E = Element<D>;
  typename E::S scale{};
  if (p.premul) scale = E::scalar(p);
  const uint64_t items = E::items(p);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t w = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < items;
       w += stride)
    E::item(p, scale, w);
}

Status cuda_error(cudaError_t error, const char* what) {
  return Error(weftUnhandledCudaError, "reduce kernel: %s failed: %s", what,
               cudaGetErrorString(error));
}

}  // namespace

Status launch_reduce(const ReduceCall& call, void* stream) {
  size_t element = reduce::dtype_size(call.dtype);
  if (element == 0)
    return Error(weftInvalidArgument, "reduce kernel: dtype %d is not a weftDataType_t",
                 static_cast<int>(call.dtype));
  if (static_cast<unsigned>(call.op) >= static_cast<unsigned>(reduce::kNumOps))
    return Error(weftInvalidArgument, "reduce kernel: op %d is not sum, prod, max or min",
                 static_cast<int>(call.op));
  if (call.n < 1 || call.n > kMaxInputs)
    return Error(weftInvalidArgument, "reduce kernel: n = %d inputs is outside [1, %d]", call.n,
                 kMaxInputs);
  if (call.scalar_host != nullptr && call.scalar_device != nullptr)
    return Error(weftInvalidArgument,
                 "reduce kernel: scalar_host and scalar_device are both set; a PreMulSum has one "
                 "scalar");
  if (call.count == 0) return Status::Ok();
  if (call.inputs == nullptr) return Error(weftInvalidArgument, "reduce kernel: inputs is NULL");
  ReduceParams p{};
  for (int k = 0; k < call.n; ++k) {
    p.in[k] = call.inputs[k];
    if (p.in[k] == nullptr || reinterpret_cast<uintptr_t>(p.in[k]) % element != 0)
      return Error(weftInvalidArgument,
                   "reduce kernel: inputs[%d] = %p is NULL or not aligned to its %zu-byte "
                   "elements",
                   k, p.in[k], element);
  }
  if (call.output == nullptr || reinterpret_cast<uintptr_t>(call.output) % element != 0)
    return Error(weftInvalidArgument,
                 "reduce kernel: output = %p is NULL or not aligned to its %zu-byte elements",
                 call.output, element);
  p.out = call.output;
  p.n = call.n;
  p.count = call.count;
  p.op = call.op;
  p.divisor = call.divisor;
  p.premul = call.scalar_host != nullptr || call.scalar_device != nullptr;
  p.scalar_source = call.scalar_device;
  if (call.scalar_host != nullptr) memcpy(p.scalar, call.scalar_host, element);
  plan_packs(p, element);

  int device = 0, sms = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return cuda_error(error, "cudaGetDevice");
  error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return cuda_error(error, "cudaDeviceGetAttribute");
  uint64_t wanted = (work_items(p, element) + kThreads - 1) / kThreads;
  uint64_t cap = static_cast<uint64_t>(sms > 0 ? sms : 1) * kBlocksPerSm;
  unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  auto queue = static_cast<cudaStream_t>(stream);
  with_dtype(call.dtype,
             [&](auto d) { reduce_kernel<d.value><<<blocks, kThreads, 0, queue>>>(p); });
  error = cudaGetLastError();
  if (error != cudaSuccess) return cuda_error(error, "kernel launch");
  return Status::Ok();
}

}  // namespace weft::cuda
