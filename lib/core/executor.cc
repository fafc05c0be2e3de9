#include "core/executor.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/log.h"

namespace weft {

namespace {

// A step of a job that is posted and not yet complete.
struct InFlight {
  uint32_t job;
  uint32_t step;
  PendingOp op;
};

// Per-job execution state, reused across calls so the hot path does not allocate.
struct JobState {
  std::vector<uint32_t> remaining;  // unfinished dependencies per step
  std::vector<uint32_t> ready_comm, ready_compute;
  uint32_t completed = 0;
  uint32_t total = 0;
  std::byte* scratch = nullptr;
};

thread_local std::vector<JobState> t_states;
thread_local std::vector<InFlight> t_in_flight;
thread_local std::vector<Communicator*> t_comms;

const algo::Step& step_of(const Job& job, uint32_t index) {
  return job.program != nullptr ? job.program->program.steps[index] : job.single_step;
}

std::byte* address(const Job& job, const JobState& state, const algo::Range& range) {
  std::byte* base = range.buf == algo::Buf::Input    ? job.input
                    : range.buf == algo::Buf::Output ? job.output
                                                     : state.scratch;
  return base + range.offset * job.math.element_size;
}

void push_ready(const Job& job, JobState& state, uint32_t index) {
  algo::StepKind kind = step_of(job, index).kind;
  if (kind == algo::StepKind::Send || kind == algo::StepKind::Recv)
    state.ready_comm.push_back(index);
  else
    state.ready_compute.push_back(index);
}

void complete_step(const Job& job, JobState& state, uint32_t index) {
  ++state.completed;
  if (job.program == nullptr) return;
  const CompiledProgram& compiled = *job.program;
  for (uint32_t i = compiled.dependents_begin[index]; i < compiled.dependents_begin[index + 1]; ++i) {
    uint32_t next = compiled.dependents[i];
    if (--state.remaining[next] == 0) push_ready(job, state, next);
  }
}

Status post_step(const Job& job, JobState& state, uint32_t index, PendingOp* op) {
  const algo::Step& step = step_of(job, index);
  uint32_t k = job.program != nullptr ? job.program->message_index[index] : 0;
  uint64_t sequence = job.sequence_base + k;
  if (step.kind == algo::StepKind::Send)
    return job.comm->post_send(step.peer, job.tag_kind, sequence, address(job, state, step.a),
                               step.a.count * job.math.element_size, op);
  return job.comm->post_recv(step.peer, job.tag_kind, sequence, address(job, state, step.dst),
                             step.dst.count * job.math.element_size, op);
}

void run_compute(const Job& job, JobState& state, uint32_t index) {
  const algo::Step& step = step_of(job, index);
  std::byte* dst = address(job, state, step.dst);
  const std::byte* a = address(job, state, step.a);
  if (step.kind == algo::StepKind::Copy) {
    if (dst != a) memmove(dst, a, step.a.count * job.math.element_size);
  } else {
    reduce::apply(job.math.dtype, job.math.op, dst, a, address(job, state, step.b),
                  step.dst.count);
  }
}

void finish_job(const Job& job) {
  const JobMath& math = job.math;
  if (math.divisor == 0 || math.divide_count == 0) return;
  std::byte* range = job.output + math.divide_offset * math.element_size;
  reduce::divide(math.dtype, range, range, math.divisor, math.divide_count);
}

// Hands out scratch from each communicator's arena, one slice per job.
void assign_scratch(std::span<Job> jobs, std::vector<JobState>& states) {
  t_comms.clear();
  for (const Job& job : jobs)
    if (std::find(t_comms.begin(), t_comms.end(), job.comm) == t_comms.end())
      t_comms.push_back(job.comm);
  for (Communicator* comm : t_comms) {
    size_t total = 0;
    for (const Job& job : jobs)
      if (job.comm == comm && job.program != nullptr)
        total += job.program->program.scratch_count * job.math.element_size;
    std::byte* arena = comm->scratch_arena(total);
    size_t offset = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].comm != comm || jobs[i].program == nullptr) continue;
      states[i].scratch = arena + offset;
      offset += jobs[i].program->program.scratch_count * jobs[i].math.element_size;
    }
  }
}

void abandon_in_flight() {
  for (InFlight& entry : t_in_flight) entry.op.comm->transport().abandon(entry.op.request);
  t_in_flight.clear();
}

std::string describe_waits(std::span<Job> jobs) {
  std::string what;
  for (const InFlight& entry : t_in_flight) {
    if (what.size() > 200) {
      what += ", ...";
      break;
    }
    what += (what.empty() ? "" : ", ") +
            std::string(entry.op.is_send ? "send to" : "receive from") + " rank " +
            std::to_string(entry.op.peer);
  }
  (void)jobs;
  return what.empty() ? "local work" : what;
}

}  // namespace

Status run_jobs(std::span<Job> jobs) {
  std::vector<JobState>& states = t_states;
  if (states.size() < jobs.size()) states.resize(jobs.size());
  t_in_flight.clear();
  uint32_t unfinished_jobs = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    JobState& state = states[j];
    state.ready_comm.clear();
    state.ready_compute.clear();
    state.completed = 0;
    if (job.program == nullptr) {
      state.total = 1;
      push_ready(job, state, 0);
    } else {
      const algo::Program& program = job.program->program;
      state.total = static_cast<uint32_t>(program.steps.size());
      state.remaining.resize(state.total);
      for (uint32_t i = 0; i < state.total; ++i) {
        state.remaining[i] = program.steps[i].num_deps;
        if (state.remaining[i] == 0) push_ready(job, state, i);
      }
    }
    if (state.total > 0) ++unfinished_jobs;
  }
  assign_scratch(jobs, states);

  t_comms.clear();
  int64_t timeout_ms = INT64_MAX;
  for (const Job& job : jobs) {
    if (std::find(t_comms.begin(), t_comms.end(), job.comm) == t_comms.end()) {
      t_comms.push_back(job.comm);
      timeout_ms = std::min(timeout_ms, job.comm->timeout_ms());
    }
  }
  ProgressLoop loop(t_comms);
  // Every completion restarts the clock: a timeout means nothing moved for that long.
  Deadline deadline = deadline_after_ms(timeout_ms);

  while (unfinished_jobs > 0) {
    // Post every ready transfer first so data flows while we compute.
    bool worked = false;
    for (size_t j = 0; j < jobs.size(); ++j) {
      JobState& state = states[j];
      while (!state.ready_comm.empty()) {
        uint32_t index = state.ready_comm.back();
        state.ready_comm.pop_back();
        InFlight entry{static_cast<uint32_t>(j), index, {}};
        Status posted = post_step(jobs[j], state, index, &entry.op);
        if (entry.op.request != nullptr) t_in_flight.push_back(entry);
        if (!posted.ok()) {
          jobs[j].comm->fail(posted.code(), posted.message());
          abandon_in_flight();
          return posted;
        }
      }
      if (!state.ready_compute.empty()) {
        uint32_t index = state.ready_compute.back();
        state.ready_compute.pop_back();
        run_compute(jobs[j], state, index);
        complete_step(jobs[j], state, index);
        worked = true;
      }
      if (state.total > 0 && state.completed == state.total) {
        finish_job(jobs[j]);
        state.total = 0;  // counted once
        --unfinished_jobs;
      }
    }
    if (unfinished_jobs == 0) break;

    Status status = loop.poll();
    if (!status.ok()) {
      abandon_in_flight();
      return status;
    }
    for (size_t i = 0; i < t_in_flight.size();) {
      InFlight& entry = t_in_flight[i];
      if (!entry.op.request->done.load(std::memory_order_acquire)) {
        ++i;
        continue;
      }
      status = complete_status(entry.op);
      entry.op.comm->transport().release(entry.op.request);
      uint32_t job = entry.job, step = entry.step;
      t_in_flight[i] = t_in_flight.back();
      t_in_flight.pop_back();
      if (!status.ok()) {
        abandon_in_flight();
        return status;
      }
      complete_step(jobs[job], states[job], step);
      worked = true;
    }
    if (worked) {
      deadline = deadline_after_ms(timeout_ms);
      continue;
    }
    if (Clock::now() >= deadline) {
      status = loop.timeout(timeout_ms, describe_waits(jobs));
      abandon_in_flight();
      return status;
    }
    loop.idle(deadline);
  }
  return Status::Ok();
}

}  // namespace weft
