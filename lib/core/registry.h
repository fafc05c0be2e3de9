// Buffers peers may read in place. weftMemAlloc memory is a shared segment
// per allocation, named "/weft-mem-<pid>-<serial>" and linked while
// allocated, so that the ranks of a node can map each other's buffers; a
// communicator's Registry records what the user registered with it (any host
// memory; only weftMemAlloc memory lets peers read it in place, the rest is
// still staged).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"

namespace weft {

// Where an address range lies in weftMemAlloc memory: enough for a peer on
// this node to map the allocation by name.
struct SharedLocation {
  uint32_t pid = 0;
  uint64_t serial = 0;
  uint64_t segment_bytes = 0;
  uint64_t offset = 0;  // of the range's start within the segment
};

// The segment name of an allocation.
std::string shared_memory_name(uint32_t pid, uint64_t serial);

// weftMemAlloc / weftMemFree. The first allocation of a process removes the
// segments of processes that no longer exist; names still allocated at exit
// are unlinked then.
Status shared_alloc(size_t bytes, void** out);
Status shared_free(void* pointer);
// Whether [data, data + bytes) lies inside one allocation of this process.
bool find_shared(const void* data, size_t bytes, SharedLocation* out);

// A communicator's registered buffers (weftCommRegister). Thread-safe: the
// progress thread reads it while the user registers.
class Registry {
 public:
  Status add(void* data, size_t bytes, void** handle);
  Status remove(void* handle);
  // Whether [data, data + bytes) lies inside one registered buffer.
  bool covers(const void* data, size_t bytes) const;

 private:
  struct Range {
    uintptr_t begin, end;
  };
  mutable std::mutex mutex_;
  std::map<uintptr_t, Range> ranges_;  // by handle
};

}  // namespace weft
