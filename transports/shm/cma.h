// Cross-memory attach (process_vm_readv): one copy straight out of another
// process's private memory. Needs ptrace access to that process (same user
// and no Yama restriction, or CAP_SYS_PTRACE); knows no collective.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace weft::shm {

// Reads `bytes` at address `remote` of process `pid` into `local`. Partial
// transfers are continued; a read that fails or stops short (the process
// died, the range is unmapped) is an error carrying errno's text.
Status cma_read(pid_t pid, uint64_t remote, void* local, size_t bytes);

}  // namespace weft::shm
