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

// Fails the job's communicator if a peer announced another call for the job's sequence.
Status check_mismatch(const Job& job) {
  if (job.tag_kind != TagKind::Collective || !job.comm->direct()->shared()) return Status::Ok();
  std::string why = job.comm->direct()->mismatch(job.sequence, job.shape);
  if (why.empty()) return Status::Ok();
  job.comm->fail(weftInvalidUsage, why);
  return Status(weftInvalidUsage, why);
}

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
    has_transfers_ = has_transfers_ || job.direct == nullptr;
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
    return job.comm->post_send(step.peer, job.tag_kind, sequence, address(job_index, step.a),
                               step.a.count * job.math.element_size, op);
  return job.comm->post_recv(step.peer, job.tag_kind, sequence, address(job_index, step.dst),
                             step.dst.count * job.math.element_size, op);
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
  unfinished_jobs_ = 0;
}

std::string JobRunner::describe_waits() const {
  std::string what;
  for (size_t j = 0; j < jobs_.size(); ++j)
    if (jobs_[j].direct != nullptr && states_[j].completed != states_[j].total)
      what = jobs_[j].comm->direct()->describe(states_[j].direct);
  for (const InFlight& entry : in_flight_) {
    if (what.size() > 200) {
      what += ", ...";
      break;
    }
    what += (what.empty() ? "" : ", ") +
            std::string(entry.op.is_send ? "send to" : "receive from") + " rank " +
            std::to_string(entry.op.peer);
  }
  return what.empty() ? "local work" : what;
}

Status JobRunner::advance(bool* progressed) {
  *progressed = false;
  // Post every ready transfer first so data flows while we compute.
  for (size_t j = 0; j < jobs_.size(); ++j) {
    JobState& state = states_[j];
    while (!state.ready_comm.empty()) {
      uint32_t index = state.ready_comm.back();
      state.ready_comm.pop_back();
      InFlight entry{static_cast<uint32_t>(j), index, {}};
      Status posted = post_step(j, index, &entry.op);
      if (entry.op.request != nullptr) in_flight_.push_back(entry);
      if (!posted.ok()) {
        jobs_[j].comm->fail(posted.code(), posted.message());
        abandon();
        return root_cause(jobs_[j], posted);
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
  for (size_t j = 0; j < jobs_.size(); ++j) {
    JobState& state = states_[j];
    const Job& job = jobs_[j];
    if (job.direct == nullptr || state.total == 0 || state.completed == state.total) continue;
    const std::byte* input = state.staged_input != nullptr ? state.staged_input : job.input;
    if (job.comm->direct()->advance(job, input, &state.direct, progressed))
      complete_step(j, 0);
    else
      direct_bell_ = job.comm->direct()->doorbell();
  }

  // Direct jobs skip the transports' cost while they move, but a blocked one
  // progresses them: a peer's earlier transfer may still need this rank's
  // part of the protocol (an acknowledgement) to complete.
  if (!in_flight_.empty() || has_transfers_ || direct_bell_ != nullptr)
    for (Communicator* comm : comms_) comm->progress();
  for (size_t i = 0; i < in_flight_.size();) {
    InFlight& entry = in_flight_[i];
    if (!entry.op.request->done.load(std::memory_order_acquire)) {
      ++i;
      continue;
    }
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
    // A call that ran against a peer's different call may have completed with
    // garbage (same sizes): it fails instead.
    if (Status same = check_mismatch(jobs_[j]); !same.ok()) {
      abandon();
      return same;
    }
    const JobMath& math = jobs_[j].math;
    if (math.divisor != 0 && math.divide_count != 0) {
      std::byte* range = jobs_[j].output + math.divide_offset * math.element_size;
      reduce::divide(math.dtype, range, range, math.divisor, math.divide_count);
    }
    state.total = 0;  // counted once
    --unfinished_jobs_;
    *progressed = true;
  }
  if (!*progressed && unfinished_jobs_ > 0) check_mismatches();
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

void JobRunner::check_mismatches() {
  for (size_t j = 0; j < jobs_.size(); ++j)
    if (states_[j].total != 0 && states_[j].completed != states_[j].total)
      (void)check_mismatch(jobs_[j]);  // fails the communicator, seen below
}

void assign_direct_tickets(std::span<Job> jobs) {
  for (Job& job : jobs)
    if (job.direct != nullptr) job.direct_ticket = job.comm->direct()->issue_ticket();
}

Status run_jobs(std::span<Job> jobs) {
  assign_direct_tickets(jobs);
  // Reused by the calling thread, so a blocking call does not allocate (bound once: each
  // thread-local access from a shared library is a call).
  thread_local JobRunner thread_runner;
  JobRunner& runner = thread_runner;
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
    Clock::time_point now = Clock::now();
    if (!deadline) deadline = now + std::chrono::milliseconds(runner.timeout_ms());
    if (now >= *deadline) {
      Status status = loop.timeout(runner.timeout_ms(), runner.describe_waits());
      runner.abandon();
      return status;
    }
    loop.idle(now, *deadline, runner.doorbell(), runner.direct_waiting());
  }
  return Status::Ok();
}

}  // namespace weft
