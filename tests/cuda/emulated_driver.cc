// A host emulation of the CUDA driver (libcuda.so.1), for testing the GPU path's
// orchestration on machines without a GPU: the driver entry points Weft and the GPU tests
// call, with "device memory" in host memory and every stream a thread. It tests what Weft
// asks of the driver and in which order (streams, events, flags, IPC of memory between
// processes, kernel launches); it says nothing of a real GPU's speed or memory model, and
// nothing that passes here is reported as GPU support.
//  - Device memory is shared memory (memfd): cuMemAlloc'd memory can be opened by another
//    process through a legacy IPC handle (/proc/<pid>/fd), cuMemCreate'd memory is exported
//    as a file descriptor, mapped with cuMemMap at a reserved range and readable only after
//    cuMemSetAccess (so a missing call faults, as it would on a GPU).
//  - A stream is a thread running its operations in order; the legacy default stream is one
//    more per context. Events, cuStreamWaitEvent and the 64-bit stream memory operations are
//    honoured (a wait polls the flag: its writer may be another process).
//  - cuLaunchKernel runs Weft's reduction kernels (weft_reduce_<dtype>) with the kernels' own
//    work-item code (functors.h) on the stream's thread.
// WEFT_EMULATED_GPUS sets the device count (default 2: tests of a stream of another GPU);
// WEFT_EMULATED_NO_VMM=1 reports no POSIX-fd handles (legacy IPC only).
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/functors.h"

namespace {

using Result = int;
using DevicePtr = unsigned long long;
constexpr Result kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3,
                 kInvalidDevice = 101, kInvalidImage = 200, kInvalidContext = 201,
                 kInvalidHandle = 400, kNotFound = 500, kNotReady = 600, kNotSupported = 801;
constexpr int kSms = 4;

struct Device {
  int ordinal;
};

struct Context {
  int device;
};

class Stream;

// What the emulation knows of an address range: device memory of `device` (or host memory
// that CUDA allocated, for cuMemHostAlloc).
struct Range {
  size_t bytes;
  int device;
  bool host;
  int memfd;  // cuMemAlloc'd: legacy IPC opens it; -1 otherwise
};

struct Physical {  // a cuMemCreate handle
  int fd;
  size_t bytes;
  bool exportable;
};

struct IpcHandle {  // the 64 bytes of a legacy IPC handle
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  uint8_t pad[40];
};
static_assert(sizeof(IpcHandle) == 64);
constexpr uint64_t kIpcMagic = 0x776566746970636dull;

std::mutex g_mutex;
bool g_initialized = false;
std::map<uintptr_t, Range>* g_ranges = new std::map<uintptr_t, Range>;  // by base address
std::vector<std::unique_ptr<Context>>* g_primary = new std::vector<std::unique_ptr<Context>>;
thread_local std::vector<Context*> t_contexts;

int device_count() {
  const char* value = getenv("WEFT_EMULATED_GPUS");
  int n = value != nullptr ? atoi(value) : 2;
  return n > 0 && n <= 64 ? n : 2;
}

bool vmm_supported() {
  const char* value = getenv("WEFT_EMULATED_NO_VMM");
  return value == nullptr || strcmp(value, "1") != 0;
}

Context* current() {
  return t_contexts.empty() ? nullptr : t_contexts.back();
}

// The range holding `p`, if CUDA made it (under g_mutex).
const Range* find_range(uintptr_t p, uintptr_t* base) {
  auto it = g_ranges->upper_bound(p);
  if (it == g_ranges->begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.bytes) return nullptr;
  if (base != nullptr) *base = it->first;
  return &it->second;
}

void add_range(void* p, Range range) {
  std::lock_guard<std::mutex> lock(g_mutex);
  (*g_ranges)[reinterpret_cast<uintptr_t>(p)] = range;
}

void remove_range(uintptr_t p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_ranges->erase(p);
}

int new_memfd(size_t bytes) {
  int fd = memfd_create("weft-emulated-gpu", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Polls until `ready` holds: spins briefly, then yields, then sleeps (the writer may be
// another process, so there is nothing to block on).
void poll_until(const std::function<bool()>& ready) {
  for (int i = 0; !ready(); ++i) {
    if (i < 64) continue;
    if (i < 256) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(i < 2048 ? 20 : 200));
  }
}

// A stream: its own thread runs the operations in order.
class Stream {
 public:
  explicit Stream(Context* context) : context_(context), thread_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  Context* context() const { return context_; }
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    changed_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t target = enqueued_;
    changed_.wait(lock, [&] { return done_ >= target; });
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ == enqueued_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      t_contexts.assign(1, context_);
      work();
      lock.lock();
      ++done_;
      changed_.notify_all();
    }
  }

  Context* context_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

std::map<Context*, std::unique_ptr<Stream>>* g_legacy =
    new std::map<Context*, std::unique_ptr<Stream>>;

// The stream a handle names: NULL and CU_STREAM_LEGACY are the current context's default
// stream (CU_STREAM_PER_THREAD too); null when there is none.
Stream* resolve(void* handle) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(handle);
  if (value > 2) return static_cast<Stream*>(handle);  // 0, 1, 2: NULL, legacy, per-thread
  Context* context = current();
  if (context == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::unique_ptr<Stream>& stream = (*g_legacy)[context];
  if (!stream) stream = std::make_unique<Stream>(context);
  return stream.get();
}

// As with CUDA, an event may be destroyed while stream work still records or waits on it: that
// work holds the counts, which live until the last of it is done.
struct EventCounts {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
};
struct Event {
  std::shared_ptr<EventCounts> counts = std::make_shared<EventCounts>();
};

struct Kernel {
  weftDataType_t dtype;
};
Kernel g_kernels[weftNumTypes];

struct Module {
  int loaded = 1;
};
Module g_module;  // every image is the same module: its kernels are known by name

template <weftDataType_t D>
void run_reduce(const weft::cuda::ReduceParams& p) {
  using E = weft::cuda::Element<D>;
  typename E::S scale{};
  if (p.premul) scale = E::scalar(p);
  for (uint64_t w = 0; w < E::items(p); ++w) E::item(p, scale, w);
}

Result need_init() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_initialized ? kSuccess : kNotInitialized;
}

#define NEED_INIT()                         \
  do {                                      \
    if (Result r_ = need_init()) return r_; \
  } while (0)

#define NEED_CONTEXT()                                \
  do {                                                \
    NEED_INIT();                                      \
    if (current() == nullptr) return kInvalidContext; \
  } while (0)

// --- the entry points ---------------------------------------------------------------------

Result cu_init(unsigned) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_initialized) {
    for (int d = 0; d < device_count(); ++d)
      g_primary->push_back(std::make_unique<Context>(Context{d}));
    for (int t = 0; t < weftNumTypes; ++t) g_kernels[t].dtype = static_cast<weftDataType_t>(t);
  }
  g_initialized = true;
  return kSuccess;
}

Result get_error_string(Result error, const char** text) {
  switch (error) {
    case kSuccess:
      *text = "no error";
      break;
    case kInvalidValue:
      *text = "invalid argument";
      break;
    case kOutOfMemory:
      *text = "out of memory";
      break;
    case kNotInitialized:
      *text = "initialization error";
      break;
    case kInvalidDevice:
      *text = "invalid device ordinal";
      break;
    case kInvalidContext:
      *text = "invalid device context";
      break;
    case kInvalidHandle:
      *text = "invalid resource handle";
      break;
    case kNotFound:
      *text = "named symbol not found";
      break;
    case kNotReady:
      *text = "device not ready";
      break;
    default:
      *text = "not supported by the emulated driver";
      break;
  }
  return kSuccess;
}

Result driver_get_version(int* version) {
  *version = 13000;
  return kSuccess;
}

Result device_get_count(int* count) {
  NEED_INIT();
  *count = device_count();
  return kSuccess;
}

Result device_get(int* device, int ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= device_count()) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

Result device_get_name(char* name, int length, int device) {
  NEED_INIT();
  snprintf(name, static_cast<size_t>(length), "Weft emulated GPU %d", device);
  return kSuccess;
}

Result device_get_attribute(int* value, int attribute, int device) {
  NEED_INIT();
  if (device < 0 || device >= device_count()) return kInvalidDevice;
  switch (attribute) {
    case 16:
      *value = kSms;
      break;  // multiprocessors
    case 41:
      *value = 1;
      break;  // unified addressing
    case 75:
      *value = 9;
      break;  // compute capability major
    case 76:
      *value = 0;
      break;  // minor
    case 102:
    case 103:
      *value = vmm_supported();
      break;  // VMM, POSIX-fd handles
    case 122:
      *value = 1;
      break;  // 64-bit stream memory operations
    default:
      *value = 0;
      break;
  }
  return kSuccess;
}

Result primary_ctx_retain(Context** context, int device) {
  NEED_INIT();
  if (device < 0 || device >= device_count()) return kInvalidDevice;
  std::lock_guard<std::mutex> lock(g_mutex);
  *context = (*g_primary)[device].get();
  return kSuccess;
}

Result primary_ctx_release(int device) {
  NEED_INIT();
  return device >= 0 && device < device_count() ? kSuccess : kInvalidDevice;
}

Result ctx_set_current(Context* context) {
  NEED_INIT();
  if (context == nullptr) {
    t_contexts.clear();
  } else if (t_contexts.empty()) {
    t_contexts.push_back(context);
  } else {
    t_contexts.back() = context;
  }
  return kSuccess;
}

Result ctx_get_current(Context** context) {
  NEED_INIT();
  *context = current();
  return kSuccess;
}

Result ctx_push_current(Context* context) {
  NEED_INIT();
  if (context == nullptr) return kInvalidContext;
  t_contexts.push_back(context);
  return kSuccess;
}

Result ctx_pop_current(Context** context) {
  NEED_INIT();
  if (t_contexts.empty()) return kInvalidContext;
  if (context != nullptr) *context = t_contexts.back();
  t_contexts.pop_back();
  return kSuccess;
}

Result ctx_get_device(int* device) {
  NEED_CONTEXT();
  *device = current()->device;
  return kSuccess;
}

Result ctx_synchronize() {
  NEED_CONTEXT();
  resolve(nullptr)->synchronize();
  return kSuccess;
}

Result pointer_get_attributes(unsigned n, int* attributes, void** data, DevicePtr ptr) {
  NEED_INIT();
  std::lock_guard<std::mutex> lock(g_mutex);
  const Range* range = find_range(static_cast<uintptr_t>(ptr), nullptr);
  for (unsigned i = 0; i < n; ++i) {
    uint32_t value = 0;
    if (range != nullptr && attributes[i] == 2) value = range->host ? 1 : 2;  // memory type
    if (range != nullptr && attributes[i] == 9) value = static_cast<uint32_t>(range->device);
    memcpy(data[i], &value, sizeof value);
  }
  return kSuccess;
}

Result mem_get_address_range(DevicePtr* base, size_t* bytes, DevicePtr ptr) {
  NEED_INIT();
  std::lock_guard<std::mutex> lock(g_mutex);
  uintptr_t start = 0;
  const Range* range = find_range(static_cast<uintptr_t>(ptr), &start);
  if (range == nullptr || range->host) return kNotFound;
  if (base != nullptr) *base = start;
  if (bytes != nullptr) *bytes = range->bytes;
  return kSuccess;
}

Result stream_create(Stream** stream, unsigned) {
  NEED_CONTEXT();
  *stream = new Stream(current());
  return kSuccess;
}

Result stream_destroy(Stream* stream) {
  NEED_INIT();
  if (stream == nullptr || stream == reinterpret_cast<Stream*>(1)) return kInvalidHandle;
  stream->synchronize();
  delete stream;
  return kSuccess;
}

Result stream_get_ctx(void* handle, Context** context) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  *context = stream->context();
  return kSuccess;
}

Result stream_is_capturing(void* handle, int* status) {
  NEED_INIT();
  if (resolve(handle) == nullptr) return kInvalidContext;
  *status = 0;
  return kSuccess;
}

Result stream_synchronize(void* handle) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  stream->synchronize();
  return kSuccess;
}

Result stream_query(void* handle) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  return stream->idle() ? kSuccess : kNotReady;
}

Result event_create(Event** event, unsigned) {
  NEED_CONTEXT();
  *event = new Event;
  return kSuccess;
}

Result event_destroy(Event* event) {
  NEED_INIT();
  delete event;
  return kSuccess;
}

Result event_record(Event* event, void* handle) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr || event == nullptr) return kInvalidHandle;
  const uint64_t generation = event->counts->recorded.fetch_add(1) + 1;
  stream->enqueue([counts = event->counts, generation] {
    uint64_t seen = counts->completed.load();
    while (seen < generation && !counts->completed.compare_exchange_weak(seen, generation)) {
    }
  });
  return kSuccess;
}

Result event_query(Event* event) {
  NEED_INIT();
  return event->counts->completed.load() >= event->counts->recorded.load() ? kSuccess : kNotReady;
}

Result event_synchronize(Event* event) {
  NEED_INIT();
  const uint64_t target = event->counts->recorded.load();
  poll_until([&] { return event->counts->completed.load() >= target; });
  return kSuccess;
}

Result stream_wait_event(void* handle, Event* event, unsigned) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr || event == nullptr) return kInvalidHandle;
  const uint64_t target = event->counts->recorded.load();
  stream->enqueue([counts = event->counts, target] {
    poll_until([&] { return counts->completed.load() >= target; });
  });
  return kSuccess;
}

Result memcpy_async(DevicePtr dst, DevicePtr src, size_t bytes, void* handle) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  stream->enqueue(
      [=] { memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes); });
  return kSuccess;
}

Result memcpy_sync(DevicePtr dst, DevicePtr src, size_t bytes) {
  if (Result r = memcpy_async(dst, src, bytes, nullptr)) return r;
  resolve(nullptr)->synchronize();
  return kSuccess;
}

Result memset_d8_async(DevicePtr dst, unsigned char value, size_t bytes, void* handle) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  stream->enqueue([=] { memset(reinterpret_cast<void*>(dst), value, bytes); });
  return kSuccess;
}

Result memset_d8(DevicePtr dst, unsigned char value, size_t bytes) {
  if (Result r = memset_d8_async(dst, value, bytes, nullptr)) return r;
  resolve(nullptr)->synchronize();
  return kSuccess;
}

Result stream_write_value64(void* handle, DevicePtr address, uint64_t value, unsigned) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  stream->enqueue([=] {
    // Orders every earlier operation's writes before the flag, as the default flags do.
    __atomic_store_n(reinterpret_cast<uint64_t*>(address), value, __ATOMIC_SEQ_CST);
  });
  return kSuccess;
}

Result stream_wait_value64(void* handle, DevicePtr address, uint64_t value, unsigned flags) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  if (flags != 0) return kNotSupported;  // only CU_STREAM_WAIT_VALUE_GEQ is emulated
  stream->enqueue([=] {
    poll_until([&] {
      const uint64_t now = __atomic_load_n(reinterpret_cast<uint64_t*>(address), __ATOMIC_SEQ_CST);
      return static_cast<int64_t>(now - value) >= 0;
    });
  });
  return kSuccess;
}

Result mem_alloc(DevicePtr* out, size_t bytes) {
  NEED_CONTEXT();
  if (bytes == 0) return kInvalidValue;
  const int fd = new_memfd(bytes);
  if (fd < 0) return kOutOfMemory;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return kOutOfMemory;
  }
  add_range(p, Range{bytes, current()->device, false, fd});
  *out = reinterpret_cast<DevicePtr>(p);
  return kSuccess;
}

Result mem_free(DevicePtr ptr) {
  NEED_INIT();
  Range range;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_ranges->find(static_cast<uintptr_t>(ptr));
    if (it == g_ranges->end() || it->second.memfd < 0) return kInvalidValue;
    range = it->second;
    g_ranges->erase(it);
  }
  munmap(reinterpret_cast<void*>(ptr), range.bytes);
  close(range.memfd);
  return kSuccess;
}

Result mem_host_alloc(void** out, size_t bytes, unsigned) {
  NEED_CONTEXT();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  add_range(p, Range{bytes, current()->device, true, -1});
  *out = p;
  return kSuccess;
}

Result mem_free_host(void* p) {
  NEED_INIT();
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_ranges->find(reinterpret_cast<uintptr_t>(p));
    if (it == g_ranges->end() || !it->second.host) return kInvalidValue;
    bytes = it->second.bytes;
    g_ranges->erase(it);
  }
  munmap(p, bytes);
  return kSuccess;
}

Result mem_host_get_device_pointer(DevicePtr* out, void* p, unsigned) {
  NEED_INIT();
  *out = reinterpret_cast<DevicePtr>(p);
  return kSuccess;
}

Result ipc_get_mem_handle(IpcHandle* handle, DevicePtr ptr) {
  NEED_INIT();
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_ranges->find(static_cast<uintptr_t>(ptr));
  if (it == g_ranges->end() || it->second.memfd < 0) return kInvalidValue;
  *handle = IpcHandle{kIpcMagic, getpid(), it->second.memfd, it->second.bytes, {}};
  return kSuccess;
}

Result ipc_open_mem_handle(DevicePtr* out, IpcHandle handle, unsigned) {
  NEED_CONTEXT();
  if (handle.magic != kIpcMagic) return kInvalidValue;
  if (handle.pid == getpid()) return kInvalidContext;  // as CUDA: not within one process
  const std::string path =
      "/proc/" + std::to_string(handle.pid) + "/fd/" + std::to_string(handle.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidValue;
  void* p = mmap(nullptr, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return kOutOfMemory;
  add_range(p, Range{handle.bytes, current()->device, false, -1});
  *out = reinterpret_cast<DevicePtr>(p);
  return kSuccess;
}

Result ipc_close_mem_handle(DevicePtr ptr) {
  NEED_INIT();
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_ranges->find(static_cast<uintptr_t>(ptr));
    if (it == g_ranges->end()) return kInvalidValue;
    bytes = it->second.bytes;
    g_ranges->erase(it);
  }
  munmap(reinterpret_cast<void*>(ptr), bytes);
  return kSuccess;
}

constexpr size_t kGranularity = 2 << 20;

struct AllocationProp {  // as weft::cuda::drv::AllocationProp
  int type;
  int handle_types;
  int location_type;
  int location_id;
};

Result mem_get_allocation_granularity(size_t* granularity, const AllocationProp*, int) {
  NEED_INIT();
  *granularity = kGranularity;
  return kSuccess;
}

Result mem_create(Physical** handle, size_t bytes, const AllocationProp* prop, unsigned long long) {
  NEED_INIT();
  if (!vmm_supported() && prop->handle_types != 0) return kNotSupported;
  if (bytes == 0 || bytes % kGranularity != 0 || prop->location_type != 1) return kInvalidValue;
  const int fd = new_memfd(bytes);
  if (fd < 0) return kOutOfMemory;
  *handle = new Physical{fd, bytes, (prop->handle_types & 1) != 0};
  return kSuccess;
}

Result mem_release(Physical* handle) {
  NEED_INIT();
  close(handle->fd);
  delete handle;
  return kSuccess;
}

Result mem_address_reserve(DevicePtr* out, size_t bytes, size_t, DevicePtr, unsigned long long) {
  NEED_INIT();
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  *out = reinterpret_cast<DevicePtr>(p);
  return kSuccess;
}

Result mem_address_free(DevicePtr ptr, size_t bytes) {
  NEED_INIT();
  munmap(reinterpret_cast<void*>(ptr), bytes);
  return kSuccess;
}

Result mem_map(DevicePtr ptr, size_t bytes, size_t offset, Physical* handle, unsigned long long) {
  NEED_CONTEXT();
  if (offset + bytes > handle->bytes) return kInvalidValue;
  // Mapped, but not accessible until cuMemSetAccess.
  void* p = mmap(reinterpret_cast<void*>(ptr), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, handle->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return kInvalidValue;
  add_range(p, Range{bytes, current()->device, false, -1});
  return kSuccess;
}

Result mem_unmap(DevicePtr ptr, size_t bytes) {
  NEED_INIT();
  remove_range(static_cast<uintptr_t>(ptr));
  mmap(reinterpret_cast<void*>(ptr), bytes, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return kSuccess;
}

Result mem_set_access(DevicePtr ptr, size_t bytes, const void*, size_t count) {
  NEED_INIT();
  if (count == 0) return kInvalidValue;
  return mprotect(reinterpret_cast<void*>(ptr), bytes, PROT_READ | PROT_WRITE) == 0 ? kSuccess
                                                                                    : kInvalidValue;
}

Result mem_export_to_shareable_handle(void* out, Physical* handle, int type, unsigned long long) {
  NEED_INIT();
  if (type != 1 || !handle->exportable) return kInvalidValue;
  const int fd = dup(handle->fd);
  if (fd < 0) return kOutOfMemory;
  memcpy(out, &fd, sizeof fd);
  return kSuccess;
}

Result mem_import_from_shareable_handle(Physical** handle, void* os_handle, int type) {
  NEED_INIT();
  if (type != 1) return kInvalidValue;
  const int fd = dup(static_cast<int>(reinterpret_cast<intptr_t>(os_handle)));
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) return kInvalidValue;
  *handle = new Physical{fd, static_cast<size_t>(st.st_size), false};
  return kSuccess;
}

Result module_load_data(Module** module, const void* image) {
  NEED_CONTEXT();
  if (image == nullptr) return kInvalidImage;
  *module = &g_module;
  return kSuccess;
}

Result module_unload(Module* module) {
  NEED_INIT();
  return module == &g_module ? kSuccess : kInvalidHandle;
}

Result module_get_function(Kernel** function, Module*, const char* name) {
  NEED_INIT();
  const char* prefix = "weft_reduce_";
  if (strncmp(name, prefix, strlen(prefix)) != 0) return kNotFound;
  const int dtype = atoi(name + strlen(prefix));
  if (dtype < 0 || dtype >= weftNumTypes) return kNotFound;
  *function = &g_kernels[dtype];
  return kSuccess;
}

Result launch_kernel(Kernel* kernel, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, void* handle, void** parameters, void**) {
  NEED_INIT();
  Stream* stream = resolve(handle);
  if (stream == nullptr) return kInvalidContext;
  if (kernel == nullptr || parameters == nullptr) return kInvalidValue;
  // The parameter block is copied at launch, as the driver does.
  weft::cuda::ReduceParams p;
  memcpy(&p, parameters[0], sizeof p);
  const weftDataType_t dtype = kernel->dtype;
  stream->enqueue([p, dtype] {
    weft::cuda::with_dtype(dtype, [&](auto d) { run_reduce<decltype(d)::value>(p); });
  });
  return kSuccess;
}

struct Entry {
  const char* name;
  void* function;
};

#define ENTRY(name, fn) \
  { name, reinterpret_cast<void*>(fn) }
const Entry kEntries[] = {
    ENTRY("cuInit", cu_init),
    ENTRY("cuGetErrorString", get_error_string),
    ENTRY("cuDriverGetVersion", driver_get_version),
    ENTRY("cuDeviceGetCount", device_get_count),
    ENTRY("cuDeviceGet", device_get),
    ENTRY("cuDeviceGetName", device_get_name),
    ENTRY("cuDeviceGetAttribute", device_get_attribute),
    ENTRY("cuDevicePrimaryCtxRetain", primary_ctx_retain),
    ENTRY("cuDevicePrimaryCtxRelease", primary_ctx_release),
    ENTRY("cuCtxSetCurrent", ctx_set_current),
    ENTRY("cuCtxGetCurrent", ctx_get_current),
    ENTRY("cuCtxPushCurrent", ctx_push_current),
    ENTRY("cuCtxPopCurrent", ctx_pop_current),
    ENTRY("cuCtxGetDevice", ctx_get_device),
    ENTRY("cuCtxSynchronize", ctx_synchronize),
    ENTRY("cuPointerGetAttributes", pointer_get_attributes),
    ENTRY("cuStreamCreate", stream_create),
    ENTRY("cuStreamDestroy", stream_destroy),
    ENTRY("cuStreamGetCtx", stream_get_ctx),
    ENTRY("cuStreamIsCapturing", stream_is_capturing),
    ENTRY("cuStreamSynchronize", stream_synchronize),
    ENTRY("cuStreamQuery", stream_query),
    ENTRY("cuStreamWaitEvent", stream_wait_event),
    ENTRY("cuEventCreate", event_create),
    ENTRY("cuEventDestroy", event_destroy),
    ENTRY("cuEventRecord", event_record),
    ENTRY("cuEventQuery", event_query),
    ENTRY("cuEventSynchronize", event_synchronize),
    ENTRY("cuMemcpyAsync", memcpy_async),
    ENTRY("cuMemcpy", memcpy_sync),
    ENTRY("cuMemsetD8Async", memset_d8_async),
    ENTRY("cuMemsetD8", memset_d8),
    ENTRY("cuStreamWriteValue64", stream_write_value64),
    ENTRY("cuStreamWaitValue64", stream_wait_value64),
    ENTRY("cuMemGetAddressRange", mem_get_address_range),
    ENTRY("cuMemAlloc", mem_alloc),
    ENTRY("cuMemFree", mem_free),
    ENTRY("cuMemHostAlloc", mem_host_alloc),
    ENTRY("cuMemFreeHost", mem_free_host),
    ENTRY("cuMemHostGetDevicePointer", mem_host_get_device_pointer),
    ENTRY("cuIpcGetMemHandle", ipc_get_mem_handle),
    ENTRY("cuIpcOpenMemHandle", ipc_open_mem_handle),
    ENTRY("cuIpcCloseMemHandle", ipc_close_mem_handle),
    ENTRY("cuMemGetAllocationGranularity", mem_get_allocation_granularity),
    ENTRY("cuMemCreate", mem_create),
    ENTRY("cuMemRelease", mem_release),
    ENTRY("cuMemAddressReserve", mem_address_reserve),
    ENTRY("cuMemAddressFree", mem_address_free),
    ENTRY("cuMemMap", mem_map),
    ENTRY("cuMemUnmap", mem_unmap),
    ENTRY("cuMemSetAccess", mem_set_access),
    ENTRY("cuMemExportToShareableHandle", mem_export_to_shareable_handle),
    ENTRY("cuMemImportFromShareableHandle", mem_import_from_shareable_handle),
    ENTRY("cuModuleLoadData", module_load_data),
    ENTRY("cuModuleUnload", module_unload),
    ENTRY("cuModuleGetFunction", module_get_function),
    ENTRY("cuLaunchKernel", launch_kernel),
};
#undef ENTRY

}  // namespace

extern "C" {

// Present only in the emulation: tests read it to say which driver they ran on.
__attribute__((visibility("default"))) int weft_emulated_cuda_driver = 1;

__attribute__((visibility("default"))) Result cuGetProcAddress_v2(const char* name, void** fn, int,
                                                                  uint64_t, int* found) {
  for (const Entry& entry : kEntries)
    if (strcmp(entry.name, name) == 0) {
      *fn = entry.function;
      if (found != nullptr) *found = 1;
      return kSuccess;
    }
  *fn = nullptr;
  if (found != nullptr) *found = 0;
  return kNotFound;
}

__attribute__((visibility("default"))) Result cuInit(unsigned flags) {
  return cu_init(flags);
}

}  // extern "C"
