// Groups. The shim keeps a group's calls itself and hands them to Weft at its
// end, so that inits in the group run first, a simulated group launches
// nothing, and a non-blocking group can complete in the background (on a
// Weft stream of its own). Blocking calls run on the calling thread (Weft's
// NULL stream) holding their communicators' `use` locks shared; an abort from
// another thread revokes the communicator first, which ends their waits.
#include <algorithm>
#include <thread>

#include "api/nccl/shim.h"

namespace weft::nccl {

namespace {

struct GroupState {
  int depth = 0;
  std::vector<InitJob> inits;
  std::vector<Call> calls;
  ncclResult_t first_error = ncclSuccess;
  std::string first_message;
};
thread_local GroupState t_group;

weftResult_t replay(const Call& call, weftStream_t host_stream) {
  weftComm_t comm = call.comm->weft;
  weftStream_t stream = host_stream;
  if (call.comm->gpu && weft_stream_for(call.stream, call.function, &stream) != ncclSuccess)
    return weftInvalidArgument;
  auto dtype = static_cast<weftDataType_t>(call.dtype);
  auto op = static_cast<weftRedOp_t>(call.op);
  if (call.kind == Call::Kind::Send)
    return weftSend(call.send, call.count, dtype, call.root, comm, stream);
  if (call.kind == Call::Kind::Recv)
    return weftRecv(call.recv, call.count, dtype, call.root, comm, stream);
  switch (call.collective) {
    case algo::Collective::AllReduce:
      return weftAllReduce(call.send, call.recv, call.count, dtype, op, comm, stream);
    case algo::Collective::ReduceScatter:
      return weftReduceScatter(call.send, call.recv, call.count, dtype, op, comm, stream);
    case algo::Collective::AllGather:
      return weftAllGather(call.send, call.recv, call.count, dtype, comm, stream);
    case algo::Collective::Broadcast:
      return weftBroadcast(call.send, call.recv, call.count, dtype, call.root, comm, stream);
    case algo::Collective::Reduce:
      return weftReduce(call.send, call.recv, call.count, dtype, op, call.root, comm, stream);
    case algo::Collective::AllToAll:
      return weftAllToAll(call.send, call.recv, call.count, dtype, comm, stream);
    case algo::Collective::Gather:
      return weftGather(call.send, call.recv, call.count, dtype, call.root, comm, stream);
    case algo::Collective::Scatter:
      return weftScatter(call.send, call.recv, call.count, dtype, call.root, comm, stream);
    default:
      break;
  }
  return weftInternalError;
}

// A failed call may have failed its communicators: their async error says so.
// The caller holds their `use` locks.
void note_failures(const std::vector<std::shared_ptr<CommState>>& comms) {
  std::string message = last_error();
  for (const auto& comm : comms) {
    weftResult_t failed = weftSuccess;
    if (comm->weft != nullptr && weftCommGetAsyncError(comm->weft, &failed) == weftSuccess &&
        failed != weftSuccess)
      comm->settle(to_nccl(failed), message);
  }
}

// The communicators of `calls`, each once, in address order (the lock order).
std::vector<std::shared_ptr<CommState>> comms_of(const std::vector<Call>& calls) {
  std::vector<std::shared_ptr<CommState>> comms;
  for (const Call& call : calls) comms.push_back(call.comm);
  std::sort(comms.begin(), comms.end());
  comms.erase(std::unique(comms.begin(), comms.end()), comms.end());
  return comms;
}

ncclResult_t simulate(const std::vector<Call>& calls, ncclSimInfo_t* info) {
  double total = 0;
  for (const Call& call : calls) {
    if (call.kind != Call::Kind::Collective) continue;  // point to point is not timed
    const char* name = algo::collective_name(call.collective);
    std::shared_lock<std::shared_mutex> use(call.comm->use);
    double predicted = -1;
    if (call.comm->weft != nullptr &&
        weftCommPredictTime(call.comm->weft, name,
                            call.count * dtype_bytes(static_cast<ncclDataType_t>(call.dtype)),
                            &predicted) == weftSuccess &&
        predicted > 0)
      total += predicted;
  }
  info->estimatedTime = static_cast<float>(total);
  return ncclSuccess;
}

// Hands the calls to Weft as one group. `may_defer`: a group end, which may
// return InProgress when a communicator is non-blocking.
ncclResult_t launch(const std::vector<Call>& calls, bool may_defer, const char* function) {
  std::vector<std::shared_ptr<CommState>> comms = comms_of(calls);
  bool deferred = false;
  for (const auto& comm : comms) {
    if (ncclResult_t r = comm->wait_ready(); r != ncclSuccess) {
      std::lock_guard<std::mutex> lock(comm->mutex);
      return record(r, function, "comm failed: %s", comm->error.c_str());
    }
    // A GPU communicator's calls return once enqueued: nothing to defer.
    deferred = deferred || (may_defer && !comm->blocking && !comm->gpu);
  }
  weftStream_t stream = nullptr;  // blocking: Weft runs the group before returning
  if (deferred && weftStreamCreate(&stream) != weftSuccess)
    return from_weft(weftSystemError, function);
  ncclResult_t submitted = ncclSuccess;
  {
    std::vector<std::shared_lock<std::shared_mutex>> uses;
    for (const auto& comm : comms) uses.emplace_back(comm->use);
    for (const auto& comm : comms) {
      if (comm->retired.load())
        submitted = record(ncclInvalidUsage, function, "comm was destroyed or aborted");
    }
    if (submitted == ncclSuccess) {
      weftGroupStart();
      for (const Call& call : calls) {
        weftResult_t r = replay(call, stream);
        if (r != weftSuccess && submitted == ncclSuccess) submitted = from_weft(r, call.function);
      }
      // After a failed call Weft's group end drops the group and reports that call.
      weftResult_t ended = weftGroupEnd();
      if (submitted == ncclSuccess) submitted = from_weft(ended, function);
      if (submitted != ncclSuccess) note_failures(comms);
    }
    if (deferred && submitted == ncclSuccess)
      for (const auto& comm : comms) comm->status.store(ncclInProgress);
  }
  if (!deferred) return submitted;
  if (submitted != ncclSuccess) {
    weftStreamDestroy(stream);
    return submitted;
  }
  std::thread([stream, comms, function] {
    ncclResult_t done = from_weft(weftStreamSynchronize(stream), function);
    weftStreamDestroy(stream);
    std::string message = last_error();
    for (const auto& comm : comms) comm->settle(done, message);
  }).detach();
  return ncclInProgress;
}

// The group's inits, each on its own thread (the ranks of one process must
// join the rendezvous together); InProgress when any is non-blocking.
ncclResult_t run_inits(std::vector<InitJob>& jobs) {
  if (jobs.empty()) return ncclSuccess;
  bool blocking = true;
  for (InitJob& job : jobs) {
    if (job.parent) {
      if (ncclResult_t r = job.parent->wait_ready(); r != ncclSuccess)
        return record(r, job.function, "the parent comm failed");
    }
    blocking = blocking && (job.child ? job.child->blocking : job.parent->blocking);
  }
  if (!blocking) {
    for (InitJob& job : jobs) {
      if (job.parent) job.parent->status.store(ncclInProgress);
      std::thread([job = std::move(job)] { run_init(job, true); }).detach();
    }
    return ncclInProgress;
  }
  std::vector<std::pair<ncclResult_t, std::string>> results(jobs.size());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < jobs.size(); ++i)
    threads.emplace_back([&, i] { results[i] = run_init(jobs[i], false); });
  results[0] = run_init(jobs[0], false);
  for (std::thread& thread : threads) thread.join();
  for (const auto& [code, message] : results)
    if (code != ncclSuccess) return record(code, message);
  return ncclSuccess;
}

ncclResult_t group_end(ncclSimInfo_t* simulated, const char* function) {
  GroupState& g = t_group;
  if (g.depth == 0)
    return record(ncclInvalidUsage, function, "called without a matching ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<InitJob> inits = std::move(g.inits);
  std::vector<Call> calls = std::move(g.calls);
  g.inits.clear();
  g.calls.clear();
  ncclResult_t inited = run_inits(inits);
  if (inited != ncclSuccess && inited != ncclInProgress) return inited;
  if (g.first_error != ncclSuccess)
    return record(g.first_error,
                  std::string(function) +
                      ": group abandoned because a call inside it failed: " + g.first_message);
  if (simulated != nullptr) return simulate(calls, simulated);
  if (calls.empty()) return inited;
  ncclResult_t launched = launch(calls, true, function);
  return launched == ncclSuccess ? inited : launched;
}

}  // namespace

bool in_group() {
  return t_group.depth > 0;
}

bool pending_in_group(const CommState* state) {
  for (const InitJob& job : t_group.inits)
    if (job.child.get() == state) return true;
  return false;
}

ncclResult_t defer_init(InitJob job) {
  t_group.inits.push_back(std::move(job));
  return ncclSuccess;
}

size_t dtype_bytes(ncclDataType_t dtype) {
  size_t size = 0;  // stays 0 for a datatype Weft does not know
  weftDataTypeSize(static_cast<weftDataType_t>(dtype), &size);
  return size;
}

ncclResult_t submit_call(ncclComm_t handle, Call call) {
  auto check = [&]() -> ncclResult_t {
    if (ncclResult_t r = resolve(handle, call.function, &call.comm); r != ncclSuccess) return r;
    int dtype = call.dtype;
    if (dtype < 0 || dtype >= ncclNumTypes)
      return record(ncclInvalidArgument, call.function, "datatype %d is not a valid ncclDataType_t",
                    dtype);
    if (call.op < 0)
      return record(ncclInvalidArgument, call.function, "op %d is not a valid ncclRedOp_t",
                    call.op);
    if (call.count > 0 && !call.comm->gpu) {
      if (ncclResult_t r = check_host_memory(call.send, "sendbuff", call.function);
          r != ncclSuccess)
        return r;
      if (ncclResult_t r = check_host_memory(call.recv, "recvbuff", call.function);
          r != ncclSuccess)
        return r;
    }
    if (in_group() && call.comm->status.load() == ncclInProgress &&
        pending_in_group(call.comm.get()))
      return record(ncclInvalidUsage, call.function,
                    "comm is initialised at the end of this group: issue calls after ncclGroupEnd");
    return ncclSuccess;
  };
  ncclResult_t checked = check();
  GroupState& g = t_group;
  if (g.depth == 0) return checked == ncclSuccess ? launch({call}, false, call.function) : checked;
  if (checked != ncclSuccess) {
    if (g.first_error == ncclSuccess) {
      g.first_error = checked;
      g.first_message = last_error();
    }
    return checked;
  }
  g.calls.push_back(std::move(call));
  return ncclSuccess;
}

}  // namespace weft::nccl

using namespace weft::nccl;

extern "C" {

ncclResult_t pncclGroupStart() {
  apply_nccl_env();
  GroupState& g = t_group;
  if (g.depth++ == 0) {
    g.first_error = ncclSuccess;
    g.first_message.clear();
  }
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclGroupStart)

ncclResult_t pncclGroupEnd() {
  return group_end(nullptr, __func__);
}
WEFT_NCCL_ALIAS(ncclGroupEnd)

// Ends the group without launching it: estimatedTime (us) from Weft's cost
// model, the sum over its collectives (point-to-point calls are not timed).
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* info) {
  constexpr unsigned int kSimInfoMagic = 0x74685283;
  if (info == nullptr) return record(ncclInvalidArgument, __func__, "simInfo is NULL");
  if (info->size < sizeof(ncclSimInfo_t) || info->magic != kSimInfoMagic)
    return record(ncclInvalidArgument, __func__,
                  "simInfo is not initialized via NCCL_SIM_INFO_INITIALIZER (size %zu, magic 0x%x)",
                  info->size, info->magic);
  return group_end(info, __func__);
}
WEFT_NCCL_ALIAS(ncclGroupSimulateEnd)

}  // extern "C"
