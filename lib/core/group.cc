#include "core/group.h"

namespace weft {

namespace {

struct GroupState {
  int depth = 0;
  JobBatch group;      // jobs of the open group
  JobBatch immediate;  // the job of a call outside any group, reused
  Status first_error;
};
thread_local GroupState t_group;

Status run_batch(JobBatch& batch) {
  for (const Job& job : batch.jobs) WEFT_RETURN_IF_ERROR(job.comm->usable());
  return run_jobs(batch.jobs);
}

}  // namespace

Status group_start() {
  if (t_group.depth == 0) t_group.first_error = Status::Ok();
  ++t_group.depth;
  return Status::Ok();
}

bool in_group() { return t_group.depth > 0; }

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
  Status status = run_batch(t_group.group);
  t_group.group.clear();
  return status;
}

JobBatch& submit_batch() { return in_group() ? t_group.group : t_group.immediate; }

Status finish_submit(const Status& prepared) {
  if (in_group()) return prepared;  // errors are recorded by the API layer
  if (!prepared.ok()) {
    t_group.immediate.clear();
    return prepared;
  }
  Status status = run_batch(t_group.immediate);
  t_group.immediate.clear();
  return status;
}

}  // namespace weft
