#include "transports/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/wire.h"

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

// One ucp context per process and kind (network peers, or peers of this node), shared by
// the communicators' workers: reading UCX's configuration and opening its components is
// most of what a context costs, and a split would pay it again for every communicator.
// Kept for the process's life once made (a one-node job closes its network worker right
// after setup, and its next communicator would make the context again); never cleaned up,
// as abandoned transports are not. A child forked from the process makes its own.
std::mutex context_mutex;
auto* const shared_context = new std::shared_ptr<ucp_context>[2];  // [kind]
pid_t shared_context_pid[2] = {0, 0};

Status make_context(bool node, std::shared_ptr<ucp_context>* out) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return ucx_error("config read", status);
  // UCX's registration cache hooks the process's mmap/munmap, and creating it
  // takes the lock of those hooks: in a child forked from a multi-threaded
  // parent ucp_init could hang on it. Weft registers nothing with UCX, so it
  // does without the cache. UCX_RCACHE_ENABLE set by the user still wins.
  if (getenv("UCX_RCACHE_ENABLE") == nullptr) (void)ucp_config_modify(config, "RCACHE_ENABLE", "n");
  // Peers of this node: sysv alone (and self), which moves messages from SysV memory,
  // outside /dev/shm: UCX's posix twin reserves about 4 MiB of FIFOs in /dev/shm per worker
  // (docs/shared-memory.md), which a container's 64 MB cannot give to dozens of
  // communicators. Not cma: UCX aborts the process when a CMA read meets a peer that has
  // exited (docs/reliability.md, "A peer that exits mid-rendezvous"). Network peers: not
  // posix, sysv or cma, which reach no other node; and a worker's network
  // interfaces (TCP's listening sockets and route lookups) are half its creation, which
  // node-only communicators skip. UCX_TLS set by the user still wins.
  if (getenv("UCX_TLS") == nullptr) {
    (void)ucp_config_modify(config, "TLS", node ? "self,sysv" : "^posix,sysv,cma");
    // sysv's receive buffers (8 KiB each) grow 64 at a time, not 512: UCX's default put 4.2
    // MB of SysV memory behind every worker, every page cleared as the worker was made, which
    // was most of the CPU a communicator's creation took at 8 ranks (docs/shared-memory.md).
    // Its FIFO takes 64; more come as messages are held. Named by the mm family's prefix
    // (UCX does not match SYSV_ here), and only where sysv is open: a context without an mm
    // transport warns of the name. Set by the user, either name still wins.
    if (node && getenv("UCX_MM_RX_BUFS_GROW") == nullptr &&
        getenv("UCX_SYSV_RX_BUFS_GROW") == nullptr)
      (void)ucp_config_modify(config, "MM_RX_BUFS_GROW", "64");
  }
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

Status process_context(bool node, std::shared_ptr<ucp_context>* out) {
  std::lock_guard<std::mutex> lock(context_mutex);
  if (shared_context_pid[node] == getpid() && shared_context[node]) {
    *out = shared_context[node];
    return Status::Ok();
  }
  // None yet, or the parent's (inherited by fork): unusable here, and not this process's to
  // clean up, so it is left as it is.
  if (shared_context[node]) (void)new std::shared_ptr<ucp_context>(std::move(shared_context[node]));
  WEFT_RETURN_IF_ERROR(make_context(node, out));
  shared_context[node] = *out;
  shared_context_pid[node] = getpid();
  return Status::Ok();
}

// The IPC namespace's inode (0: unknown): UCX's sysv reaches only peers that share it, which
// the same host name and boot id do not guarantee (containers with the host's name).
uint64_t ipc_namespace() {
  struct stat ns {};
  return stat("/proc/self/ns/ipc", &ns) == 0 ? uint64_t(ns.st_ino) : 0;
}

// A rank's transport address: its IPC namespace, then each worker's UCX address (empty for
// a worker it did not open).
struct Address {
  uint64_t ipc_namespace = 0;
  std::vector<uint8_t> workers[2];  // [kind]
};

std::vector<uint8_t> encode(const Address& address) {
  WireWriter writer;
  writer.put(address.ipc_namespace);
  for (const std::vector<uint8_t>& worker : address.workers) writer.put_blob(worker);
  return std::move(writer.data());
}

bool decode(const std::vector<uint8_t>& in, Address* address) {
  WireReader reader(in);
  return reader.get(&address->ipc_namespace) && reader.get_blob(&address->workers[0]) &&
         reader.get_blob(&address->workers[1]) && reader.left() == 0;
}

}  // namespace

Status Transport::open_worker(Kind kind) {
  WEFT_RETURN_IF_ERROR(process_context(kind == kNode, &contexts_[kind]));
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  // Serialized: the caller guarantees one thread at a time (the communicator's lock).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_params.events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  ucs_status_t status = ucp_worker_create(contexts_[kind].get(), &worker_params, &workers_[kind]);
  if (status != UCS_OK) return ucx_error("worker create", status);
  return Status::Ok();
}

void Transport::close_worker(Kind kind) {
  if (workers_[kind] != nullptr) ucp_worker_destroy(workers_[kind]);
  workers_[kind] = nullptr;
  contexts_[kind].reset();
}

// Points event_fd_ at the one kept worker's fd, or at an epoll set of both.
Status Transport::watch_workers() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
  epoll_fd_ = -1;
  event_fd_ = -1;
  int fds[2] = {-1, -1};
  for (Kind kind : {kNetwork, kNode}) {
    if (workers_[kind] == nullptr) continue;
    ucs_status_t status = ucp_worker_get_efd(workers_[kind], &fds[kind]);
    if (status != UCS_OK) return ucx_error("worker event fd", status);
  }
  if (fds[kNetwork] < 0 || fds[kNode] < 0) {
    event_fd_ = fds[kNetwork] >= 0 ? fds[kNetwork] : fds[kNode];
    return Status::Ok();
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Error(weftSystemError, "epoll_create1 failed: %s", strerror(errno));
  for (int fd : fds) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0)
      return Error(weftSystemError, "epoll_ctl failed: %s", strerror(errno));
  }
  event_fd_ = epoll_fd_;
  return Status::Ok();
}

Status Transport::create(bool one_node, std::unique_ptr<Transport>* out) {
  std::unique_ptr<Transport> transport(new Transport());
  Address address;
  address.ipc_namespace = ipc_namespace();
  for (Kind kind : {kNetwork, kNode}) {
    if (kind == kNetwork && one_node) continue;
    WEFT_RETURN_IF_ERROR(transport->open_worker(kind));
    ucp_address_t* worker_address = nullptr;
    size_t length = 0;
    ucs_status_t status =
        ucp_worker_get_address(transport->workers_[kind], &worker_address, &length);
    if (status != UCS_OK) return ucx_error("worker address", status);
    const auto* bytes = reinterpret_cast<const uint8_t*>(worker_address);
    address.workers[kind].assign(bytes, bytes + length);
    ucp_worker_release_address(transport->workers_[kind], worker_address);
  }
  transport->address_ = encode(address);
  WEFT_RETURN_IF_ERROR(transport->watch_workers());
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
  for (Kind kind : {kNetwork, kNode}) close_worker(kind);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status Transport::set_peers(int rank, const std::vector<std::vector<uint8_t>>& addresses,
                            const std::vector<bool>& same_host) {
  Address own;
  if (!decode(address_, &own)) return Error(weftInternalError, "own UCX address unreadable");
  const size_t nranks = addresses.size();
  std::vector<Address> peers(nranks);
  std::vector<Kind> route(nranks, kNetwork);
  bool needed[2] = {false, false};
  for (size_t peer = 0; peer < nranks; ++peer) {
    if (!decode(addresses[peer], &peers[peer]))
      return Error(weftRemoteError, "malformed UCX address from rank %zu", peer);
    if (same_host[peer] && own.ipc_namespace != 0 && peers[peer].ipc_namespace == own.ipc_namespace)
      route[peer] = kNode;
    if (int(peer) != rank) needed[route[peer]] = true;
  }
  // This rank itself: whichever worker is kept (the node's, when neither is needed).
  Kind kept_alone = needed[kNode] || !needed[kNetwork] ? kNode : kNetwork;
  if (workers_[kept_alone] == nullptr) kept_alone = kept_alone == kNode ? kNetwork : kNode;
  peer_addresses_.assign(nranks, {});
  peer_workers_.assign(nranks, nullptr);
  endpoints_.assign(nranks, nullptr);
  node_peers_.assign(nranks, false);
  for (size_t peer = 0; peer < nranks; ++peer) {
    const Kind kind = int(peer) == rank ? kept_alone : route[peer];
    if (peers[peer].workers[kind].empty() || workers_[kind] == nullptr)
      return Error(weftInvalidUsage,
                   "rank %zu and this rank disagree on whether they share a node (%s worker "
                   "missing): were their communicators created the same way?",
                   peer, kind == kNode ? "shared-memory" : "network");
    peer_addresses_[peer] = std::move(peers[peer].workers[kind]);
    peer_workers_[peer] = workers_[kind];
    node_peers_[peer] = route[peer] == kNode;
  }
  // A worker no peer uses is closed, so that progress and waits touch only the others.
  needed[kept_alone] = true;
  for (Kind kind : {kNetwork, kNode})
    if (!needed[kind]) close_worker(kind);
  return watch_workers();
}

Status Transport::endpoint(int peer, ucp_ep_h* out) {
  if (endpoints_[peer] == nullptr) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(peer_addresses_[peer].data());
    // Peer failures are detected by the bootstrap's control plane, which lets
    // UCX keep its fastest shared-memory paths.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t status = ucp_ep_create(peer_workers_[peer], &params, &endpoints_[peer]);
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
  request->worker = peer_workers_[peer];
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

Status Transport::post_recv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) {
  request->done.store(false, std::memory_order_relaxed);
  request->handle = nullptr;
  request->expected_bytes = bytes;
  request->info = {};
  request->worker = peer_workers_[peer];
  // UCX before 1.16 leaves recv_info unwritten when a receive completes at once (an
  // unexpected message already there: openucx/ucx#9425), so a shorter message than the
  // receive expects went unnoticed. Without immediate completion the callback always runs
  // with the message's length.
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = on_recv_done;
  param.user_data = request;
  return track(ucp_tag_recv_nbx(request->worker, data, bytes, tag, ~ucp_tag_t(0), &param), request,
               "tag receive");
}

std::optional<size_t> Transport::probe(int peer, uint64_t tag) {
  ucp_tag_recv_info_t info{};
  if (ucp_tag_probe_nb(peer_workers_[peer], tag, ~ucp_tag_t(0), 0, &info) == nullptr)
    return std::nullopt;
  return info.length;
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
  bool progressed = false;
  for (ucp_worker_h worker : workers_)
    if (worker != nullptr && ucp_worker_progress(worker) != 0) progressed = true;
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
  for (ucp_worker_h worker : workers_)
    if (worker != nullptr && ucp_worker_arm(worker) != UCS_OK) return false;
  return true;
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
  if (request->handle != nullptr) ucp_request_cancel(request->worker, request->handle);
}

void Transport::close_endpoints(bool force, int64_t timeout_ms) {
  std::vector<std::pair<ucp_worker_h, void*>> closing;
  for (size_t peer = 0; peer < endpoints_.size(); ++peer) {
    ucp_ep_h& ep = endpoints_[peer];
    if (ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request))
      closing.emplace_back(peer_workers_[peer], request);
    ep = nullptr;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (auto [worker, request] : closing) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker, request);
    ucp_request_free(request);
  }
}

}  // namespace weft::ucx
