#include "core/group.h"

#include <vector>

#include "common/log.h"

namespace weft {

namespace {

struct GroupState {
  int depth = 0;
  std::vector<P2PCall> calls;
  // Reused across calls so that the hot path does not allocate.
  std::vector<PendingOp> ops;
  std::vector<uint32_t> sequences;
  Status first_error;
};
thread_local GroupState t_group;

// Posts every call (sequence numbers in call order, receives first so eager
// data has somewhere to land) and waits for all of them together.
Status run_calls(std::span<const P2PCall> calls) {
  std::vector<PendingOp>* ops = &t_group.ops;
  std::vector<uint32_t>& sequences = t_group.sequences;
  ops->assign(calls.size(), PendingOp{});
  sequences.resize(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    Communicator* comm = calls[i].comm;
    sequences[i] = calls[i].is_send ? comm->next_p2p_send_sequence(calls[i].peer)
                                    : comm->next_p2p_recv_sequence(calls[i].peer);
  }
  Status posted = Status::Ok();
  for (int pass = 0; pass < 2 && posted.ok(); ++pass) {
    for (size_t i = 0; i < calls.size() && posted.ok(); ++i) {
      const P2PCall& call = calls[i];
      if (call.is_send != (pass == 1)) continue;
      posted = call.is_send ? call.comm->post_send(call.peer, TagKind::PointToPoint, sequences[i],
                                                   call.buffer, call.bytes, &(*ops)[i])
                            : call.comm->post_recv(call.peer, TagKind::PointToPoint, sequences[i],
                                                   call.buffer, call.bytes, &(*ops)[i]);
      if (!posted.ok()) call.comm->fail(posted.code(), posted.message());
    }
  }
  Status waited = wait_all(*ops);
  return posted.ok() ? waited : posted;
}

}  // namespace

Status group_start() {
  if (t_group.depth == 0) t_group.first_error = Status::Ok();
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
  std::vector<P2PCall> calls;
  calls.swap(t_group.calls);
  if (!t_group.first_error.ok()) {
    Status error = t_group.first_error;
    t_group.first_error = Status::Ok();
    return Status(error.code(),
                  "group abandoned because a call inside it failed: " + error.message());
  }
  for (const P2PCall& call : calls) WEFT_RETURN_IF_ERROR(call.comm->usable());
  Status status = run_calls(calls);
  calls.clear();
  t_group.calls.swap(calls);  // keep the capacity for the next group
  return status;
}

Status submit_p2p(const P2PCall& call) {
  if (in_group()) {
    t_group.calls.push_back(call);
    return Status::Ok();
  }
  if (call.peer == call.comm->rank())
    return Error(weftInvalidUsage,
                 "peer %d is this rank: a send or receive to self outside weftGroupStart/End "
                 "would wait for itself",
                 call.peer);
  return run_calls({&call, 1});
}

}  // namespace weft
