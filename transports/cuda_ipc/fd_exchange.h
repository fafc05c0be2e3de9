// File descriptors between the ranks of one node: the route for cuMem
// POSIX-fd handles (cuMemExportToShareableHandle gives an fd that only
// means something once passed to the peer process, which SCM_RIGHTS does).
// Each rank listens on an abstract-namespace AF_UNIX socket named from the
// communicator's unique id and its rank; a pair of ranks shares one stream
// connection, opened by the higher rank. A connection proves itself with a
// token derived from the id (which holds the bootstrap's random secret) and
// must come from the same user (SO_PEERCRED); anything else is dropped.
// Every wait has a deadline and every error names the peer. One thread at
// a time per FdExchange. Knows nothing of CUDA or collectives
// (docs/cuda-ipc.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft::cuda_ipc {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// What one message carries: descriptors and a few bytes describing them
// (sizes, offsets, the exporter's handle bytes).
struct FdMessage {
  std::vector<UniqueFd> fds;
  std::vector<uint8_t> bytes;
};

inline constexpr size_t kMaxFdsPerMessage = 64;
inline constexpr size_t kMaxMessageBytes = 64 * 1024;

class FdExchange {
 public:
  FdExchange() = default;
  FdExchange(const FdExchange&) = delete;
  FdExchange& operator=(const FdExchange&) = delete;
  ~FdExchange();

  // Starts listening as `rank` of `nranks` for the communicator whose
  // unique id is `id` (its bytes). An address in use (the same id and rank
  // twice on this node) is an error.
  Status listen(const void* id, size_t id_bytes, int rank, int nranks);

  // Sends descriptors and bytes to `peer`, connecting first if needed.
  Status send(int peer, const int* fds, size_t nfds, const void* bytes, size_t nbytes,
              int64_t timeout_ms);
  // Receives the next message from `peer`, connecting first if needed.
  Status recv(int peer, FdMessage* out, int64_t timeout_ms);

  int rank() const { return rank_; }
  // The socket's name without the leading NUL (for messages and tests).
  const std::string& name() const { return name_; }

  // The abstract socket name of `rank` for the id (without the leading NUL).
  static std::string socket_name(const void* id, size_t id_bytes, int rank);

 private:
  Status connection(int peer, int64_t deadline_ms, int* fd);
  Status accept_from(int peer, int64_t deadline_ms);
  Status dial(int peer, int64_t deadline_ms);

  int rank_ = -1;
  int nranks_ = 0;
  std::string name_;
  std::vector<uint8_t> id_;
  uint64_t token_ = 0;
  UniqueFd listener_;
  std::map<int, UniqueFd> peers_;  // established connections by peer rank
};

}  // namespace weft::cuda_ipc
