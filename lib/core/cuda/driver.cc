#include "core/cuda/driver.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#if defined(WEFT_HAVE_CUDA_HEADERS)
#include <cuda.h>
#endif

namespace weft::cuda {

namespace {

constexpr int kAttrMemoryType = 2, kAttrIsManaged = 8, kAttrDeviceOrdinal = 9;
constexpr unsigned kMemoryTypeDevice = 2;
constexpr int kCaptureNone = 0;
constexpr int kApiVersion = 12000;  // the entry points' CUDA 12.0 semantics

#if defined(WEFT_HAVE_CUDA_HEADERS)
static_assert(CUDA_SUCCESS == drv::kSuccess && CUDA_ERROR_NOT_READY == drv::kNotReady);
static_assert(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == kAttrMemoryType &&
              CU_POINTER_ATTRIBUTE_IS_MANAGED == kAttrIsManaged &&
              CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == kAttrDeviceOrdinal);
static_assert(CU_MEMORYTYPE_DEVICE == kMemoryTypeDevice &&
              CU_STREAM_CAPTURE_STATUS_NONE == kCaptureNone);
static_assert(sizeof(CUdeviceptr) == sizeof(drv::DevicePtr) &&
              sizeof(CUmemGenericAllocationHandle) == sizeof(drv::MemHandle) &&
              sizeof(CUdevice) == sizeof(drv::Device));
static_assert(CU_STREAM_NON_BLOCKING == drv::kStreamNonBlocking &&
              CU_EVENT_DISABLE_TIMING == drv::kEventDisableTiming &&
              CU_STREAM_WAIT_VALUE_GEQ == drv::kWaitValueGeq &&
              CU_STREAM_WRITE_VALUE_DEFAULT == drv::kWriteValueDefault &&
              CU_MEMHOSTALLOC_PORTABLE == drv::kHostAllocPortable &&
              CU_MEMHOSTALLOC_DEVICEMAP == drv::kHostAllocDeviceMap &&
              CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == drv::kIpcLazyEnablePeerAccess);
static_assert(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == drv::kAttrMultiprocessorCount &&
              CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ==
                  drv::kAttrVirtualMemoryManagement &&
              CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED ==
                  drv::kAttrPosixFdHandles &&
              CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS == drv::kAttr64BitStreamMemOps);
static_assert(CU_MEM_LOCATION_TYPE_DEVICE == drv::kLocationDevice &&
              CU_MEM_ALLOCATION_TYPE_PINNED == drv::kAllocationPinned &&
              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == drv::kHandlePosixFd &&
              CU_MEM_ACCESS_FLAGS_PROT_READWRITE == drv::kAccessReadWrite &&
              CU_MEM_ALLOC_GRANULARITY_MINIMUM == drv::kGranularityMinimum);
static_assert(sizeof(CUmemAllocationProp) == sizeof(drv::AllocationProp) &&
              offsetof(CUmemAllocationProp, location) == offsetof(drv::AllocationProp, location) &&
              offsetof(CUmemAllocationProp, allocFlags) == offsetof(drv::AllocationProp, flags));
static_assert(sizeof(CUmemAccessDesc) == sizeof(drv::AccessDesc) &&
              sizeof(CUmemLocation) == sizeof(drv::MemLocation));
static_assert(sizeof(CUipcMemHandle) == sizeof(drv::IpcMemHandle) &&
              CU_IPC_HANDLE_SIZE == drv::kIpcHandleBytes);
#endif

// Resolves the entry points through cuGetProcAddress (driver >= 12.0), which
// picks the version of each that matches kApiVersion.
bool resolve(void* library, Api* d) {
  using GetProc = drv::Result (*)(const char*, void**, int, uint64_t, int*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) return false;
  auto one = [&](const char* name, auto* fn) {
    void* p = nullptr;
    int found = 0;
    if (get_proc(name, &p, kApiVersion, 0, &found) != drv::kSuccess || p == nullptr) return false;
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
    return true;
  };
  return one("cuGetErrorString", &d->get_error_string) &&
         one("cuPointerGetAttributes", &d->pointer_get_attributes) &&
         one("cuStreamGetCtx", &d->stream_get_ctx) &&
         one("cuStreamIsCapturing", &d->stream_is_capturing) &&
         one("cuStreamSynchronize", &d->stream_synchronize) &&
         one("cuStreamQuery", &d->stream_query) && one("cuCtxPushCurrent", &d->ctx_push_current) &&
         one("cuCtxPopCurrent", &d->ctx_pop_current) && one("cuCtxGetDevice", &d->ctx_get_device) &&
         one("cuCtxGetCurrent", &d->ctx_get_current) && one("cuDeviceGet", &d->device_get) &&
         one("cuDeviceGetCount", &d->device_get_count) &&
         one("cuDeviceGetAttribute", &d->device_get_attribute) &&
         one("cuDevicePrimaryCtxRetain", &d->primary_ctx_retain) &&
         one("cuDevicePrimaryCtxRelease", &d->primary_ctx_release) &&
         one("cuStreamCreate", &d->stream_create) && one("cuStreamDestroy", &d->stream_destroy) &&
         one("cuStreamWaitEvent", &d->stream_wait_event) &&
         one("cuEventCreate", &d->event_create) && one("cuEventRecord", &d->event_record) &&
         one("cuEventQuery", &d->event_query) && one("cuEventDestroy", &d->event_destroy) &&
         one("cuMemcpyAsync", &d->memcpy_async) && one("cuMemsetD8Async", &d->memset_d8_async) &&
         one("cuStreamWriteValue64", &d->stream_write_value64) &&
         one("cuStreamWaitValue64", &d->stream_wait_value64) &&
         one("cuMemGetAllocationGranularity", &d->mem_get_allocation_granularity) &&
         one("cuMemCreate", &d->mem_create) && one("cuMemRelease", &d->mem_release) &&
         one("cuMemAddressReserve", &d->mem_address_reserve) &&
         one("cuMemAddressFree", &d->mem_address_free) && one("cuMemMap", &d->mem_map) &&
         one("cuMemUnmap", &d->mem_unmap) && one("cuMemSetAccess", &d->mem_set_access) &&
         one("cuMemExportToShareableHandle", &d->mem_export_to_shareable_handle) &&
         one("cuMemImportFromShareableHandle", &d->mem_import_from_shareable_handle) &&
         one("cuMemGetAddressRange", &d->mem_get_address_range) &&
         one("cuMemAlloc", &d->mem_alloc) && one("cuMemFree", &d->mem_free) &&
         one("cuIpcGetMemHandle", &d->ipc_get_mem_handle) &&
         one("cuIpcOpenMemHandle", &d->ipc_open_mem_handle) &&
         one("cuIpcCloseMemHandle", &d->ipc_close_mem_handle) &&
         one("cuMemHostAlloc", &d->mem_host_alloc) && one("cuMemFreeHost", &d->mem_free_host) &&
         one("cuMemHostGetDevicePointer", &d->mem_host_get_device_pointer) &&
         one("cuModuleLoadData", &d->module_load_data) &&
         one("cuModuleUnload", &d->module_unload) &&
         one("cuModuleGetFunction", &d->module_get_function) &&
         one("cuLaunchKernel", &d->launch_kernel);
}

// The newest object in the loader's list, with its name.
struct Tail {
  const link_map* map = nullptr;
  std::string name;
};

struct Scan {
  bool count_only;
  unsigned long long adds = 0;
  bool found = false;
  Tail tail;  // a full scan: the newest object when it looked (under the loader's lock)
};

int scan_object(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<Scan*>(data);
  scan->adds = info->dlpi_adds;
  if (scan->count_only) return 1;
  if (scan->tail.map == nullptr) {
    // Read in the same pass as the search, so that a library loaded after it (libcuda, by
    // another thread) cannot become the pin that hides it.
    for (const link_map* map = _r_debug.r_map; map != nullptr; map = map->l_next)
      scan->tail.map = map;
    if (scan->tail.map != nullptr && scan->tail.map->l_name != nullptr)
      scan->tail.name = scan->tail.map->l_name;
  }
  const char* slash = info->dlpi_name != nullptr ? strrchr(info->dlpi_name, '/') : nullptr;
  const char* base = slash != nullptr ? slash + 1 : info->dlpi_name;
  scan->found = base != nullptr && strncmp(base, "libcuda.so", 10) == 0;
  return scan->found ? 1 : 0;
}

std::atomic<const Api*> g_driver{nullptr};
std::atomic<unsigned long long> g_scanned_adds{~0ull};  // objects loaded at the last full scan
std::mutex g_mutex;

// The newest object in the loader's list at the last full scan that missed libcuda,
// held open (so that it stays mapped) by a reference of ours. The loader appends every
// object it loads to that list, so while the object's l_next is null nothing was loaded
// since and libcuda is still absent: one pointer load per call instead of
// dl_iterate_phdr and the loader's lock. Each pin stays for the process's life (a
// reader may still look at an old one); after kMaxPins every call probes instead.
std::atomic<const link_map*> g_tail{nullptr};
constexpr int kMaxPins = 64;
int g_pins = 0;  // under g_mutex

// Pins `tail`, the newest object of a full scan that missed libcuda, as g_tail (under
// g_mutex), if it can be opened again.
void pin_tail(const Tail& tail) {
  if (g_pins >= kMaxPins) {
    g_tail.store(nullptr, std::memory_order_release);
    return;
  }
  if (tail.map == nullptr || tail.name.empty()) return;
  void* handle = dlopen(tail.name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  link_map* opened = nullptr;
  if (handle == nullptr) return;
  // Unloaded meanwhile and another object under that name: no pin (the pointer is only
  // compared, never read, until it is ours).
  if (dlinfo(handle, RTLD_DI_LINKMAP, &opened) != 0 || opened != tail.map) {
    dlclose(handle);
    return;
  }
  ++g_pins;
  g_tail.store(tail.map, std::memory_order_release);
}

// Nothing was loaded since the pinned tail was the newest object.
bool nothing_loaded_since_pin() {
  const link_map* tail = g_tail.load(std::memory_order_acquire);
  return tail != nullptr && __atomic_load_n(&tail->l_next, __ATOMIC_ACQUIRE) == nullptr;
}

// loaded_driver() once objects were loaded since the last scan (or none is pinned): looks
// for libcuda among them. Apart, so that the per-call check sets up none of its state.
[[gnu::noinline]] const Api* scan_for_driver() {
  Scan probe{true, 0, false, {}};
  dl_iterate_phdr(scan_object, &probe);
  // A full scan of these objects is done (and published its driver, if it found one, first).
  if (probe.adds == g_scanned_adds.load(std::memory_order_acquire))
    return g_driver.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const Api* d = g_driver.load(std::memory_order_acquire)) return d;
  Scan full{false, 0, false, {}};
  dl_iterate_phdr(scan_object, &full);
  // Already loaded: this only takes a reference, never loads a library.
  void* library = full.found ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) : nullptr;
  static Api driver;
  const bool resolved = library != nullptr && resolve(library, &driver);
  if (resolved) g_driver.store(&driver, std::memory_order_release);
  if (!full.found) pin_tail(full.tail);
  g_scanned_adds.store(full.adds, std::memory_order_release);
  return resolved ? &driver : nullptr;
}

// The driver if this process has loaded libcuda, else null. Loaded objects
// only change when dlpi_adds does, so a miss costs one early-stopped probe
// (or, with a pinned tail, one load).
const Api* loaded_driver() {
  if (const Api* d = g_driver.load(std::memory_order_acquire)) return d;
  if (nothing_loaded_since_pin()) return nullptr;
  return scan_for_driver();
}

}  // namespace

const char* Api::error_string(drv::Result r) const {
  const char* text = nullptr;
  return get_error_string(r, &text) == drv::kSuccess && text != nullptr ? text : "unknown error";
}

const Api* api() {
  return loaded_driver();
}

Status driver_error(drv::Result r, const char* what, const char* call) {
  const Api* d = loaded_driver();
  return Error(weftUnhandledCudaError, "%s: %s failed: %s (CUDA error %d)", what, call,
               d != nullptr ? d->error_string(r) : "no driver", r);
}

ContextScope::ContextScope(drv::Context context) {
  const Api* d = loaded_driver();
  if (d == nullptr) {
    status_ = Error(weftInternalError, "no CUDA driver is loaded");
    return;
  }
  drv::Result r = d->ctx_push_current(context);
  if (r != drv::kSuccess) {
    status_ = driver_error(r, "GPU path", "cuCtxPushCurrent");
    return;
  }
  pushed_ = true;
}

ContextScope::~ContextScope() {
  if (!pushed_) return;
  drv::Context popped = nullptr;
  loaded_driver()->ctx_pop_current(&popped);
}

PointerInfo pointer_info(const void* ptr) {
  PointerInfo info;
  const Api* d = loaded_driver();
  if (d == nullptr || ptr == nullptr) return info;
  // Eight zeroed bytes per answer: the attributes are 1- to 4-byte values.
  int attributes[3] = {kAttrMemoryType, kAttrIsManaged, kAttrDeviceOrdinal};
  uint64_t type = 0, managed = 0, ordinal = 0;
  void* data[3] = {&type, &managed, &ordinal};
  // Not a CUDA pointer: success with empty answers. Driver not initialised:
  // an error, and then nothing can be device memory either.
  if (d->pointer_get_attributes(3, attributes, data, reinterpret_cast<drv::DevicePtr>(ptr)) !=
      drv::kSuccess)
    return info;
  int32_t device = 0;
  memcpy(&device, &ordinal, sizeof device);
  if (managed != 0) {
    info.type = weftMemoryManaged;
    info.device = device;
  } else if (static_cast<uint32_t>(type) == kMemoryTypeDevice) {
    info.type = weftMemoryDevice;
    info.device = device;
  }
  return info;
}

Status check_host_memory(const char* call, const char* what, const void* ptr) {
  PointerInfo info = pointer_info(ptr);
  if (info.type != weftMemoryDevice) return Status::Ok();
  return Error(weftInvalidUsage,
               "%s: %s is device memory (GPU %d), but this communicator was made for host "
               "memory: create it with weftConfig_t.cudaDevice = %d to run on the GPU, or copy "
               "the buffer to host memory",
               call, what, info.device, info.device);
}

Status check_host_buffers(const char* call, const void* send, const void* recv) {
  if (loaded_driver() == nullptr) return Status::Ok();
  WEFT_RETURN_IF_ERROR(check_host_memory(call, "sendbuff", send));
  return check_host_memory(call, "recvbuff", recv);
}

Status inspect_stream(void* stream, const char* what, StreamInfo* info) {
  const Api* d = loaded_driver();
  if (d == nullptr)
    return Error(weftInvalidArgument,
                 "%s: no CUDA driver is loaded in this process, so it cannot be a CUDA stream",
                 what);
  drv::Context context = nullptr;
  drv::Result r = d->stream_get_ctx(stream, &context);
  if (r != drv::kSuccess)
    return Error(weftInvalidArgument, "%s is not a usable CUDA stream: cuStreamGetCtx: %s", what,
                 d->error_string(r));
  int capture = kCaptureNone;
  r = d->stream_is_capturing(stream, &capture);
  if (r != drv::kSuccess) return driver_error(r, what, "cuStreamIsCapturing");
  if (capture != kCaptureNone)
    return Error(weftInvalidUsage,
                 "%s is capturing a CUDA graph; Weft does not support graph capture yet: "
                 "create the Weft stream outside the capture",
                 what);
  r = d->ctx_push_current(context);
  if (r != drv::kSuccess) return driver_error(r, what, "cuCtxPushCurrent");
  int device = -1;
  r = d->ctx_get_device(&device);
  drv::Context popped = nullptr;
  d->ctx_pop_current(&popped);
  if (r != drv::kSuccess) return driver_error(r, what, "cuCtxGetDevice");
  info->device = device;
  return Status::Ok();
}

Status synchronize_stream(void* stream) {
  const Api* d = loaded_driver();
  if (d == nullptr) return Error(weftInternalError, "CUDA stream without a loaded driver");
  drv::Result r = d->stream_synchronize(stream);
  return r == drv::kSuccess ? Status::Ok() : driver_error(r, "stream", "cuStreamSynchronize");
}

Status query_stream(void* stream) {
  const Api* d = loaded_driver();
  if (d == nullptr) return Error(weftInternalError, "CUDA stream without a loaded driver");
  drv::Result r = d->stream_query(stream);
  if (r == drv::kNotReady) return Status(weftInProgress, "");
  return r == drv::kSuccess ? Status::Ok() : driver_error(r, "stream", "cuStreamQuery");
}

}  // namespace weft::cuda
