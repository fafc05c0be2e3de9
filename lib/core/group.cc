#include "core/group.h"

namespace weft {

namespace {

struct GroupState {
  int depth = 0;
  JobBatch group;  // operations of the open group
  Stream* group_stream = nullptr;
  bool group_has_ops = false;
  JobBatch single;  // the operation of a call outside any group, reused
  Stream* single_stream = nullptr;
  Status first_error;
};
thread_local GroupState t_group;

// Tags are numbered when a batch launches, in call order, so that a call or
// group that failed before launching consumes no sequence number.
void assign_sequences(JobBatch& batch) {
  for (Job& job : batch.jobs) {
    if (job.tag_kind == TagKind::Collective) {
      job.sequence_base = (job.comm->next_collective_sequence() & 0xFFFF) << 20;
    } else {
      int peer = job.single_step.peer;
      job.sequence_base = job.single_step.kind == algo::StepKind::Send
                              ? job.comm->next_p2p_send_sequence(peer)
                              : job.comm->next_p2p_recv_sequence(peer);
    }
  }
}

// Runs now, or queues on the stream (the batch is handed over).
Status launch(JobBatch& batch, Stream* stream) {
  for (const Job& job : batch.jobs) WEFT_RETURN_IF_ERROR(job.comm->usable());
  assign_sequences(batch);
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
  if (t_group.depth == 0) {
    t_group.first_error = Status::Ok();
    t_group.group_has_ops = false;
    t_group.group_stream = nullptr;
  }
  ++t_group.depth;
  return Status::Ok();
}

bool in_group() {
  return t_group.depth > 0;
}

void group_record_error(const Status& status) {
  if (in_group() && t_group.first_error.ok()) t_group.first_error = status;
}

Status group_end() {
  if (t_group.depth == 0)
    return Error(weftInvalidUsage, "weftGroupEnd called without a matching weftGroupStart");
  if (--t_group.depth > 0) return Status::Ok();
  if (!t_group.first_error.ok()) {
    Status error = t_group.first_error;
    t_group.first_error = Status::Ok();
    t_group.group.clear();
    return Status(error.code(),
                  "group abandoned because a call inside it failed: " + error.message());
  }
  Status status = launch(t_group.group, t_group.group_stream);
  t_group.group.clear();
  return status;
}

Status begin_submit(Stream* stream, JobBatch** batch) {
  if (!in_group()) {
    t_group.single.clear();
    t_group.single_stream = stream;
    *batch = &t_group.single;
    return Status::Ok();
  }
  if (t_group.group_has_ops && stream != t_group.group_stream)
    return Error(weftInvalidUsage,
                 "every operation of a group must use the same stream (the group runs as one "
                 "unit on it)");
  t_group.group_has_ops = true;
  t_group.group_stream = stream;
  *batch = &t_group.group;
  return Status::Ok();
}

Status finish_submit(const Status& prepared) {
  if (in_group()) return prepared;  // errors are recorded by the API layer
  if (!prepared.ok()) {
    t_group.single.clear();
    return prepared;
  }
  return launch(t_group.single, t_group.single_stream);
}

}  // namespace weft
