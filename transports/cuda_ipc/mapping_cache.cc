#include "transports/cuda_ipc/mapping_cache.h"

#include <utility>

namespace weft::cuda_ipc {
namespace {

std::string key_of(std::span<const uint8_t> handle) {
  return std::string(reinterpret_cast<const char*>(handle.data()), handle.size());
}

}  // namespace

MappingCache::MappingCache(Close close, size_t max_idle)
    : close_(std::move(close)), max_idle_(max_idle) {}

MappingCache::~MappingCache() {
  while (!entries_.empty()) close_entry(entries_.begin());
}

void MappingCache::close_entry(std::map<std::string, Entry>::iterator it) {
  if (it->second.users == 0) idle_.erase(it->second.idle);
  close_(it->second.mapping);
  entries_.erase(it);
}

Status MappingCache::acquire(std::span<const uint8_t> handle, const Open& open, Mapping* out) {
  if (handle.empty()) return Error(weftInvalidArgument, "cuda_ipc: handle must not be empty");
  std::string key = key_of(handle);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    Entry entry;
    WEFT_RETURN_IF_ERROR(open(&entry.mapping));
    ++opens_;
    it = entries_.emplace(std::move(key), entry).first;
  } else if (it->second.users == 0) {
    idle_.erase(it->second.idle);
  }
  ++it->second.users;
  *out = it->second.mapping;
  return Status::Ok();
}

bool MappingCache::release(std::span<const uint8_t> handle) {
  auto it = entries_.find(key_of(handle));
  if (it == entries_.end() || it->second.users == 0) return false;
  if (--it->second.users > 0) return true;
  it->second.idle = idle_.insert(idle_.end(), it->first);
  if (idle_.size() > max_idle_) close_entry(entries_.find(idle_.front()));
  return true;
}

bool MappingCache::evict(std::span<const uint8_t> handle) {
  auto it = entries_.find(key_of(handle));
  if (it == entries_.end() || it->second.users > 0) return false;
  close_entry(it);
  return true;
}

}  // namespace weft::cuda_ipc
