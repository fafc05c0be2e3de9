// The host executor: runs programs (algorithms/schedule.h) on real buffers
// over the communicator's transport. Every Weft operation, a single Send as
// much as an AllReduce, is a Job; a group runs its jobs together, so they
// overlap and none can wait on another. A JobRunner advances a set of jobs
// step by step, so that one thread can drive many of them (the stream
// progress thread) or wait for one set (a blocking call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "algorithms/schedule.h"
#include "common/status.h"
#include "core/communicator.h"
#include "core/direct.h"
#include "core/program.h"
#include "core/reduce/reduce.h"

namespace weft {

// What a job computes with, beyond moving bytes.
struct JobMath {
  weftDataType_t dtype = weftUint8;
  reduce::Op op = reduce::Op::Sum;
  size_t element_size = 1;
  // Avg: divide this Output range by `divisor` once the program is done.
  uint64_t divide_offset = 0, divide_count = 0, divisor = 0;
  // Pre-multiplied sum: the input (premul_count elements) is scaled when the
  // job starts, into a staging buffer, by premul_value (copied at creation)
  // or by *premul_source (read at run time).
  bool premul = false;
  uint8_t premul_value[8] = {};
  const void* premul_source = nullptr;
  uint64_t premul_count = 0;
};

struct Job;

// What a job runs after its program, when that program can only be built
// once the first has run (hierarchical AllToAllv gathers every rank's
// counts first). Owned by the job's batch.
class JobStage {
 public:
  virtual ~JobStage() = default;
  // Called once the job's program has completed: points `job` at the next
  // program and its buffers, numbers its messages on from
  // kSecondStageMessages, clears job->next_stage after the last stage, and
  // sets *scratch to that program's scratch (kept by the stage).
  virtual Status next(Job* job, std::byte** scratch) = 0;
};

struct Job {
  Communicator* comm = nullptr;
  // The program, or null for a lone Send/Recv described by `single_step`
  // (point-to-point calls, which then need no program of their own).
  const CompiledProgram* program = nullptr;
  algo::Step single_step;
  std::byte* input = nullptr;
  std::byte* output = nullptr;
  JobMath math;
  TagKind tag_kind = TagKind::Collective;
  // Tag sequence of message k with a peer: sequence_base + k (set at launch).
  uint64_t sequence_base = 0;
  // Point-to-point (set at launch): a message that its pair's ring carries
  // (shm::PairRings::carries) travels there as the pair's ring message `ring_index`; a
  // receive by the transport records the ring messages from its peer launched before it
  // (the index its sender would have used, had its count put the message in the ring).
  bool by_ring = false;
  uint64_t ring_index = 0;
  // A collective's tag salt: bits of its call's fingerprint (set at launch; make_tag).
  uint64_t tag_salt = 0;
  // A direct (shared-memory) collective, run by the communicator's direct
  // state instead of a program.
  const DirectCall* direct = nullptr;
  // Its place among the communicator's direct ops (set at launch).
  uint64_t direct_ticket = 0;
  // What runs once the program completes, if anything.
  JobStage* next_stage = nullptr;
  // The collective's name (static), for messages.
  const char* what = "";
  // A collective's call as every rank must make it, and its number among the
  // communicator's collectives (set at launch): peers compare them.
  CallShape shape;
  uint64_t sequence = 0;
  // The shape packed as announced at launch (0: not announced, as with WEFT_CHECK=off or
  // no peer on the node: nothing to compare), packed once for the call's every check.
  uint64_t announced_shape = 0;
  // An announced call's sequence, count and shape hashed to the bits the direct path's ready
  // words keep for it (set at launch), else 0: ranks whose words carry the same tag made
  // the same call.
  uint64_t ready_tag = 0;
  // AllToAllv: this rank's send counts then receive counts, nranks each (kept by the
  // batch), announced with the call; null for other collectives.
  const uint64_t* alltoallv_counts = nullptr;
  // WEFT_CHECK=full: the bytes of the input that are hashed (0: none, e.g. a Broadcast's
  // non-root).
  uint64_t hashed_input_bytes = 0;
};

// Jobs about to run together, with the programs they use kept alive.
struct JobBatch {
  std::vector<Job> jobs;
  std::vector<std::shared_ptr<const CompiledProgram>> programs;
  std::vector<std::shared_ptr<DirectCall>> directs;
  std::vector<std::shared_ptr<JobStage>> stages;
  std::vector<std::shared_ptr<const std::vector<uint64_t>>> alltoallv_counts;  // Job's
  // A DirectCall for the next job: a spare one when there is one (a batch is reused
  // call after call, so a blocking direct call then allocates nothing).
  std::shared_ptr<DirectCall> new_direct() {
    if (spare_directs_.empty()) return std::make_shared<DirectCall>();
    std::shared_ptr<DirectCall> call = std::move(spare_directs_.back());
    spare_directs_.pop_back();
    return call;
  }
  void clear() {
    jobs.clear();
    programs.clear();
    for (std::shared_ptr<DirectCall>& call : directs)
      if (call.use_count() == 1 && spare_directs_.size() < kSpareDirects)
        spare_directs_.push_back(std::move(call));
    directs.clear();
    stages.clear();
    alltoallv_counts.clear();
  }

 private:
  static constexpr size_t kSpareDirects = 4;
  std::vector<std::shared_ptr<DirectCall>> spare_directs_;  // held by nothing else
};

class JobRunner {
 public:
  // Prepares to run `jobs` (which must outlive the run).
  void start(std::span<Job> jobs);
  // One round: posts every ready transfer, runs ready computation, progresses
  // the transports and reaps completions. *progressed says whether anything
  // completed; an error means the run failed (and was abandoned).
  Status advance(bool* progressed);
  // The last advance moved some transfer's data without completing it (a large message
  // going fragment by fragment): the caller goes on instead of idling. UCX signals a sleeper
  // when a message arrives, not when a full shared-memory FIFO has room again, so a sender
  // asleep there stalled until its wait's slice ended: 4 ranks on 2 cores exchanged 2-32 MiB
  // at 0.1-7 GB/s from run to run instead of 5-9 (docs/performance.md, "Point-to-point on
  // one node", also for starting the idle spell over instead, which measured slower). It
  // does not postpone the timeout, which counts from the last completion.
  bool transfers_moved() const { return transfers_moved_; }
  bool done() const { return unfinished_jobs_ == 0; }
  // Gives up: in-flight transfers are abandoned.
  void abandon();
  // Counts as done the sends in flight to a peer that has left after finishing the call they
  // belong to (it received them); true if there were any. UCX may never report them complete:
  // a rendezvous send waits for the receiver's acknowledgement, which a receiver that went on
  // and exited may take with it.
  bool settle_sends_to_departed();
  // Communicators involved, the strictest timeout among them, and what is in
  // flight (for timeout messages).
  const std::vector<Communicator*>& comms() const { return comms_; }
  int64_t timeout_ms() const { return timeout_ms_; }
  std::string describe_waits() const;
  // When the last advance found only direct jobs and ring messages waiting for their peers
  // (no transfer in flight): the doorbell those peers ring, to sleep on.
  shm::Doorbell* doorbell() const {
    return in_flight_.empty() && !several_bells_ ? direct_bell_ : nullptr;
  }
  // Whether direct jobs or ring messages wait for peers (nothing but the doorbell announces
  // them).
  bool direct_waiting() const { return direct_bell_ != nullptr; }

 private:
  // Fails the communicator of any waiting collective whose peers announced another call, and
  // returns that mismatch (also where a peer's failure came first).
  Status check_mismatches();
  struct JobState {
    std::vector<uint32_t> remaining;  // unfinished dependencies per step
    std::vector<uint32_t> ready_comm, ready_compute;
    uint32_t completed = 0;
    uint32_t total = 0;
    std::byte* scratch = nullptr;
    std::byte* staged_input = nullptr;  // pre-multiplied input, if any
    DirectRun direct;
  };
  struct InFlight {
    uint32_t job;
    uint32_t step;
    PendingOp op;
  };
  // While idle: a receive whose sender's count put the message on the other way (the ring
  // or the transport) is named instead of waiting out the timeout.
  Status check_crossed_messages();

  void start_program(size_t job);
  Status next_stage(size_t job);
  void push_ready(size_t job, uint32_t step);
  void complete_step(size_t job, uint32_t step);
  Status post_step(size_t job, uint32_t step, PendingOp* op);
  void run_compute(size_t job, uint32_t step);
  std::byte* address(size_t job, const algo::Range& range);
  std::byte* grow_buffer(size_t bytes);

  std::span<Job> jobs_;
  std::vector<JobState> states_;
  std::vector<InFlight> in_flight_;
  std::vector<uint32_t> ring_waiting_;  // jobs whose ring message has not moved yet
  uint32_t idle_advances_ = 0;          // check_crossed_messages runs on one in 16
  std::vector<Communicator*> comms_;
  int64_t timeout_ms_ = 0;
  uint32_t unfinished_jobs_ = 0;
  // A doorbell that waiting direct jobs or ring messages need rung, and whether they wait on
  // several (communicators): then none is slept on (the sleeps are short instead).
  void wait_on(shm::Doorbell* bell) {
    several_bells_ = several_bells_ || (direct_bell_ != nullptr && direct_bell_ != bell);
    direct_bell_ = bell;
  }
  shm::Doorbell* direct_bell_ = nullptr;
  bool several_bells_ = false;
  bool has_transfers_ = false;    // some job is not direct
  bool transfers_moved_ = false;  // transfers_moved()
  // Scratch and staging for all jobs of a run, kept across runs.
  std::unique_ptr<std::byte[]> buffer_;
  size_t buffer_bytes_ = 0;
};

// Numbers the direct jobs in launch order (the order they run in on every
// rank, whichever thread starts them): call when a batch is launched.
void assign_direct_tickets(std::span<Job> jobs);

// Runs every job to completion in the calling thread. Fails when any
// communicator fails or nothing completes within the strictest timeout.
Status run_jobs(std::span<Job> jobs);

// Runs one direct job (numbered, announced) to completion in the calling thread, without a
// JobRunner: the same waits, mismatch checks and timeout as run_jobs.
Status run_direct_job(Job& job);

// A point-to-point message that its pair's ring carries (shm::PairRings::carries), as the
// blocking fast path runs it: no Job, no JobRunner. `sequence` (the pair's point-to-point
// sequence, as Job::sequence_base) and `index` (its ring index) are set at launch.
struct RingMessage {
  Communicator* comm = nullptr;
  std::byte* data = nullptr;
  size_t bytes = 0;
  uint64_t sequence = 0;
  uint64_t index = 0;
  int peer = -1;
  bool is_send = false;
};
// The most messages one run_ring_messages takes (a group with more runs as jobs).
inline constexpr size_t kMaxRingMessages = 64;
// Runs launched messages of one communicator, kMaxRingMessages at most, to completion in the
// calling thread: the same waits, checks and timeout as run_jobs.
Status run_ring_messages(std::span<const RingMessage> messages);

}  // namespace weft
