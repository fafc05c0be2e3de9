// The CUDA driver as Weft's host code sees it: found at run time, never
// linked, never initialised by Weft. A process that has not loaded libcuda
// has no device memory and no CUDA streams, so every check here is then a
// cheap "host" answer (one pointer load: see loaded_driver in driver.cc) and works on
// machines without a driver. Plain C++: no CUDA headers needed.
#pragma once

#include "common/status.h"
#include "weft/weft.h"

namespace weft::cuda {

struct PointerInfo {
  weftMemoryType_t type = weftMemoryHost;
  int device = -1;  // the CUDA ordinal for device and managed memory
};

// What CUDA knows about ptr. Host (not an error) for memory CUDA does not
// know, when libcuda is not loaded, or when the process never called cuInit.
PointerInfo pointer_info(const void* ptr);

// Refuses device memory for a host-memory call, naming the argument:
// "<call>: <what> is device memory (GPU n); ...". Host and managed memory
// (which the CPU can read) pass.
Status check_host_memory(const char* call, const char* what, const void* ptr);
// Both of a collective's buffers ("sendbuff", "recvbuff"; null: not checked) with one look
// for the driver, most of what a small call's check costs when libcuda is not loaded.
Status check_host_buffers(const char* call, const void* send, const void* recv);

struct StreamInfo {
  int device = -1;
};
// Validates a cudaStream_t (NULL: the legacy default stream of the current
// context) for use by Weft: the driver must be loaded, the stream valid and
// not capturing a CUDA graph (refused for now). Errors name `what`.
Status inspect_stream(void* stream, const char* what, StreamInfo* info);
// cuStreamSynchronize / cuStreamQuery (weftInProgress while work is pending).
Status synchronize_stream(void* stream);
Status query_stream(void* stream);

}  // namespace weft::cuda
