// Collectives, point to point, memory, registration and custom ops. On a
// communicator made while a CUDA context was current (a GPU communicator)
// calls take device memory and are enqueued on their cudaStream_t (0: the
// legacy default stream) and return at once, as NCCL's do; on a host
// communicator the stream is opaque and every call completes before it
// returns (see docs/nccl-shim.md).
#include "api/nccl/shim.h"

using namespace weft::nccl;
namespace algo = weft::algo;

extern "C" {

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::AllReduce, "ncclAllReduce", sendbuff,
                 recvbuff, count, raw_value(datatype), raw_value(op), 0, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclAllReduce)

ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream) {
  return submit_call(comm, Call{Call::Kind::Collective, algo::Collective::ReduceScatter,
                                "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                                raw_value(datatype), raw_value(op), 0, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclReduceScatter)

ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::AllGather, "ncclAllGather", sendbuff,
                 recvbuff, sendcount, raw_value(datatype), ncclSum, 0, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclAllGather)

ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::Broadcast, "ncclBroadcast", sendbuff,
                 recvbuff, count, raw_value(datatype), ncclSum, root, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclBroadcast)

// The legacy in-place broadcast.
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::Broadcast, "ncclBcast", buff, buff,
                 count, raw_value(datatype), ncclSum, root, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclBcast)

ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::Reduce, "ncclReduce", sendbuff, recvbuff,
                 count, raw_value(datatype), raw_value(op), root, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclReduce)

ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::AllToAll, "ncclAlltoAll", sendbuff,
                 recvbuff, count, raw_value(datatype), ncclSum, 0, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclAlltoAll)

ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::Gather, "ncclGather", sendbuff, recvbuff,
                 count, raw_value(datatype), ncclSum, root, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclGather)

ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Collective, algo::Collective::Scatter, "ncclScatter", sendbuff,
                 recvbuff, count, raw_value(datatype), ncclSum, root, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclScatter)

ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Send, algo::Collective::Barrier, "ncclSend", sendbuff, nullptr, count,
                 raw_value(datatype), ncclSum, peer, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclSend)

ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return submit_call(
      comm, Call{Call::Kind::Recv, algo::Collective::Barrier, "ncclRecv", nullptr, recvbuff, count,
                 raw_value(datatype), ncclSum, peer, nullptr, stream});
}
WEFT_NCCL_ALIAS(ncclRecv)

// Immediate even inside a group (nccl-tests allocates inside one). A program
// with a current CUDA context gets device memory of its device (cuMemAlloc);
// one without, weftMemAlloc's shared host memory.
ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  apply_nccl_env();
  if (ptr == nullptr) return record(ncclInvalidArgument, __func__, "ptr is NULL");
  *ptr = nullptr;
  if (cuda_context_current()) return device_alloc(ptr, size, __func__);
  return from_weft(weftMemAlloc(ptr, size), __func__);
}
WEFT_NCCL_ALIAS(ncclMemAlloc)

ncclResult_t pncclMemFree(void* ptr) {
  apply_nccl_env();
  if (is_device_memory(ptr)) return device_free(ptr, __func__);
  return from_weft(weftMemFree(ptr), __func__);
}
WEFT_NCCL_ALIAS(ncclMemFree)

// Registration only speeds calls up, so memory Weft cannot use (NULL, empty,
// device) gets Success with a NULL handle, which NCCL also allows.
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  if (handle == nullptr) return record(ncclInvalidArgument, __func__, "handle is NULL");
  *handle = nullptr;
  if (buff == nullptr || size == 0 || is_device_memory(buff)) return ncclSuccess;
  std::shared_lock<std::shared_mutex> use(state->use);
  return from_weft(weftCommRegister(state->weft, buff, size, handle), __func__);
}
WEFT_NCCL_ALIAS(ncclCommRegister)

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  if (handle == nullptr) return ncclSuccess;
  std::shared_lock<std::shared_mutex> use(state->use);
  return from_weft(weftCommDeregister(state->weft, handle), __func__);
}
WEFT_NCCL_ALIAS(ncclCommDeregister)

// Weft has no symmetric windows: NCCL's "unsupported" answer is Success with
// *win untouched, which callers (nccl-tests -R 2, PyTorch) accept.
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void*, size_t, ncclWindow_t* win, int) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve(comm, __func__, &state); r != ncclSuccess) return r;
  if (win == nullptr) return record(ncclInvalidArgument, __func__, "win is NULL");
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclCommWindowRegister)

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve(comm, __func__, &state); r != ncclSuccess) return r;
  if (win == nullptr) return ncclSuccess;
  return record(ncclInvalidArgument, __func__,
                "win was not made by ncclCommWindowRegister (Weft makes no windows)");
}
WEFT_NCCL_ALIAS(ncclCommWindowDeregister)

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  if (ncclResult_t r = check_host_memory(scalar, "scalar", __func__); r != ncclSuccess) return r;
  static_assert(sizeof(ncclRedOp_t) == sizeof(weftRedOp_t));
  std::shared_lock<std::shared_mutex> use(state->use);
  return from_weft(
      weftRedOpCreatePreMulSum(reinterpret_cast<weftRedOp_t*>(op), scalar,
                               static_cast<weftDataType_t>(datatype),
                               static_cast<weftScalarResidence_t>(residence), state->weft),
      __func__);
}
WEFT_NCCL_ALIAS(ncclRedOpCreatePreMulSum)

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  std::shared_lock<std::shared_mutex> use(state->use);
  return from_weft(weftRedOpDestroy(static_cast<weftRedOp_t>(op), state->weft), __func__);
}
WEFT_NCCL_ALIAS(ncclRedOpDestroy)

}  // extern "C"
