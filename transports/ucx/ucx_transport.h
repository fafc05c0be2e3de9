// UCX host transport: a worker per communicator (one ucp context per process), tagged
// send/receive to any peer (shared memory, CMA or TCP as UCX chooses), and a
// worker event fd so waits can sleep instead of spinning. It moves bytes and
// knows nothing of collectives: tags are the caller's.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
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
  ucp_tag_recv_info_t info{};  // receives: what arrived
  void* handle = nullptr;      // UCX's request while in flight
};

class Transport {
 public:
  // `one_node`: every peer shares this node, so the worker opens shared-memory
  // transports only (unless UCX_TLS says otherwise).
  static Status create(bool one_node, std::unique_ptr<Transport>* out);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // This worker's address, for the bootstrap's peer table.
  const std::vector<uint8_t>& address() const { return address_; }
  // Peers' worker addresses, indexed by rank; endpoints are created on first use.
  void set_peers(std::vector<std::vector<uint8_t>> addresses);

  Status post_send(int peer, uint64_t tag, const void* data, size_t bytes, Request* request);
  Status post_recv(uint64_t tag, void* data, size_t bytes, Request* request);
  // A completed request's outcome: ok, or an error naming what went wrong.
  Status result(const Request& request, int peer) const;

  // Advances communication; returns whether anything happened.
  bool progress();
  // Prepares to sleep on event_fd(): false when events are already pending
  // (progress again instead of sleeping).
  bool arm();
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
  Transport() = default;
  Status endpoint(int peer, ucp_ep_h* out);

  std::shared_ptr<ucp_context> context_;  // shared by the process's transports
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<uint8_t> address_;
  std::vector<std::vector<uint8_t>> peer_addresses_;
  std::vector<ucp_ep_h> endpoints_;
  std::vector<Request*> free_requests_;
  size_t abandoned_ = 0;  // abandoned requests UCX has not finished with
  std::vector<std::unique_ptr<Request>> all_requests_;
};

}  // namespace weft::ucx
