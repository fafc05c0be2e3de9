// Group semantics: between weftGroupStart and weftGroupEnd (which nest), the
// calling thread's operations are collected, then run together by one
// executor loop, so no order of posting can deadlock.
#pragma once

#include "common/status.h"
#include "core/executor.h"

namespace weft {

Status group_start();
Status group_end();
bool in_group();
// Records an error raised inside a group; group_end reports it.
void group_record_error(const Status& status);

// The batch an operation joins: the open group's, or one run by finish_submit.
JobBatch& submit_batch();
// Outside a group: runs the batch the operation was put in and empties it.
// `prepared` is how preparing the job went; a failure discards the batch.
Status finish_submit(const Status& prepared);

}  // namespace weft
