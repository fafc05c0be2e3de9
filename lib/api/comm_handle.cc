#include "api/comm_handle.h"

#include <cstdint>
#include <mutex>
#include <vector>

namespace weft {

weftComm_t wrap_comm(std::unique_ptr<Communicator> impl) {
  return new weftComm{kLiveCommMagic, std::move(impl)};
}

Status comm_error(weftComm_t comm) {
  if (comm == nullptr) return Error(weftInvalidArgument, "comm is NULL");
  if (comm->magic == kRetiredCommMagic)
    return Error(weftInvalidUsage, "comm was already destroyed or aborted");
  return Error(weftInvalidArgument, "comm is not a communicator");
}

void retire_comm(weftComm_t comm) {
  comm->magic = kRetiredCommMagic;
  comm->impl.reset();
  // Retired handles stay allocated (and reachable) for the process's life.
  static std::mutex mutex;
  static std::vector<weftComm_t>* retired = new std::vector<weftComm_t>();
  std::lock_guard<std::mutex> lock(mutex);
  retired->push_back(comm);
}

}  // namespace weft
