#include "core/registry.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "transports/shm/shm.h"

namespace weft {

namespace {

constexpr const char* kPrefix = "weft-mem";

struct Allocation {
  shm::Segment segment;
  uint32_t pid;  // the creator (a forked child inherits its parent's entries)
  uint64_t serial;
};

struct Allocations {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> by_address;
  uint64_t next_serial = 0;
  pid_t swept = 0;  // the process that removed orphans (a forked child sweeps again)
  bool exit_hook = false;
};

// Never destroyed: the exit hook and late frees may run after static destructors.
Allocations& allocations() {
  static Allocations* state = new Allocations;
  return *state;
}

// At exit the mappings go with the process, but the names would stay in /dev/shm.
void unlink_at_exit() {
  Allocations& state = allocations();
  std::lock_guard lock(state.mutex);
  for (auto& [address, allocation] : state.by_address)
    if (allocation.pid == static_cast<uint32_t>(getpid())) allocation.segment.unlink();
}

// The allocation holding [data, data + bytes), or null (caller holds the lock).
const Allocation* find_locked(Allocations& state, const void* data, size_t bytes) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  auto it = state.by_address.upper_bound(begin);
  if (it == state.by_address.begin()) return nullptr;
  --it;
  const Allocation& allocation = it->second;
  if (begin + bytes < begin || begin + bytes > it->first + allocation.segment.size())
    return nullptr;
  return &allocation;
}

}  // namespace

std::string shared_memory_name(uint32_t pid, uint64_t serial) {
  char name[64];
  snprintf(name, sizeof(name), "/%s-%u-%llu", kPrefix, pid,
           static_cast<unsigned long long>(serial));
  return name;
}

Status shared_alloc(size_t bytes, void** out) {
  if (bytes == 0) return Error(weftInvalidArgument, "size is 0");
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) return Error(weftInvalidArgument, "size %zu is too large", bytes);
  bytes = (bytes + page - 1) / page * page;
  Allocations& state = allocations();
  std::lock_guard lock(state.mutex);
  uint32_t pid = static_cast<uint32_t>(getpid());
  if (state.swept != static_cast<pid_t>(pid)) {
    state.swept = static_cast<pid_t>(pid);
    if (int removed = shm::remove_orphans(kPrefix))
      WEFT_LOG(INFO, INIT, "removed %d /dev/shm/%s-* segment(s) of processes that are gone",
               removed, kPrefix);
  }
  if (!state.exit_hook) {
    state.exit_hook = true;
    std::atexit(unlink_at_exit);
  }
  Allocation allocation{{}, pid, state.next_serial++};
  WEFT_RETURN_IF_ERROR(shm::Segment::create_named(shared_memory_name(pid, allocation.serial), bytes,
                                                  &allocation.segment));
  std::byte* data = allocation.segment.data();
  state.by_address.emplace(reinterpret_cast<uintptr_t>(data), std::move(allocation));
  *out = data;
  return Status::Ok();
}

Status shared_free(void* pointer) {
  Allocations& state = allocations();
  std::lock_guard lock(state.mutex);
  auto it = state.by_address.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == state.by_address.end())
    return Error(weftInvalidArgument,
                 "ptr %p is not the start of memory from weftMemAlloc (freed already?)", pointer);
  state.by_address.erase(it);  // unmaps and unlinks
  return Status::Ok();
}

bool find_shared(const void* data, size_t bytes, SharedLocation* out) {
  Allocations& state = allocations();
  std::lock_guard lock(state.mutex);
  const Allocation* allocation = find_locked(state, data, bytes);
  if (allocation == nullptr) return false;
  out->pid = allocation->pid;
  out->serial = allocation->serial;
  out->segment_bytes = allocation->segment.size();
  out->offset =
      static_cast<uint64_t>(static_cast<const std::byte*>(data) - allocation->segment.data());
  return true;
}

Status Registry::add(void* data, size_t bytes, void** handle) {
  // Handles are unique in the process, so another communicator's is unknown here.
  static std::atomic<uintptr_t> next_handle{1};
  uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (begin + bytes < begin)
    return Error(weftInvalidArgument, "buff %p + size %zu wraps around", data, bytes);
  uintptr_t id = next_handle.fetch_add(1);
  std::lock_guard lock(mutex_);
  ranges_.emplace(id, Range{begin, begin + bytes});
  *handle = reinterpret_cast<void*>(id);
  return Status::Ok();
}

Status Registry::remove(void* handle) {
  std::lock_guard lock(mutex_);
  if (ranges_.erase(reinterpret_cast<uintptr_t>(handle)) == 0)
    return Error(weftInvalidArgument,
                 "handle %p is not registered with this communicator (deregistered already?)",
                 handle);
  return Status::Ok();
}

bool Registry::covers(const void* data, size_t bytes) const {
  uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard lock(mutex_);
  for (const auto& [handle, range] : ranges_)
    if (begin >= range.begin && begin + bytes <= range.end && begin + bytes >= begin) return true;
  return false;
}

}  // namespace weft
