// UCX host transport: tagged send/receive to any peer, and an event fd so waits can sleep
// instead of spinning. Peers on this node (same host, same IPC namespace) are reached by a
// worker with shared-memory transports only, the others by a worker with network ones; each
// communicator keeps the workers its peers need (one ucp context per process and kind). UCX's
// CMA transport is never used: it aborts the process when the peer it reads from has exited
// (a rank that failed and left mid-rendezvous). It moves bytes and knows nothing of
// collectives: tags are the caller's.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"

namespace weft::ucx {

// One posted operation, owned by the transport (acquire/release/abandon) so
// that UCX never completes into freed memory, even after the caller gave up.
struct Request {
  std::atomic<bool> done{false};
  bool abandoned = false;
  ucs_status_t status = UCS_OK;
  size_t expected_bytes = 0;
  ucp_tag_recv_info_t info{};     // receives: what arrived
  void* handle = nullptr;         // UCX's request while in flight
  ucp_worker_h worker = nullptr;  // the worker it was posted on
};

class Transport {
 public:
  // `one_node`: every peer shares this node, so only the shared-memory worker is opened.
  // Otherwise both are, until set_peers knows which ones the peers need.
  static Status create(bool one_node, std::unique_ptr<Transport>* out);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // This rank's workers' addresses and IPC namespace, for the bootstrap's peer table.
  const std::vector<uint8_t>& address() const { return address_; }
  // Peers' addresses, indexed by rank (`rank`: this one's); `same_host[p]`: rank p runs on this
  // rank's host (by the communicator's host identity). A peer on this host and IPC namespace is
  // reached by the shared-memory worker, any other by the network worker; every rank decides alike,
  // so a receive waits on the worker its sender sends from. A worker no peer needs is closed.
  // Endpoints are created on first use.
  Status set_peers(int rank, const std::vector<std::vector<uint8_t>>& addresses,
                   const std::vector<bool>& same_host);

  // After set_peers: whether `peer` is reached through the shared-memory worker (same host
  // and IPC namespace; this rank itself too).
  bool on_node(int peer) const { return node_peers_[peer]; }

  Status post_send(int peer, uint64_t tag, const void* data, size_t bytes, Request* request);
  Status post_recv(int peer, uint64_t tag, void* data, size_t bytes, Request* request);
  // The length of a message from `peer` tagged `tag` that arrived with no receive posted for
  // it yet (left there), if there is one.
  std::optional<size_t> probe(int peer, uint64_t tag);
  // A completed request's outcome: ok, or an error naming what went wrong.
  Status result(const Request& request, int peer) const;

  // Advances communication; returns whether anything happened.
  bool progress();
  // Prepares to sleep on event_fd(): false when events are already pending
  // (progress again instead of sleeping).
  bool arm();
  // Readable when a worker has events: the worker's own fd, or an epoll set of both.
  int event_fd() const { return event_fd_; }

  // Requests come from a free list: no allocation on the hot path.
  Request* acquire();
  // Returns a completed request to the free list.
  void release(Request* request);
  // Gives up on a request: cancels it if in flight; it is recycled once UCX
  // completes it, or freed with the transport.
  void abandon(Request* request);
  // Closes endpoints: flushed (bounded by timeout_ms) or forced.
  void close_endpoints(bool force, int64_t timeout_ms);
  // Whether UCX still holds requests this side gave up on (their completion may never come:
  // a rendezvous send to a peer that left).
  bool holds_abandoned() const { return abandoned_ > 0; }

 private:
  enum Kind { kNetwork = 0, kNode = 1 };
  Transport() = default;
  Status open_worker(Kind kind);
  void close_worker(Kind kind);
  Status watch_workers();
  Status endpoint(int peer, ucp_ep_h* out);

  std::shared_ptr<ucp_context> contexts_[2];  // [kind], shared by the process's transports
  ucp_worker_h workers_[2] = {nullptr, nullptr};
  int event_fd_ = -1;
  int epoll_fd_ = -1;  // owned: watches both workers' fds when both are kept
  std::vector<uint8_t> address_;
  std::vector<std::vector<uint8_t>> peer_addresses_;  // on the worker that reaches the peer
  std::vector<ucp_worker_h> peer_workers_;
  std::vector<bool> node_peers_;  // on_node()
  std::vector<ucp_ep_h> endpoints_;
  std::vector<Request*> free_requests_;
  size_t abandoned_ = 0;  // abandoned requests UCX has not finished with
  std::vector<std::unique_ptr<Request>> all_requests_;
};

}  // namespace weft::ucx
