// Turns API calls into jobs: validates them against the communicator, picks
// the algorithm, fetches the program, stages pre-multiplied inputs, and
// queues the job in the calling thread's group (or runs it at once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/schedule.h"
#include "common/status.h"
#include "core/communicator.h"
#include "core/stream.h"
#include "weft/weft.h"

namespace weft {

struct CollectiveCall {
  algo::Collective collective = algo::Collective::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;  // as the C API's count argument
  weftDataType_t dtype = weftUint8;
  weftRedOp_t op = weftSum;  // reductions only
  int root = 0;              // rooted collectives only
  // AllToAllv only: elements, one entry per peer.
  const size_t* send_counts = nullptr;
  const size_t* send_displs = nullptr;
  const size_t* recv_counts = nullptr;
  const size_t* recv_displs = nullptr;
};

struct P2PCall {
  Communicator* comm = nullptr;
  bool is_send = false;
  void* buffer = nullptr;
  size_t bytes = 0;
  int peer = -1;
};

// Shared with the GPU path (core/cuda/device_collectives.cc), as the host path makes them: the
// call's checks against the communicator (not its buffers), its schedule parameters (the
// algorithm unset; in place as NCCL's layouts say, never with a PreMulSum, whose input is
// staged) and what it computes with.
Status validate_collective(Communicator& comm, const CollectiveCall& call, size_t element);
algo::Params collective_params(const Communicator& comm, const CollectiveCall& call, size_t element,
                               bool premul);
// `input_elements`: algo::input_count of the call's parameters (a PreMulSum scales them).
void describe_math(const Communicator& comm, const CollectiveCall& call, uint64_t input_elements,
                   size_t element, const Communicator::PreMulSum* premul, JobMath* out);
// The call as peers compare it (WEFT_CHECK): every pre-multiplied sum is one op; `root`: the
// call's (0 for collectives without one).
CallShape call_shape(const CollectiveCall& call, int root, bool premul);

// Run now (stream null) or queued on the stream; inside a group, with the group.
Status submit_collective(Communicator& comm, const CollectiveCall& call, Stream* stream);
Status submit_p2p(const P2PCall& call, Stream* stream);

}  // namespace weft
