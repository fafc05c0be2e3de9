// The object behind a weftComm_t. Handles are never freed: destroy and abort
// free the communicator and mark the handle retired, so a later call with it
// gets a clear "already destroyed" error instead of touching freed memory.
#pragma once

#include <memory>

#include "common/status.h"
#include "core/communicator.h"
#include "weft/weft.h"

namespace weft {

weftComm_t wrap_comm(std::unique_ptr<Communicator> impl);
// The live communicator behind `comm`, or an error naming what is wrong with it.
Status resolve_comm(weftComm_t comm, Communicator** out);
// Frees the communicator; the handle stays, retired.
void retire_comm(weftComm_t comm);

}  // namespace weft
