#include "core/group.h"

#include <algorithm>
#include <span>

#include "common/log.h"
#include "core/cuda/device_collectives.h"

namespace weft {

namespace detail {

struct GroupState {
  JobBatch group;  // operations of the open group
  Stream* group_stream = nullptr;
  bool group_has_ops = false;
  JobBatch single;  // the operation of a call outside any group, reused
  Stream* single_stream = nullptr;
  Status first_error;
  // A thread (or the process) ending inside a group drops what the group holds.
  ~GroupState() {
    if (t_group.depth > 0)
      WEFT_LOG(WARN, INIT,
               "a thread ended inside weftGroupStart (depth %d) without weftGroupEnd: its %zu "
               "queued operation(s) never ran",
               t_group.depth, group.jobs.size());
    t_group.state = nullptr;
  }
};

thread_local constinit ThreadGroup t_group{};

}  // namespace detail

namespace {

using detail::GroupState;
using detail::ThreadGroup;

// Owns the thread's group state, freed as the thread ends; touched only to make it.
thread_local std::unique_ptr<GroupState> t_group_owner;

[[gnu::noinline]] GroupState& make_group_state(ThreadGroup& thread) {
  t_group_owner = std::make_unique<GroupState>();
  thread.state = t_group_owner.get();
  return *thread.state;
}

GroupState& group_state(ThreadGroup& thread) {
  return thread.state != nullptr ? *thread.state : make_group_state(thread);
}

// Tags are numbered when a batch launches, in call order, so that a call or
// group that failed before launching consumes no sequence number.
inline void assign_collective_sequence(Job& job) {
  job.sequence = job.comm->next_collective_sequence();
  job.sequence_base = (job.sequence & 0xFFFF) << 20;
  job.tag_salt = call_fingerprint(job.shape) >> 57;
  job.comm->note_launch(job.what);
  DirectState& direct = *job.comm->direct();
  if (direct.shared() && direct.check() != CheckMode::Off) direct.announce(job);
  if (job.comm->reports_calls())
    job.comm->record_call(job.sequence, job.shape, job.alltoallv_counts);
}

void assign_sequences(JobBatch& batch) {
  for (Job& job : batch.jobs) {
    if (job.tag_kind == TagKind::Collective) {
      assign_collective_sequence(job);
    } else {
      const algo::Step& step = job.single_step;
      const bool send = step.kind == algo::StepKind::Send;
      job.sequence_base = send ? job.comm->next_p2p_send_sequence(step.peer)
                               : job.comm->next_p2p_recv_sequence(step.peer);
      shm::PairRings& rings = job.comm->direct()->pair_rings();
      job.by_ring = rings.carries((send ? step.a.count : step.dst.count) * job.math.element_size);
      job.ring_index = job.by_ring
                           ? (send ? rings.next_send(step.peer) : rings.next_recv(step.peer))
                       : send ? 0
                              : rings.launched_from(step.peer);
    }
  }
}

// Out of line, where a peer left: a peer may have left over a mismatch in an earlier small
// rooted call in which this rank only sent (DirectState, "Lanes"), the cause to name where
// it shows; else whether this job needs a peer that left.
[[gnu::noinline]] Status check_departures(const Job& job) {
  if (std::string why = job.comm->direct()->settled_lane_mismatch(); !why.empty()) {
    job.comm->fail(weftInvalidUsage, why);
    return Status(weftInvalidUsage, why);
  }
  return job.comm->check_departures();
}

// After numbering: fails work that needs a peer that left before it was numbered.
inline Status check_departures(std::span<const Job> jobs) {
  // Pairs with Communicator::peer_left: either it sees these numbers, or this sees its peer.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (const Job& job : jobs)
    if (job.comm->has_departures()) WEFT_RETURN_IF_ERROR(check_departures(job));
  return Status::Ok();
}

// Runs now, or queues on the stream (the batch is handed over).
Status launch(JobBatch& batch, Stream* stream) {
  for (const Job& job : batch.jobs) WEFT_RETURN_IF_ERROR(job.comm->usable());
  assign_sequences(batch);
  WEFT_RETURN_IF_ERROR(check_departures(batch.jobs));
  if (stream != nullptr) {
    StreamEngine::instance().enqueue_jobs(stream, std::move(batch));
    batch.clear();
    return Status::Ok();
  }
  Status status = ring_jobs_only(batch.jobs) ? run_ring_jobs(batch.jobs) : run_jobs(batch.jobs);
  batch.clear();
  return status;
}

}  // namespace

Status group_start() {
  ThreadGroup& thread = detail::t_group;
  GroupState& g = group_state(thread);
  if (thread.depth == 0) {
    g.first_error = Status::Ok();
    g.group_has_ops = false;
    g.group_stream = nullptr;
  }
  ++thread.depth;
  return Status::Ok();
}

void group_record_error(const Status& status) {
  if (!in_group()) return;
  GroupState& g = group_state(detail::t_group);
  if (g.first_error.ok()) g.first_error = status;
}

size_t group_ops_of(const Communicator* comm) {
  if (!in_group()) return 0;
  const GroupState& g = group_state(detail::t_group);
  return static_cast<size_t>(std::count_if(g.group.jobs.begin(), g.group.jobs.end(),
                                           [comm](const Job& job) { return job.comm == comm; }));
}

Status group_end() {
  ThreadGroup& thread = detail::t_group;
  GroupState& g = group_state(thread);
  if (thread.depth == 0)
    return Error(weftInvalidUsage, "weftGroupEnd called without a matching weftGroupStart");
  if (--thread.depth > 0) return Status::Ok();
  if (!g.first_error.ok()) {
    Status error = g.first_error;
    g.first_error = Status::Ok();
    g.group.clear();
    cuda::drop_group_p2p();
    return Status(error.code(),
                  "group abandoned because a call inside it failed: " + error.message());
  }
  Status status = launch(g.group, g.group_stream);
  g.group.clear();
  // The group's GPU sends and receives: enqueued after its host work was.
  Status gpu = cuda::flush_group_p2p();
  return status.ok() ? gpu : status;
}

Status launch_direct(Job& job) {
  // The caller checked that the communicator is usable and that no group is open.
  assign_collective_sequence(job);
  WEFT_RETURN_IF_ERROR(check_departures({&job, 1}));
  return run_direct_job(job);
}

Status begin_submit(Stream* stream, JobBatch** batch) {
  ThreadGroup& thread = detail::t_group;
  GroupState& g = group_state(thread);
  if (thread.depth == 0) {
    g.single.clear();
    g.single_stream = stream;
    *batch = &g.single;
    return Status::Ok();
  }
  if (g.group_has_ops && stream != g.group_stream)
    return Error(weftInvalidUsage,
                 "every operation of a group must use the same stream (the group runs as one "
                 "unit on it)");
  g.group_has_ops = true;
  g.group_stream = stream;
  *batch = &g.group;
  return Status::Ok();
}

Status finish_submit(const Status& prepared) {
  ThreadGroup& thread = detail::t_group;
  if (thread.depth > 0) return prepared;  // errors are recorded by the API layer
  GroupState& g = group_state(thread);
  if (!prepared.ok()) {
    g.single.clear();
    return prepared;
  }
  return launch(g.single, g.single_stream);
}

}  // namespace weft
