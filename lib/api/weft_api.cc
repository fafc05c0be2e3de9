// The C ABI: validates every argument, runs the call in the core, and turns a
// failed Status into a result code plus the thread's last-error message.
#include <cstring>
#include <memory>
#include <string>

#include "api/comm_handle.h"
#include "common/dtype.h"
#include "common/env.h"
#include "common/log.h"
#include "common/status.h"
#include "core/bootstrap.h"
#include "core/collectives.h"
#include "core/communicator.h"
#include "core/env_launch.h"
#include "core/group.h"
#include "core/reduce/numeric_types.h"
#include "core/registry.h"
#include "core/stream.h"
#include "weft/weft.h"

using weft::Error;
using weft::Status;

namespace {

weftResult_t report(const Status& status, const char* function) {
  if (status.ok()) return weftSuccess;
  std::string message = std::string(function) + ": " + status.message();
  weft::set_last_error(message);
  WEFT_LOG(INFO, INIT, "%s failed (%s): %s", function, weft::result_string(status.code()),
           message.c_str());
  return status.code();
}

// A failure inside a group is also reported by the group's end.
weftResult_t report_call(const Status& status, const char* function) {
  if (!status.ok()) weft::group_record_error(status);
  return report(status, function);
}

Status read_config(const weftConfig_t* config, weft::CommConfig* out) {
  if (config == nullptr) return Status::Ok();
  if (config->magic != WEFT_CONFIG_MAGIC)
    return Error(weftInvalidArgument,
                 "config was not initialised with WEFT_CONFIG_INITIALIZER (magic 0x%x)",
                 config->magic);
  if (config->size < offsetof(weftConfig_t, blocking) + sizeof(int))
    return Error(weftInvalidArgument, "config->size %zu is too small", config->size);
  // Fields beyond the caller's size are from a newer header: treat as unset.
  auto has = [&](size_t offset, size_t bytes) { return config->size >= offset + bytes; };
  if (has(offsetof(weftConfig_t, blocking), sizeof(int)) &&
      config->blocking != WEFT_CONFIG_UNDEF_INT) {
    if (config->blocking != 0 && config->blocking != 1)
      return Error(weftInvalidArgument, "config->blocking must be 0 or 1, not %d",
                   config->blocking);
    out->blocking = config->blocking == 1;
  }
  if (has(offsetof(weftConfig_t, timeoutMs), sizeof(int)) &&
      config->timeoutMs != WEFT_CONFIG_UNDEF_INT) {
    if (config->timeoutMs <= 0)
      return Error(weftInvalidArgument, "config->timeoutMs must be positive, not %d",
                   config->timeoutMs);
    out->timeout_ms = config->timeoutMs;
  }
  if (has(offsetof(weftConfig_t, commName), sizeof(const char*)) && config->commName != nullptr)
    out->name = config->commName;
  if (has(offsetof(weftConfig_t, algorithms), sizeof(const char*)) && config->algorithms != nullptr)
    out->algorithms = config->algorithms;
  return Status::Ok();
}

// An enum argument's value as the caller passed it. Callers of a C ABI can
// pass any int; reading it as int first keeps out-of-range values defined.
// Reads through a pointer, never as an enum-typed value, so that even an
// out-of-range argument is well defined.
template <typename Enum>
int raw_value(const Enum* value) {
  int raw;
  static_assert(sizeof(raw) == sizeof(Enum));
  memcpy(&raw, value, sizeof(raw));
  return raw;
}

Status check_dtype(int raw) {
  if (raw < 0 || raw >= weftNumTypes)
    return Error(weftInvalidArgument, "datatype %d is not a valid weftDataType_t", raw);
  return Status::Ok();
}

Status check_op(int raw) {
  if (raw < 0) return Error(weftInvalidArgument, "op %d is not a valid weftRedOp_t", raw);
  return Status::Ok();
}

Status check_out_pointer(const void* pointer, const char* name) {
  if (pointer == nullptr) return Error(weftInvalidArgument, "%s is NULL", name);
  return Status::Ok();
}

Status check_rank_args(int nranks, int rank) {
  if (nranks < 1 || nranks > weft::kMaxRanks)
    return Error(weftInvalidArgument, "nranks %d is out of range [1, %d]", nranks, weft::kMaxRanks);
  if (rank < 0 || rank >= nranks)
    return Error(weftInvalidArgument, "rank %d is out of range [0, %d)", rank, nranks);
  return Status::Ok();
}

Status init_rank(weftComm_t* comm, int nranks, const weftUniqueId& id, int rank,
                 const weftConfig_t* config) {
  WEFT_RETURN_IF_ERROR(check_out_pointer(comm, "comm"));
  *comm = nullptr;
  WEFT_RETURN_IF_ERROR(check_rank_args(nranks, rank));
  weft::CommConfig comm_config;
  WEFT_RETURN_IF_ERROR(read_config(config, &comm_config));
  weft::RootAddress root;
  WEFT_RETURN_IF_ERROR(weft::decode_unique_id(id, &root));
  std::unique_ptr<weft::Communicator> impl;
  WEFT_RETURN_IF_ERROR(weft::Communicator::create(root, nranks, rank, comm_config, &impl));
  *comm = weft::wrap_comm(std::move(impl));
  return Status::Ok();
}

// The stream behind a handle: null for NULL, an error for anything else unknown.
Status resolve_stream(weftStream_t stream, weft::Stream** out) {
  *out = reinterpret_cast<weft::Stream*>(stream);
  if (stream != nullptr && (*out)->magic != weft::Stream::kMagic)
    return Error(weftInvalidArgument, "stream is not a weftStream_t (destroyed?)");
  return Status::Ok();
}

Status resolve_event(weftEvent_t event, weft::Event** out) {
  *out = reinterpret_cast<weft::Event*>(event);
  if (event == nullptr) return Error(weftInvalidArgument, "event is NULL");
  if ((*out)->magic != weft::Event::kMagic)
    return Error(weftInvalidArgument, "event is not a weftEvent_t (destroyed?)");
  return Status::Ok();
}

// Validates a point-to-point call and hands it to the group machinery.
Status p2p(void* buffer, size_t count, int raw_dtype, int peer, weftComm_t comm,
           weftStream_t stream, bool is_send) {
  weft::Communicator* impl = nullptr;
  WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
  WEFT_RETURN_IF_ERROR(impl->usable());
  WEFT_RETURN_IF_ERROR(check_dtype(raw_dtype));
  auto datatype = static_cast<weftDataType_t>(raw_dtype);
  size_t element = weft::dtype_size(datatype);
  if (count > SIZE_MAX / element)
    return Error(weftInvalidArgument, "count %zu of %s overflows the addressable size", count,
                 weft::dtype_name(datatype));
  if (buffer == nullptr && count > 0)
    return Error(weftInvalidArgument, "%s is NULL with count %zu",
                 is_send ? "sendbuff" : "recvbuff", count);
  if (peer < 0 || peer >= impl->nranks())
    return Error(weftInvalidArgument, "peer %d is out of range [0, %d)", peer, impl->nranks());
  weft::Stream* queue = nullptr;
  WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
  return weft::submit_p2p({impl, is_send, buffer, count * element, peer}, queue);
}

using Coll = weft::algo::Collective;

Status run_collective(const weft::CollectiveCall& call, weftComm_t comm, weftStream_t stream) {
  weft::Communicator* impl = nullptr;
  WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
  weft::Stream* queue = nullptr;
  WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
  return weft::submit_collective(*impl, call, queue);
}

Status collective(Coll kind, const void* send, void* recv, size_t count, int raw_dtype,
                  int raw_op, int root, weftComm_t comm, weftStream_t stream) {
  WEFT_RETURN_IF_ERROR(check_dtype(raw_dtype));
  WEFT_RETURN_IF_ERROR(check_op(raw_op));
  auto dtype = static_cast<weftDataType_t>(raw_dtype);
  auto op = static_cast<weftRedOp_t>(raw_op);
  weft::CollectiveCall call;
  call.collective = kind;
  call.send = send;
  call.recv = recv;
  call.count = count;
  call.dtype = dtype;
  call.op = op;
  call.root = root;
  return run_collective(call, comm, stream);
}

// One loop per direction and format: each element through the scalar
// conversions the reduction kernels are tested against.
template <typename Bits, float (*Widen)(Bits)>
void widen_all(const void* in, float* out, size_t count) {
  const auto* bits = static_cast<const Bits*>(in);
  for (size_t i = 0; i < count; ++i) out[i] = Widen(bits[i]);
}
template <typename Bits, Bits (*Narrow)(float)>
void narrow_all(const float* in, void* out, size_t count) {
  auto* bits = static_cast<Bits*>(out);
  for (size_t i = 0; i < count; ++i) bits[i] = Narrow(in[i]);
}

Status check_conversion(int raw_dtype, const void* in, const void* out, size_t count) {
  WEFT_RETURN_IF_ERROR(check_dtype(raw_dtype));
  auto dtype = static_cast<weftDataType_t>(raw_dtype);
  if (!weft::dtype_is_floating(dtype))
    return Error(weftInvalidArgument, "datatype %s is not a floating-point type",
                 weft::dtype_name(dtype));
  if (count > 0 && in == nullptr)
    return Error(weftInvalidArgument, "in is NULL with count %zu", count);
  if (count > 0 && out == nullptr)
    return Error(weftInvalidArgument, "out is NULL with count %zu", count);
  return Status::Ok();
}

}  // namespace

extern "C" {

weftResult_t weftGetVersion(int* version) {
  if (version == nullptr) return report(Error(weftInvalidArgument, "version is NULL"), __func__);
  *version = WEFT_VERSION;
  return weftSuccess;
}

const char* weftGetErrorString(weftResult_t result) {
  return weft::result_string(result);
}

const char* weftGetLastError(weftComm_t) {
  return weft::last_error();
}

weftResult_t weftGetUniqueId(weftUniqueId* unique_id) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(unique_id, "uniqueId"));
    weft::RootAddress root;
    WEFT_RETURN_IF_ERROR(weft::choose_interface_address(&root.address, nullptr));
    WEFT_RETURN_IF_ERROR(weft::random_bytes(root.secret.data(), root.secret.size()));
    WEFT_RETURN_IF_ERROR(weft::start_root(&root, weft::default_timeout_ms()));
    return weft::encode_unique_id(root, unique_id);
  };
  return report(run(), __func__);
}

weftResult_t weftCommInitRank(weftComm_t* comm, int nranks, weftUniqueId comm_id, int rank) {
  return report(init_rank(comm, nranks, comm_id, rank, nullptr), __func__);
}

weftResult_t weftCommInitRankConfig(weftComm_t* comm, int nranks, weftUniqueId comm_id, int rank,
                                    weftConfig_t* config) {
  return report(init_rank(comm, nranks, comm_id, rank, config), __func__);
}

weftResult_t weftCommInitFromEnv(weftComm_t* comm, weftConfig_t* config) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(comm, "comm"));
    *comm = nullptr;
    weft::CommConfig comm_config;
    WEFT_RETURN_IF_ERROR(read_config(config, &comm_config));
    weft::LaunchInfo launch;
    WEFT_RETURN_IF_ERROR(weft::read_launch_env(&launch));
    if (comm_config.timeout_ms <= 0) comm_config.timeout_ms = weft::default_timeout_ms();
    if (launch.rank == 0) {
      weft::RootAddress listen = launch.root;
      WEFT_RETURN_IF_ERROR(weft::listen_address_for(launch.root.address, &listen.address));
      WEFT_RETURN_IF_ERROR(weft::start_root(&listen, comm_config.timeout_ms));
    }
    std::unique_ptr<weft::Communicator> impl;
    WEFT_RETURN_IF_ERROR(
        weft::Communicator::create(launch.root, launch.nranks, launch.rank, comm_config, &impl));
    *comm = weft::wrap_comm(std::move(impl));
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t* newcomm,
                           weftConfig_t* config) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(newcomm, "newcomm"));
    *newcomm = nullptr;
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    if (color < 0 && color != WEFT_SPLIT_NOCOLOR)
      return Error(weftInvalidArgument, "color %d is negative and not WEFT_SPLIT_NOCOLOR", color);
    weft::CommConfig comm_config;
    comm_config.blocking = impl->config().blocking;
    WEFT_RETURN_IF_ERROR(read_config(config, &comm_config));
    std::unique_ptr<weft::Communicator> child;
    WEFT_RETURN_IF_ERROR(impl->split(color, key, comm_config, &child));
    if (child) *newcomm = weft::wrap_comm(std::move(child));
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommCount(const weftComm_t comm, int* count) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(count, "count"));
    *count = impl->nranks();
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommLastAlgorithm(weftComm_t comm, const char** algorithm, double* predicted_us) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(algorithm, "algorithm"));
    *algorithm = impl->tuner().last_algorithm();
    if (predicted_us != nullptr) *predicted_us = impl->tuner().last_predicted_us();
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommUserRank(const weftComm_t comm, int* rank) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(rank, "rank"));
    *rank = impl->rank();
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommFinalize(weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    weft::StreamEngine::instance().wait_for_comm(impl);  // outstanding work completes first
    return impl->finalize();
  };
  return report(run(), __func__);
}

weftResult_t weftCommDestroy(weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    // Queued stream work on this communicator finishes (or fails) first.
    weft::StreamEngine::instance().wait_for_comm(impl);
    Status finalized = impl->finalize();
    weft::retire_comm(comm);
    return finalized;
  };
  return report(run(), __func__);
}

weftResult_t weftCommAbort(weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    impl->abort();  // queued stream work fails promptly
    weft::StreamEngine::instance().wait_for_comm(impl);
    weft::retire_comm(comm);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t* async_error) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(async_error, "asyncError"));
    *async_error = impl->async_error();
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftSend(const void* sendbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  return report_call(p2p(const_cast<void*>(sendbuff), count, raw_value(&datatype), peer, comm, stream, true),
                     __func__);
}

weftResult_t weftRecv(void* recvbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  return report_call(p2p(recvbuff, count, raw_value(&datatype), peer, comm, stream, false), __func__);
}

weftResult_t weftGroupStart(void) {
  return report(weft::group_start(), __func__);
}

weftResult_t weftGroupEnd(void) {
  return report(weft::group_end(), __func__);
}

weftResult_t weftBarrier(weftComm_t comm, weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    weft::CollectiveCall call;
    call.collective = weft::algo::Collective::Barrier;
    return run_collective(call, comm, stream);
  };
  return report_call(run(), __func__);
}

weftResult_t weftAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                           weftStream_t stream) {
  return report_call(
      collective(Coll::AllReduce, sendbuff, recvbuff, count, raw_value(&datatype), raw_value(&op), 0, comm, stream),
      __func__);
}

weftResult_t weftReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               weftStream_t stream) {
  return report_call(
      collective(Coll::ReduceScatter, sendbuff, recvbuff, recvcount, raw_value(&datatype), raw_value(&op), 0, comm, stream),
      __func__);
}

weftResult_t weftAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  return report_call(collective(Coll::AllGather, sendbuff, recvbuff, sendcount, raw_value(&datatype), weftSum,
                                0, comm, stream),
                     __func__);
}

weftResult_t weftBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm,
                           weftStream_t stream) {
  return report_call(
      collective(Coll::Broadcast, sendbuff, recvbuff, count, raw_value(&datatype), weftSum, root, comm, stream),
      __func__);
}

weftResult_t weftBcast(void* buff, size_t count, weftDataType_t datatype, int root, weftComm_t comm,
                       weftStream_t stream) {
  return report_call(
      collective(Coll::Broadcast, buff, buff, count, raw_value(&datatype), weftSum, root, comm, stream),
      __func__);
}

weftResult_t weftReduce(const void* sendbuff, void* recvbuff, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  return report_call(
      collective(Coll::Reduce, sendbuff, recvbuff, count, raw_value(&datatype), raw_value(&op), root, comm, stream),
      __func__);
}

weftResult_t weftAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  return report_call(
      collective(Coll::AllToAll, sendbuff, recvbuff, count, raw_value(&datatype), weftSum, 0, comm, stream),
      __func__);
}

weftResult_t weftAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::CollectiveCall call;
    WEFT_RETURN_IF_ERROR(check_dtype(raw_value(&datatype)));
    call.collective = Coll::AllToAllv;
    call.send = sendbuff;
    call.recv = recvbuff;
    call.dtype = datatype;
    call.send_counts = sendcounts;
    call.send_displs = sdispls;
    call.recv_counts = recvcounts;
    call.recv_displs = rdispls;
    return run_collective(call, comm, stream);
  };
  return report_call(run(), __func__);
}

weftResult_t weftGather(const void* sendbuff, void* recvbuff, size_t count, weftDataType_t datatype,
                        int root, weftComm_t comm, weftStream_t stream) {
  return report_call(
      collective(Coll::Gather, sendbuff, recvbuff, count, raw_value(&datatype), weftSum, root, comm, stream),
      __func__);
}

weftResult_t weftScatter(const void* sendbuff, void* recvbuff, size_t count,
                         weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  return report_call(
      collective(Coll::Scatter, sendbuff, recvbuff, count, raw_value(&datatype), weftSum, root, comm, stream),
      __func__);
}

weftResult_t weftStreamCreate(weftStream_t* stream) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(stream, "stream"));
    auto* created = new weft::Stream();
    weft::StreamEngine::instance().add_stream(created);
    *stream = reinterpret_cast<weftStream_t>(created);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftStreamDestroy(weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    if (queue == nullptr) return Error(weftInvalidArgument, "stream is NULL");
    Status drained = weft::StreamEngine::instance().remove_stream(queue);
    queue->magic = 0;
    delete queue;
    return drained;
  };
  return report(run(), __func__);
}

weftResult_t weftStreamSynchronize(weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    if (queue == nullptr) return Status::Ok();  // the NULL stream is always done
    return weft::StreamEngine::instance().synchronize(queue);
  };
  return report(run(), __func__);
}

weftResult_t weftStreamQuery(weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    if (queue == nullptr) return Status::Ok();
    return weft::StreamEngine::instance().query(queue);
  };
  Status status = run();
  return status.code() == weftInProgress ? weftInProgress : report(status, __func__);
}

weftResult_t weftStreamWaitEvent(weftStream_t stream, weftEvent_t event) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    weft::Event* marker = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    WEFT_RETURN_IF_ERROR(resolve_event(event, &marker));
    if (queue == nullptr) return weft::StreamEngine::instance().event_synchronize(marker);
    weft::StreamEngine::instance().enqueue_wait(queue, marker);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftEventCreate(weftEvent_t* event) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(event, "event"));
    *event = reinterpret_cast<weftEvent_t>(new weft::Event());
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftEventRecord(weftEvent_t event, weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    weft::Event* marker = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_event(event, &marker));
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    if (queue == nullptr)
      return Error(weftInvalidArgument,
                   "stream is NULL: NULL-stream work is complete at once, "
                   "so there is nothing to record");
    weft::StreamEngine::instance().enqueue_record(queue, marker);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftEventSynchronize(weftEvent_t event) {
  auto run = [&]() -> Status {
    weft::Event* marker = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_event(event, &marker));
    return weft::StreamEngine::instance().event_synchronize(marker);
  };
  return report(run(), __func__);
}

weftResult_t weftEventQuery(weftEvent_t event) {
  auto run = [&]() -> Status {
    weft::Event* marker = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_event(event, &marker));
    return weft::StreamEngine::instance().event_query(marker);
  };
  Status status = run();
  return status.code() == weftInProgress ? weftInProgress : report(status, __func__);
}

weftResult_t weftEventDestroy(weftEvent_t event) {
  auto run = [&]() -> Status {
    weft::Event* marker = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_event(event, &marker));
    // Streams may still refer to it: wait until they have passed it.
    weft::StreamEngine::instance().forget_event(marker);
    marker->magic = 0;
    delete marker;
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftRedOpCreatePreMulSum(weftRedOp_t* op, void* scalar, weftDataType_t datatype,
                                      weftScalarResidence_t residence, weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(op, "op"));
    WEFT_RETURN_IF_ERROR(check_out_pointer(scalar, "scalar"));
    WEFT_RETURN_IF_ERROR(check_dtype(raw_value(&datatype)));
    size_t element = weft::dtype_size(datatype);
    int raw_residence = raw_value(&residence);
    if (raw_residence != weftScalarDevice && raw_residence != weftScalarHostImmediate)
      return Error(weftInvalidArgument, "residence %d is not a weftScalarResidence_t",
                   raw_residence);
    weft::Communicator::PreMulSum definition{};
    definition.dtype = datatype;
    definition.immediate = residence == weftScalarHostImmediate;
    if (definition.immediate)
      memcpy(definition.value, scalar, element);
    else
      definition.pointer = scalar;  // host memory read at each call (no GPU yet)
    return impl->create_premulsum(definition, op);
  };
  return report(run(), __func__);
}

weftResult_t weftRedOpDestroy(weftRedOp_t op, weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_op(raw_value(&op)));
    return impl->destroy_premulsum(op);
  };
  return report(run(), __func__);
}

weftResult_t weftMemAlloc(void** ptr, size_t size) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(ptr, "ptr"));
    *ptr = nullptr;
    return weft::shared_alloc(size, ptr);
  };
  return report(run(), __func__);
}

weftResult_t weftMemFree(void* ptr) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(ptr, "ptr"));
    return weft::shared_free(ptr);
  };
  return report(run(), __func__);
}

weftResult_t weftCommRegister(const weftComm_t comm, void* buff, size_t size, void** handle) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(handle, "handle"));
    *handle = nullptr;
    WEFT_RETURN_IF_ERROR(check_out_pointer(buff, "buff"));
    if (size == 0) return Error(weftInvalidArgument, "size is 0");
    return impl->registry().add(buff, size, handle);
  };
  return report(run(), __func__);
}

weftResult_t weftCommDeregister(const weftComm_t comm, void* handle) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(handle, "handle"));
    return impl->registry().remove(handle);
  };
  return report(run(), __func__);
}

weftResult_t weftConvertFromFloat(weftDataType_t datatype, const float* in, void* out,
                                  size_t count) {
  auto run = [&]() -> Status {
    int raw = raw_value(&datatype);
    WEFT_RETURN_IF_ERROR(check_conversion(raw, in, out, count));
    namespace r = weft::reduce;
    switch (raw) {
      case weftFloat16:
        narrow_all<uint16_t, r::float_to_fp16>(in, out, count);
        break;
      case weftBfloat16:
        narrow_all<uint16_t, r::float_to_bf16>(in, out, count);
        break;
      case weftFloat8e4m3:
        narrow_all<uint8_t, r::float_to_fp8e4m3>(in, out, count);
        break;
      case weftFloat8e5m2:
        narrow_all<uint8_t, r::float_to_fp8e5m2>(in, out, count);
        break;
      case weftFloat32:
        if (count > 0) memmove(out, in, count * sizeof(float));
        break;
      default:
        for (size_t i = 0; i < count; ++i) static_cast<double*>(out)[i] = in[i];
    }
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftConvertToFloat(weftDataType_t datatype, const void* in, float* out, size_t count) {
  auto run = [&]() -> Status {
    int raw = raw_value(&datatype);
    WEFT_RETURN_IF_ERROR(check_conversion(raw, in, out, count));
    namespace r = weft::reduce;
    switch (raw) {
      case weftFloat16:
        widen_all<uint16_t, r::fp16_to_float>(in, out, count);
        break;
      case weftBfloat16:
        widen_all<uint16_t, r::bf16_to_float>(in, out, count);
        break;
      case weftFloat8e4m3:
        widen_all<uint8_t, r::fp8e4m3_to_float>(in, out, count);
        break;
      case weftFloat8e5m2:
        widen_all<uint8_t, r::fp8e5m2_to_float>(in, out, count);
        break;
      case weftFloat32:
        if (count > 0) memmove(out, in, count * sizeof(float));
        break;
      default:
        for (size_t i = 0; i < count; ++i)
          out[i] = static_cast<float>(static_cast<const double*>(in)[i]);
    }
    return Status::Ok();
  };
  return report(run(), __func__);
}

}  // extern "C"
