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

// The driver ABI Weft uses, in its own words (values and signatures as in
// cuda.h, checked against it below when the CUDA headers are present).
using CuResult = int;
using CuDevicePtr = unsigned long long;
using CuStream = void*;
using CuContext = void*;
constexpr CuResult kCuSuccess = 0;
constexpr CuResult kCuNotReady = 600;
constexpr int kAttrMemoryType = 2, kAttrIsManaged = 8, kAttrDeviceOrdinal = 9;
constexpr unsigned kMemoryTypeDevice = 2;
constexpr int kCaptureNone = 0;
constexpr int kApiVersion = 12000;  // the entry points' CUDA 12.0 semantics

#if defined(WEFT_HAVE_CUDA_HEADERS)
static_assert(CUDA_SUCCESS == kCuSuccess && CUDA_ERROR_NOT_READY == kCuNotReady);
static_assert(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == kAttrMemoryType &&
              CU_POINTER_ATTRIBUTE_IS_MANAGED == kAttrIsManaged &&
              CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == kAttrDeviceOrdinal);
static_assert(CU_MEMORYTYPE_DEVICE == kMemoryTypeDevice &&
              CU_STREAM_CAPTURE_STATUS_NONE == kCaptureNone);
static_assert(sizeof(CUdeviceptr) == sizeof(CuDevicePtr));
#endif

struct Driver {
  CuResult (*get_error_string)(CuResult, const char**);
  CuResult (*pointer_get_attributes)(unsigned, int*, void**, CuDevicePtr);
  CuResult (*stream_get_ctx)(CuStream, CuContext*);
  CuResult (*stream_is_capturing)(CuStream, int*);
  CuResult (*stream_synchronize)(CuStream);
  CuResult (*stream_query)(CuStream);
  CuResult (*ctx_push_current)(CuContext);
  CuResult (*ctx_pop_current)(CuContext*);
  CuResult (*ctx_get_device)(int*);

  const char* error_string(CuResult r) const {
    const char* text = nullptr;
    return get_error_string(r, &text) == kCuSuccess && text != nullptr ? text : "unknown error";
  }
};

// Resolves the entry points through cuGetProcAddress (driver >= 12.0), which
// picks the version of each that matches kApiVersion.
bool resolve(void* library, Driver* d) {
  using GetProc = CuResult (*)(const char*, void**, int, uint64_t, int*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) return false;
  auto one = [&](const char* name, auto* fn) {
    void* p = nullptr;
    int found = 0;
    if (get_proc(name, &p, kApiVersion, 0, &found) != kCuSuccess || p == nullptr) return false;
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
    return true;
  };
  return one("cuGetErrorString", &d->get_error_string) &&
         one("cuPointerGetAttributes", &d->pointer_get_attributes) &&
         one("cuStreamGetCtx", &d->stream_get_ctx) &&
         one("cuStreamIsCapturing", &d->stream_is_capturing) &&
         one("cuStreamSynchronize", &d->stream_synchronize) &&
         one("cuStreamQuery", &d->stream_query) && one("cuCtxPushCurrent", &d->ctx_push_current) &&
         one("cuCtxPopCurrent", &d->ctx_pop_current) && one("cuCtxGetDevice", &d->ctx_get_device);
}

struct Scan {
  bool count_only;
  unsigned long long adds = 0;
  bool found = false;
};

int scan_object(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<Scan*>(data);
  scan->adds = info->dlpi_adds;
  if (scan->count_only) return 1;
  const char* slash = info->dlpi_name != nullptr ? strrchr(info->dlpi_name, '/') : nullptr;
  const char* base = slash != nullptr ? slash + 1 : info->dlpi_name;
  scan->found = base != nullptr && strncmp(base, "libcuda.so", 10) == 0;
  return scan->found ? 1 : 0;
}

std::atomic<const Driver*> g_driver{nullptr};
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

// Run by dl_iterate_phdr, under the loader's lock, so the list holds still while it is
// walked: the last object's map and name.
struct Tail {
  const link_map* map = nullptr;
  std::string name;
};
int find_tail(dl_phdr_info*, size_t, void* data) {
  auto* tail = static_cast<Tail*>(data);
  for (const link_map* map = _r_debug.r_map; map != nullptr; map = map->l_next) tail->map = map;
  if (tail->map != nullptr && tail->map->l_name != nullptr) tail->name = tail->map->l_name;
  return 1;
}

// Pins the list's last object as g_tail (under g_mutex), if it can be opened again.
void pin_tail() {
  if (g_pins >= kMaxPins) {
    g_tail.store(nullptr, std::memory_order_release);
    return;
  }
  Tail tail;
  dl_iterate_phdr(find_tail, &tail);
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

// The driver if this process has loaded libcuda, else null. Loaded objects
// only change when dlpi_adds does, so a miss costs one early-stopped probe
// (or, with a pinned tail, one load).
const Driver* loaded_driver() {
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  if (nothing_loaded_since_pin()) return nullptr;
  Scan probe{true};
  dl_iterate_phdr(scan_object, &probe);
  if (probe.adds == g_scanned_adds.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  Scan full{false};
  dl_iterate_phdr(scan_object, &full);
  g_scanned_adds.store(probe.adds, std::memory_order_relaxed);
  // Already loaded: this only takes a reference, never loads a library.
  void* library = full.found ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) : nullptr;
  static Driver driver;
  if (library == nullptr || !resolve(library, &driver)) {
    pin_tail();
    return nullptr;
  }
  g_driver.store(&driver, std::memory_order_release);
  return &driver;
}

Status driver_error(const Driver& d, CuResult r, const char* what, const char* call) {
  return Error(weftUnhandledCudaError, "%s: %s failed: %s (CUDA error %d)", what, call,
               d.error_string(r), r);
}

}  // namespace

PointerInfo pointer_info(const void* ptr) {
  PointerInfo info;
  const Driver* d = loaded_driver();
  if (d == nullptr || ptr == nullptr) return info;
  // Eight zeroed bytes per answer: the attributes are 1- to 4-byte values.
  int attributes[3] = {kAttrMemoryType, kAttrIsManaged, kAttrDeviceOrdinal};
  uint64_t type = 0, managed = 0, ordinal = 0;
  void* data[3] = {&type, &managed, &ordinal};
  // Not a CUDA pointer: success with empty answers. Driver not initialised:
  // an error, and then nothing can be device memory either.
  if (d->pointer_get_attributes(3, attributes, data, reinterpret_cast<CuDevicePtr>(ptr)) !=
      kCuSuccess)
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
               "%s: %s is device memory (GPU %d); this call takes host memory, and the GPU path "
               "(a stream from weftStreamCreateFromCuda run by the CUDA executor) is not built "
               "yet: copy the buffer to host memory first",
               call, what, info.device);
}

Status check_host_buffers(const char* call, const void* send, const void* recv) {
  if (loaded_driver() == nullptr) return Status::Ok();
  WEFT_RETURN_IF_ERROR(check_host_memory(call, "sendbuff", send));
  return check_host_memory(call, "recvbuff", recv);
}

Status inspect_stream(void* stream, const char* what, StreamInfo* info) {
  const Driver* d = loaded_driver();
  if (d == nullptr)
    return Error(weftInvalidArgument,
                 "%s: no CUDA driver is loaded in this process, so it cannot be a CUDA stream",
                 what);
  CuContext context = nullptr;
  CuResult r = d->stream_get_ctx(stream, &context);
  if (r != kCuSuccess)
    return Error(weftInvalidArgument, "%s is not a usable CUDA stream: cuStreamGetCtx: %s", what,
                 d->error_string(r));
  int capture = kCaptureNone;
  r = d->stream_is_capturing(stream, &capture);
  if (r != kCuSuccess) return driver_error(*d, r, what, "cuStreamIsCapturing");
  if (capture != kCaptureNone)
    return Error(weftInvalidUsage,
                 "%s is capturing a CUDA graph; Weft does not support graph capture yet: "
                 "create the Weft stream outside the capture",
                 what);
  r = d->ctx_push_current(context);
  if (r != kCuSuccess) return driver_error(*d, r, what, "cuCtxPushCurrent");
  int device = -1;
  r = d->ctx_get_device(&device);
  CuContext popped = nullptr;
  d->ctx_pop_current(&popped);
  if (r != kCuSuccess) return driver_error(*d, r, what, "cuCtxGetDevice");
  info->device = device;
  return Status::Ok();
}

Status synchronize_stream(void* stream) {
  const Driver* d = loaded_driver();
  if (d == nullptr) return Error(weftInternalError, "CUDA stream without a loaded driver");
  CuResult r = d->stream_synchronize(stream);
  return r == kCuSuccess ? Status::Ok() : driver_error(*d, r, "stream", "cuStreamSynchronize");
}

Status query_stream(void* stream) {
  const Driver* d = loaded_driver();
  if (d == nullptr) return Error(weftInternalError, "CUDA stream without a loaded driver");
  CuResult r = d->stream_query(stream);
  if (r == kCuNotReady) return Status(weftInProgress, "");
  return r == kCuSuccess ? Status::Ok() : driver_error(*d, r, "stream", "cuStreamQuery");
}

}  // namespace weft::cuda
