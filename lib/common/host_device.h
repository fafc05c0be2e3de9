// Marks a function for both the host compiler and the device side of nvcc, so
// that arithmetic written once runs in host kernels, CUDA kernels and host tests.
#pragma once

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif
