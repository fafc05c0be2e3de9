#include "core/cuda/device_collectives.h"

#include "common/dtype.h"
#include "common/log.h"
#include "core/cuda/device_comm.h"
#include "core/cuda/driver.h"

namespace weft::cuda {

namespace {

bool is_reduction(algo::Collective collective) {
  return collective == algo::Collective::AllReduce ||
         collective == algo::Collective::ReduceScatter || collective == algo::Collective::Reduce;
}

// The stream a call on `comm` may use: a CUDA stream of its device, or none.
Status check_stream(const Communicator& comm, const Stream* stream, const char* name) {
  const DeviceComm* device = comm.device();
  if (device == nullptr)
    return Error(weftInvalidUsage,
                 "%s: stream wraps a cudaStream_t, but this communicator was made for host "
                 "memory: set weftConfig_t.cudaDevice when creating it to run on the GPU",
                 name);
  if (stream == nullptr) return Status::Ok();
  if (!stream->cuda.bound)
    return Error(weftInvalidUsage,
                 "%s: this communicator runs on GPU %d, so its calls take a stream from "
                 "weftStreamCreateFromCuda (or NULL), not a host stream",
                 name, device->device());
  if (stream->cuda.device != device->device())
    return Error(weftInvalidArgument,
                 "%s: stream belongs to GPU %d, but this communicator runs on GPU %d", name,
                 stream->cuda.device, device->device());
  return Status::Ok();
}

// A buffer the GPU path reads or writes: device (or managed) memory of the communicator's GPU.
Status check_device_memory(const char* name, const char* what, const void* ptr, int device) {
  const PointerInfo info = pointer_info(ptr);
  if (info.type == weftMemoryHost)
    return Error(weftInvalidUsage,
                 "%s: %s %p is host memory, but this communicator runs on GPU %d and takes device "
                 "memory",
                 name, what, ptr, device);
  if (info.device != device)
    return Error(weftInvalidArgument,
                 "%s: %s %p is memory of GPU %d, but this communicator runs on GPU %d", name, what,
                 ptr, info.device, device);
  return Status::Ok();
}

}  // namespace

Status submit_collective(Communicator& comm, const CollectiveCall& call, Stream* stream) {
  const char* name = algo::collective_name(call.collective);
  WEFT_RETURN_IF_ERROR(check_stream(comm, stream, name));
  DeviceComm& device = *comm.device();
  const size_t element = dtype_size(call.dtype);
  WEFT_RETURN_IF_ERROR(validate_collective(comm, call, element));
  if (call.collective == algo::Collective::AllToAllv)
    return Error(weftInvalidUsage,
                 "alltoallv on a GPU communicator is not built yet (its lowering needs every "
                 "rank's counts): use AllToAll with padding, or a host communicator");
  const Communicator::PreMulSum* premul =
      is_reduction(call.collective) ? comm.premulsum(call.op) : nullptr;
  const algo::Params params = collective_params(comm, call, element, premul != nullptr);
  const uint64_t reads = algo::input_count(params), writes = algo::output_count(params);
  if (reads > 0 && call.send == nullptr)
    return Error(weftInvalidArgument, "%s: sendbuff is NULL with count %llu", name,
                 static_cast<unsigned long long>(call.count));
  if (writes > 0 && call.recv == nullptr)
    return Error(weftInvalidArgument, "%s: recvbuff is NULL with count %llu", name,
                 static_cast<unsigned long long>(call.count));
  if (reads > 0)
    WEFT_RETURN_IF_ERROR(check_device_memory(name, "sendbuff", call.send, device.device()));
  if (writes > 0)
    WEFT_RETURN_IF_ERROR(check_device_memory(name, "recvbuff", call.recv, device.device()));
  if (premul != nullptr && !premul->immediate)
    WEFT_RETURN_IF_ERROR(
        check_device_memory(name, "the PreMulSum op's scalar", premul->pointer, device.device()));
  WEFT_RETURN_IF_ERROR(comm.usable());

  algo::Algorithm forced;
  const uint64_t bytes = call.count * element;
  const bool is_forced = comm.tuner().context().overrides.find(call.collective, bytes, &forced);
  std::shared_ptr<const DeviceProgram> program;
  WEFT_RETURN_IF_ERROR(device.plan(params, element, is_forced ? &forced : nullptr, &program));
  DeviceOp op;
  op.program = program.get();
  op.input = reinterpret_cast<drv::DevicePtr>(call.send);
  op.output = reinterpret_cast<drv::DevicePtr>(call.recv);
  op.math = collective_math(comm, call, params, element, premul);
  op.what = name;
  WEFT_LOG(TRACE, COLL, "%s count %llu %s on GPU %d: %s, %zu stream operations, %.1f us predicted",
           name, static_cast<unsigned long long>(call.count), dtype_name(call.dtype),
           device.device(), algo::algorithm_name(program->algorithm), program->lowered.ops.size(),
           program->predicted_us);
  comm.note_launch(name);
  uint64_t ticket = 0;
  WEFT_RETURN_IF_ERROR(device.enqueue(op, stream != nullptr ? stream->cuda.stream : nullptr,
                                      stream != nullptr, &ticket));
  if (stream == nullptr) return device.wait(ticket);
  return Status::Ok();
}

Status refuse_p2p(const Communicator& comm, const Stream* stream) {
  WEFT_RETURN_IF_ERROR(check_stream(comm, stream, "send/recv"));
  return Error(weftInvalidUsage,
               "send/recv on a GPU communicator is not built yet (collectives are): use a host "
               "communicator for point-to-point transfers");
}

}  // namespace weft::cuda
