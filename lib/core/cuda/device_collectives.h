// Collectives on GPU communicators (docs/gpu.md): the call checked as on the host path, its
// device buffers and stream checked against the communicator's device, its algorithm chosen by
// the device cost model, its lowered list enqueued by the communicator's DeviceComm.
#pragma once

#include "common/status.h"
#include "core/collectives.h"
#include "core/communicator.h"
#include "core/stream.h"

namespace weft::cuda {

// A collective on a GPU communicator, or one given a CUDA stream (which a host communicator
// refuses). `stream`: a Weft stream wrapping a cudaStream_t (the call returns at once, the GPU
// runs it in that stream's order), or null (it runs after the legacy default stream's work so
// far and completes before the call returns).
Status submit_collective(Communicator& comm, const CollectiveCall& call, Stream* stream);

// A send or receive on a GPU communicator (or given a CUDA stream). Inside a group it waits
// for the group's end, where each communicator's messages become one list (lower_p2p);
// otherwise it is enqueued (and, on no stream, completed) at once.
Status submit_p2p(const P2PCall& call, Stream* stream);
// At the end of the outermost group: enqueues the group's GPU sends and receives (or drops
// them, when the group failed).
Status flush_group_p2p();
void drop_group_p2p();

}  // namespace weft::cuda
