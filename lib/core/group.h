// Group semantics: between weftGroupStart and weftGroupEnd (which nest), the
// calling thread's point-to-point operations are collected, then posted
// together and completed together, so no order of posting can deadlock.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "core/communicator.h"

namespace weft {

struct P2PCall {
  Communicator* comm = nullptr;
  bool is_send = false;
  void* buffer = nullptr;
  size_t bytes = 0;
  int peer = -1;
};

Status group_start();
Status group_end();
bool in_group();
// Inside a group: queued until the outermost group_end. Outside: runs now.
Status submit_p2p(const P2PCall& call);
// Records an error raised inside a group; group_end reports it.
void group_record_error(const Status& status);

}  // namespace weft
