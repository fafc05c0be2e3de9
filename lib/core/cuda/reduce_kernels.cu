// The reduction kernels, one per dtype (12 instantiations), compiled by nvcc into a fatbin
// (SASS for sm_90 plus compute_90 PTX) that libweft embeds and loads through the driver
// (reduce_launch.cc): so libweft links neither the CUDA runtime nor libcuda. The op,
// PreMulSum and Avg are run-time parameters, uniform across the grid, so nvcc compiles few
// kernels and the branch costs nothing next to the memory traffic. Each kernel's name is
// weft_reduce_<dtype value>, unmangled, for cuModuleGetFunction.
//
// __grid_constant__: the inputs are indexed by a loop variable, which would otherwise copy
// the whole parameter block to local memory.
#include "core/cuda/functors.h"
#include "core/cuda/reduce_launch.h"

namespace weft::cuda {

template <weftDataType_t D>
__device__ void reduce_items(const ReduceParams& p) {
  using E = Element<D>;
  typename E::S scale{};
  if (p.premul) scale = E::scalar(p);
  const uint64_t items = E::items(p);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t w = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < items;
       w += stride)
    E::item(p, scale, w);
}

}  // namespace weft::cuda

#define WEFT_REDUCE_KERNEL(D)                                                    \
  extern "C" __global__ void __launch_bounds__(weft::cuda::kReduceThreads)       \
      weft_reduce_##D(const __grid_constant__ weft::cuda::ReduceParams p) {      \
    weft::cuda::reduce_items<static_cast<weftDataType_t>(D)>(p);                 \
  }
WEFT_REDUCE_KERNEL(0)
WEFT_REDUCE_KERNEL(1)
WEFT_REDUCE_KERNEL(2)
WEFT_REDUCE_KERNEL(3)
WEFT_REDUCE_KERNEL(4)
WEFT_REDUCE_KERNEL(5)
WEFT_REDUCE_KERNEL(6)
WEFT_REDUCE_KERNEL(7)
WEFT_REDUCE_KERNEL(8)
WEFT_REDUCE_KERNEL(9)
WEFT_REDUCE_KERNEL(10)
WEFT_REDUCE_KERNEL(11)
