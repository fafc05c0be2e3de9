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

// A send or receive on a GPU communicator: refused for now, naming what is missing.
Status refuse_p2p(const Communicator& comm, const Stream* stream);

}  // namespace weft::cuda
