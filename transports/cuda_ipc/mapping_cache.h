// Peers' exported memory, opened once and kept: importing a handle
// (cuMemImportFromShareableHandle + reserve + map, or cudaIpcOpenMemHandle)
// costs far more than a collective on a small buffer, and user buffers are
// used call after call. Keyed by the exporter's handle bytes, so a buffer
// that was freed and allocated again (a new handle) is opened afresh. The
// open and close calls are the caller's (the CUDA driver's, or mmap in
// tests), so this compiles and is tested without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <span>
#include <string>

#include "common/status.h"

namespace weft::cuda_ipc {

struct Mapping {
  void* address = nullptr;
  size_t bytes = 0;
};

class MappingCache {
 public:
  using Open = std::function<Status(Mapping*)>;
  using Close = std::function<void(const Mapping&)>;

  // Keeps at most `max_idle` mappings that nobody uses (the least recently
  // released are closed first); `close` undoes what an Open did.
  MappingCache(Close close, size_t max_idle);
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;
  ~MappingCache();  // closes every mapping, in use or not

  // The mapping for `handle`: cached, or opened with `open` now. Every
  // successful acquire is matched by one release of the same handle.
  Status acquire(std::span<const uint8_t> handle, const Open& open, Mapping* out);
  // False when `handle` is not acquired.
  bool release(std::span<const uint8_t> handle);
  // Closes the mapping of a handle whose memory the exporter freed; false
  // when it is not cached or still in use.
  bool evict(std::span<const uint8_t> handle);

  size_t size() const { return entries_.size(); }
  uint64_t opens() const { return opens_; }

 private:
  struct Entry {
    Mapping mapping;
    uint64_t users = 0;
    std::list<std::string>::iterator idle;  // valid when users == 0
  };
  void close_entry(std::map<std::string, Entry>::iterator it);

  Close close_;
  size_t max_idle_;
  std::map<std::string, Entry> entries_;
  std::list<std::string> idle_;  // unused handles, least recently released first
  uint64_t opens_ = 0;
};

}  // namespace weft::cuda_ipc
