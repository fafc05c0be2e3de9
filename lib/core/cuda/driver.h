// The CUDA driver as Weft's host code sees it: found at run time, never
// linked, never initialised by Weft. A process that has not loaded libcuda
// has no device memory and no CUDA streams, so every check here is then a
// cheap "host" answer (one pointer load: see loaded_driver in driver.cc) and works on
// machines without a driver. Plain C++: no CUDA headers needed.
#pragma once

#include <cstddef>
#include <cstdint>

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

// The driver's ABI as the GPU path uses it, in Weft's own words: values and layouts as in
// cuda.h (driver.cc checks them against it where the CUDA headers are present).
namespace drv {
using Result = int;
using DevicePtr = unsigned long long;
using Stream = void*;
using Event = void*;
using Context = void*;
using Module = void*;
using Function = void*;
using MemHandle = unsigned long long;
using Device = int;
constexpr Result kSuccess = 0, kNotReady = 600;
// Special streams.
inline Stream legacy_stream() {
  return reinterpret_cast<Stream>(uintptr_t{1});
}
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr unsigned kWaitValueGeq = 0;  // (int64_t)(*addr - value) >= 0
constexpr unsigned kWriteValueDefault = 0;
constexpr unsigned kHostAllocPortable = 1, kHostAllocDeviceMap = 2;
constexpr unsigned kIpcLazyEnablePeerAccess = 1;
constexpr int kAttrMultiprocessorCount = 16, kAttrVirtualMemoryManagement = 102,
              kAttrPosixFdHandles = 103, kAttr64BitStreamMemOps = 122;
constexpr int kLocationDevice = 1, kAllocationPinned = 1, kHandlePosixFd = 1, kAccessReadWrite = 3,
              kGranularityMinimum = 0;
struct MemLocation {
  int type = kLocationDevice;
  int id = 0;
};
struct AllocationProp {
  int type = kAllocationPinned;
  int handle_types = kHandlePosixFd;
  MemLocation location;
  void* win32_metadata = nullptr;
  struct {
    unsigned char compression = 0;
    unsigned char rdma_capable = 0;
    unsigned short usage = 0;
    unsigned char reserved[4] = {};
  } flags;
};
struct AccessDesc {
  MemLocation location;
  int flags = kAccessReadWrite;
};
constexpr size_t kIpcHandleBytes = 64;
struct IpcMemHandle {
  unsigned char bytes[kIpcHandleBytes] = {};
};
}  // namespace drv

// The driver entry points the GPU path calls (CUDA 12.0 semantics, through cuGetProcAddress).
struct Api {
  drv::Result (*get_error_string)(drv::Result, const char**);
  drv::Result (*pointer_get_attributes)(unsigned, int*, void**, drv::DevicePtr);
  drv::Result (*stream_get_ctx)(drv::Stream, drv::Context*);
  drv::Result (*stream_is_capturing)(drv::Stream, int*);
  drv::Result (*stream_synchronize)(drv::Stream);
  drv::Result (*stream_query)(drv::Stream);
  drv::Result (*ctx_push_current)(drv::Context);
  drv::Result (*ctx_pop_current)(drv::Context*);
  drv::Result (*ctx_get_device)(drv::Device*);
  drv::Result (*ctx_get_current)(drv::Context*);
  drv::Result (*device_get)(drv::Device*, int);
  drv::Result (*device_get_count)(int*);
  drv::Result (*device_get_attribute)(int*, int, drv::Device);
  drv::Result (*primary_ctx_retain)(drv::Context*, drv::Device);
  drv::Result (*primary_ctx_release)(drv::Device);
  drv::Result (*stream_create)(drv::Stream*, unsigned);
  drv::Result (*stream_destroy)(drv::Stream);
  drv::Result (*stream_wait_event)(drv::Stream, drv::Event, unsigned);
  drv::Result (*event_create)(drv::Event*, unsigned);
  drv::Result (*event_record)(drv::Event, drv::Stream);
  drv::Result (*event_query)(drv::Event);
  drv::Result (*event_destroy)(drv::Event);
  drv::Result (*memcpy_async)(drv::DevicePtr, drv::DevicePtr, size_t, drv::Stream);
  drv::Result (*memset_d8_async)(drv::DevicePtr, unsigned char, size_t, drv::Stream);
  drv::Result (*stream_write_value64)(drv::Stream, drv::DevicePtr, uint64_t, unsigned);
  drv::Result (*stream_wait_value64)(drv::Stream, drv::DevicePtr, uint64_t, unsigned);
  drv::Result (*mem_get_allocation_granularity)(size_t*, const drv::AllocationProp*, int);
  drv::Result (*mem_create)(drv::MemHandle*, size_t, const drv::AllocationProp*,
                            unsigned long long);
  drv::Result (*mem_release)(drv::MemHandle);
  drv::Result (*mem_address_reserve)(drv::DevicePtr*, size_t, size_t, drv::DevicePtr,
                                     unsigned long long);
  drv::Result (*mem_address_free)(drv::DevicePtr, size_t);
  drv::Result (*mem_map)(drv::DevicePtr, size_t, size_t, drv::MemHandle, unsigned long long);
  drv::Result (*mem_unmap)(drv::DevicePtr, size_t);
  drv::Result (*mem_set_access)(drv::DevicePtr, size_t, const drv::AccessDesc*, size_t);
  drv::Result (*mem_export_to_shareable_handle)(void*, drv::MemHandle, int, unsigned long long);
  drv::Result (*mem_import_from_shareable_handle)(drv::MemHandle*, void*, int);
  drv::Result (*mem_get_address_range)(drv::DevicePtr*, size_t*, drv::DevicePtr);
  drv::Result (*mem_alloc)(drv::DevicePtr*, size_t);
  drv::Result (*mem_free)(drv::DevicePtr);
  drv::Result (*ipc_get_mem_handle)(drv::IpcMemHandle*, drv::DevicePtr);
  drv::Result (*ipc_open_mem_handle)(drv::DevicePtr*, drv::IpcMemHandle, unsigned);
  drv::Result (*ipc_close_mem_handle)(drv::DevicePtr);
  drv::Result (*mem_host_alloc)(void**, size_t, unsigned);
  drv::Result (*mem_free_host)(void*);
  drv::Result (*mem_host_get_device_pointer)(drv::DevicePtr*, void*, unsigned);
  drv::Result (*module_load_data)(drv::Module*, const void*);
  drv::Result (*module_unload)(drv::Module);
  drv::Result (*module_get_function)(drv::Function*, drv::Module, const char*);
  drv::Result (*launch_kernel)(drv::Function, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, drv::Stream, void**, void**);

  const char* error_string(drv::Result r) const;
};

// The loaded driver's entry points, or null when the process has not loaded libcuda (or it
// lacks one of them: a driver older than CUDA 12).
const Api* api();

// A failed driver call: weftUnhandledCudaError, "<what>: <call> failed: <CUDA's message>
// (CUDA error N)".
Status driver_error(drv::Result r, const char* what, const char* call);

// Makes a context current on the calling thread for the scope's life (pushed, then popped),
// so that the GPU path never changes which context its caller's thread has current.
class ContextScope {
 public:
  explicit ContextScope(drv::Context context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  const Status& status() const { return status_; }

 private:
  Status status_;
  bool pushed_ = false;
};

}  // namespace weft::cuda
