// The communicator: a set of ranks joined by the bootstrap, with a transport
// to every peer, a failure state shared by all its operations, and the
// sequence numbers that keep its messages apart.
#pragma once

#include <poll.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/brief_mutex.h"
#include "common/status.h"
#include "core/bootstrap.h"
#include "core/direct.h"
#include "core/layout.h"
#include "core/program.h"
#include "core/registry.h"
#include "core/tuner.h"
#include "transports/ucx/ucx_transport.h"

namespace weft {

struct CommConfig {
  int64_t timeout_ms = 0;  // 0: WEFT_TIMEOUT_MS
  bool blocking = true;
  std::string name;
  std::string algorithms;  // forced algorithms, WEFT_ALGO syntax; "" for WEFT_ALGO itself
  int cuda_device = -1;    // >= 0: a GPU communicator on that CUDA device (device memory only)
  // Every rank is known to share this rank's node (a split or shrink of ranks that do): UCX
  // is opened without its network transports, which cost every worker half its creation.
  bool one_node = false;
};

struct PeerInfo {
  uint64_t host_hash = 0;  // hostname + boot id: ranks with equal hashes share a node
  int32_t package = -1;    // of the rank's binding on its node; -1: unknown
  int32_t numa = -1;
  std::string host;
  int32_t pid = 0;
  double host_speed = 1;  // local_host_speed: the communicator's cost model takes their median
  Blob transport_address;
};

// Message kinds, so that point-to-point and collective traffic never match each other.
enum class TagKind : uint8_t { PointToPoint = 1, Collective = 2 };

// Tag layout: sender rank (20 bits) | collective (1 bit) | call salt (7 bits) | sequence
// (36 bits). A collective's salt is 7 bits of its call's fingerprint (call_fingerprint):
// messages of ranks that made different calls do not match (but for one pair in 128), so
// such calls wait, where the ranks compare their calls, instead of completing with garbage.
inline constexpr int kTagSequenceBits = 36;
inline constexpr uint64_t kTagSaltMask = 0x7f;
inline uint64_t make_tag(int sender, TagKind kind, uint64_t sequence, uint64_t salt = 0) {
  return (static_cast<uint64_t>(sender) << 44) |
         (static_cast<uint64_t>(kind == TagKind::Collective) << 43) |
         ((salt & kTagSaltMask) << kTagSequenceBits) |
         (sequence & ((uint64_t{1} << kTagSequenceBits) - 1));
}
inline constexpr int kMaxRanks = 1 << 20;

class Communicator;
namespace cuda {
class DeviceComm;
}

// One posted send or receive.
struct PendingOp {
  Communicator* comm = nullptr;
  ucx::Request* request = nullptr;
  int peer = -1;
  bool is_send = false;
};

class Communicator {
 public:
  static Status create(const RootAddress& root, int nranks, int rank, const CommConfig& config,
                       std::unique_ptr<Communicator>* out);
  ~Communicator();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int64_t timeout_ms() const { return config_.timeout_ms; }
  const CommConfig& config() const { return config_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // Where the ranks sit (possibly injected by WEFT_TOPO_FILE): for schedules and the tuner.
  const CommTopology& topology() const { return topology_; }
  // More ranks of this communicator on this node than cores: waits must not spin.
  bool oversubscribed() const { return oversubscribed_; }
  // Every rank is on this node (by real host identity, whatever WEFT_TOPO_FILE
  // says) and maps every peer's staging: direct algorithms can run.
  bool has_shared_memory() const { return direct_->shared(); }
  // The direct algorithms' state; available() is false when they cannot run.
  DirectState* direct() const { return direct_.get(); }
  // Buffers registered with weftCommRegister (direct ops read them in place).
  Registry& registry() { return registry_; }
  // The GPU side of a communicator made for a CUDA device (config cuda_device), else null:
  // its collectives take device memory only and run on CUDA streams.
  cuda::DeviceComm* device() const { return device_.get(); }

  // Ok while the communicator can run operations; otherwise why not (inline: every call
  // asks, and a usable communicator needs two loads).
  Status usable() const {
    if (failed_code_.load(std::memory_order_acquire) == weftSuccess && !finalized_)
      return Status::Ok();
    return unusable();
  }
  // weftSuccess, or the error that failed the communicator.
  weftResult_t async_error() const { return failed_code_.load(std::memory_order_acquire); }
  // async_error() once the notices that had reached this rank are handled. A failed peer
  // releases its GPU waits, and its queue then runs on and signals this rank: a call here can
  // complete from that before the root's verdict, already sent here, is read; asked after
  // the call, this includes the verdict.
  weftResult_t settled_async_error();
  // Marks the communicator failed (first cause wins) and wakes every wait.
  // A timeout found here is also sent to every peer (through the bootstrap
  // root), so that none of them waits out a second timeout of its own; and
  // since peers waiting for each other time out together, the root's verdict
  // (the report that waits for a rank which reported nothing) is awaited
  // briefly, and becomes this communicator's failure.
  void fail(weftResult_t code, const std::string& message);
  // Fails the communicator here and, through the bootstrap root, on every peer (weftRemoteError
  // there, with the same message): for a failure only this rank can see that leaves its
  // peers waiting for it (a revoke, a message of the wrong size).
  void fail_everywhere(weftResult_t code, const std::string& message);
  // Why the communicator failed (Ok if it did not).
  Status failure() const;
  // A receive from `peer` of `expected` bytes met a message of `sent`: fails the
  // communicator everywhere (only this rank sees it) and returns the verdict.
  Status fail_size_mismatch(int peer, size_t sent, size_t expected);
  // The length of point-to-point message `sequence` from `peer` if it waits in the transport,
  // unreceived.
  std::optional<size_t> probe_p2p(int peer, uint64_t sequence);

  // Posts a send/receive of raw bytes tagged for `peer` (make_tag).
  Status post_send(int peer, TagKind kind, uint64_t sequence, uint64_t salt, const void* data,
                   size_t bytes, PendingOp* op);
  Status post_recv(int peer, TagKind kind, uint64_t sequence, uint64_t salt, void* data,
                   size_t bytes, PendingOp* op);
  // Counters read by the control thread too (departures), written only by
  // the launching thread: a relaxed load and store, no read-modify-write.
  uint32_t next_p2p_send_sequence(int peer) { return bump(p2p_send_sequence_[peer]); }
  uint32_t next_p2p_recv_sequence(int peer) { return bump(p2p_recv_sequence_[peer]); }

  // Collective state: sequence numbers, cached programs, custom ops.
  uint64_t next_collective_sequence() { return bump(collective_sequence_); }
  ProgramCache& programs() { return programs_; }
  Tuner& tuner() { return *tuner_; }
  // Pre-multiplied sums created with weftRedOpCreatePreMulSum.
  struct PreMulSum {
    weftDataType_t dtype;
    bool immediate;       // value copied at creation, else read at each call
    uint8_t value[8];     // immediate: the scalar's bytes
    const void* pointer;  // otherwise: where to read it
  };
  Status create_premulsum(const PreMulSum& op, weftRedOp_t* out);
  Status destroy_premulsum(weftRedOp_t op);
  // The op's definition, or null for built-in ops and unknown ids.
  const PreMulSum* premulsum(weftRedOp_t op) const;

  // A peer that left on purpose (finalize or destroy) had launched what its
  // goodbye counts. Work this rank launched beyond that can never complete:
  // the communicator fails at once, naming the peer, instead of at the timeout.
  // A failure a peer reported (through the root): recorded, not passed on.
  void fail_from_peer(weftResult_t code, const std::string& message);
  void peer_left(int peer, const std::string& label, const std::vector<uint8_t>& goodbye);
  // Whether a peer has left (after a seq_cst fence that follows the launch's
  // sequence numbers, so that peer_left either sees them or is seen).
  bool has_departures() const { return any_departure_.load(std::memory_order_relaxed); }
  // Whether `peer` has left after finishing the call of this rank's message `sequence` to it
  // (a collective's sequence, or the index of a point-to-point send to it).
  bool peer_left_after(int peer, TagKind kind, uint64_t sequence) const;
  // Fails the communicator if work just numbered needs a peer that left before it.
  Status check_departures();
  // The collective just numbered (a static name), for departure messages.
  void note_launch(const char* what) { last_launched_.store(what, std::memory_order_relaxed); }

  // Mismatch detection without shared segments (ranks on several nodes, or no room in
  // /dev/shm; docs/reliability.md): every collective launched is recorded, and a call that
  // has waited kCallReportMs reports the latest ones to the bootstrap root, which compares
  // the ranks' reports and fails every rank at the first disagreement.
  bool reports_calls() const { return reports_calls_; }
  // alltoallv_counts: an AllToAllv's send then receive counts (nranks each), else null.
  void record_call(uint64_t sequence, const CallShape& shape, const uint64_t* alltoallv_counts);
  // The oldest call of this rank waits for `sequence` (called while idle): it reports once it
  // waited kCallReportMs with no progress since (note_progress).
  void note_waiting(uint64_t sequence);
  void note_progress();
  static constexpr int64_t kCallReportMs = 50;

  Status split(int color, int key, const CommConfig& config, std::unique_ptr<Communicator>* out);
  // Tells the peers this rank leaves on purpose.
  Status finalize();
  // Abandons everything in flight; peers are told this rank aborted.
  void abort();
  // Fails every operation in flight or to come, here and (through the root)
  // on every peer, but keeps the control plane, so that shrink can follow.
  void revoke();
  // The ranks outside `exclude` (valid, distinct ranks, not this one: the caller checks) form a new
  // communicator, renumbered in rank order, with no help from the excluded ones. Works on a failed
  // communicator; needs the root.
  Status shrink(std::span<const int> exclude, const CommConfig& config,
                std::unique_ptr<Communicator>* out);

  // Transport access, serialised by the communicator's lock so that the
  // progress thread (streams) and the calling thread can share it.
  bool progress();
  bool arm();
  void release(ucx::Request* request);
  void abandon(ucx::Request* request);
  Status request_result(const ucx::Request& request, int peer) const {
    return transport_->result(request, peer);
  }
  int event_fd() const { return transport_->event_fd(); }
  int wake_fd() const { return wake_fd_; }

  // Stream operations not yet finished on this communicator; destroy waits for them.
  std::atomic<int>& pending_stream_ops() { return pending_stream_ops_; }

 private:
  Communicator() = default;

  int rank_ = 0;
  int nranks_ = 0;
  CommConfig config_;
  std::vector<PeerInfo> peers_;
  CommTopology topology_;
  std::unique_ptr<ucx::Transport> transport_;
  std::unique_ptr<Bootstrap> bootstrap_;
  // Shrink's agreement among `survivors` when the bootstrap root's process is excluded
  // (shrink_agreement.cc): through the first survivor, over UCX; *leader_id gets the
  // first survivor's `id_blob` (the shrunk communicator's unique id).
  Status agree_without_root(const std::vector<int32_t>& excluded, const std::vector<int>& survivors,
                            const Blob& id_blob, Blob* leader_id, Deadline deadline);
  // Whether every rank of the process hosting the bootstrap root is in `excluded` (sorted),
  // and there is such a rank.
  bool root_excluded(const std::vector<int32_t>& excluded) const;
  // Raw transfers of the agreement, waited for together.
  struct Transfers {
    std::vector<PendingOp> ops;
    std::vector<bool> done;  // by op, for the posted ones
    Status post(Communicator* comm, int peer, bool send, uint64_t salt, void* data, size_t bytes);
    // Until all are done, one fails, or the deadline (then some stay not done).
    Status await(Communicator* comm, Deadline deadline);
    // Releases completed requests and abandons the others.
    void finish(Communicator* comm);
  };
  uint64_t rootless_shrinks_ = 0;  // agreements without the root so far (their tags' salt)
  // Whether the ranks `rank_of` picks from `members` all share this rank's node, as the
  // transport sees it (host and IPC namespace): a child of only such ranks opens no network
  // transport.
  template <typename Range, typename RankOf>
  bool on_this_node(const Range& members, RankOf rank_of) const {
    for (const auto& member : members)
      if (peers_[rank_of(member)].host_hash != peers_[rank_].host_hash ||
          !transport_->on_node(rank_of(member)))
        return false;
    return true;
  }
  template <typename T>
  static T bump(std::atomic<T>& counter) {
    T value = counter.load(std::memory_order_relaxed);
    counter.store(value + 1, std::memory_order_relaxed);
    return value;
  }
  // What this rank launched, for its goodbye: collectives, then per peer the
  // sends to it and the receives from it.
  std::vector<uint8_t> goodbye() const;
  void close_endpoints();
  // The message for work that needs `peer`, which left after it; "" if none does.
  std::string departure_conflict(int peer) const;

  std::unique_ptr<std::atomic<uint32_t>[]> p2p_send_sequence_;
  std::unique_ptr<std::atomic<uint32_t>[]> p2p_recv_sequence_;
  std::atomic<uint64_t> collective_sequence_{0};
  // Peers that left on purpose and what they had launched (guarded by departures_mutex_).
  struct Departure {
    std::string label;
    uint64_t collectives = 0;
    uint32_t sent_to_me = 0, received_from_me = 0;
  };
  std::atomic<bool> any_departure_{false};
  mutable std::mutex departures_mutex_;
  std::vector<std::optional<Departure>> departures_;
  // The last job this rank launched on the communicator, for departure messages.
  std::atomic<const char*> last_launched_{""};
  // Cross-node mismatch detection (guarded by calls_mutex_ but for note_progress's reset): the
  // latest calls, by sequence modulo their number, the call waiting and since when, the last
  // sequence reported.
  bool reports_calls_ = false;
  std::mutex calls_mutex_;
  struct RecordedCall {
    uint64_t sequence = UINT64_MAX;  // none yet
    CallShape shape;
    std::vector<uint64_t> counts;  // AllToAllv's (up to kMaxCountedRanks ranks)
  };
  std::array<RecordedCall, 8> recent_calls_;
  std::atomic<uint64_t> waiting_sequence_{UINT64_MAX};  // also reset without the lock
  Clock::time_point waiting_since_;
  uint64_t reported_sequence_ = UINT64_MAX;
  ProgramCache programs_;
  AlgorithmOverrides overrides_;
  std::unique_ptr<Tuner> tuner_;  // per-size decisions, cached
  std::vector<std::optional<PreMulSum>> premulsums_;
  // The first cause wins: false if the communicator had failed already.
  bool record_failure(weftResult_t code, const std::string& message);
  int wake_fd_ = -1;  // eventfd: written when the communicator fails
  std::atomic<weftResult_t> failed_code_{weftSuccess};
  // usable() once it found the communicator failed or finalized: the status saying which.
  Status unusable() const;
  mutable std::mutex failure_mutex_;
  std::condition_variable failed_;  // notified when a failure is recorded
  std::string failed_message_;
  bool finalized_ = false;
  bool oversubscribed_ = false;
  Registry registry_;  // outlives direct_, which reads it
  // Made before the bootstrap can report a failure (fail() interrupts it).
  std::unique_ptr<DirectState> direct_ = std::make_unique<DirectState>();
  // Destroyed before the bootstrap and the transport (~Communicator): its watchdog may fail
  // the communicator until then.
  std::unique_ptr<cuda::DeviceComm> device_;
  BriefMutex transport_mutex_;  // taken on every post and progress: inline when free
  std::atomic<int> pending_stream_ops_{0};
};

// How a blocking wait idles: spins briefly (yielding the core), then sleeps
// on the communicators' event fds, so an idle rank costs no CPU.
class ProgressLoop {
 public:
  // `extra_fd` (optional) also ends a sleep: the stream engine's wake-up.
  explicit ProgressLoop(std::span<Communicator* const> comms, int extra_fd = -1)
      : comms_(comms), extra_fd_(extra_fd) {}
  void set_comms(std::span<Communicator* const> comms) { comms_ = comms; }
  ~ProgressLoop() { disarm(); }
  // Something completed: the next idle spell starts with spinning again.
  void progressed() {
    idle_since_ = Clock::time_point();
    disarm();
  }
  // Nothing was ready (`now`: the caller's clock reading): spin for a few microseconds (unless the
  // node is oversubscribed), then yield the core for a while (peers may need it), then sleep until
  // an event, a failure, the extra fd or (at most) the deadline. `bell`: only direct jobs wait, for
  // their peers: sleep on this doorbell instead (its first call arms it and returns, so that the
  // caller checks its work once more before sleeping). `direct_waits` without a bell: direct jobs
  // and transfers both wait, so no sleep exceeds a millisecond. `awaited_elsewhere`: every rank
  // the caller waits for last ran on another CPU, so a rank sharing this one has nothing they
  // need: spin for a few microseconds even on an oversubscribed node (a yield would hand the
  // core to a rank that is waiting too, and cost two context switches for nothing).
  void idle(Clock::time_point now, Deadline deadline, shm::Doorbell* bell = nullptr,
            bool direct_waits = false, bool awaited_elsewhere = false);
  // The last idle() returned to spin (its caller may poll its own work meanwhile).
  bool spinning() const { return spinning_; }
  // Marks every communicator failed with a timeout naming `what`.
  Status timeout(int64_t timeout_ms, const std::string& what);
  // Leaves the doorbell armed by idle(): before an op finishes, since its communicator (whose
  // shared memory holds the doorbell) may then be destroyed.
  void disarm();

 private:
  std::span<Communicator* const> comms_;
  int extra_fd_;
  Clock::time_point idle_since_;       // zero: not idle
  Clock::time_point elsewhere_since_;  // this idle spell's first awaited_elsewhere (zero: none)
  bool pure_spin_ = true;
  bool spinning_ = false;  // spinning()
  std::vector<struct pollfd> fds_;
  shm::Doorbell* armed_ = nullptr;  // announced as a sleeper there
  uint32_t armed_seen_ = 0;
  static constexpr auto kPureSpin = std::chrono::microseconds(5);
  static constexpr auto kYieldSpin = std::chrono::microseconds(50);
  static constexpr int kDoorbellSliceMs = 10;
};

// The outcome of a completed op (transfer errors, size mismatches); a
// failure also fails its communicator.
Status complete_status(const PendingOp& op);

}  // namespace weft
