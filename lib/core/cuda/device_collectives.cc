#include "core/cuda/device_collectives.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/dtype.h"
#include "common/log.h"
#include "core/cuda/device_comm.h"
#include "core/cuda/driver.h"
#include "core/group.h"

namespace weft::cuda {

namespace {

// The sends and receives of the calling thread's open group, by communicator, in call order.
struct GroupedP2p {
  Communicator* comm;
  Stream* stream;
  std::vector<algo::P2pMessage> sends, receives;
};
thread_local std::vector<GroupedP2p> t_group_p2p;

// Enqueues one rank's messages as one operation; on no stream, waits for it.
Status enqueue_p2p(Communicator& comm, Stream* stream, const std::vector<algo::P2pMessage>& sends,
                   const std::vector<algo::P2pMessage>& receives, const char* what) {
  DeviceComm& device = *comm.device();
  std::shared_ptr<const DeviceProgram> program;
  WEFT_RETURN_IF_ERROR(device.p2p_program(sends, receives, &program));
  DeviceOp op;
  op.program = program.get();
  op.math.dtype = weftUint8;  // moves bytes; addresses are absolute (input and output 0)
  op.what = what;
  uint64_t ticket = 0;
  WEFT_RETURN_IF_ERROR(device.enqueue(op, stream != nullptr ? stream->cuda.stream : nullptr,
                                      stream != nullptr, &ticket));
  return stream == nullptr ? device.wait(ticket) : Status::Ok();
}

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

// A buffer the GPU path reads or writes: device (or managed) memory of the communicator's GPU,
// with at least `bytes` from `ptr` to the end of its allocation.
Status check_device_memory(const char* name, const char* what, const void* ptr, int device,
                           uint64_t bytes) {
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
  drv::DevicePtr base = 0;
  size_t size = 0;
  const auto at = reinterpret_cast<drv::DevicePtr>(ptr);
  // Managed memory and some allocators have no range to ask: then there is nothing to check.
  if (info.type == weftMemoryDevice &&
      api()->mem_get_address_range(&base, &size, at) == drv::kSuccess && base + size - at < bytes)
    return Error(weftInvalidArgument,
                 "%s: %s %p has %llu bytes to the end of its allocation, but the call needs %llu",
                 name, what, ptr, static_cast<unsigned long long>(base + size - at),
                 static_cast<unsigned long long>(bytes));
  return Status::Ok();
}

// WEFT_CHECK on the GPU path: the call is announced in the node's shared control block under
// the communicator's collective sequence, then compared with what the peers announced for it.
// Of two mismatched ranks the later to launch finds the other's announcement (the fence orders
// each rank's announcement before its reads, so both cannot miss) and fails every rank through
// the bootstrap; their queued GPU work then drains. Without it the streams would wait for
// chunks that never come, or move the wrong bytes. A rank many calls ahead on its streams
// overwrites announcements its peers have not compared yet: those comparisons are skipped.
Status announce_call(Communicator& comm, const CollectiveCall& call, const algo::Params& params,
                     bool premul) {
  DirectState& direct = *comm.direct();
  if (comm.nranks() == 1 || !direct.shared() || direct.check() == CheckMode::Off)
    return Status::Ok();
  const CallShape shape = call_shape(call, params.root, premul);
  std::vector<uint64_t> counts;
  if (call.collective == algo::Collective::AllToAllv) {
    counts.assign(call.send_counts, call.send_counts + comm.nranks());
    counts.insert(counts.end(), call.recv_counts, call.recv_counts + comm.nranks());
  }
  const uint64_t sequence = comm.next_collective_sequence();
  direct.announce(sequence, shape, counts.empty() ? nullptr : counts.data());
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::string why = direct.mismatch(sequence, shape);
  if (why.empty()) return Status::Ok();
  comm.fail_everywhere(weftInvalidUsage, why);
  return Status(weftInvalidUsage, why);
}

}  // namespace

Status submit_collective(Communicator& comm, const CollectiveCall& call, Stream* stream) {
  const char* name = algo::collective_name(call.collective);
  WEFT_RETURN_IF_ERROR(check_stream(comm, stream, name));
  DeviceComm& device = *comm.device();
  const size_t element = dtype_size(call.dtype);
  WEFT_RETURN_IF_ERROR(validate_collective(comm, call, element));
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
    WEFT_RETURN_IF_ERROR(
        check_device_memory(name, "sendbuff", call.send, device.device(), reads * element));
  if (writes > 0)
    WEFT_RETURN_IF_ERROR(
        check_device_memory(name, "recvbuff", call.recv, device.device(), writes * element));
  if (premul != nullptr && !premul->immediate)
    WEFT_RETURN_IF_ERROR(check_device_memory(name, "the PreMulSum op's scalar", premul->pointer,
                                             device.device(), element));
  WEFT_RETURN_IF_ERROR(comm.usable());
  if (call.collective == algo::Collective::AllToAllv && params.in_place)
    return Error(weftInvalidArgument, "alltoallv has no in-place form");
  WEFT_RETURN_IF_ERROR(announce_call(comm, call, params, premul != nullptr));
  if (call.collective == algo::Collective::AllToAllv) {
    // Each rank's pieces to and from each peer, as one list of messages: no rank needs the
    // others' counts (a receive that does not match its peer's send hangs until the timeout).
    std::vector<algo::P2pMessage> sends, receives;
    const auto send = reinterpret_cast<uintptr_t>(call.send);
    const auto recv = reinterpret_cast<uintptr_t>(call.recv);
    for (int p = 0; p < comm.nranks(); ++p) {
      sends.push_back({p, send + call.send_displs[p] * element, call.send_counts[p] * element});
      receives.push_back({p, recv + call.recv_displs[p] * element, call.recv_counts[p] * element});
    }
    comm.note_launch(name);
    return enqueue_p2p(comm, stream, sends, receives, name);
  }

  algo::Algorithm forced;
  const uint64_t bytes = call.count * element;
  const bool is_forced = comm.tuner().context().overrides.find(call.collective, bytes, &forced);
  std::shared_ptr<const DeviceProgram> program;
  WEFT_RETURN_IF_ERROR(device.plan(params, element, is_forced ? &forced : nullptr, &program));
  DeviceOp op;
  op.program = program.get();
  op.input = reinterpret_cast<drv::DevicePtr>(call.send);
  op.output = reinterpret_cast<drv::DevicePtr>(call.recv);
  describe_math(comm, call, algo::input_count(params), element, premul, &op.math);
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

Status submit_p2p(const P2PCall& call, Stream* stream) {
  Communicator& comm = *call.comm;
  const char* name = call.is_send ? "send" : "recv";
  WEFT_RETURN_IF_ERROR(check_stream(comm, stream, name));
  DeviceComm& device = *comm.device();
  if (call.bytes > 0)
    WEFT_RETURN_IF_ERROR(check_device_memory(name, call.is_send ? "sendbuff" : "recvbuff",
                                             call.buffer, device.device(), call.bytes));
  const algo::P2pMessage message{call.peer, reinterpret_cast<uintptr_t>(call.buffer), call.bytes};
  if (!in_group()) {
    WEFT_RETURN_IF_ERROR(comm.usable());
    if (call.peer == comm.rank())
      return Error(weftInvalidUsage,
                   "peer %d is this rank: a send or receive to self outside weftGroupStart/End "
                   "would wait for itself",
                   call.peer);
    const std::vector<algo::P2pMessage> one{message}, none;
    return enqueue_p2p(comm, stream, call.is_send ? one : none, call.is_send ? none : one, name);
  }
  auto it = std::find_if(t_group_p2p.begin(), t_group_p2p.end(),
                         [&](const GroupedP2p& g) { return g.comm == &comm; });
  if (it == t_group_p2p.end()) {
    t_group_p2p.push_back({&comm, stream, {}, {}});
    it = t_group_p2p.end() - 1;
  } else if (it->stream != stream) {
    return Error(weftInvalidUsage,
                 "%s: every send and receive of a group on one communicator must use the same "
                 "stream (they run as one operation on it)",
                 name);
  }
  (call.is_send ? it->sends : it->receives).push_back(message);
  return Status::Ok();
}

Status flush_group_p2p() {
  if (t_group_p2p.empty()) return Status::Ok();  // every host group asks
  std::vector<GroupedP2p> pending = std::move(t_group_p2p);
  t_group_p2p.clear();
  Status first;
  for (GroupedP2p& g : pending) {
    Status status = g.comm->usable();
    if (status.ok()) status = enqueue_p2p(*g.comm, g.stream, g.sends, g.receives, "send/recv");
    if (!status.ok() && first.ok()) first = status;
  }
  return first;
}

void drop_group_p2p() {
  t_group_p2p.clear();
}

}  // namespace weft::cuda
