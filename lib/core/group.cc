#include "core/group.h"

#include <algorithm>
#include <span>

#include "common/log.h"
#include "core/collectives.h"
#include "core/cuda/device_collectives.h"

namespace weft {

namespace detail {

struct GroupState {
  JobBatch group;  // operations of the open group
  // Its point-to-point messages that rings carry, held while it has nothing else (one
  // communicator, no stream, kMaxRingMessages at most); else they join `group` as jobs.
  std::vector<RingMessage> ring_messages;
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
               t_group.depth, group.jobs.size() + ring_messages.size());
    t_group.state = nullptr;
  }
};

thread_local constinit ThreadGroup t_group [[gnu::tls_model("initial-exec")]]{};

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
// it shows; else whether work on `comm` needs a peer that left.
[[gnu::noinline]] Status check_departures(Communicator& comm) {
  if (std::string why = comm.direct()->settled_lane_mismatch(); !why.empty()) {
    comm.fail(weftInvalidUsage, why);
    return Status(weftInvalidUsage, why);
  }
  return comm.check_departures();
}

// After numbering: fails work that needs a peer that left before it was numbered.
inline Status check_departures(std::span<const Job> jobs) {
  // Pairs with Communicator::peer_left: either it sees these numbers, or this sees its peer.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (const Job& job : jobs)
    if (job.comm->has_departures()) WEFT_RETURN_IF_ERROR(check_departures(*job.comm));
  return Status::Ok();
}

// Numbers ring messages of one communicator in call order, as assign_sequences numbers jobs,
// and runs them.
Status launch_ring_messages(std::span<RingMessage> messages) {
  Communicator& comm = *messages.front().comm;
  WEFT_RETURN_IF_ERROR(comm.usable());
  shm::PairRings& rings = comm.direct()->pair_rings();
  for (RingMessage& message : messages) {
    const int peer = message.peer;
    message.sequence =
        message.is_send ? comm.next_p2p_send_sequence(peer) : comm.next_p2p_recv_sequence(peer);
    message.index = message.is_send ? rings.next_send(peer) : rings.next_recv(peer);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // as check_departures(jobs)
  if (comm.has_departures()) WEFT_RETURN_IF_ERROR(check_departures(comm));
  return run_ring_messages(messages);
}

RingMessage ring_message(const P2PCall& call) {
  return {.comm = call.comm,
          .data = static_cast<std::byte*>(call.buffer),
          .bytes = call.bytes,
          .peer = call.peer,
          .is_send = call.is_send};
}

// The group is about to hold something else: its held messages join it first, as jobs.
void release_ring_messages(GroupState& g) {
  for (const RingMessage& message : g.ring_messages)
    add_p2p_job(g.group,
                {message.comm, message.is_send, message.data, message.bytes, message.peer});
  g.ring_messages.clear();
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
  Status status = run_jobs(batch.jobs);
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
  auto on_comm = [comm](const auto& op) { return op.comm == comm; };
  return static_cast<size_t>(
      std::count_if(g.group.jobs.begin(), g.group.jobs.end(), on_comm) +
      std::count_if(g.ring_messages.begin(), g.ring_messages.end(), on_comm));
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
    g.ring_messages.clear();
    cuda::drop_group_p2p();
    return Status(error.code(),
                  "group abandoned because a call inside it failed: " + error.message());
  }
  Status status;
  if (g.ring_messages.empty()) {
    status = launch(g.group, g.group_stream);
    g.group.clear();
  } else {  // then the group holds nothing else
    status = launch_ring_messages(g.ring_messages);
    g.ring_messages.clear();
  }
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
  if (!g.ring_messages.empty()) release_ring_messages(g);
  *batch = &g.group;
  return Status::Ok();
}

Status submit_ring_message(const P2PCall& call) {
  ThreadGroup& thread = detail::t_group;
  if (thread.depth == 0) {
    RingMessage message = ring_message(call);
    return launch_ring_messages({&message, 1});
  }
  GroupState& g = group_state(thread);
  const bool held = g.group.jobs.empty() && (!g.group_has_ops || g.group_stream == nullptr) &&
                    g.ring_messages.size() < kMaxRingMessages &&
                    (g.ring_messages.empty() || g.ring_messages.front().comm == call.comm);
  if (!held) {
    JobBatch* batch = nullptr;
    WEFT_RETURN_IF_ERROR(begin_submit(nullptr, &batch));
    add_p2p_job(*batch, call);
    return Status::Ok();
  }
  g.group_has_ops = true;
  g.group_stream = nullptr;
  g.ring_messages.push_back(ring_message(call));
  return Status::Ok();
}

void add_p2p_job(JobBatch& batch, const P2PCall& call) {
  // Made in place: a Job is a few hundred bytes, and copying one in was a tenth of the call.
  Job& job = batch.jobs.emplace_back();
  job.comm = call.comm;
  job.single_step.kind = call.is_send ? algo::StepKind::Send : algo::StepKind::Recv;
  job.single_step.peer = call.peer;
  algo::Range range{0, call.bytes, call.is_send ? algo::Buf::Input : algo::Buf::Output};
  (call.is_send ? job.single_step.a : job.single_step.dst) = range;
  (call.is_send ? job.input : job.output) = static_cast<std::byte*>(call.buffer);
  job.tag_kind = TagKind::PointToPoint;
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
