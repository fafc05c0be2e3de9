// Direct collectives over shared memory (algorithms OneShot and TwoShot):
// when every rank of a communicator is on one node, each rank maps every
// peer's staging buffer and reads its peers' data straight from it, instead
// of sending messages. An operation runs in rounds, each moving what fits in
// half the staging: every rank writes its part into its own staging and
// publishes the round (ready), then reads what it needs from every peer's
// staging. Rounds alternate between the two halves, so the only wait is for
// the peers' ready: a rank writes round r+1 only after it saw every peer
// publish round r, which each did only after reading round r-1, the last one
// in that half. Reductions always combine ranks 0, 1, ..., n-1 in that
// order, so every rank ends with identical bits. A one-shot op whose round
// fits in the rest of the ready word's cache line (56 bytes; an AllToAll's
// blocks for its peers only) is written there instead of the staging, so a
// peer takes one cache miss for the word and the data rather than two.
//
// Lanes: a Broadcast or Reduce of at most kLaneBytes runs in one small slot
// of a ring of lanes instead (kLanes, fewer where /dev/shm is short), each slot with its own ready
// word, numbered by the communicator's lane rounds. Every rank publishes each lane round (writers
// with their input in the slot, and the word again at the slot's head, on the data's line, for its
// reader); a rank waits only for the ranks whose slot it reads (a Broadcast's non-roots for the
// root, a Reduce's root for every rank), and a rank with nothing to read (the Broadcast root,
// Reduce's non-roots) returns once it published. Before a rank publishes
// lane round L it checks that every peer published round L - W + 1 (W, the
// window: kLaneWindow, less on large communicators and where /dev/shm is short), which each did
// only after finishing the rounds before. So a sender runs up to W - 1 calls ahead of its slowest
// peer, and ranks that share a core take turns in batches of calls instead of once per call
// (docs/performance.md, "Small Broadcast and Reduce return early"). With mismatch detection on, a
// lane's ready word carries the call's tag, as the staging's do: a rank that reads a slot compares
// the writer's call at once; a rank that only sent compares every peer's word of that round later,
// when it publishes round L + W - 1 or when its next staged op finds every
// peer ready (both wait for the peers anyway), and the op that runs compares
// the oldest such round's announcements while it waits. So a mismatched
// rooted call fails at once on the ranks that read the mismatched data, and
// on the others at the latest by their next staged call or W calls later
// (docs/reliability.md, "Small rooted calls").
//
// Zero copy: when every rank's input lies in weftMemAlloc memory registered
// with the communicator (and does not overlap what the rank writes), peers
// read it in place from the owner's segment, in one step of any size, with
// no staging. Each rank publishes an offer per op (whether its input can be
// read in place, and how); a rank whose input cannot knows at once that the
// op is staged, the others read every offer, so all decide alike. The owner
// completes the op (and so hands the buffer back to the user) only after
// every peer raised its done word for the op. Messages below
// WEFT_SHM_ZERO_COPY_BYTES are staged (one synchronisation instead of two).
// AllReduce, Reduce, AllGather, Broadcast and AllToAll take it; in-place
// Reduce and AllToAll are staged (a rank would overwrite its input while
// peers read it), in-place AllReduce too unless CMA works (two-phase, below).
//
// CMA: an offer has two kinds. Input that is not registered weftMemAlloc
// memory may still be offered by cross-memory attach (its pid and address):
// peers copy it with process_vm_readv straight into their output, one copy
// instead of two, then raise their done word as above. Offers of both kinds
// mix in one op. AllGather, Broadcast, AllToAll and AllReduce take it (a Reduce with a
// CMA offer is staged), from WEFT_SHM_CMA_BYTES per block (0: never;
// unset: kAutoCmaBytes unless the node's ranks outnumber its cores, where a
// rank's read waits for its peer's time slice twice and staging was faster, but for
// AllToAll within the cache: kOversubscribedAllToAllCmaBytes).
// Init probes it collectively (every rank reads a word of every peer, skipped
// when no rank wants CMA); if any pair fails (Yama, a container, another pid
// namespace), nobody offers CMA.
//
// An AllReduce read in place runs in one of two ways. One-shot: every rank reduces every
// input whole into its output. Two-phase, where some rank is in place (and CMA works), or
// some rank offers by CMA and the algorithm is TwoShot or the inputs outgrow half the
// cache (registered inputs alone are read in one step): rank r reduces its n-th
// of the vector (slice r) from every input into its output and raises its reduced word;
// once every peer raised theirs it copies each peer's reduced slice from that peer's
// output by CMA. A rank writes its output's other slices only in the second phase, after
// every peer read its input there, so an in-place rank's input stays whole while it is
// read; each rank moves 2(n-1)/n of the vector instead of n-1 vectors, and reduces an
// n-th of it. (Writing an in-place one-shot's pieces only once every peer had copied
// them ran 1.2-2.6x slower than staging.)
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "common/status.h"
#include "core/registry.h"
#include "core/timed_choice.h"
#include "transports/shm/pair_ring.h"
#include "transports/shm/shm.h"

namespace weft {

struct Job;

// WEFT_SHM_CMA_BYTES when unset and the ranks have a core each: from there each rank times
// both ways (DirectState::cma_choices_). The faster way changes with the host's state as
// well as the size: at 2 ranks in the slow state a CMA read ran AllGather and AllToAll of
// 32 KiB-512 KiB blocks and out-of-place AllReduce of 16-256 KiB about twice as fast as
// staging; in the fast state staging was as fast or faster at most of those sizes, in place
// by up to 1.5x (docs/shared-memory.md, "CMA chosen from 16 KiB blocks"). Smaller blocks
// gain a microsecond at most where CMA wins (8 KiB: 3.5 against 4.8 us) and lost 1.2-3x
// where it did not (2026-12-06), more than the choice's probes would win back.
inline constexpr uint64_t kAutoCmaBytes = 16 << 10;
// Where the node's ranks outnumber its cores, AllToAll alone is read by CMA (WEFT_SHM_CMA_BYTES
// unset), untimed, from this block size while the op's buffers over the node (every rank's
// input and output) fit the last-level cache (DirectState::cma_buffer_bound_). At 4 ranks on
// this VM's 2 cores, staged against CMA, out of place: 128 KiB-1 MiB outputs (32-256 KiB
// blocks) ran 1.0-2.5x faster by CMA in three runs on two days (256 KiB: 119 against 48.5
// and 106 against 95 us; 1 MiB: 451 against 326), 64 KiB ones 1.5x slower, and from 4 MiB
// outputs, past the cache, CMA ran 1.5x slower in two of the three (4 MiB: 2265 against
// 3355 us). AllGather lost by CMA there at every size: a reader's done word waits for its
// owner's next time slice, and AllGather's staging copies little more than CMA does.
inline constexpr uint64_t kOversubscribedAllToAllCmaBytes = 32 << 10;
// How much faster per byte CMA must be to be chosen there: the op is timed whole (both
// ways' waits included), so nothing of either way's cost falls outside its figure.
inline constexpr double kCmaMargin = 1.0;
// The first ops after a change between the two take up to 3x their steady time, CMA's
// first two (traced at 2 MiB blocks: CMA 412, 389, then 234 µs after staged ops; 510, 408,
// then 260; staged 1026 after CMA ones at 8 MiB, then about 400), so they are not counted.
inline constexpr uint32_t kCmaWarmup = 2;

// How much faster per byte a zero-copy op must run with streaming stores for its copies from
// mapped memory to stream (DirectState::copy_stores_). Once blocks outgrow the caches those
// ops are bound by memory traffic, which streaming cuts by the reads an ordinary store makes
// of each line first: 2-rank out-of-place AllGather and AllToAll ops read by CMA ran a median
// 1.08-1.23x faster streamed from 4 MiB blocks (1.04-1.11x at 2 MiB), timed op by op within
// one run; whole runs vary more than that. The margin: the output's lines are left in
// memory, and a caller that reads them next pays outside the op.
inline constexpr double kCopyStreamingMargin = 1.1;

// Lanes (a small Broadcast or Reduce): a sender runs up to kLaneWindow - 1 calls ahead of its
// slowest peer (fewer on large communicators and where /dev/shm is short:
// DirectState::lane_window_), in a ring of kLanes slots per rank, kShortLanes where /dev/shm is
// short. Twice the window, or nearly: then a peer's word for the oldest lane round a rank has
// not compared still holds that round (the peer's next round in its slot needs this rank's
// round lanes - window + 1 further, more than the peer may run ahead). Ranks that share cores
// take turns once per window: at 4 ranks on 2 cores a window of 64 took half the context
// switches of 32, and 8-byte Broadcast 0.31 us against 0.38; at 8 ranks 0.62 against 0.71
// (docs/performance.md).
inline constexpr uint64_t kLaneWindow = 64;
inline constexpr uint64_t kLaneBytes = 512;  // a lane slot's data
inline constexpr uint64_t kLanes = 128;
// Where /dev/shm is short every byte of the header is taken from staging: 128 slots (72 KiB)
// failed ContainerDevShm's 64 8-rank communicators in 64 MB. The announcement ring stays
// within 16 KiB there too (32 KiB with room).
inline constexpr uint64_t kShortLanes = 64;
static_assert(2 * kLaneWindow <= kLanes + 2);

// Per collective, the smallest block offered by CMA (0: never); only AllGather, Broadcast,
// AllToAll and AllReduce are ever nonzero (only AllToAll where ranks outnumber the cores).
using CmaThresholds = std::array<uint64_t, algo::kNumCollectives>;
// WEFT_SHM_CMA_BYTES's value for every such collective when set, else the automatic ones.
CmaThresholds cma_thresholds(std::optional<uint64_t> set, bool oversubscribed);

// WEFT_CHECK: what ranks tell each other about every collective they call
// (docs/reliability.md, "Mismatch detection"). Off: nothing; On: the call's
// shape, and AllToAllv's count rows; Full: also a hash of each rank's input.
enum class CheckMode : uint8_t { Off, On, Full };

// What a collective call was, as every rank must have called it: peers
// compare theirs to find mismatched calls (DirectState::announce). Its first 8
// bytes are the word announced, so that announcing packs nothing.
struct CallShape {
  algo::Collective collective = algo::Collective::AllReduce;
  uint8_t dtype = weftUint8;  // a weftDataType_t
  uint8_t op = 0;             // a weftRedOp_t; every pre-multiplied sum counts as weftNumOps
  uint8_t announced = 1;      // so that the word is never 0
  int32_t root = 0;
  uint64_t count = 0;
  friend bool operator==(const CallShape&, const CallShape&) = default;
};
static_assert(offsetof(CallShape, count) == sizeof(uint64_t), "the shape's word is 8 bytes");
// "AllReduce(count=1000, float, sum)".
std::string describe_call(const CallShape& call);
// The call hashed to 64 bits, which differ between calls that differ but for rare
// collisions: the whole shape, but an AllToAllv's count (its ranks' counts differ).
// Inline: every collective's launch hashes its call.
inline uint64_t call_fingerprint(const CallShape& call) {
  const uint64_t count = call.collective == algo::Collective::AllToAllv ? 0 : call.count;
  uint64_t shape;  // the shape's first word, as announced
  memcpy(&shape, &call, sizeof(shape));
  uint64_t word = (shape ^ 0x9E3779B97F4A7C15ull) * 0xFF51AFD7ED558CCDull;
  word = (word ^ (word >> 31) ^ count) * 0xC4CEB9FE1A85EC53ull;
  return word ^ (word >> 29);
}

// What a direct job computes (copied from the call, so that a job queued on a
// stream does not depend on the caller's count arrays).
struct DirectCall {
  algo::Collective collective = algo::Collective::AllReduce;
  algo::Algorithm algorithm = algo::Algorithm::OneShot;
  uint64_t count = 0;
  int root = 0;
  // AllToAllv only, in elements, one entry per peer (behind a pointer: the other
  // collectives' calls then construct and destroy no vectors).
  struct PeerCounts {
    std::vector<uint64_t> send_counts, send_displs, recv_counts, recv_displs;
  };
  std::unique_ptr<PeerCounts> peers;
};

// Where one direct job stands.
struct DirectRun {
  uint64_t ticket = 0;     // this communicator's direct ops run in ticket order
  uint64_t step = 0;       // rounds of this job completed
  bool published = false;  // this round's staging is written, peers' not read yet
  bool more = false;       // this rank needs a round after the current one
  // How the op moves its data; every rank decides alike from the offers.
  enum class Path : uint8_t { Undecided, Staging, ZeroCopy, Lane };
  Path path = Path::Undecided;
  bool offered = false;  // this rank's offer for the op is published
  bool read = false;     // zero copy or CMA: this rank read its peers' inputs
  // An AllReduce read in two phases, and whether this rank reduced its slice (its first).
  bool two_phase = false;
  bool reduced = false;
  // Whether this rank chose between staging the op and reading it by CMA (a TimedChoice;
  // DirectState::path_timing_ has the rest).
  bool path_timed = false;
  int lane_root = -1;  // lane: the only rank whose slot this rank reads (-1: every rank)
  // Every rank's ready word of the job's first round carried this rank's call (its tag):
  // the peers made the same call, so the check at completion can be skipped.
  bool same_call = false;
  // The op's geometry, computed at its first advance: elements per staging slot, and
  // rounds as this rank sees them (0: none at all).
  bool sized = false;
  // Whether this rank's stores are chosen in the op's rounds (a TimedChoice of streaming
  // stores), and whether those of the round in progress stream (DirectState::timing_ has
  // the rest). Beside the other flags, where zeroing them costs small calls least
  // (bench/perf/call_overhead.sh).
  bool timed = false;
  bool streamed = false;
  // Zero copy: whether this rank's copies from mapped memory are chosen (a TimedChoice;
  // DirectState::copy_timing_ has the rest).
  bool copy_timed = false;
  // Whether this rank copies from the staging into the op's output with streaming stores
  // (DirectState::streams_output).
  bool stream_output = false;
  uint64_t per_round = 0, rounds = 0;
  // The op's one round travels next to the ready words instead of in the staging.
  bool inline_data = false;
};

class DirectState {
 public:
  // A gathering of one blob per rank over the bootstrap (collective).
  using AllGather =
      std::function<Status(const std::vector<uint8_t>&, std::vector<std::vector<uint8_t>>*)>;

  DirectState() = default;
  ~DirectState();
  DirectState(const DirectState&) = delete;
  DirectState& operator=(const DirectState&) = delete;

  // Collective over the communicator. `same_node`: every rank runs on this
  // node. A communicator of one gets private memory; ranks on several nodes,
  // WEFT_SHM_DISABLE=1, or a rank without room in /dev/shm for its segment
  // (a container's small /dev/shm) get no direct state (available() is false:
  // collectives take the message path; the last case WARNs once). A segment
  // that exists but cannot be mapped on some rank fails every rank.
  // `registry`: the communicator's registered buffers (outlives this state).
  // `oversubscribed`: this node has more of the ranks than cores (CMA's default).
  Status init(int rank, int nranks, bool same_node, bool oversubscribed, const AllGather& allgather,
              const Registry* registry);

  // Direct algorithms can run (one rank, or shared memory with every peer).
  bool available() const { return !segments_.empty(); }
  // Why not, when not available().
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  // The peers' memory is mapped here (more than one rank on this node).
  bool shared() const { return available() && nranks_ > 1; }
  size_t staging_bytes() const { return staging_bytes_; }
  // Every pair of ranks can read each other's memory by cross-memory attach.
  bool cma() const { return cma_; }
  // Per collective, the smallest block that every rank offers by CMA (unregistered input,
  // out of place for AllToAll); 0: none.
  const CmaThresholds& cma_floors() const { return cma_floors_; }
  // Broadcasts and Reduces of at most this many bytes run in the lanes (0: none), their
  // senders at most lane_window() - 1 calls ahead of their peers.
  uint64_t lane_bytes() const { return shared() ? kLaneBytes : 0; }
  uint64_t lane_window() const { return lane_window_; }
  // Small sends and receives between this node's ranks (none where /dev/shm is short).
  shm::PairRings& pair_rings() { return pair_rings_; }
  // The window of a communicator of `nranks` ranks on one node with room in /dev/shm.
  static uint64_t lane_window_for(int nranks);

  // Called when a job is launched: its place in the communicator's order.
  uint64_t issue_ticket() { return tickets_issued_++; }
  // Moves the job as far as it can without waiting. Returns true once it is
  // complete; *progressed says whether a round completed. `input` is the job's
  // input or its pre-multiplied staging.
  bool advance(const Job& job, const std::byte* input, DirectRun* run, bool* progressed);
  std::string describe(const DirectRun& run) const;

  // Mismatch detection: unless WEFT_CHECK=off, every collective this rank
  // launches on a shared communicator is announced in its segment by sequence
  // number; a rank waiting for its peers compares what they announced for the
  // same sequence with its own call. Costs a few stores per launch and loads
  // while waiting. `alltoallv_counts`: AllToAllv's send counts then receive
  // counts (nranks each), or null.
  CheckMode check() const { return check_; }
  // Announces the job's call (its sequence, shape and AllToAllv counts) and sets its
  // announced_shape (packed, for agrees()) and ready_tag (for the ready words).
  void announce(Job& job);
  // Announces a call of `sequence` (the GPU path's, which has no Job); returns its packed shape.
  uint64_t announce(uint64_t sequence, const CallShape& call, const uint64_t* alltoallv_counts);
  // Whether every peer's announcement of `sequence` seen so far is the call of `count`
  // elements and packed `shape` (the check made on every call: loads only; false for
  // AllToAllv, whose counts mismatch() compares).
  bool agrees(uint64_t sequence, uint64_t count, uint64_t shape) const;
  // A message naming the first peer that announced another call for
  // `sequence`, and both calls, or for AllToAllv the first pair of ranks whose
  // counts disagree; "" when every announcement seen agrees.
  std::string mismatch(uint64_t sequence, const CallShape& call) const;
  // Whether the op of `ticket` is the one running (the lanes' state is then its thread's).
  bool running(uint64_t ticket) const {
    return tickets_done_.load(std::memory_order_acquire) == ticket;
  }
  // Whether some lane call of this rank's may not be known yet to match its peers' (checks
  // on). This and lane_mismatch() only for the running op, or with none running.
  bool lanes_unacked() const { return lanes_unacked_; }
  // Acks the lane calls whose peers' words show the same call; then a message naming the peer
  // whose word or announcement shows another call in the oldest round left, and both calls;
  // "" if none does yet.
  std::string lane_mismatch();
  // lane_mismatch() from a thread that may not run the communicator's ops: "" unless every op
  // launched so far has finished (their state is then this thread's).
  std::string settled_lane_mismatch();
  // WEFT_CHECK=full: the hash of this rank's input for `sequence` (written when the
  // op starts, after its launch's announcement), and a peer's, once it wrote it.
  void announce_input_hash(uint64_t sequence, uint64_t hash);
  std::optional<uint64_t> input_hash(int rank, uint64_t sequence) const;

  // A peer last published from the CPU this thread runs on: it cannot run while this
  // rank spins for it (ranks left unbound, or bound to one core), so a wait should
  // yield at once instead of spinning first.
  bool shares_cpu_with_peer() const;
  // Every rank that `run`, a staged op, still waits for last published from another CPU than
  // this thread's (false for the other paths, and when a rank's CPU is unknown).
  bool awaited_elsewhere(const DirectRun& run) const;

  // This rank's doorbell: peers ring it after publishing.
  shm::Doorbell* doorbell() { return bell_.load(std::memory_order_acquire); }
  // Wakes this rank's sleepers (a failure, new work) whatever they wait for.
  void interrupt();

  struct Control;   // in shared memory, at the start of each rank's segment
  struct LaneSlot;  // in shared memory, lane_count_ of them (or more) after the announcements

 private:
  Control& control(int rank) const;
  // Rank `rank`'s announcement slot for `sequence` (its words: see direct.cc).
  std::atomic<uint64_t>* announcement(int rank, uint64_t sequence) const;
  // Count and packed shape of rank `rank`'s announcement of `sequence`, if the slot holds it.
  bool announced_call(int rank, uint64_t sequence, uint64_t* count, uint64_t* shape) const;
  // Word `word` of rank `rank`'s announcement of `sequence`, if that is what the slot holds.
  std::optional<uint64_t> announced_word(int rank, uint64_t sequence, size_t word) const;
  // The first pair of ranks whose AllToAllv counts for `sequence` (a call of packed
  // `shape`) disagree; "" if none.
  std::string count_mismatch(uint64_t sequence, uint64_t shape) const;
  // Where rank `rank` writes the round in progress of `run`: its staging's half, or beside
  // its ready word (inline_data).
  const std::byte* staging(int rank, const DirectRun& run) const;
  std::byte* own_staging(const DirectRun& run) const;
  // Whether the job's one round fits beside the ready word (decided alike on every rank).
  bool inline_op(const Job& job) const;
  // An inline AllToAll's slot of rank `writer` that holds its block for `reader` (the
  // writer's own block has none).
  static int compact_slot(int writer, int reader);
  // Whether every rank published `round`; *same_call: each with the call's `tag`.
  bool peers_ready(uint64_t round, uint64_t tag, bool* more, bool* same_call) const;
  // Lanes. Whether the job runs in one lane round (decided alike on every rank).
  bool lane_op(const Job& job) const;
  // Runs the job's lane round: publishes, then waits for the slots it reads, if any.
  bool advance_lane(const Job& job, const std::byte* input, DirectRun* run, bool* progressed);
  // Rank q's ready word for lane round `round`'s slot: (round << kRoundShift) | its tag << 1
  // once it published that round, an earlier round before, a later one once it ran ahead.
  uint64_t lane_word(int q, uint64_t round) const;
  // The same word in rank q's slot of lane round `round`, which it writes with its data there.
  uint64_t lane_data_word(int q, uint64_t round) const;
  // This rank's word for lane round `round`, as every peer that made the same call wrote it.
  uint64_t own_lane_word(uint64_t round) const;
  // Whether every peer published lane round `round` (with checks on: made this rank's call
  // in it); moves lane_acked_ on to it if so.
  bool ack_lane(uint64_t round);
  // Checks on: acks every lane round this rank has not acked, once its staged op found every
  // peer ready (so past them); whether all made this rank's calls.
  [[gnu::noinline]] bool ack_lanes();
  // Lane round `round`'s slot in every rank's ring.
  uint64_t lane_index(uint64_t round) const;
  // Rank q's slot of lane round `round`.
  LaneSlot& lane_slot(int q, uint64_t round) const;
  // Records the CPU this thread runs on for the peers (shares_cpu_with_peer).
  void note_cpu() const;
  // Wakes the peers that sleep waiting for what this rank just published.
  void ring_peers() const;
  // Writes this rank's part of round run.step into its staging; returns whether
  // this rank needs another round after it.
  bool pack(const Job& job, const std::byte* input, const DirectRun& run) const;
  // Reads the peers' parts of round run.step into the output.
  void unpack(const Job& job, const DirectRun& run) const;
  // The job's rounds as this rank sees them (0: none at all), `per_round` elements per slot.
  uint64_t rounds(const Job& job, uint64_t per_round) const;
  // Bytes this rank writes to its staging in the op's current round (run.step).
  uint64_t round_bytes(const Job& job, const DirectRun& run) const;
  // Whether an AllToAllv's own block skips the staging (pack and unpack decide alike).
  bool own_block_direct_v(const Job& job) const;
  // An AllToAllv's buffers as far as its counts reach, in elements past input and output.
  struct Extents {
    uint64_t input = 0, output = 0;
  };
  Extents alltoallv_extents(const Job& job) const;
  // Whether this rank's unpack writes the staged op's output with streaming stores: an
  // AllGather, Broadcast or AllToAll(v) whose buffers over the node's ranks reach
  // output_stream_floor_ (the last-level cache), whose output is not input this rank reads,
  // and that copies something (not a Broadcast's root in place).
  bool streams_output(const Job& job) const;
  // unpack's copy into the op's output: with streaming stores, counted, when run.stream_output.
  void copy_out(std::byte* dst, const std::byte* src, size_t bytes, const DirectRun& run) const;
  // Whether the call's rounds are timed for the choice of stores: one-shot, and this rank both
  // writes its staging and reads the peers'.
  bool packs_and_unpacks(const DirectCall& call) const;
  // The choice for a collective's rounds of `bytes` (at least stream_floor_).
  TimedChoice& stores_for(algo::Collective collective, uint64_t bytes);
  // The timed op ended: its time handed to its choice.
  void observe_path(const Job& job, const DirectRun& run);
  // Where a collective's choice for `bytes` (at least `floor`) lies in stores_ or
  // cma_choices_.
  static size_t choice_index(algo::Collective collective, uint64_t bytes, uint64_t floor);
  // Which of `classes` size classes `bytes` (at least `floor`) falls in: powers of two from
  // the floor, the last class taking the rest.
  static size_t size_class(uint64_t bytes, uint64_t floor, size_t classes);
  // pack and unpack for a round whose stores are chosen: timed, the time handed to stores_.
  bool timed_pack(const Job& job, const std::byte* input, const DirectRun& run);
  void timed_unpack(const Job& job, const DirectRun& run);
  // A zero-copy op's reads, whose copies from mapped memory `stores` chooses; the op is timed
  // from there to its end (observe_copies).
  Status timed_reads(const Job& job, TimedChoice* stores);
  void observe_copies(const Job& job);
  // Elements per staging slot.
  uint64_t slot_elements(const Job& job) const;
  // Maps this rank's staging pages that an op whose first (largest) round writes
  // `first_round_bytes` will write, once (both halves).
  void prefault_staging(uint64_t first_round_bytes);
  void reduce_all(const Job& job, const DirectRun& run, std::byte* dst, size_t offset_bytes,
                  uint64_t count) const;

  // Zero copy. Whether the op is staged without offers (no peer, a collective that is never
  // read in place, or below every rank's smallest offer).
  bool staged_unoffered(const Job& job) const;
  // Publishes this rank's offer, then (when it could be read in place) waits for the
  // peers' and decides; false while waiting.
  bool choose_path(const Job& job, const std::byte* input, DirectRun* run);
  struct Offer;
  // How peers may read this rank's input in place, if at all.
  Offer offer_for(const Job& job, const std::byte* input) const;
  // This rank's offer for the op, refused while staging is the faster way for its blocks
  // (cma_chosen_); an offer so chosen times the op (path_timing_).
  Offer chosen_offer(const Job& job, const std::byte* input, DirectRun* run);
  // Points sources_ at every rank's input (mapping peers' segments); a peer
  // whose input differs in size from what this rank's call reads is an error.
  Status map_inputs(const Job& job, const std::byte* input);
  // Copies `bytes` at `offset` of rank q's input to `dst`, whatever its kind; a copy from
  // mapped memory (this rank's own input, a peer's weftMemAlloc segment) `streamed` or not.
  Status read_input(int q, size_t offset, std::byte* dst, size_t bytes, bool streamed) const;
  // Calls read(q, offset, dst) for every block a zero-copy op reads (rank q's input at
  // `offset`, to `dst`), in order, until one fails.
  template <typename Read>
  Status for_each_read(const Job& job, Read read) const;
  // The choice of stores for a zero-copy op's copies from mapped memory, when they are
  // chosen: blocks from stream_floor_, and a block that is not already in place.
  TimedChoice* copy_stores_for(const Job& job);
  // An AllReduce's zero-copy reduction of elements [begin, end): every input reduced in
  // rank order into the output (the same bits on every rank), piece by piece, each piece of
  // a peer read by CMA first copied into cma_scratch_, where the reduction finds it in the
  // cache.
  Status reduce_read_inputs(const Job& job, uint64_t begin, uint64_t end);
  // A two-phase AllReduce's elements of slice `q` (of the job's count over the ranks).
  uint64_t slice_begin(const Job& job, int q) const;
  // Its second phase: every peer's reduced slice copied from the peer's output.
  Status read_reduced_slices(const Job& job);
  // Reads the peers' inputs, then waits until every peer read this rank's.
  bool zero_copy(const Job& job, DirectRun* run, bool* progressed);
  // What each rank tells the others at init's second stage: where its CMA
  // probe word lies (its pid, address and value), its size thresholds, its WEFT_CHECK and
  // its cma_buffer_bound_.
  struct SetupWords {
    uint64_t pid, probe_address, probe_value, zero_copy_bytes, check;
    CmaThresholds cma_bytes;
    uint64_t cma_buffer_bound;
  };
  // Whether every pair of ranks can use cross-memory attach (collective).
  Status probe_cma(const AllGather& allgather, const std::vector<SetupWords>& setups);

  int rank_ = 0;
  int nranks_ = 0;
  CheckMode check_ = CheckMode::On;
  size_t header_bytes_ =
      0;                   // this rank's control block, announcements and lanes, before its staging
  size_t slot_words_ = 0;  // words per announcement slot
  // Announcement slots in use - 1 (a power of two, the fewest any rank made; all ranks agree):
  // a sequence's slot.
  uint64_t announced_mask_ = 7;
  size_t staging_bytes_ = 0;
  std::vector<shm::Segment> segments_;  // by rank; own included
  std::vector<Control*> controls_;
  std::vector<std::byte*> stagings_;  // by rank: its staging (both halves)
  std::vector<LaneSlot*> lanes_;      // by rank: its lane slots
  shm::PairRings pair_rings_;
  // Lane slots in use per rank, the fewest any rank made room for (all ranks agree).
  uint64_t lane_count_ = kLanes;
  size_t half_bytes_ = 0;        // staging_bytes_ / 2
  size_t prefaulted_bytes_ = 0;  // of each own staging half: pages mapped so far
  std::vector<std::atomic<uint64_t>*> announcements_;  // by rank: its first slot
  std::atomic<shm::Doorbell*> bell_{nullptr};
  // Rounds of this communicator completed by its direct ops (all ranks agree;
  // its parity picks the staging half).
  uint64_t round_ = 0;
  // Lane rounds of this communicator's ops so far (all ranks agree), and the newest lane
  // round up to which every peer was seen to publish each round (with checks on: with this
  // rank's call in it).
  uint64_t lane_round_ = 0;
  uint64_t lane_acked_ = 0;
  // Checks on: this rank's call in each lane round not acked yet, by its slot.
  struct LaneCall {
    uint64_t sequence = 0;
    uint64_t tag = 0;
    CallShape shape;
  };
  std::array<LaneCall, kLanes> lane_calls_{};
  // Checks on: a lane call may not be acked yet (one test for a staged op's path); and a
  // staged op found every peer past this rank's lane calls, yet some word not this rank's.
  bool lanes_unacked_ = false;
  bool lanes_passed_ = false;
  // How far a sender runs ahead, plus one: kLaneWindow, less where the announcement ring is
  // short (half of it), so that a peer that made another call still finds this rank's
  // announcement of it however far ahead this rank ran in the lanes, and where the lanes are
  // (half of them).
  uint64_t lane_window_ = kLaneWindow;
  std::string unavailable_reason_;
  std::atomic<uint64_t> tickets_issued_{0};
  std::atomic<uint64_t> tickets_done_{0};
  const Registry* registry_ = nullptr;
  uint64_t zero_copy_bytes_ = 0;  // smaller messages are staged
  CmaThresholds cma_bytes_{};     // smaller blocks are staged; 0: no CMA offers
  CmaThresholds offer_floors_{};  // smaller blocks are staged by every rank, unoffered
  CmaThresholds cma_floors_{};    // cma_floors()
  // The largest buffers over the node (every rank's input and output) an op offers by CMA:
  // the last-level cache where ranks outnumber the cores and WEFT_SHM_CMA_BYTES is unset.
  uint64_t cma_buffer_bound_ = UINT64_MAX;
  bool cma_ = false;
  uint64_t cma_probe_ = 0;  // the word peers read at init
  // By collective and by round size (powers of two from the floor, the last class taking
  // the rest): rounds' costs per byte written differ between collectives (an AllGather
  // reads n times what it writes, a ReduceScatter writes n slots) and grow once a round
  // outgrows the caches, so a figure from 1 MiB rounds must not judge 2 MiB ones.
  static constexpr size_t kStoreSizeClasses = 4;
  std::array<TimedChoice, algo::kNumCollectives * kStoreSizeClasses> stores_;
  uint64_t stream_floor_ = UINT64_MAX;  // theirs (WEFT_SHM_STREAM_BYTES), for a cheap check
  // Bytes of an op's buffers over the node from which its staged output is streamed: the
  // last-level cache (WEFT_CACHE_BYTES); UINT64_MAX: never. Untimed, so ranks that outnumber
  // the cores stream too: beyond the cache the output goes to memory whatever writes it.
  uint64_t output_stream_floor_ = UINT64_MAX;
  // Bytes of an AllReduce's inputs over the node from which it is read in two phases when
  // read in place: half the last-level cache (WEFT_CACHE_BYTES). At 2 ranks out of place,
  // one-shot reads ran 1-1.5 MiB vectors up to 1.4x faster and two phases 2-16 MiB ones
  // 1.2-1.6x faster (4 MiB: 1110 against 1548-1860 us).
  uint64_t two_phase_floor_ = UINT64_MAX;
  // Bytes the op in progress wrote to its output with streaming stores (its TRACE line).
  mutable uint64_t output_streamed_bytes_ = 0;
  // The timed round in progress (a communicator's ops run one at a time): the bytes this
  // rank writes to its staging and how long its pack took.
  struct RoundTiming {
    uint64_t bytes = 0;
    double pack_us = 0;
  };
  RoundTiming timing_;
  // Whether this rank times CMA against staging for blocks from its CMA threshold
  // (WEFT_SHM_CMA_BYTES unset) and offers its input only while CMA is the faster way; one
  // refusal stages the op on every rank. By collective, in place or not (a staged in-place
  // AllGather skips its own block's copy: at 2 ranks from 256 KiB blocks it ran 1.7-1.9x
  // faster than out of place, a CMA read about as fast either way), and block size in
  // powers of two from cma_bytes_: at 2 ranks the faster way changed with the size as
  // well as with the host's state.
  bool cma_chosen_ = false;
  static constexpr size_t kCmaSizeClasses = 11;  // 16 KiB to 16 MiB blocks from the default
  std::array<TimedChoice, algo::kNumCollectives * 2 * kCmaSizeClasses> cma_choices_;
  // The stores of zero-copy ops' copies from mapped memory (an AllGather's or AllToAll's
  // own block, a Broadcast root's out-of-place output, peers' weftMemAlloc inputs), chosen
  // as stores_ is, from stream_floor_ by collective and block size; timed: the op from its
  // reads to its end, so that what streaming saves the peers' reads of this rank's input
  // counts too.
  std::array<TimedChoice, algo::kNumCollectives * kStoreSizeClasses> copy_stores_;
  // The timed op in progress: its choice, the bytes of its input and its start.
  struct PathTiming {
    TimedChoice* choice = nullptr;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point start;
  };
  PathTiming path_timing_;
  // The zero-copy op in progress whose copies are chosen: its choice, whether they streamed,
  // its block bytes and the start of its reads.
  struct CopyTiming {
    TimedChoice* choice = nullptr;
    bool streamed = false;
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point start;
  };
  CopyTiming copy_timing_;
  // Peers' weftMemAlloc segments mapped so far, by (pid, serial). A freed
  // allocation stays mapped here until the cache is next emptied.
  std::map<std::pair<uint32_t, uint64_t>, shm::Segment> peer_memory_;
  // Every rank's input for the op in progress: here (own or mapped), or
  // at `address` in process `pid` (CMA); a two-phase AllReduce's output at `output` in
  // the rank's process.
  struct Source {
    const std::byte* local = nullptr;
    pid_t pid = 0;
    uint64_t address = 0;
    uint64_t output = 0;
  };
  std::vector<Source> sources_;
  std::vector<pid_t> pids_;  // by rank: its process (two-phase AllReduce reads its output)
  std::vector<std::byte> cma_scratch_;  // reduce_read_inputs: a piece per rank read by CMA
};

}  // namespace weft
