#include "api/comm_handle.h"

#include <cstdint>
#include <mutex>
#include <vector>

struct weftComm {
  uint64_t magic;
  std::unique_ptr<weft::Communicator> impl;
};

namespace weft {

namespace {
constexpr uint64_t kLiveMagic = 0x7765667443303031ull;     // "weftC001"
constexpr uint64_t kRetiredMagic = 0x7765667444454144ull;  // "weftDEAD"
}  // namespace

weftComm_t wrap_comm(std::unique_ptr<Communicator> impl) {
  return new weftComm{kLiveMagic, std::move(impl)};
}

Status resolve_comm(weftComm_t comm, Communicator** out) {
  if (comm == nullptr) return Error(weftInvalidArgument, "comm is NULL");
  if (comm->magic == kRetiredMagic)
    return Error(weftInvalidUsage, "comm was already destroyed or aborted");
  if (comm->magic != kLiveMagic) return Error(weftInvalidArgument, "comm is not a communicator");
  *out = comm->impl.get();
  return Status::Ok();
}

void retire_comm(weftComm_t comm) {
  comm->magic = kRetiredMagic;
  comm->impl.reset();
  // Retired handles stay allocated (and reachable) for the process's life.
  static std::mutex mutex;
  static std::vector<weftComm_t>* retired = new std::vector<weftComm_t>();
  std::lock_guard<std::mutex> lock(mutex);
  retired->push_back(comm);
}

}  // namespace weft
