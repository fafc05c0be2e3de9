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
#include "core/cuda/device_comm.h"
#include "core/cuda/driver.h"
#include "core/env_launch.h"
#include "core/group.h"
#include "core/reduce/numeric_types.h"
#include "core/registry.h"
#include "core/stream.h"
#include "weft/weft.h"

using weft::Error;
using weft::Status;

namespace {

// A failed status as report() returns it: the thread's last error set, the failure logged.
[[gnu::cold]] weftResult_t report_failure(const Status& status, const char* function) {
  std::string message = std::string(function) + ": " + status.message();
  weft::set_last_error(message);
  WEFT_LOG(INFO, INIT, "%s failed (%s): %s", function, weft::result_string(status.code()),
           message.c_str());
  return status.code();
}

weftResult_t report(const Status& status, const char* function) {
  return status.ok() ? weftSuccess : report_failure(status, function);
}

// A failure inside a group is also reported by the group's end.
weftResult_t report_call(const Status& status, const char* function) {
  if (status.ok()) return weftSuccess;
  weft::group_record_error(status);
  return report_failure(status, function);
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
  if (has(offsetof(weftConfig_t, cudaDevice), sizeof(int)) &&
      config->cudaDevice != WEFT_CONFIG_UNDEF_INT) {
    if (config->cudaDevice < 0)
      return Error(weftInvalidArgument,
                   "config->cudaDevice must be a CUDA device ordinal (0 or more), not %d",
                   config->cudaDevice);
    out->cuda_device = config->cudaDevice;
  }
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

// Weft events order host streams; on a CUDA stream they would order nothing.
Status check_host_stream(const weft::Stream* queue) {
  if (queue != nullptr && queue->cuda.bound)
    return Error(weftInvalidUsage,
                 "stream wraps a cudaStream_t: Weft events on CUDA streams are not supported "
                 "yet; use cudaEventRecord / cudaStreamWaitEvent on the cudaStream_t");
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
  if (count > 0 && impl->device() == nullptr && (queue == nullptr || !queue->cuda.bound))
    WEFT_RETURN_IF_ERROR(weft::cuda::check_host_memory(is_send ? "weftSend" : "weftRecv",
                                                       is_send ? "sendbuff" : "recvbuff", buffer));
  return weft::submit_p2p({impl, is_send, buffer, count * element, peer}, queue);
}

using Coll = weft::algo::Collective;

inline Status run_collective(const weft::CollectiveCall& call, weftComm_t comm,
                             weftStream_t stream) {
  weft::Communicator* impl = nullptr;
  WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
  weft::Stream* queue = nullptr;
  WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
  return weft::submit_collective(*impl, call, queue);
}

Status collective(Coll kind, const void* send, void* recv, size_t count, int raw_dtype, int raw_op,
                  int root, weftComm_t comm, weftStream_t stream) {
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

// One loop per format and direction: each element through the scalar
// conversions the reduction kernels are tested against.
float double_to_float(double d) {
  return static_cast<float>(d);
}
double float_to_double(float f) {
  return f;
}

template <bool kToFloat, typename Bits, float (*Widen)(Bits), Bits (*Narrow)(float)>
void convert_each(const void* in, void* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if constexpr (kToFloat)
      static_cast<float*>(out)[i] = Widen(static_cast<const Bits*>(in)[i]);
    else
      static_cast<Bits*>(out)[i] = Narrow(static_cast<const float*>(in)[i]);
  }
}

// Between fp32 and the floating type raw_dtype (checked), in either direction.
template <bool kToFloat>
void convert_all(int raw_dtype, const void* in, void* out, size_t count) {
  namespace r = weft::reduce;
  switch (raw_dtype) {
    case weftFloat16:
      return convert_each<kToFloat, uint16_t, r::fp16_to_float, r::float_to_fp16>(in, out, count);
    case weftBfloat16:
      return convert_each<kToFloat, uint16_t, r::bf16_to_float, r::float_to_bf16>(in, out, count);
    case weftFloat8e4m3:
      return convert_each<kToFloat, uint8_t, r::fp8e4m3_to_float, r::float_to_fp8e4m3>(in, out,
                                                                                       count);
    case weftFloat8e5m2:
      return convert_each<kToFloat, uint8_t, r::fp8e5m2_to_float, r::float_to_fp8e5m2>(in, out,
                                                                                       count);
    case weftFloat32:
      if (count > 0) memmove(out, in, count * sizeof(float));
      return;
    default:
      return convert_each<kToFloat, double, double_to_float, float_to_double>(in, out, count);
  }
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

template <bool kToFloat>
weftResult_t convert_checked(weftDataType_t datatype, const void* in, void* out, size_t count,
                             const char* entry_point) {
  int raw = raw_value(&datatype);
  Status status = check_conversion(raw, in, out, count);
  if (status.ok()) convert_all<kToFloat>(raw, in, out, count);
  return report(status, entry_point);
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
    if (weft::env_string("WEFT_SOCKET_IFNAME")) {
      // The rendezvous is at WEFT_ROOT, but naming an interface that does not
      // exist is a mistake to stop at, not to ignore.
      weft::SocketAddress unused;
      WEFT_RETURN_IF_ERROR(weft::choose_interface_address(&unused, nullptr));
    }
    if (comm_config.timeout_ms <= 0) comm_config.timeout_ms = weft::default_timeout_ms();
    if (launch.rank == 0) {
      weft::RootAddress listen = launch.root;
      WEFT_RETURN_IF_ERROR(weft::listen_address_for(launch.root.address, &listen.address));
      WEFT_RETURN_IF_ERROR(weft::start_root(&listen, comm_config.timeout_ms));
      // Port 0 (one rank, no address given): the listener chose one.
      launch.root.address.set_port(listen.address.port());
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
    comm_config.cuda_device = impl->config().cuda_device;
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
    if (const weft::cuda::DeviceComm* device = impl->device()) {
      *algorithm = device->last_algorithm();
      if (predicted_us != nullptr) *predicted_us = device->last_predicted_us();
      return Status::Ok();
    }
    *algorithm = impl->tuner().last_algorithm();
    if (predicted_us != nullptr) *predicted_us = impl->tuner().last_predicted_us();
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommPredictTime(weftComm_t comm, const char* collective, size_t bytes,
                                 double* predicted_us) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(collective, "collective"));
    WEFT_RETURN_IF_ERROR(check_out_pointer(predicted_us, "predictedUs"));
    Coll kind;
    if (!weft::algo::parse_collective(collective, &kind))
      return Error(weftInvalidArgument, "collective '%s' is not a collective name", collective);
    // The tuner's choice: the fastest candidate, or the forced one (WEFT_ALGO).
    weft::algo::Algorithm forced;
    const bool is_forced = impl->tuner().context().overrides.find(kind, bytes, &forced);
    *predicted_us = -1;
    for (const weft::Candidate& candidate : impl->tuner().candidates(kind, bytes)) {
      if (!is_forced || candidate.algorithm == forced) {
        *predicted_us = candidate.time_us;
        break;
      }
    }
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
    if (size_t queued = weft::group_ops_of(impl))
      return Error(weftInvalidUsage,
                   "the open group holds %zu operation(s) of this communicator: call "
                   "weftGroupEnd first (the communicator is not destroyed)",
                   queued);
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
    // The open group's operations of this communicator cannot run any more:
    // the group fails at its end instead of using a communicator that is gone.
    if (weft::group_ops_of(impl) > 0)
      weft::group_record_error(Error(weftInvalidUsage,
                                     "weftCommAbort aborted a communicator "
                                     "with operations in the group"));
    impl->abort();  // queued stream work fails promptly
    weft::StreamEngine::instance().wait_for_comm(impl);
    weft::retire_comm(comm);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommRevoke(weftComm_t comm) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    impl->revoke();  // fails every wait on comm; freeing is left to abort or destroy
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommShrink(weftComm_t comm, const int* exclude_ranks, int n_exclude,
                            weftComm_t* newcomm, weftConfig_t* config, int shrink_flags) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(newcomm, "newcomm"));
    *newcomm = nullptr;
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    if (shrink_flags != WEFT_SHRINK_DEFAULT && shrink_flags != WEFT_SHRINK_ABORT)
      return Error(weftInvalidArgument,
                   "shrinkFlags %d is neither WEFT_SHRINK_DEFAULT nor WEFT_SHRINK_ABORT",
                   shrink_flags);
    if (n_exclude < 0) return Error(weftInvalidArgument, "nExclude %d is negative", n_exclude);
    if (n_exclude > 0 && exclude_ranks == nullptr)
      return Error(weftInvalidArgument, "excludeRanks is NULL with nExclude %d", n_exclude);
    std::vector<bool> seen(impl->nranks(), false);
    for (int i = 0; i < n_exclude; ++i) {
      const int excluded = exclude_ranks[i];
      if (excluded < 0 || excluded >= impl->nranks())
        return Error(weftInvalidArgument, "excludeRanks[%d] = %d is not a rank of comm (0..%d)", i,
                     excluded, impl->nranks() - 1);
      if (seen[excluded])
        return Error(weftInvalidArgument, "excludeRanks[%d] = %d is listed twice", i, excluded);
      seen[excluded] = true;
    }
    if (n_exclude == impl->nranks())
      return Error(weftInvalidArgument, "excludeRanks names all %d ranks of comm: nobody is left",
                   n_exclude);
    if (seen[impl->rank()])
      return Error(weftInvalidUsage,
                   "rank %d is in excludeRanks: only the ranks that stay call weftCommShrink (this "
                   "rank has no place in the new communicator)",
                   impl->rank());
    if (weft::group_ops_of(impl) > 0)
      return Error(weftInvalidUsage,
                   "the open group holds operations of comm: call weftGroupEnd before "
                   "weftCommShrink");
    weft::CommConfig comm_config;
    comm_config.blocking = impl->config().blocking;
    comm_config.cuda_device = impl->config().cuda_device;
    WEFT_RETURN_IF_ERROR(read_config(config, &comm_config));
    if (shrink_flags == WEFT_SHRINK_ABORT) impl->revoke();
    // The parent's queued stream work ends (or fails) before its members change.
    weft::StreamEngine::instance().wait_for_comm(impl);
    std::unique_ptr<weft::Communicator> child;
    WEFT_RETURN_IF_ERROR(
        impl->shrink(std::span<const int>(exclude_ranks, n_exclude), comm_config, &child));
    *newcomm = weft::wrap_comm(std::move(child));
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t* async_error) {
  auto run = [&]() -> Status {
    weft::Communicator* impl = nullptr;
    WEFT_RETURN_IF_ERROR(weft::resolve_comm(comm, &impl));
    WEFT_RETURN_IF_ERROR(check_out_pointer(async_error, "asyncError"));
    *async_error = impl->settled_async_error();
    // Why, for weftGetLastError (NCCL's watchdog users print it next).
    if (*async_error != weftSuccess)
      weft::set_last_error("weftCommGetAsyncError: " + impl->failure().message());
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftSend(const void* sendbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  return report_call(
      p2p(const_cast<void*>(sendbuff), count, raw_value(&datatype), peer, comm, stream, true),
      __func__);
}

weftResult_t weftRecv(void* recvbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  return report_call(p2p(recvbuff, count, raw_value(&datatype), peer, comm, stream, false),
                     __func__);
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
  return report_call(collective(Coll::AllReduce, sendbuff, recvbuff, count, raw_value(&datatype),
                                raw_value(&op), 0, comm, stream),
                     __func__);
}

weftResult_t weftReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               weftStream_t stream) {
  return report_call(collective(Coll::ReduceScatter, sendbuff, recvbuff, recvcount,
                                raw_value(&datatype), raw_value(&op), 0, comm, stream),
                     __func__);
}

weftResult_t weftAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  return report_call(collective(Coll::AllGather, sendbuff, recvbuff, sendcount,
                                raw_value(&datatype), weftSum, 0, comm, stream),
                     __func__);
}

weftResult_t weftBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm,
                           weftStream_t stream) {
  return report_call(collective(Coll::Broadcast, sendbuff, recvbuff, count, raw_value(&datatype),
                                weftSum, root, comm, stream),
                     __func__);
}

weftResult_t weftBcast(void* buff, size_t count, weftDataType_t datatype, int root, weftComm_t comm,
                       weftStream_t stream) {
  return report_call(collective(Coll::Broadcast, buff, buff, count, raw_value(&datatype), weftSum,
                                root, comm, stream),
                     __func__);
}

weftResult_t weftReduce(const void* sendbuff, void* recvbuff, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  return report_call(collective(Coll::Reduce, sendbuff, recvbuff, count, raw_value(&datatype),
                                raw_value(&op), root, comm, stream),
                     __func__);
}

weftResult_t weftAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  return report_call(collective(Coll::AllToAll, sendbuff, recvbuff, count, raw_value(&datatype),
                                weftSum, 0, comm, stream),
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
  return report_call(collective(Coll::Gather, sendbuff, recvbuff, count, raw_value(&datatype),
                                weftSum, root, comm, stream),
                     __func__);
}

weftResult_t weftScatter(const void* sendbuff, void* recvbuff, size_t count,
                         weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  return report_call(collective(Coll::Scatter, sendbuff, recvbuff, count, raw_value(&datatype),
                                weftSum, root, comm, stream),
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

weftResult_t weftStreamCreateFromCuda(void* cudaStream, weftStream_t* stream) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(stream, "stream"));
    weft::cuda::StreamInfo info;
    WEFT_RETURN_IF_ERROR(weft::cuda::inspect_stream(cudaStream, "cudaStream", &info));
    auto* created = new weft::Stream();
    created->cuda = {true, cudaStream, info.device};
    weft::StreamEngine::instance().add_stream(created);
    *stream = reinterpret_cast<weftStream_t>(created);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftPointerGetMemoryType(const void* ptr, weftMemoryType_t* type, int* device) {
  auto run = [&]() -> Status {
    WEFT_RETURN_IF_ERROR(check_out_pointer(type, "type"));
    weft::cuda::PointerInfo info = weft::cuda::pointer_info(ptr);
    *type = info.type;
    if (device != nullptr) *device = info.device;
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
    WEFT_RETURN_IF_ERROR(weft::StreamEngine::instance().synchronize(queue));
    return queue->cuda.bound ? weft::cuda::synchronize_stream(queue->cuda.stream) : Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftStreamQuery(weftStream_t stream) {
  auto run = [&]() -> Status {
    weft::Stream* queue = nullptr;
    WEFT_RETURN_IF_ERROR(resolve_stream(stream, &queue));
    if (queue == nullptr) return Status::Ok();
    WEFT_RETURN_IF_ERROR(weft::StreamEngine::instance().query(queue));
    return queue->cuda.bound ? weft::cuda::query_stream(queue->cuda.stream) : Status::Ok();
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
    WEFT_RETURN_IF_ERROR(check_host_stream(queue));
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
    WEFT_RETURN_IF_ERROR(check_host_stream(queue));
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

weftResult_t weftDataTypeSize(weftDataType_t datatype, size_t* size) {
  auto run = [&]() -> Status {
    int raw = raw_value(&datatype);
    WEFT_RETURN_IF_ERROR(check_dtype(raw));
    WEFT_RETURN_IF_ERROR(check_out_pointer(size, "size"));
    *size = weft::dtype_size(datatype);
    return Status::Ok();
  };
  return report(run(), __func__);
}

weftResult_t weftConvertFromFloat(weftDataType_t datatype, const float* in, void* out,
                                  size_t count) {
  return convert_checked<false>(datatype, in, out, count, __func__);
}

weftResult_t weftConvertToFloat(weftDataType_t datatype, const void* in, float* out, size_t count) {
  return convert_checked<true>(datatype, in, out, count, __func__);
}

}  // extern "C"
