// The CUDA driver as Weft's own programs use it (the GPU tests, weft-perf -G): loaded with
// dlopen, never linked, so that one binary runs on a GPU machine (the real libcuda.so.1), on
// a machine without a driver (no GPU: a clear reason), and, for the tests' orchestration only,
// on the host emulation of the driver (tests/cuda/emulated_driver.cc) first on
// LD_LIBRARY_PATH. RTLD_GLOBAL: Weft finds the driver the process loaded, as in a CUDA program.
#pragma once

#include <cstddef>
#include <string>

namespace weft::tools {

struct CudaDriver {
  int (*init)(unsigned);
  int (*get_error_string)(int, const char**);
  int (*device_get_count)(int*);
  int (*device_get)(int*, int);
  int (*primary_ctx_retain)(void**, int);
  int (*ctx_set_current)(void*);
  int (*mem_alloc)(unsigned long long*, size_t);
  int (*mem_free)(unsigned long long);
  int (*memcpy)(unsigned long long, unsigned long long, size_t);
  int (*memcpy_async)(unsigned long long, unsigned long long, size_t, void*);
  int (*stream_create)(void**, unsigned);
  int (*stream_destroy)(void*);
  int (*stream_synchronize)(void*);

  bool emulated = false;  // the host emulation, not a GPU
  const char* error(int result) const;
};

// Loads the driver and makes `device`'s primary context current on the calling thread (each
// thread that calls CUDA must). Null, with *why, when there is no driver or no such device.
// Call it in the process that uses CUDA: a process forked after it must not use CUDA.
const CudaDriver* use_gpu(int device, std::string* why);

// Whether a GPU (or the emulation) is there, asked in a forked child so that the caller's
// process never initialises CUDA (its own forked children can then still use it).
bool gpu_present(std::string* why);

}  // namespace weft::tools
