#include "transports/shm/cma.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace weft::shm {

Status cma_read(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  auto* to = static_cast<char*>(local);
  size_t done = 0;
  // One range each side (well under IOV_MAX); the kernel may stop early at a
  // page it cannot pin, so the rest is asked for again.
  while (done < bytes) {
    iovec mine{to + done, bytes - done};
    iovec theirs{reinterpret_cast<void*>(remote + done), bytes - done};
    ssize_t got = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return Error(weftSystemError, "process_vm_readv from pid %d: %s", static_cast<int>(pid),
                   strerror(errno));
    if (got == 0)
      return Error(weftSystemError, "process_vm_readv from pid %d stopped after %zu of %zu bytes",
                   static_cast<int>(pid), done, bytes);
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace weft::shm
