#include "transports/ucx/ucx_transport.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/log.h"

namespace weft::ucx {

namespace {

Status ucx_error(const char* what, ucs_status_t status) {
  return Error(weftSystemError, "UCX %s failed: %s", what, ucs_status_string(status));
}

void complete(void* handle, ucs_status_t status, Request* request) {
  request->status = status;
  request->handle = nullptr;
  ucp_request_free(handle);
  request->done.store(true, std::memory_order_release);
}

void on_send_done(void* handle, ucs_status_t status, void* user_data) {
  complete(handle, status, static_cast<Request*>(user_data));
}

void on_recv_done(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  auto* request = static_cast<Request*>(user_data);
  if (info != nullptr) request->info = *info;
  complete(handle, status, request);
}

// Records the outcome of a post: completed at once, failed, or in flight.
Status track(ucs_status_ptr_t posted, Request* request, const char* what) {
  if (posted == nullptr) {
    request->status = UCS_OK;
    request->done.store(true, std::memory_order_release);
    return Status::Ok();
  }
  if (UCS_PTR_IS_ERR(posted)) {
    request->status = UCS_PTR_STATUS(posted);
    request->done.store(true, std::memory_order_release);
    return ucx_error(what, request->status);
  }
  // The callback may already have run inside the post (then handle was reset).
  if (!request->done.load(std::memory_order_acquire)) request->handle = posted;
  return Status::Ok();
}

}  // namespace

namespace {

// One ucp context per process and kind (any peers, or peers of this node only), shared
// by the communicators' workers: reading UCX's configuration and opening its components
// is most of what a context costs, and a split would pay it again for every
// communicator. Kept while some transport holds it; a child forked from the process
// makes its own.
std::mutex context_mutex;
std::weak_ptr<ucp_context> shared_context[2];  // [one_node]
pid_t shared_context_pid[2] = {0, 0};

Status make_context(bool one_node, std::shared_ptr<ucp_context>* out) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return ucx_error("config read", status);
  // UCX's registration cache hooks the process's mmap/munmap, and creating it
  // takes the lock of those hooks: in a child forked from a multi-threaded
  // parent ucp_init could hang on it. Weft registers nothing with UCX, so it
  // does without the cache. UCX_RCACHE_ENABLE set by the user still wins.
  if (getenv("UCX_RCACHE_ENABLE") == nullptr) (void)ucp_config_modify(config, "RCACHE_ENABLE", "n");
  // UCX's posix transport reserves receive FIFOs in /dev/shm for every worker
  // (about 4 MiB each, measured: docs/shared-memory.md), which a container's
  // 64 MB /dev/shm cannot give to dozens of communicators; its sysv twin moves
  // messages the same way from SysV memory, outside /dev/shm. UCX_TLS set by
  // the user still wins.
  // Peers of this node only: shared memory alone (sysv for messages, cma for
  // large ones, self for a rank's own), since a worker's network interfaces
  // (TCP's listening sockets and route lookups, verbs devices) cost half its creation.
  if (getenv("UCX_TLS") == nullptr)
    (void)ucp_config_modify(config, "TLS", one_node ? "self,sysv,cma" : "^posix");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  // Workers of different communicators run on different threads at once.
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) return ucx_error("init", status);
  *out = std::shared_ptr<ucp_context>(context, [](ucp_context_h c) { ucp_cleanup(c); });
  return Status::Ok();
}

Status process_context(bool one_node, std::shared_ptr<ucp_context>* out) {
  std::lock_guard<std::mutex> lock(context_mutex);
  if (shared_context_pid[one_node] == getpid()) *out = shared_context[one_node].lock();
  if (*out) return Status::Ok();
  // None alive, or the parent's (inherited by fork, unusable here): a new one.
  WEFT_RETURN_IF_ERROR(make_context(one_node, out));
  shared_context[one_node] = *out;
  shared_context_pid[one_node] = getpid();
  return Status::Ok();
}

}  // namespace

Status Transport::create(bool one_node, std::unique_ptr<Transport>* out) {
  std::unique_ptr<Transport> transport(new Transport());
  WEFT_RETURN_IF_ERROR(process_context(one_node, &transport->context_));
  ucs_status_t status = UCS_OK;

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  // Serialized: the caller guarantees one thread at a time (the communicator's lock).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_params.events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  status = ucp_worker_create(transport->context_.get(), &worker_params, &transport->worker_);
  if (status != UCS_OK) return ucx_error("worker create", status);
  status = ucp_worker_get_efd(transport->worker_, &transport->event_fd_);
  if (status != UCS_OK) return ucx_error("worker event fd", status);

  ucp_address_t* address = nullptr;
  size_t length = 0;
  status = ucp_worker_get_address(transport->worker_, &address, &length);
  if (status != UCS_OK) return ucx_error("worker address", status);
  const auto* bytes = reinterpret_cast<const uint8_t*>(address);
  transport->address_.assign(bytes, bytes + length);
  ucp_worker_release_address(transport->worker_, address);
  *out = std::move(transport);
  return Status::Ok();
}

// How long a clean close waits for its endpoints' flush.
constexpr int64_t kCloseFlushMs = 2000;

Transport::~Transport() {
  // Flushed, not forced: what a peer still needs from this rank (the
  // acknowledgement that completes its rendezvous send) leaves before the
  // worker goes. Bounded, for a peer that stopped listening.
  close_endpoints(false, kCloseFlushMs);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

void Transport::set_peers(std::vector<std::vector<uint8_t>> addresses) {
  peer_addresses_ = std::move(addresses);
  endpoints_.assign(peer_addresses_.size(), nullptr);
}

Status Transport::endpoint(int peer, ucp_ep_h* out) {
  if (endpoints_[peer] == nullptr) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(peer_addresses_[peer].data());
    // Peer failures are detected by the bootstrap's control plane, which lets
    // UCX keep its fastest shared-memory paths.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t status = ucp_ep_create(worker_, &params, &endpoints_[peer]);
    if (status != UCS_OK) return ucx_error("endpoint create", status);
    WEFT_LOG(TRACE, TRANSPORT, "UCX endpoint to rank %d created", peer);
  }
  *out = endpoints_[peer];
  return Status::Ok();
}

Status Transport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                            Request* request) {
  request->done.store(false, std::memory_order_relaxed);
  request->handle = nullptr;
  request->expected_bytes = bytes;
  ucp_ep_h ep = nullptr;
  WEFT_RETURN_IF_ERROR(endpoint(peer, &ep));
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = on_send_done;
  param.user_data = request;
  Status posted = track(ucp_tag_send_nbx(ep, data, bytes, tag, &param), request, "tag send");
  if (posted.ok()) return posted;
  return Error(posted.code(), "%s (sending %zu bytes to rank %d)", posted.message().c_str(), bytes,
               peer);
}

Status Transport::post_recv(uint64_t tag, void* data, size_t bytes, Request* request) {
  request->done.store(false, std::memory_order_relaxed);
  request->handle = nullptr;
  request->expected_bytes = bytes;
  request->info = {};
  // UCX before 1.16 leaves recv_info unwritten when a receive completes at once (an
  // unexpected message already there: openucx/ucx#9425), so a shorter message than the
  // receive expects went unnoticed. Without immediate completion the callback always runs
  // with the message's length.
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = on_recv_done;
  param.user_data = request;
  return track(ucp_tag_recv_nbx(worker_, data, bytes, tag, ~ucp_tag_t(0), &param), request,
               "tag receive");
}

Status Transport::result(const Request& request, int peer) const {
  if (request.status == UCS_ERR_MESSAGE_TRUNCATED)
    return Error(weftInvalidUsage,
                 "rank %d sent more bytes than the matching receive of %zu bytes expects "
                 "(mismatched counts or datatypes)",
                 peer, request.expected_bytes);
  if (request.status == UCS_ERR_CANCELED)
    return Error(weftRemoteError, "operation with rank %d was cancelled", peer);
  if (request.status != UCS_OK)
    return Error(weftRemoteError, "transfer with rank %d failed: %s", peer,
                 ucs_status_string(request.status));
  return Status::Ok();
}

bool Transport::progress() {
  bool progressed = ucp_worker_progress(worker_) != 0;
  // Recycle abandoned requests UCX has now finished with.
  if (progressed && abandoned_ > 0) {
    for (const std::unique_ptr<Request>& request : all_requests_)
      if (request->abandoned && request->done.load(std::memory_order_acquire)) {
        request->abandoned = false;
        --abandoned_;
        release(request.get());
      }
  }
  return progressed;
}

bool Transport::arm() {
  return ucp_worker_arm(worker_) == UCS_OK;
}

Request* Transport::acquire() {
  if (free_requests_.empty()) {
    all_requests_.push_back(std::make_unique<Request>());
    free_requests_.push_back(all_requests_.back().get());
  }
  Request* request = free_requests_.back();
  free_requests_.pop_back();
  request->abandoned = false;
  return request;
}

void Transport::release(Request* request) {
  free_requests_.push_back(request);
}

void Transport::abandon(Request* request) {
  if (request->done.load(std::memory_order_acquire)) {
    release(request);
    return;
  }
  request->abandoned = true;
  ++abandoned_;
  if (request->handle != nullptr) ucp_request_cancel(worker_, request->handle);
}

void Transport::close_endpoints(bool force, int64_t timeout_ms) {
  std::vector<void*> closing;
  for (ucp_ep_h& ep : endpoints_) {
    if (ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
    ep = nullptr;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (void* request : closing) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker_, request);
    ucp_request_free(request);
  }
}

}  // namespace weft::ucx
