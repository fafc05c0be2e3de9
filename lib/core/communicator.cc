#include "core/communicator.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/env.h"
#include "common/log.h"
#include "common/wire.h"
#include "core/cuda/device_comm.h"

namespace weft {

namespace {

uint64_t fnv1a(const std::string& text, uint64_t hash = 1469598103934665603ull) {
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::string hostname() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Hostname plus boot id: distinct containers on one kernel share a boot id
// but not a hostname; a reused hostname on another machine has another boot id.
uint64_t host_hash() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return fnv1a(hostname() + "/" + boot_id);
}

Blob encode_peer(const PeerInfo& peer) {
  WireWriter writer;
  writer.put(peer.host_hash);
  writer.put(peer.package);
  writer.put(peer.numa);
  writer.put(peer.pid);
  writer.put(peer.host_speed);
  writer.put_string(peer.host);
  writer.put_blob(peer.transport_address);
  return std::move(writer.data());
}

bool decode_peer(const Blob& blob, PeerInfo* peer) {
  WireReader reader(blob);
  return reader.get(&peer->host_hash) && reader.get(&peer->package) && reader.get(&peer->numa) &&
         reader.get(&peer->pid) && reader.get(&peer->host_speed) &&
         reader.get_string(&peer->host) && reader.get_blob(&peer->transport_address) &&
         valid_host_speed(peer->host_speed);
}

// A new communicator's rendezvous, hosted by this rank: its unique id's bytes.
Status start_child_root(int64_t timeout_ms, Blob* id_blob) {
  RootAddress root;
  WEFT_RETURN_IF_ERROR(choose_interface_address(&root.address, nullptr));
  WEFT_RETURN_IF_ERROR(random_bytes(root.secret.data(), root.secret.size()));
  WEFT_RETURN_IF_ERROR(start_root(&root, timeout_ms));
  weftUniqueId id;
  WEFT_RETURN_IF_ERROR(encode_unique_id(root, &id));
  id_blob->assign(id.internal, id.internal + sizeof(id.internal));
  return Status::Ok();
}

bool root_from_blob(const Blob& id_blob, RootAddress* root) {
  weftUniqueId id;
  if (id_blob.size() != sizeof(id.internal)) return false;
  memcpy(id.internal, id_blob.data(), sizeof(id.internal));
  return decode_unique_id(id, root).ok();
}

}  // namespace

namespace {
// Every live communicator of the process. A rank that finished an operation
// may still owe a peer transport work for it (UCX's rendezvous completion
// goes back through the receiver's worker), so idle waits progress every
// communicator, not only their own: a peer still inside an operation on
// another communicator is never left waiting for this rank.
std::mutex live_mutex;
std::vector<Communicator*>& live_communicators() {
  static std::vector<Communicator*> live;
  return live;
}

void progress_all_communicators() {
  std::lock_guard<std::mutex> lock(live_mutex);
  for (Communicator* comm : live_communicators()) comm->progress();
}

// The first communicator warns about bad variables and, with WEFT_DEBUG=INFO,
// lists every variable Weft reads.
void log_environment_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    check_environment();
    for (const EnvVar& var : env_table()) {
      std::optional<std::string> value = env_string(var.name);
      WEFT_LOG(INFO, ENV, "%s=%s%s", var.name, value ? value->c_str() : var.default_value,
               value ? "" : " (default)");
    }
  });
}
}  // namespace

Status Communicator::create(const RootAddress& root, int nranks, int rank, const CommConfig& config,
                            std::unique_ptr<Communicator>* out) {
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->rank_ = rank;
  comm->nranks_ = nranks;
  comm->config_ = config;
  if (comm->config_.timeout_ms <= 0) comm->config_.timeout_ms = default_timeout_ms();
  if (!config.algorithms.empty()) {
    WEFT_RETURN_IF_ERROR(
        parse_algorithm_overrides(config.algorithms, "config->algorithms", &comm->overrides_));
  } else if (std::optional<std::string> spec = env_string("WEFT_ALGO")) {
    WEFT_RETURN_IF_ERROR(parse_algorithm_overrides(*spec, "WEFT_ALGO", &comm->overrides_));
  }
  comm->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (comm->wake_fd_ < 0) return Error(weftSystemError, "eventfd failed: %s", strerror(errno));
  set_log_rank(rank);
  log_environment_once();

  // Setup phases, timed for the INIT log (bench/perf/comm_setup.sh sums them).
  Clock::time_point phase_start = Clock::now();
  auto phase_ms = [&phase_start] {
    Clock::time_point now = Clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - phase_start).count();
    phase_start = now;
    return ms;
  };
  WEFT_RETURN_IF_ERROR(ucx::Transport::create(comm->config_.one_node, &comm->transport_));
  const double transport_ms = phase_ms();
  PeerInfo self;
  self.host_hash = host_hash();
  self.host = hostname();
  self.pid = getpid();
  // A bad WEFT_TUNER_FILE fails init after the join, so that the other ranks hear of it.
  Calibration machine;
  const Status calibration = load_calibration(&machine);
  self.host_speed = local_host_speed(calibration.ok() ? machine : Calibration());
  topo::RankPlace place = this_process_place(self.host_hash);
  self.package = place.package;
  self.numa = place.numa;
  self.transport_address = comm->transport_->address();

  // Before the control thread starts: a departure notice reads them.
  comm->p2p_send_sequence_ = std::make_unique<std::atomic<uint32_t>[]>(nranks);
  comm->p2p_recv_sequence_ = std::make_unique<std::atomic<uint32_t>[]>(nranks);
  Communicator* raw = comm.get();
  std::vector<Blob> table;
  WEFT_RETURN_IF_ERROR(Bootstrap::join(
      root, rank, nranks, encode_peer(self), comm->config_.timeout_ms,
      [raw](weftResult_t code, const std::string& message) { raw->fail_from_peer(code, message); },
      [raw](int peer, const std::string& label, const Blob& goodbye) {
        raw->peer_left(peer, label, goodbye);
      },
      &comm->bootstrap_, &table));
  const double bootstrap_ms = phase_ms();

  comm->peers_.resize(nranks);
  std::vector<Blob> addresses(nranks);
  for (int peer = 0; peer < nranks; ++peer) {
    if (!decode_peer(table[peer], &comm->peers_[peer]))
      return Error(weftRemoteError, "malformed peer info for rank %d", peer);
    addresses[peer] = comm->peers_[peer].transport_address;
  }
  std::vector<bool> same_host(nranks);
  for (int peer = 0; peer < nranks; ++peer)
    same_host[peer] = comm->peers_[peer].host_hash == self.host_hash;
  WEFT_RETURN_IF_ERROR(comm->transport_->set_peers(rank, addresses, same_host));
  std::vector<topo::RankPlace> places(nranks);
  for (int peer = 0; peer < nranks; ++peer) {
    const PeerInfo& info = comm->peers_[peer];
    places[peer] = topo::RankPlace{info.host_hash, info.package, info.numa, -1};
  }
  WEFT_RETURN_IF_ERROR(comm_topology(std::move(places), &comm->topology_));
  long local_ranks =
      std::count_if(comm->peers_.begin(), comm->peers_.end(),
                    [&](const PeerInfo& p) { return p.host_hash == self.host_hash; });
  comm->oversubscribed_ = local_ranks > sysconf(_SC_NPROCESSORS_ONLN);
  Bootstrap* bootstrap = comm->bootstrap_.get();
  Deadline deadline = deadline_after_ms(comm->config_.timeout_ms);
  WEFT_RETURN_IF_ERROR(comm->direct_->init(
      rank, nranks, local_ranks == nranks, comm->oversubscribed_,
      [&](const Blob& mine, std::vector<Blob>* all) {
        return bootstrap->allgather(mine, all, deadline);
      },
      &comm->registry_));
  const double shm_ms = phase_ms();
  if (comm->config_.cuda_device >= 0)
    WEFT_RETURN_IF_ERROR(cuda::DeviceComm::create(
        comm.get(), comm->config_.cuda_device,
        [&](const Blob& mine, std::vector<Blob>* all) {
          return bootstrap->allgather(mine, all, deadline_after_ms(comm->config_.timeout_ms));
        },
        &comm->device_));
  comm->reports_calls_ =
      nranks > 1 && !comm->direct_->shared() && comm->direct_->check() != CheckMode::Off;
  WEFT_RETURN_IF_ERROR(calibration);
  std::vector<double> speeds;
  for (const PeerInfo& peer : comm->peers_) speeds.push_back(peer.host_speed);
  // A cluster file describes the machine it plans for, as weft-plan times it: its figures
  // are taken as given.
  const double speed = comm->topology_.injected ? 1 : agreed_host_speed(std::move(speeds));
  machine.scale_to_speed(speed);
  TuneContext context =
      tune_context(comm->topology_, comm->has_shared_memory(), comm->overrides_, machine);
  context.single_copy_bytes = comm->direct_->cma_floors();
  context.lane_bytes = comm->direct_->lane_bytes();
  context.lane_window = static_cast<double>(comm->direct_->lane_window());
  comm->tuner_ = std::make_unique<Tuner>(std::move(context));
  WEFT_LOG(INFO, INIT,
           "communicator%s%s: rank %d of %d ready (timeout %lld ms); setup phases: transport "
           "%.3f ms, bootstrap %.3f ms, shared memory %.3f ms; cost model at %.2f of its figures' "
           "host speed",
           comm->config_.name.empty() ? "" : " ", comm->config_.name.c_str(), rank, nranks,
           static_cast<long long>(comm->config_.timeout_ms), transport_ms, bootstrap_ms, shm_ms,
           speed);
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    live_communicators().push_back(comm.get());
  }
  *out = std::move(comm);
  return Status::Ok();
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    std::erase(live_communicators(), this);
  }
  // The GPU side first (its watchdog reports through this communicator), then the bootstrap:
  // its control thread may still report failures.
  device_.reset();
  bootstrap_.reset();
  const weftResult_t failure = failed_code_.load(std::memory_order_acquire);
  // Also kept: a transport whose worker UCX still holds requests in (sends settled because
  // their receiver left: their acknowledgements will never come), which destroying it would
  // report as leaked.
  if ((failure != weftSuccess && failure != weftInvalidUsage && failure != weftInvalidArgument) ||
      (transport_ && transport_->holds_abandoned())) {
    // A timeout or a peer's failure may come with an unreachable peer, and
    // tearing down UCX endpoints to one can block in the kernel for minutes
    // (a TCP send into a full buffer), while destroy and abort must return
    // promptly: the transport is abandoned, kept reachable here and never
    // destroyed (not even at exit). Caller mistakes leave every peer reachable.
    static std::mutex abandoned_mutex;
    static auto* abandoned = new std::vector<std::unique_ptr<ucx::Transport>>;
    std::lock_guard<std::mutex> lock(abandoned_mutex);
    abandoned->push_back(std::move(transport_));
  }
  transport_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status Communicator::unusable() const {
  weftResult_t code = failed_code_.load(std::memory_order_acquire);
  if (code == weftSuccess) {
    if (finalized_)
      return Error(weftInvalidUsage, "comm was finalized; only weftCommDestroy may follow");
    return Status::Ok();
  }
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return Status(code, "communicator failed earlier: " + failed_message_);
}

namespace {
// The ranks a timeout message says it waited for: every "rank N", and every N of a list
// "ranks N, M", after "waiting for" (the waits' descriptions are where the executor and the
// direct path name them).
std::vector<int32_t> ranks_waited_for(const std::string& message) {
  std::vector<int32_t> ranks;
  size_t at = message.find("waiting for ");
  while (at != std::string::npos && (at = message.find("rank", at)) != std::string::npos) {
    at += 4;
    if (message.compare(at, 2, "s ") == 0) ++at;
    if (message.compare(at, 1, " ") != 0) continue;
    const char* next = message.c_str() + at + 1;
    for (;;) {
      char* end = nullptr;
      const long rank = strtol(next, &end, 10);
      if (end == next) break;
      if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end())
        ranks.push_back(static_cast<int32_t>(rank));
      if (end[0] != ',' || end[1] != ' ') break;
      next = end + 2;
    }
  }
  return ranks;
}
}  // namespace

void Communicator::fail(weftResult_t code, const std::string& message) {
  if (code == weftTimeout && bootstrap_ && async_error() == weftSuccess &&
      bootstrap_->report_failure(message, ranks_waited_for(message))) {
    std::unique_lock<std::mutex> lock(failure_mutex_);
    if (!failed_.wait_for(lock, std::chrono::milliseconds(Bootstrap::kVerdictGraceMs),
                          [&] { return failed_code_.load() != weftSuccess; })) {
      // The peer this rank waits for may itself wait for a stalled rank, which only the root
      // could have said: its silence is part of the answer.
      lock.unlock();
      record_failure(code, message + "; no verdict from the bootstrap root, hosted by " +
                               bootstrap_->root_host() + ", within " +
                               std::to_string(Bootstrap::kVerdictGraceMs) +
                               " ms: that process is stalled too");
      return;
    }
    // The verdict was this rank's own report: it stays a timeout.
    if (failed_message_ == message) failed_code_.store(weftTimeout, std::memory_order_release);
    return;
  }
  if ((code == weftSystemError || code == weftRemoteError) && bootstrap_ &&
      async_error() == weftSuccess) {
    // A peer's death shows first as a broken transfer (UCX: "Shared memory error", "Connection
    // reset") on the ranks that talk to it; the bootstrap's verdict, which names the dead rank,
    // follows within moments and is the better answer.
    std::unique_lock<std::mutex> lock(failure_mutex_);
    if (failed_.wait_for(lock, std::chrono::milliseconds(Bootstrap::kVerdictGraceMs),
                         [&] { return failed_code_.load() != weftSuccess; }))
      return;
  }
  record_failure(code, message);
}

weftResult_t Communicator::settled_async_error() {
  if (async_error() == weftSuccess && bootstrap_)
    bootstrap_->settle_notices(deadline_after_ms(Bootstrap::kVerdictGraceMs));
  return async_error();
}

Status Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return Status(failed_code_.load(std::memory_order_acquire), failed_message_);
}

void Communicator::fail_from_peer(weftResult_t code, const std::string& message) {
  record_failure(code, message);
}

bool Communicator::record_failure(weftResult_t code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failed_code_.load() != weftSuccess) return false;
    failed_message_ = message;
    failed_code_.store(code, std::memory_order_release);
  }
  failed_.notify_all();
  WEFT_LOG(WARN, INIT, "rank %d: communicator failed: %s", rank_, message.c_str());
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  direct_->interrupt();
  return true;
}

Status Communicator::post_send(int peer, TagKind kind, uint64_t sequence, uint64_t salt,
                               const void* data, size_t bytes, PendingOp* op) {
  op->comm = this;
  op->peer = peer;
  op->is_send = true;
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  op->request = transport_->acquire();
  return transport_->post_send(peer, make_tag(rank_, kind, sequence, salt), data, bytes,
                               op->request);
}

Status Communicator::post_recv(int peer, TagKind kind, uint64_t sequence, uint64_t salt, void* data,
                               size_t bytes, PendingOp* op) {
  op->comm = this;
  op->peer = peer;
  op->is_send = false;
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  op->request = transport_->acquire();
  return transport_->post_recv(peer, make_tag(peer, kind, sequence, salt), data, bytes,
                               op->request);
}

void Communicator::record_call(uint64_t sequence, const CallShape& shape,
                               const uint64_t* alltoallv_counts) {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  RecordedCall& call = recent_calls_[sequence % recent_calls_.size()];
  call.sequence = sequence;
  call.shape = shape;
  const size_t n = static_cast<size_t>(nranks_);
  if (alltoallv_counts != nullptr && n <= kMaxCountedRanks)
    call.counts.assign(alltoallv_counts, alltoallv_counts + 2 * n);  // keeps its capacity
  else
    call.counts.clear();
}

void Communicator::note_progress() {
  // Called at every step that moves: a load, and a store only after a wait was noted.
  if (waiting_sequence_.load(std::memory_order_relaxed) != UINT64_MAX)
    waiting_sequence_.store(UINT64_MAX, std::memory_order_relaxed);
}

void Communicator::note_waiting(uint64_t sequence) {
  std::vector<CallRecord> calls;
  {
    std::lock_guard<std::mutex> lock(calls_mutex_);
    const Clock::time_point now = Clock::now();
    if (sequence != waiting_sequence_.load(std::memory_order_relaxed)) {
      waiting_sequence_.store(sequence, std::memory_order_relaxed), waiting_since_ = now;
      return;
    }
    if (reported_sequence_ == sequence ||
        now - waiting_since_ < std::chrono::milliseconds(kCallReportMs))
      return;
    reported_sequence_ = sequence;
    for (const RecordedCall& call : recent_calls_)
      if (call.sequence != UINT64_MAX)
        calls.push_back(
            {call.sequence, call_fingerprint(call.shape), describe_call(call.shape), call.counts});
  }
  WEFT_LOG(INFO, COLL, "rank %d: collective %llu waits for %lld ms: its calls go to the root",
           rank_, static_cast<unsigned long long>(sequence), static_cast<long long>(kCallReportMs));
  (void)bootstrap_->report_calls(calls);
}

Status Communicator::split(int color, int key, const CommConfig& config,
                           std::unique_ptr<Communicator>* out) {
  WEFT_RETURN_IF_ERROR(usable());
  const Clock::time_point split_start = Clock::now();
  Deadline deadline = deadline_after_ms(config_.timeout_ms);
  WireWriter mine;
  mine.put<int32_t>(color);
  mine.put<int32_t>(key);
  std::vector<Blob> all;
  WEFT_RETURN_IF_ERROR(bootstrap_->allgather(mine.data(), &all, deadline));
  struct Member {
    int key, rank;
  };
  std::vector<Member> members;
  for (int peer = 0; peer < nranks_; ++peer) {
    WireReader reader(all[peer]);
    int32_t peer_color = 0, peer_key = 0;
    if (!reader.get(&peer_color) || !reader.get(&peer_key))
      return Error(weftRemoteError, "malformed split request from rank %d", peer);
    if (peer_color == color && color != WEFT_SPLIT_NOCOLOR) members.push_back({peer_key, peer});
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  bool leader = !members.empty() && members.front().rank == rank_;

  // The leader of each color hosts the new communicator's root.
  Blob id_blob;
  CommConfig child = config;
  if (child.timeout_ms <= 0) child.timeout_ms = config_.timeout_ms;
  if (leader) WEFT_RETURN_IF_ERROR(start_child_root(child.timeout_ms, &id_blob));
  WEFT_RETURN_IF_ERROR(bootstrap_->allgather(id_blob, &all, deadline));
  WEFT_LOG(INFO, INIT, "split: rank %d: setup phases: split exchange %.3f ms", rank_,
           std::chrono::duration<double, std::milli>(Clock::now() - split_start).count());
  if (members.empty()) {
    out->reset();
    return Status::Ok();
  }
  RootAddress root;
  if (!root_from_blob(all[members.front().rank], &root))
    return Error(weftRemoteError, "split: no unique id from the group's leader rank %d",
                 members.front().rank);
  int new_rank = static_cast<int>(std::find_if(members.begin(), members.end(),
                                               [&](const Member& m) { return m.rank == rank_; }) -
                                  members.begin());
  if (child.name.empty()) child.name = config_.name + "/" + std::to_string(color);
  child.one_node = on_this_node(members, [](const Member& m) { return m.rank; });
  return Communicator::create(root, static_cast<int>(members.size()), new_rank, child, out);
}

bool Communicator::progress() {
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  return transport_->progress();
}

bool Communicator::arm() {
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  return transport_->arm();
}

void Communicator::release(ucx::Request* request) {
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  transport_->release(request);
}

void Communicator::abandon(ucx::Request* request) {
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  transport_->abandon(request);
}

Status Communicator::create_premulsum(const PreMulSum& op, weftRedOp_t* out) {
  size_t slot = 0;
  while (slot < premulsums_.size() && premulsums_[slot].has_value()) ++slot;
  if (slot == premulsums_.size()) premulsums_.emplace_back();
  if (slot > static_cast<size_t>(weftMaxRedOp - weftNumOps))
    return Error(weftInvalidUsage, "too many custom reduction ops on this communicator");
  premulsums_[slot] = op;
  *out = static_cast<weftRedOp_t>(weftNumOps + slot);
  return Status::Ok();
}

Status Communicator::destroy_premulsum(weftRedOp_t op) {
  if (premulsum(op) == nullptr)
    return Error(weftInvalidArgument, "op %d is not a custom op of this communicator",
                 static_cast<int>(op));
  premulsums_[op - weftNumOps].reset();
  return Status::Ok();
}

const Communicator::PreMulSum* Communicator::premulsum(weftRedOp_t op) const {
  if (op < weftNumOps) return nullptr;
  size_t slot = static_cast<size_t>(op) - weftNumOps;
  if (slot >= premulsums_.size() || !premulsums_[slot]) return nullptr;
  return &*premulsums_[slot];
}

Status Communicator::finalize() {
  if (!finalized_ && device_ && bootstrap_)
    device_->finalize([this](const Blob& mine, std::vector<Blob>* all) {
      return bootstrap_->allgather(mine, all, deadline_after_ms(config_.timeout_ms));
    });
  if (!finalized_ && bootstrap_) bootstrap_->leave(true, goodbye());
  finalized_ = true;
  return Status::Ok();
}

std::vector<uint8_t> Communicator::goodbye() const {
  WireWriter writer;
  writer.put<uint64_t>(collective_sequence_.load(std::memory_order_relaxed));
  for (int peer = 0; peer < nranks_; ++peer) {
    writer.put<uint32_t>(p2p_send_sequence_[peer].load(std::memory_order_relaxed));
    writer.put<uint32_t>(p2p_recv_sequence_[peer].load(std::memory_order_relaxed));
  }
  return writer.data();
}

void Communicator::peer_left(int peer, const std::string& label,
                             const std::vector<uint8_t>& goodbye) {
  if (peer < 0 || peer >= nranks_ || peer == rank_) return;
  WireReader reader(goodbye);
  Departure departure{label};
  // This rank's entries of the leaver's per-peer counts.
  uint32_t sent = 0, received = 0;
  bool complete = reader.get(&departure.collectives);
  for (int q = 0; complete && q < nranks_; ++q) {
    complete = reader.get(&sent) && reader.get(&received);
    if (q == rank_) departure.sent_to_me = sent, departure.received_from_me = received;
  }
  if (!complete) return;  // an older peer's empty goodbye: nothing to compare
  std::string conflict;
  {
    std::lock_guard<std::mutex> lock(departures_mutex_);
    if (departures_.empty()) departures_.resize(nranks_);
    departures_[peer] = std::move(departure);
    any_departure_.store(true, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    conflict = departure_conflict(peer);
  }
  if (!conflict.empty()) record_failure(weftRemoteError, conflict);
}

bool Communicator::peer_left_after(int peer, TagKind kind, uint64_t sequence) const {
  if (!has_departures()) return false;
  std::lock_guard<std::mutex> lock(departures_mutex_);
  if (static_cast<size_t>(peer) >= departures_.size() || !departures_[peer]) return false;
  const Departure& gone = *departures_[peer];
  // A clean leaver finished everything it launched (destroy waits for its work).
  return kind == TagKind::Collective ? gone.collectives > sequence
                                     : gone.received_from_me > sequence;
}

std::string Communicator::departure_conflict(int peer) const {
  const Departure& gone = *departures_[peer];
  std::string who = gone.label + " left the communicator (finalize or destroy)";
  std::string me = "rank " + std::to_string(rank_);
  uint64_t collectives = collective_sequence_.load(std::memory_order_relaxed);
  if (collectives > gone.collectives)
    return who + " after " + std::to_string(gone.collectives) + " collectives, while " + me +
           " waits in its collective " + std::to_string(gone.collectives + 1) + " (" +
           last_launched_.load(std::memory_order_relaxed) + ")";
  uint32_t receives = p2p_recv_sequence_[peer].load(std::memory_order_relaxed);
  if (receives > gone.sent_to_me)
    return who + " after sending " + std::to_string(gone.sent_to_me) + " messages to " + me +
           ", which waits to receive message " + std::to_string(gone.sent_to_me + 1) + " from it";
  uint32_t sends = p2p_send_sequence_[peer].load(std::memory_order_relaxed);
  if (sends > gone.received_from_me)
    return who + " after receiving " + std::to_string(gone.received_from_me) + " messages from " +
           me + ", which sends it message " + std::to_string(gone.received_from_me + 1);
  return "";
}

Status Communicator::check_departures() {
  std::string conflict;
  {
    std::lock_guard<std::mutex> lock(departures_mutex_);
    for (int peer = 0; peer < static_cast<int>(departures_.size()) && conflict.empty(); ++peer)
      if (departures_[peer]) conflict = departure_conflict(peer);
  }
  if (conflict.empty()) return Status::Ok();
  record_failure(weftRemoteError, conflict);
  return Status(weftRemoteError, conflict);
}

void Communicator::abort() {
  record_failure(weftRemoteError, "rank " + std::to_string(rank_) + " aborted the communicator");
  if (bootstrap_) bootstrap_->leave(false, {});
  close_endpoints();
}

void Communicator::revoke() {
  const std::string message = "rank " + std::to_string(rank_) + " revoked the communicator";
  // The control plane stays: peers learn of it through the root, and shrink needs it.
  fail_everywhere(weftRemoteError, message);
  close_endpoints();
}

void Communicator::fail_everywhere(weftResult_t code, const std::string& message) {
  // A report naming nobody it waited for: the root passes it to every other rank.
  if (record_failure(code, message) && bootstrap_) bootstrap_->report_failure(message);
}

void Communicator::close_endpoints() {
  // Transfers in flight end with an error at once instead of at their timeout.
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  transport_->close_endpoints(true, 0);
}

Status Communicator::shrink(std::span<const int> exclude, const CommConfig& config,
                            std::unique_ptr<Communicator>* out) {
  out->reset();
  std::vector<int32_t> excluded(exclude.begin(), exclude.end());
  std::sort(excluded.begin(), excluded.end());
  // Survivors keep their order; the first of them hosts the new root.
  std::vector<int> survivors;
  for (int peer = 0; peer < nranks_; ++peer)
    if (!std::binary_search(excluded.begin(), excluded.end(), peer)) survivors.push_back(peer);
  const int new_rank =
      static_cast<int>(std::find(survivors.begin(), survivors.end(), rank_) - survivors.begin());
  CommConfig child = config;
  if (child.timeout_ms <= 0) child.timeout_ms = config_.timeout_ms;
  if (child.name.empty()) child.name = config_.name + "/shrunk";
  child.one_node = on_this_node(survivors, [](int peer) { return peer; });
  Blob id_blob, leader_id;
  if (new_rank == 0) WEFT_RETURN_IF_ERROR(start_child_root(child.timeout_ms, &id_blob));
  const Deadline deadline = deadline_after_ms(config_.timeout_ms);
  if (root_excluded(excluded)) {
    // The root's process is dead or stalled: the survivors agree among themselves.
    WEFT_RETURN_IF_ERROR(agree_without_root(excluded, survivors, id_blob, &leader_id, deadline));
  } else {
    std::vector<Blob> parts;
    WEFT_RETURN_IF_ERROR(bootstrap_->shrink(excluded, id_blob, &parts, deadline));
    if (parts.size() == survivors.size()) leader_id = parts.front();
  }
  RootAddress root;
  if (!root_from_blob(leader_id, &root))
    return Error(weftRemoteError, "shrink: no unique id from the new rank 0 (old rank %d)",
                 survivors.front());
  return Communicator::create(root, static_cast<int>(survivors.size()), new_rank, child, out);
}

// ------------------------------------------------------------------ waiting

Status Communicator::fail_size_mismatch(int peer, size_t sent, size_t expected) {
  const Status status = Error(weftInvalidUsage,
                              "rank %d sent %zu bytes where rank %d's receive expects %zu "
                              "(mismatched counts or datatypes)",
                              peer, sent, rank_, expected);
  fail_everywhere(status.code(), status.message());
  return failure();
}

std::optional<size_t> Communicator::probe_p2p(int peer, uint64_t sequence) {
  std::lock_guard<BriefMutex> lock(transport_mutex_);
  return transport_->probe(peer, make_tag(peer, TagKind::PointToPoint, sequence));
}

Status complete_status(const PendingOp& op) {
  if (!op.is_send && op.request->status == UCS_OK &&
      op.request->info.length != op.request->expected_bytes)
    return op.comm->fail_size_mismatch(op.peer, op.request->info.length,
                                       op.request->expected_bytes);
  Status status = op.comm->request_result(*op.request, op.peer);
  if (status.ok()) return status;
  // A size only the receiver sees: the peers would wait for it.
  if (status.code() == weftInvalidUsage)
    op.comm->fail_everywhere(status.code(), status.message());
  else
    op.comm->fail(status.code(), status.message());
  return op.comm->failure();  // the verdict, which may name a dead peer behind a broken transfer
}

void ProgressLoop::disarm() {
  if (armed_ != nullptr) armed_->disarm();
  armed_ = nullptr;
}

void ProgressLoop::idle(Clock::time_point now, Deadline deadline, shm::Doorbell* bell,
                        bool direct_waits, bool awaited_elsewhere) {
  if (idle_since_ == Clock::time_point()) {
    idle_since_ = now;
    elsewhere_since_ = Clock::time_point();
    // With more ranks than cores a spinning rank only delays the peer it waits for; so
    // does one that spins for a peer on its own CPU (a 4 KiB AllGather took 15 us instead
    // of 1 with two unbound ranks on one core: docs/performance.md, "Mid-size").
    pure_spin_ = std::none_of(comms_.begin(), comms_.end(), [](const Communicator* comm) {
      if (comm->oversubscribed()) return true;
      if (!comm->direct()->shares_cpu_with_peer()) return false;
      WEFT_LOG(TRACE, COLL, "rank %d: a peer runs on this CPU: the wait yields without spinning",
               comm->rank());
      return true;
    });
  }
  spinning_ = true;
  if (pure_spin_ && now < idle_since_ + kPureSpin) return;
  if (awaited_elsewhere) {
    if (elsewhere_since_ == Clock::time_point()) elsewhere_since_ = now;
    if (now < elsewhere_since_ + kPureSpin) return;
  }
  spinning_ = false;
  progress_all_communicators();
  if (now < idle_since_ + kYieldSpin) {
    // Oversubscribed cores are normal: let a runnable peer have ours.
    sched_yield();
    return;
  }
  if (bell != nullptr) {
    for (Communicator* comm : comms_)
      if (!comm->arm()) return;  // transport events pending: progress again
    if (armed_ != bell) {
      disarm();
      armed_seen_ = bell->arm();
      armed_ = bell;
      return;  // the caller looks once more, now that ringers will see us
    }
    // Short slices: the transports' events (which a futex does not see) may
    // need this rank's progress; and timeouts are noticed even without a ring.
    bell->wait(armed_seen_, remaining_ms(deadline, kDoorbellSliceMs));
    disarm();
    idle_since_ = Clock::time_point();
    return;
  }
  disarm();
  for (Communicator* comm : comms_)
    if (!comm->arm()) return;  // events pending: progress again
  fds_.clear();
  if (extra_fd_ >= 0) fds_.push_back({extra_fd_, POLLIN, 0});
  for (Communicator* comm : comms_) {
    fds_.push_back({comm->event_fd(), POLLIN, 0});
    fds_.push_back({comm->wake_fd(), POLLIN, 0});
  }
  // Bounded sleep: a missed wakeup costs at most this much latency, never a hang.
  ::poll(fds_.data(), fds_.size(), remaining_ms(deadline, direct_waits ? 1 : 100));
  if (extra_fd_ >= 0 && (fds_[0].revents & POLLIN)) {
    uint64_t drained;
    (void)!read(extra_fd_, &drained, sizeof(drained));
  }
  idle_since_ = Clock::time_point();
}

Status ProgressLoop::timeout(int64_t timeout_ms, const std::string& what) {
  Status status = Error(weftTimeout, "rank %d: timed out after %lld ms waiting for %s",
                        comms_.front()->rank(), static_cast<long long>(timeout_ms), what.c_str());
  for (Communicator* comm : comms_) comm->fail(status.code(), status.message());
  return comms_.front()->failure();  // the verdict, which may name a peer nearer the cause
}

}  // namespace weft
