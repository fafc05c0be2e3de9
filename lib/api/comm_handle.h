// The object behind a weftComm_t. Handles are never freed: destroy and abort
// free the communicator and mark the handle retired, so a later call with it
// gets a clear "already destroyed" error instead of touching freed memory.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "core/communicator.h"
#include "weft/weft.h"

struct weftComm {
  uint64_t magic;  // kLiveCommMagic, or kRetiredCommMagic once destroyed
  std::unique_ptr<weft::Communicator> impl;
};

namespace weft {

inline constexpr uint64_t kLiveCommMagic = 0x7765667443303031ull;     // "weftC001"
inline constexpr uint64_t kRetiredCommMagic = 0x7765667444454144ull;  // "weftDEAD"

weftComm_t wrap_comm(std::unique_ptr<Communicator> impl);
// What is wrong with `comm`, which is not a live communicator.
Status comm_error(weftComm_t comm);
// The live communicator behind `comm`, or an error naming what is wrong with it (inline:
// every call resolves its communicator).
inline Status resolve_comm(weftComm_t comm, Communicator** out) {
  if (comm == nullptr || comm->magic != kLiveCommMagic) return comm_error(comm);
  *out = comm->impl.get();
  return Status::Ok();
}
// Frees the communicator; the handle stays, retired.
void retire_comm(weftComm_t comm);

}  // namespace weft
