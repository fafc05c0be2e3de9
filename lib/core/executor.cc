#include "core/executor.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <string>

#include "common/log.h"

namespace weft {

namespace {

const algo::Step& step_of(const Job& job, uint32_t index) {
  return job.program != nullptr ? job.program->program.steps[index] : job.single_step;
}

constexpr size_t kAlignment = 64;
size_t aligned(size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Whether the job's call is compared with its peers' at the check level `at_least`.
bool checked(const Job& job, CheckMode at_least) {
  const DirectState& direct = *job.comm->direct();
  return job.tag_kind == TagKind::Collective && direct.check() >= at_least && direct.shared();
}

Status fail_job(const Job& job, weftResult_t code, const std::string& why) {
  job.comm->fail(code, why);
  return Status(code, why);
}

// Whether a peer may have announced another call for the job's sequence (loads only: this
// runs on every call; AllToAllv always asks mismatch()).
bool maybe_mismatched(const Job& job) {
  return job.announced_shape != 0 &&
         !job.comm->direct()->agrees(job.sequence, job.shape.count, job.announced_shape);
}

// Fails the job's communicator if a peer announced another call for the job's sequence, or,
// while the job runs as the communicator's direct op, made another call than one of this
// rank's earlier ones that it only sent in (DirectState, "Lanes": their state is that op's).
Status check_mismatch(const Job& job) {
  DirectState& direct = *job.comm->direct();
  std::string why;
  if (job.direct != nullptr && direct.running(job.direct_ticket) && direct.lanes_unacked())
    why = direct.lane_mismatch();
  if (why.empty() && maybe_mismatched(job)) why = direct.mismatch(job.sequence, job.shape);
  return why.empty() ? Status::Ok() : fail_job(job, weftInvalidUsage, why);
}

// WEFT_CHECK=full's hash: 64 bits over every byte and the length, so that ranks whose
// hashes agree hold the same bytes (not a defence against crafted collisions).
uint64_t hash_bytes(const std::byte* data, size_t bytes) {
  uint64_t hash = 0x9E3779B97F4A7C15ull ^ bytes;
  size_t at = 0;
  for (; at + sizeof(uint64_t) <= bytes; at += sizeof(uint64_t)) {
    uint64_t word;
    memcpy(&word, data + at, sizeof(word));
    hash = (hash ^ word) * 0xFF51AFD7ED558CCDull;
    hash ^= hash >> 32;
  }
  uint64_t tail = 0;
  if (at < bytes) memcpy(&tail, data + at, bytes - at);
  hash = (hash ^ tail) * 0xC4CEB9FE1A85EC53ull;
  return hash ^ (hash >> 29);
}

// WEFT_CHECK=full, when the job starts (a stream's earlier work may have written its
// input): the hash of its input, for peers to compare.
inline void announce_input(const Job& job) {
  if (job.hashed_input_bytes == 0 || !checked(job, CheckMode::Full)) return;
  job.comm->direct()->announce_input_hash(job.sequence,
                                          hash_bytes(job.input, job.hashed_input_bytes));
}

// WEFT_CHECK=full: `bytes` at `received` must be rank `source`'s input, as hashed there.
Status expect_input_of(const Job& job, int source, const std::byte* received, size_t bytes) {
  std::optional<uint64_t> sent = job.comm->direct()->input_hash(source, job.sequence);
  if (!sent) return Status::Ok();  // its slot was reused by later launches: nothing to compare
  const uint64_t got = hash_bytes(received, bytes);
  if (got == *sent) return Status::Ok();
  char hashes[64];
  snprintf(hashes, sizeof(hashes), "hash %016llx where its input's is %016llx",
           static_cast<unsigned long long>(got), static_cast<unsigned long long>(*sent));
  return fail_job(job, weftInternalError,
                  "WEFT_CHECK=full: rank " + std::to_string(job.comm->rank()) + "'s output of " +
                      describe_call(job.shape) + " differs from rank " + std::to_string(source) +
                      "'s input (" + hashes + "), sequence " + std::to_string(job.sequence));
}

// WEFT_CHECK=full, for inputs that may differ (reductions, AllToAll, Gather): the rank
// that heard from every other (the root, else rank 0) names the ranks whose input differs
// from its own, so that inputs meant to be replicated can be told apart.
void report_inputs(const Job& job) {
  const bool rooted = job.shape.collective == algo::Collective::Reduce ||
                      job.shape.collective == algo::Collective::Gather;
  const int reference = rooted ? job.shape.root : 0;
  if (job.comm->rank() != reference || job.hashed_input_bytes == 0) return;
  const DirectState& direct = *job.comm->direct();
  const std::optional<uint64_t> mine = direct.input_hash(reference, job.sequence);
  std::string differ;
  for (int q = 0; q < job.comm->nranks() && mine; ++q)
    if (std::optional<uint64_t> theirs = direct.input_hash(q, job.sequence); theirs != mine)
      differ += " " + std::to_string(q);
  if (!differ.empty())
    WEFT_LOG(INFO, COLL,
             "WEFT_CHECK=full: %s, sequence %llu: the inputs of ranks%s differ from "
             "rank %d's",
             describe_call(job.shape).c_str(), static_cast<unsigned long long>(job.sequence),
             differ.c_str(), reference);
}

// WEFT_CHECK=full, once the job completed: what the collective's semantics fix, checked
// against the hashes the ranks announced (docs/reliability.md).
Status check_inputs(const Job& job) {
  const size_t block = job.shape.count * job.math.element_size;
  switch (job.shape.collective) {
    case algo::Collective::Broadcast:
      if (job.comm->rank() == job.shape.root) return Status::Ok();
      return expect_input_of(job, job.shape.root, job.output, block);
    case algo::Collective::AllGather:
      for (int q = 0; q < job.comm->nranks(); ++q)
        WEFT_RETURN_IF_ERROR(expect_input_of(job, q, job.output + q * block, block));
      return Status::Ok();
    default:
      report_inputs(job);
      return Status::Ok();
  }
}

// A completed job's last work: a call that ran against a peer's different call may have
// completed with garbage (same sizes), so it fails instead (unless the direct path's ready
// words showed every peer in the same call: `same_call`); Avg divides its output.
// Inlined into both callers: a direct call's completion is mostly these tests.
[[gnu::always_inline]] inline Status finish_job(const Job& job, bool same_call) {
  if (!same_call && maybe_mismatched(job)) WEFT_RETURN_IF_ERROR(check_mismatch(job));
  if (checked(job, CheckMode::Full)) WEFT_RETURN_IF_ERROR(check_inputs(job));
  const JobMath& math = job.math;
  if (math.divisor != 0 && math.divide_count != 0) {
    std::byte* range = job.output + math.divide_offset * math.element_size;
    reduce::divide(math.dtype, range, range, math.divisor, math.divide_count);
  }
  return Status::Ok();
}

// A launched point-to-point job's message, when its pair's ring carries it (Job::by_ring).
RingMessage ring_message(const Job& job) {
  const algo::Step& step = job.single_step;
  const bool send = step.kind == algo::StepKind::Send;
  return {.comm = job.comm,
          .data = send ? job.input : job.output,
          .bytes = send ? step.a.count : step.dst.count,
          .sequence = job.sequence_base,
          .index = job.ring_index,
          .peer = step.peer,
          .is_send = send};
}

// Moves a ring message if it can; false while it waits (*status: a failure, such as a count
// that differs from the sender's).
bool move_by_ring(const RingMessage& message, Status* status) {
  Communicator& comm = *message.comm;
  shm::PairRings& rings = comm.direct()->pair_rings();
  if (message.is_send)
    return rings.try_send(message.peer, message.index, message.sequence, message.data,
                          message.bytes);
  size_t sent = 0;
  switch (rings.try_recv(message.peer, message.index, message.sequence, message.data, message.bytes,
                         &sent)) {
    case shm::PairRings::Received::Done:
      return true;
    case shm::PairRings::Received::WrongSize:
      *status = comm.fail_size_mismatch(message.peer, sent, message.bytes);
      return false;
    case shm::PairRings::Received::WrongSequence: {
      char why[320];
      snprintf(why, sizeof(why),
               "rank %d sent %zu bytes as another message than the one rank %d's receive of %zu "
               "bytes expects (its receive %llu from rank %d): an earlier send and receive "
               "between them had different sizes (mismatched counts or datatypes)",
               message.peer, sent, comm.rank(), message.bytes,
               static_cast<unsigned long long>(message.sequence), message.peer);
      comm.fail_everywhere(weftInvalidUsage, why);
      *status = comm.failure();
      return false;
    }
    case shm::PairRings::Received::NotYet:
      break;
  }
  return false;
}

// A receive by the ring whose sender's count sent the message by the transport, named
// (looked at while idle, instead of waiting out the timeout).
Status check_crossed(const RingMessage& message) {
  if (message.is_send) return Status::Ok();
  if (std::optional<size_t> sent = message.comm->probe_p2p(message.peer, message.sequence))
    return message.comm->fail_size_mismatch(message.peer, *sent, message.bytes);
  return Status::Ok();
}

// What a run waits for, for timeout messages: each distinct wait once, with how many
// transfers it stands for.
class Waits {
 public:
  void note(bool is_send, int peer) {
    std::string wait =
        std::string(is_send ? "send to" : "receive from") + " rank " + std::to_string(peer);
    auto same = std::find_if(waits_.begin(), waits_.end(),
                             [&wait](const auto& known) { return known.first == wait; });
    if (same != waits_.end())
      ++same->second;
    else
      waits_.emplace_back(std::move(wait), 1);
  }
  void note(const RingMessage& message) { note(message.is_send, message.peer); }
  // `what` (a direct job's wait, or ""), then the transfers.
  std::string describe(std::string what) const {
    for (const auto& [wait, count] : waits_) {
      if (what.size() > 200) {
        what += ", ...";
        break;
      }
      what += (what.empty() ? "" : ", ") + wait;
      if (count > 1) what += " (" + std::to_string(count) + " transfers)";
    }
    return what.empty() ? "local work" : what;
  }

 private:
  std::vector<std::pair<std::string, int>> waits_;
};

// A transfer that failed because a peer called another collective (and left
// once it found out) reports the mismatch, not the transport's error.
Status root_cause(const Job& job, const Status& failure) {
  Status mismatch = check_mismatch(job);
  return mismatch.ok() ? failure : mismatch;
}
}  // namespace

std::byte* JobRunner::grow_buffer(size_t bytes) {
  if (bytes > buffer_bytes_) {
    buffer_.reset(new std::byte[bytes]);
    buffer_bytes_ = bytes;
  }
  return buffer_.get();
}

void JobRunner::start(std::span<Job> jobs) {
  jobs_ = jobs;
  if (states_.size() < jobs.size()) states_.resize(jobs.size());
  in_flight_.clear();
  ring_waiting_.clear();
  comms_.clear();
  unfinished_jobs_ = 0;
  direct_bell_ = nullptr;
  has_transfers_ = false;
  timeout_ms_ = INT64_MAX;

  // One buffer for every job's scratch and staged input.
  size_t total = 0;
  for (const Job& job : jobs) {
    if (job.program != nullptr)
      total += aligned(job.program->program.scratch_count * job.math.element_size);
    total += aligned(job.math.premul_count * job.math.element_size);
  }
  std::byte* cursor = grow_buffer(total);

  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    JobState& state = states_[j];
    state.ready_comm.clear();
    state.ready_compute.clear();
    state.completed = 0;
    state.staged_input = nullptr;
    if (job.program != nullptr) {
      state.scratch = cursor;
      cursor += aligned(job.program->program.scratch_count * job.math.element_size);
    }
    if (job.math.premul) {
      // Scaled when the job starts: a stream's earlier work may have written the input.
      state.staged_input = cursor;
      cursor += aligned(job.math.premul_count * job.math.element_size);
      const void* scalar =
          job.math.premul_source != nullptr ? job.math.premul_source : job.math.premul_value;
      reduce::scale(job.math.dtype, state.staged_input, job.input, scalar, job.math.premul_count);
    }
    announce_input(job);
    has_transfers_ = has_transfers_ || (job.direct == nullptr && !job.by_ring);
    if (job.direct != nullptr) {
      state.total = 1;
      state.direct = DirectRun{job.direct_ticket};
    } else if (job.program == nullptr) {
      state.total = 1;
      push_ready(j, 0);
    } else {
      start_program(j);
    }
    if (state.total > 0) ++unfinished_jobs_;
    if (std::find(comms_.begin(), comms_.end(), job.comm) == comms_.end()) {
      comms_.push_back(job.comm);
      timeout_ms_ = std::min(timeout_ms_, job.comm->timeout_ms());
    }
  }
}

void JobRunner::start_program(size_t job) {
  JobState& state = states_[job];
  const algo::Program& program = jobs_[job].program->program;
  state.completed = 0;
  state.total = static_cast<uint32_t>(program.steps.size());
  state.remaining.resize(state.total);
  for (uint32_t i = 0; i < state.total; ++i) {
    state.remaining[i] = program.steps[i].num_deps;
    if (state.remaining[i] == 0) push_ready(job, i);
  }
}

Status JobRunner::next_stage(size_t job) {
  Job& next = jobs_[job];
  Status status = next.next_stage->next(&next, &states_[job].scratch);
  if (!status.ok()) {
    next.comm->fail(status.code(), status.message());
    abandon();
    return status;
  }
  start_program(job);
  return Status::Ok();
}

std::byte* JobRunner::address(size_t job, const algo::Range& range) {
  const JobState& state = states_[job];
  std::byte* base = range.buf == algo::Buf::Output ? jobs_[job].output
                    : range.buf == algo::Buf::Scratch
                        ? state.scratch
                        : (state.staged_input != nullptr ? state.staged_input : jobs_[job].input);
  return base + range.offset * jobs_[job].math.element_size;
}

void JobRunner::push_ready(size_t job, uint32_t step) {
  algo::StepKind kind = step_of(jobs_[job], step).kind;
  if (kind == algo::StepKind::Send || kind == algo::StepKind::Recv)
    states_[job].ready_comm.push_back(step);
  else
    states_[job].ready_compute.push_back(step);
}

void JobRunner::complete_step(size_t job, uint32_t step) {
  JobState& state = states_[job];
  ++state.completed;
  const CompiledProgram* compiled = jobs_[job].program;
  if (compiled == nullptr) return;
  for (uint32_t i = compiled->dependents_begin[step]; i < compiled->dependents_begin[step + 1];
       ++i) {
    uint32_t next = compiled->dependents[i];
    if (--state.remaining[next] == 0) push_ready(job, next);
  }
}

Status JobRunner::post_step(size_t job_index, uint32_t index, PendingOp* op) {
  const Job& job = jobs_[job_index];
  const algo::Step& step = step_of(job, index);
  uint32_t k = job.program != nullptr ? job.program->message_index[index] : 0;
  uint64_t sequence = job.sequence_base + k;
  if (step.kind == algo::StepKind::Send)
    return job.comm->post_send(step.peer, job.tag_kind, sequence, job.tag_salt,
                               address(job_index, step.a), step.a.count * job.math.element_size,
                               op);
  return job.comm->post_recv(step.peer, job.tag_kind, sequence, job.tag_salt,
                             address(job_index, step.dst), step.dst.count * job.math.element_size,
                             op);
}

void JobRunner::run_compute(size_t job_index, uint32_t index) {
  const Job& job = jobs_[job_index];
  const algo::Step& step = step_of(job, index);
  std::byte* dst = address(job_index, step.dst);
  const std::byte* a = address(job_index, step.a);
  if (step.kind == algo::StepKind::Copy) {
    if (dst != a) memmove(dst, a, step.a.count * job.math.element_size);
  } else {
    reduce::apply(job.math.dtype, job.math.op, dst, a, address(job_index, step.b), step.dst.count);
  }
}

void JobRunner::abandon() {
  for (InFlight& entry : in_flight_) entry.op.comm->abandon(entry.op.request);
  in_flight_.clear();
  ring_waiting_.clear();
  unfinished_jobs_ = 0;
}

std::string JobRunner::describe_waits() const {
  std::string what;
  for (size_t j = 0; j < jobs_.size(); ++j)
    if (jobs_[j].direct != nullptr && states_[j].completed != states_[j].total)
      what = jobs_[j].comm->direct()->describe(states_[j].direct);
  Waits waits;
  for (const InFlight& entry : in_flight_) waits.note(entry.op.is_send, entry.op.peer);
  for (uint32_t job : ring_waiting_) waits.note(ring_message(jobs_[job]));
  return waits.describe(std::move(what));
}

Status JobRunner::advance(bool* progressed) {
  *progressed = false;
  // Post every ready transfer first so data flows while we compute.
  for (size_t j = 0; j < jobs_.size(); ++j) {
    JobState& state = states_[j];
    while (!state.ready_comm.empty()) {
      uint32_t index = state.ready_comm.back();
      state.ready_comm.pop_back();
      if (jobs_[j].by_ring) {
        ring_waiting_.push_back(static_cast<uint32_t>(j));
        continue;
      }
      InFlight entry{static_cast<uint32_t>(j), index, {}};
      Status posted = post_step(j, index, &entry.op);
      if (entry.op.request != nullptr) in_flight_.push_back(entry);
      if (!posted.ok()) {
        jobs_[j].comm->fail(posted.code(), posted.message());
        abandon();
        return root_cause(jobs_[j], jobs_[j].comm->failure());
      }
    }
    if (!state.ready_compute.empty()) {
      uint32_t index = state.ready_compute.back();
      state.ready_compute.pop_back();
      run_compute(j, index);
      complete_step(j, index);
      *progressed = true;
    }
  }

  direct_bell_ = nullptr;
  several_bells_ = false;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    JobState& state = states_[j];
    const Job& job = jobs_[j];
    if (job.direct == nullptr || state.total == 0 || state.completed == state.total) continue;
    const std::byte* input = state.staged_input != nullptr ? state.staged_input : job.input;
    if (job.comm->direct()->advance(job, input, &state.direct, progressed))
      complete_step(j, 0);
    else
      wait_on(job.comm->direct()->doorbell());
  }
  for (size_t i = 0; i < ring_waiting_.size();) {
    const uint32_t j = ring_waiting_[i];
    Status failed;
    if (!move_by_ring(ring_message(jobs_[j]), &failed)) {
      if (!failed.ok()) {
        abandon();
        return failed;
      }
      wait_on(jobs_[j].comm->direct()->doorbell());
      ++i;
      continue;
    }
    ring_waiting_[i] = ring_waiting_.back();
    ring_waiting_.pop_back();
    complete_step(j, 0);
    *progressed = true;
  }

  // Direct jobs skip the transports' cost while they move, but a blocked one
  // progresses them: a peer's earlier transfer may still need this rank's
  // part of the protocol (an acknowledgement) to complete.
  transfers_moved_ = false;
  if (!in_flight_.empty() || has_transfers_ || direct_bell_ != nullptr)
    for (Communicator* comm : comms_)
      if (comm->progress() && !in_flight_.empty()) transfers_moved_ = true;
  for (size_t i = 0; i < in_flight_.size();) {
    InFlight& entry = in_flight_[i];
    if (!entry.op.request->done.load(std::memory_order_acquire)) {
      ++i;
      continue;
    }
    // A receive of another size than expected may be a peer's different call: named first,
    // so that the communicator's failure (the first cause) is the mismatch.
    if (!entry.op.is_send && entry.op.request->info.length != entry.op.request->expected_bytes)
      (void)check_mismatch(jobs_[entry.job]);
    Status status = complete_status(entry.op);
    entry.op.comm->release(entry.op.request);
    uint32_t job = entry.job, step = entry.step;
    in_flight_[i] = in_flight_.back();
    in_flight_.pop_back();
    if (!status.ok()) {
      abandon();
      return root_cause(jobs_[job], status);
    }
    complete_step(job, step);
    *progressed = true;
  }

  for (size_t j = 0; j < jobs_.size(); ++j) {
    JobState& state = states_[j];
    if (state.total == 0 || state.completed != state.total) continue;
    if (jobs_[j].next_stage != nullptr) {
      WEFT_RETURN_IF_ERROR(next_stage(j));
      *progressed = true;
      if (state.total > 0) continue;  // an empty program is done at once
    }
    // A state is reused batch after batch: only a direct job's run is its own.
    const bool same_call = jobs_[j].direct != nullptr && state.direct.same_call;
    if (Status finished = finish_job(jobs_[j], same_call); !finished.ok()) {
      abandon();
      return finished;
    }
    state.total = 0;  // counted once
    --unfinished_jobs_;
    *progressed = true;
  }
  if (!*progressed && unfinished_jobs_ > 0) {
    Status mismatch = check_mismatches();
    // The transport's queue is looked at on one idle advance in 16: a wait spins over them.
    if (mismatch.ok() && (++idle_advances_ & 15) == 0) mismatch = check_crossed_messages();
    if (!mismatch.ok()) {
      abandon();
      return mismatch;
    }
  }
  if (*progressed)
    for (Communicator* comm : comms_)
      if (comm->reports_calls()) comm->note_progress();
  // A failure matters only to work still unfinished: what completed, completed.
  if (unfinished_jobs_ > 0) {
    for (Communicator* comm : comms_) {
      Status usable = comm->usable();
      if (!usable.ok()) {
        abandon();
        return usable;
      }
    }
  }
  return Status::Ok();
}

Status JobRunner::check_mismatches() {
  for (size_t j = 0; j < jobs_.size(); ++j)
    if (states_[j].total != 0 && states_[j].completed != states_[j].total)
      WEFT_RETURN_IF_ERROR(check_mismatch(jobs_[j]));
  // Without shared segments the root compares: each communicator's oldest waiting call.
  for (Communicator* comm : comms_) {
    if (!comm->reports_calls()) continue;
    uint64_t oldest = UINT64_MAX;
    for (size_t j = 0; j < jobs_.size(); ++j)
      if (jobs_[j].comm == comm && jobs_[j].tag_kind == TagKind::Collective &&
          states_[j].total != 0 && states_[j].completed != states_[j].total)
        oldest = std::min(oldest, jobs_[j].sequence);
    if (oldest != UINT64_MAX) comm->note_waiting(oldest);
  }
  return Status::Ok();
}

Status JobRunner::check_crossed_messages() {
  for (uint32_t j : ring_waiting_) WEFT_RETURN_IF_ERROR(check_crossed(ring_message(jobs_[j])));
  for (const InFlight& entry : in_flight_) {
    const Job& job = jobs_[entry.job];
    if (entry.op.is_send || job.tag_kind != TagKind::PointToPoint) continue;
    const std::optional<size_t> sent =
        job.comm->direct()->pair_rings().arrived(entry.op.peer, job.ring_index, job.sequence_base);
    if (sent) return job.comm->fail_size_mismatch(entry.op.peer, *sent, job.single_step.dst.count);
  }
  return Status::Ok();
}

bool JobRunner::settle_sends_to_departed() {
  bool settled = false;
  for (size_t i = 0; i < ring_waiting_.size();) {
    const uint32_t j = ring_waiting_[i];
    const Job& job = jobs_[j];
    if (job.single_step.kind != algo::StepKind::Send ||
        !job.comm->peer_left_after(job.single_step.peer, job.tag_kind, job.sequence_base)) {
      ++i;
      continue;
    }
    ring_waiting_[i] = ring_waiting_.back();
    ring_waiting_.pop_back();
    complete_step(j, 0);
    settled = true;
  }
  for (size_t i = 0; i < in_flight_.size();) {
    InFlight& entry = in_flight_[i];
    const Job& job = jobs_[entry.job];
    const uint64_t sequence =
        job.tag_kind == TagKind::Collective ? job.sequence : job.sequence_base;
    if (!entry.op.is_send || !job.comm->peer_left_after(entry.op.peer, job.tag_kind, sequence)) {
      ++i;
      continue;
    }
    entry.op.comm->abandon(entry.op.request);
    const uint32_t finished = entry.job, step = entry.step;
    in_flight_[i] = in_flight_.back();
    in_flight_.pop_back();
    complete_step(finished, step);
    settled = true;
  }
  return settled;
}

void assign_direct_tickets(std::span<Job> jobs) {
  for (Job& job : jobs)
    if (job.direct != nullptr) job.direct_ticket = job.comm->direct()->issue_ticket();
}

namespace {

// The calling thread's runner, reused so that a blocking call does not allocate. Reached
// through a constant-initialised, initial-exec pointer (as detail::t_group): one load,
// where a thread-local object with a destructor costs a __tls_get_addr and a guard check.
thread_local constinit JobRunner* t_runner [[gnu::tls_model("initial-exec")]] = nullptr;
// Frees it as the thread ends, and forgets it: a call made after that (from a later
// thread-local's destructor, or an atexit handler on the main thread) makes a new one.
struct RunnerOwner {
  std::unique_ptr<JobRunner> runner;
  ~RunnerOwner() { t_runner = nullptr; }
};
thread_local RunnerOwner t_runner_owner;

[[gnu::noinline]] JobRunner& make_thread_runner() {
  t_runner_owner.runner = std::make_unique<JobRunner>();
  t_runner = t_runner_owner.runner.get();
  return *t_runner;
}

}  // namespace

Status run_jobs(std::span<Job> jobs) {
  assign_direct_tickets(jobs);
  JobRunner* thread_runner = t_runner;
  JobRunner& runner = thread_runner != nullptr ? *thread_runner : make_thread_runner();
  runner.start(jobs);
  ProgressLoop loop(runner.comms());
  // A timeout means nothing moved for that long: every completion clears the deadline and
  // the next idle spell sets it. The clock is read only while idle (a small collective
  // completes several steps without waiting; a clock read is a tenth of its cost).
  std::optional<Deadline> deadline;
  while (!runner.done()) {
    bool progressed = false;
    WEFT_RETURN_IF_ERROR(runner.advance(&progressed));
    if (progressed) {
      deadline.reset();
      loop.progressed();
      continue;
    }
    if (runner.settle_sends_to_departed()) continue;  // progress: the next advance sees it
    Clock::time_point now = Clock::now();
    if (!deadline) deadline = now + std::chrono::milliseconds(runner.timeout_ms());
    if (now >= *deadline) {
      Status status = loop.timeout(runner.timeout_ms(), runner.describe_waits());
      runner.abandon();
      return status;
    }
    if (runner.transfers_moved()) {
      loop.progressed();
      continue;
    }
    loop.idle(now, *deadline, runner.doorbell(), runner.direct_waiting());
  }
  return Status::Ok();
}

namespace {

constexpr int kTightPolls = 64;  // a few microseconds: ProgressLoop's pure spin

inline void pause_core() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls the direct job alone (the peers' ready words) up to kTightPolls times, pausing the
// core between polls. Returns true once the job is complete; stops early when it progressed
// or its communicator failed (the caller's checks return the failure).
bool poll_direct(DirectState& direct, Job& job, DirectRun* run, bool* progressed) {
  for (int i = 0; i < kTightPolls && job.comm->async_error() == weftSuccess; ++i) {
    pause_core();
    if (direct.advance(job, job.input, run, progressed)) return true;
    if (*progressed) return false;
  }
  return false;
}

}  // namespace

Status run_direct_job(Job& job) {
  Communicator& comm = *job.comm;
  DirectState& direct = *comm.direct();
  DirectRun run{direct.issue_ticket()};
  job.direct_ticket = run.ticket;  // for check_mismatch
  announce_input(job);
  bool progressed = false;
  // A rank alone, or one whose peers arrived first, is done at the first try.
  if (direct.advance(job, job.input, &run, &progressed)) return finish_job(job, run.same_call);
  Communicator* const comms[] = {&comm};
  ProgressLoop loop(comms);
  Deadline deadline{};  // as in run_jobs: nothing moved for the timeout (zero: not waiting)
  // While the wait may spin, the job is polled alone between the checks below (the
  // transports' progress, the peers' announcements, the clock: a fraction of a microsecond
  // together), so that it completes as soon as the last peer publishes, not up to a round
  // of checks later. Until the loop has decided, it may spin where it would at its start.
  bool spin = !comm.oversubscribed() && !direct.shares_cpu_with_peer();
  for (;;) {
    progressed = false;
    if (direct.advance(job, job.input, &run, &progressed)) break;
    if (!progressed && spin && poll_direct(direct, job, &run, &progressed)) break;
    if (progressed) {
      deadline = Deadline{};
      loop.progressed();
      continue;
    }
    // Waiting on the peers: the checks JobRunner::advance makes for a blocked direct job. A
    // mismatch is named even where a peer's failure (it found the mismatch first) came first.
    WEFT_RETURN_IF_ERROR(check_mismatch(job));
    WEFT_RETURN_IF_ERROR(comm.usable());
    comm.progress();
    Clock::time_point now = Clock::now();
    if (deadline == Deadline{}) deadline = now + std::chrono::milliseconds(comm.timeout_ms());
    if (now >= deadline) return loop.timeout(comm.timeout_ms(), direct.describe(run));
    loop.idle(now, deadline, direct.doorbell(), true, direct.awaited_elsewhere(run));
    spin = loop.spinning();
  }
  return finish_job(job, run.same_call);
}

Status run_ring_messages(std::span<const RingMessage> messages) {
  static_assert(kMaxRingMessages <= 64, "one bit of `waiting` per message");
  Communicator& comm = *messages.front().comm;
  DirectState& direct = *comm.direct();
  uint64_t waiting = messages.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << messages.size()) - 1;
  // Moves every message that can move; whether any did.
  auto move_all = [&](Status* failed) {
    bool moved = false;
    for (uint64_t left = waiting; left != 0 && failed->ok(); left &= left - 1) {
      const int j = __builtin_ctzll(left);
      if (!move_by_ring(messages[j], failed)) continue;
      waiting &= ~(uint64_t{1} << j);
      moved = true;
    }
    return moved;
  };
  Status failed;
  // A peer that arrived first: done at the first try.
  if (move_all(&failed); waiting == 0 || !failed.ok()) return failed;
  Communicator* const comms[] = {&comm};
  ProgressLoop loop(comms);
  Deadline deadline{};  // as in run_jobs: nothing moved for the timeout (zero: not waiting)
  bool spin = !comm.oversubscribed();
  Clock::time_point next_look{};
  for (;;) {
    bool moved = move_all(&failed);
    // While the wait may spin, the rings alone are polled between the checks below, as a
    // direct job's words are (run_direct_job).
    for (int poll = 0; spin && !moved && failed.ok() && poll < kTightPolls; ++poll) {
      pause_core();
      moved = move_all(&failed);
    }
    WEFT_RETURN_IF_ERROR(failed);
    if (waiting == 0) return Status::Ok();
    if (moved) {
      deadline = Deadline{};
      loop.progressed();
      continue;
    }
    WEFT_RETURN_IF_ERROR(comm.usable());
    Clock::time_point now = Clock::now();
    // As JobRunner: sends to a peer that left having received them are done, and the
    // transport's queue is looked at once a millisecond.
    const bool look = now >= next_look;
    if (look) next_look = now + std::chrono::milliseconds(1);
    for (uint64_t left = waiting; left != 0; left &= left - 1) {
      const RingMessage& message = messages[__builtin_ctzll(left)];
      if (message.is_send &&
          comm.peer_left_after(message.peer, TagKind::PointToPoint, message.sequence))
        waiting &= ~(left & -left);
      else if (look)
        WEFT_RETURN_IF_ERROR(check_crossed(message));
    }
    if (waiting == 0) return Status::Ok();
    comm.progress();  // a peer's earlier transfer may need this rank's part
    if (deadline == Deadline{}) deadline = now + std::chrono::milliseconds(comm.timeout_ms());
    if (now >= deadline) {
      Waits waits;
      for (uint64_t left = waiting; left != 0; left &= left - 1)
        waits.note(messages[__builtin_ctzll(left)]);
      return loop.timeout(comm.timeout_ms(), waits.describe(""));
    }
    loop.idle(now, deadline, direct.doorbell(), true);
    spin = loop.spinning();
  }
}

}  // namespace weft
