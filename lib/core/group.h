// Group semantics: between weftGroupStart and weftGroupEnd (which nest), the
// calling thread's operations are collected, then run together by one
// executor loop (or queued together on their stream), so no order of posting
// can deadlock.
#pragma once

#include "common/status.h"
#include "core/executor.h"
#include "core/stream.h"

namespace weft {

struct P2PCall;

Status group_start();
Status group_end();
namespace detail {
struct GroupState;
// The calling thread's group nesting depth and its group's state (made on first use).
// Constant-initialised and trivially destructible, so that an access needs no wrapper call
// and no guard; initial-exec, so that it is one load from the thread pointer instead of a
// __tls_get_addr call (a point-to-point exchange made about eight). The library's whole
// thread-local block (152 bytes) then comes from the static TLS surplus that glibc keeps for
// libraries opened later (dlopen).
struct ThreadGroup {
  int depth = 0;
  GroupState* state = nullptr;
};
extern thread_local constinit ThreadGroup t_group [[gnu::tls_model("initial-exec")]];
}  // namespace detail
// Whether the calling thread is inside weftGroupStart/End (inline: every call asks).
inline bool in_group() {
  return detail::t_group.depth > 0;
}
// Records an error raised inside a group; group_end reports it.
void group_record_error(const Status& status);
// Operations of `comm` queued in this thread's open group (0 outside a group).
size_t group_ops_of(const Communicator* comm);

// Outside a group, on no stream: numbers a lone direct collective (announcing it to the
// peers) and runs it to completion, without a batch (the blocking fast path).
Status launch_direct(Job& job);
// The batch the next operation joins: the open group's (every operation of a
// group must use the same stream), or a fresh one for this call alone.
Status begin_submit(Stream* stream, JobBatch** batch);
// A point-to-point call on no stream whose message its pair's ring carries (the caller
// checked): outside a group, numbered and run at once; inside one, held as a ring message
// while the group holds nothing else (its end then runs them without jobs), else queued as a
// job.
Status submit_ring_message(const P2PCall& call);
// Appends a point-to-point call's job to `batch`.
void add_p2p_job(JobBatch& batch, const P2PCall& call);
// Outside a group: runs the call's batch now (no stream) or queues it on the
// stream. `prepared` is how preparing the operation went; a failure drops it.
Status finish_submit(const Status& prepared);

}  // namespace weft
