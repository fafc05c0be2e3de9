// Communicators: handles, config, init (blocking, non-blocking, in groups),
// split, finalize, destroy, abort, queries.
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "api/nccl/shim.h"

// The object behind ncclComm_t. Handles are never freed, so that a call with
// a destroyed communicator gets a clear error instead of touching freed memory.
struct ncclComm {
  uint64_t magic;
  std::shared_ptr<weft::nccl::CommState> state;
};

namespace weft::nccl {

namespace {

constexpr uint64_t kHandleMagic = 0x6e63636c57656674ull;  // "ncclWeft"
constexpr unsigned int kConfigMagic = 0xcafebeef;
static_assert(sizeof(ncclUniqueId) == sizeof(weftUniqueId));

struct CommOptions {
  bool blocking = true;
  std::string name;
};

// ncclConfig_t read by its size: fields beyond it come from an older header
// and keep their defaults. Only blocking and commName mean something to Weft.
ncclResult_t read_config(const ncclConfig_t* config, const char* function, CommOptions* out) {
  if (config != nullptr) {
    if (config->size < offsetof(ncclConfig_t, blocking))
      return record(ncclInvalidArgument, function, "config->size %zu is too small", config->size);
    if (config->magic != kConfigMagic)
      return record(ncclInvalidArgument, function,
                    "config is not initialized via NCCL_CONFIG_INITIALIZER (magic 0x%x)",
                    config->magic);
    auto has = [&](size_t offset, size_t bytes) { return config->size >= offset + bytes; };
    if (has(offsetof(ncclConfig_t, blocking), sizeof(int)) &&
        config->blocking != NCCL_CONFIG_UNDEF_INT) {
      if (config->blocking != 0 && config->blocking != 1)
        return record(ncclInvalidArgument, function, "config->blocking must be 0 or 1, not %d",
                      config->blocking);
      out->blocking = config->blocking == 1;
    }
    if (has(offsetof(ncclConfig_t, commName), sizeof(const char*)) && config->commName != nullptr)
      out->name = config->commName;
  }
  // As in NCCL, the environment overrides the config.
  if (const char* env = getenv("NCCL_COMM_BLOCKING"); env != nullptr && env[0] != '\0') {
    if (strcmp(env, "0") != 0 && strcmp(env, "1") != 0)
      return record(ncclInvalidArgument, function, "NCCL_COMM_BLOCKING must be 0 or 1, not '%s'",
                    env);
    out->blocking = env[0] == '1';
  }
  return ncclSuccess;
}

weftConfig_t weft_config(const CommState& state) {
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (!state.name.empty()) config.commName = state.name.c_str();
  if (state.gpu) config.cudaDevice = state.device;
  return config;
}

std::shared_ptr<CommState> new_state(const CommOptions& options) {
  auto state = std::make_shared<CommState>();
  state->blocking = options.blocking;
  state->name = options.name;
  return state;
}

ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config, const char* function) {
  apply_nccl_env();
  if (comm == nullptr) return record(ncclInvalidArgument, function, "comm is NULL");
  *comm = nullptr;
  if (nranks < 1) return record(ncclInvalidArgument, function, "nranks %d is below 1", nranks);
  if (rank < 0 || rank >= nranks)
    return record(ncclInvalidArgument, function, "rank %d is out of range [0, %d)", rank, nranks);
  CommOptions options;
  if (ncclResult_t r = read_config(config, function, &options); r != ncclSuccess) return r;
  std::shared_ptr<CommState> state = new_state(options);
  // As NCCL: the communicator belongs to the device current at init (its Weft init may run on
  // another thread, at the group's end).
  state->gpu = current_cuda_device(&state->device);
  *comm = make_handle(state);
  weftUniqueId weft_id;
  memcpy(&weft_id, &id, sizeof(weft_id));
  CommState* raw = state.get();  // the job owns `state`, which outlives the call
  InitJob job{state, nullptr,
              [raw, nranks, weft_id, rank](weftComm_t* out) {
                weftConfig_t weft = weft_config(*raw);
                return weftCommInitRankConfig(out, nranks, weft_id, rank, &weft);
              },
              function};
  return submit_init(std::move(job));
}

// An integer property of a ready communicator, asked of Weft.
ncclResult_t query(ncclComm_t comm, int* out, const char* name,
                   weftResult_t (*ask)(const weftComm_t, int*), const char* function) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, function, &state); r != ncclSuccess) return r;
  if (out == nullptr) return record(ncclInvalidArgument, function, "%s is NULL", name);
  std::shared_lock<std::shared_mutex> use(state->use);
  return from_weft(ask(state->weft, out), function);
}

}  // namespace

ncclResult_t CommState::wait_ready() {
  ncclResult_t now = status.load(std::memory_order_acquire);
  if (now != ncclInProgress) return now;
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [&] { return status.load(std::memory_order_acquire) != ncclInProgress; });
  return status.load(std::memory_order_acquire);
}

void CommState::settle(ncclResult_t result, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    // The first failure sticks: a communicator does not heal.
    ncclResult_t now = status.load(std::memory_order_acquire);
    if (now != ncclSuccess && now != ncclInProgress) return;
    if (result != ncclSuccess) error = message;
    status.store(result, std::memory_order_release);
  }
  changed.notify_all();
}

ncclComm_t make_handle(std::shared_ptr<CommState> state) {
  auto* handle = new ncclComm{kHandleMagic, std::move(state)};
  // Every handle stays reachable for the process's life (leak checkers agree).
  static std::mutex mutex;
  static auto* handles = new std::vector<ncclComm*>();
  std::lock_guard<std::mutex> lock(mutex);
  handles->push_back(handle);
  return handle;
}

ncclResult_t resolve(ncclComm_t comm, const char* function, std::shared_ptr<CommState>* out) {
  apply_nccl_env();
  if (comm == nullptr) return record(ncclInvalidArgument, function, "comm is NULL");
  if (comm->magic != kHandleMagic)
    return record(ncclInvalidArgument, function, "comm is not a communicator");
  if (comm->state->retired.load(std::memory_order_acquire))
    return record(ncclInvalidUsage, function, "comm was already destroyed or aborted");
  *out = comm->state;
  return ncclSuccess;
}

ncclResult_t resolve_ready(ncclComm_t comm, const char* function, std::shared_ptr<CommState>* out) {
  if (ncclResult_t r = resolve(comm, function, out); r != ncclSuccess) return r;
  CommState& state = **out;
  if (in_group() && state.status.load() == ncclInProgress && pending_in_group(&state))
    return record(ncclInvalidUsage, function,
                  "comm is initialised at the end of the enclosing group: end the group first");
  if (ncclResult_t r = state.wait_ready(); r != ncclSuccess) {
    std::lock_guard<std::mutex> lock(state.mutex);
    return record(r, function, "comm failed: %s", state.error.c_str());
  }
  if (state.retired.load()) return record(ncclInvalidUsage, function, "comm was aborted");
  return ncclSuccess;
}

std::pair<ncclResult_t, std::string> run_init(const InitJob& job, bool settle_parent) {
  weftComm_t made = nullptr;
  ncclResult_t code = ncclSuccess;
  if (job.child && job.child->retired.load()) {
    code = record(ncclInvalidUsage, job.function, "comm was aborted before its init ran");
  } else {
    std::shared_lock<std::shared_mutex> parent_use;
    if (job.parent) parent_use = std::shared_lock<std::shared_mutex>(job.parent->use);
    if (job.parent && job.parent->retired.load())
      code = record(ncclInvalidUsage, job.function, "the parent comm was destroyed or aborted");
    else
      code = from_weft(job.run(&made), job.function);
  }
  std::string message = code == ncclSuccess ? "" : last_error();
  if (job.child) {
    bool abandoned;
    {
      std::lock_guard<std::mutex> lock(job.child->mutex);
      abandoned = job.child->aborted;
      if (!abandoned) job.child->weft = made;
    }
    // Aborted while it ran: the communicator it made has no owner.
    if (abandoned && made != nullptr) weftCommAbort(made);
    job.child->settle(abandoned ? ncclRemoteError : code,
                      abandoned ? "comm was aborted during its init" : message);
  }
  if (settle_parent && job.parent) job.parent->settle(code, message);
  return {code, message};
}

ncclResult_t submit_init(InitJob job) {
  const bool blocking = job.child ? job.child->blocking : job.parent->blocking;
  if (in_group()) return defer_init(std::move(job));
  if (job.parent) {
    if (ncclResult_t r = job.parent->wait_ready(); r != ncclSuccess) {
      std::lock_guard<std::mutex> lock(job.parent->mutex);
      return record(r, job.function, "the parent comm failed: %s", job.parent->error.c_str());
    }
  }
  if (blocking) return run_init(job, false).first;
  if (job.parent) job.parent->status.store(ncclInProgress, std::memory_order_release);
  std::thread([job = std::move(job)] { run_init(job, true); }).detach();
  return ncclInProgress;
}

}  // namespace weft::nccl

using namespace weft::nccl;

extern "C" {

ncclResult_t pncclGetUniqueId(ncclUniqueId* unique_id) {
  apply_nccl_env();
  if (unique_id == nullptr) return record(ncclInvalidArgument, __func__, "uniqueId is NULL");
  return from_weft(weftGetUniqueId(reinterpret_cast<weftUniqueId*>(unique_id)), __func__);
}
WEFT_NCCL_ALIAS(ncclGetUniqueId)

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return init_rank(comm, nranks, comm_id, rank, nullptr, __func__);
}
WEFT_NCCL_ALIAS(ncclCommInitRank)

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                     ncclConfig_t* config) {
  return init_rank(comm, nranks, comm_id, rank, config, __func__);
}
WEFT_NCCL_ALIAS(ncclCommInitRankConfig)

// Weft has one rendezvous per communicator: every rank uses the first id
// (its creator hosts the rendezvous); the others stay unused.
ncclResult_t pncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                       ncclUniqueId* comm_ids, ncclConfig_t* config) {
  if (n_ids < 1) return record(ncclInvalidArgument, __func__, "nId %d is below 1", n_ids);
  if (comm_ids == nullptr) return record(ncclInvalidArgument, __func__, "commIds is NULL");
  return init_rank(comm, nranks, comm_ids[0], rank, config, __func__);
}
WEFT_NCCL_ALIAS(ncclCommInitRankScalable)

// One process, ndev ranks: they join one rendezvous together, as at the end of a group.
ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  apply_nccl_env();
  if (comms == nullptr) return record(ncclInvalidArgument, __func__, "comms is NULL");
  if (ndev < 1) return record(ncclInvalidArgument, __func__, "ndev %d is below 1", ndev);
  ncclUniqueId id;
  if (ncclResult_t r = pncclGetUniqueId(&id); r != ncclSuccess) return r;
  // The p-names: a profiler interposing on ncclGroupStart should not see our inner calls.
  pncclGroupStart();
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < ndev && result == ncclSuccess; ++i) {
    result = init_rank(&comms[i], ndev, id, i, nullptr, __func__);
    if (result == ncclSuccess) comms[i]->state->device = devlist != nullptr ? devlist[i] : i;
  }
  ncclResult_t ended = pncclGroupEnd();
  return result != ncclSuccess ? result : ended;
}
WEFT_NCCL_ALIAS(ncclCommInitAll)

namespace {
// Split and shrink: a child made from `parent` by `make` at the end of the
// init job (NCCL's non-blocking semantics), or none when `joins` is false.
ncclResult_t derive(const char* caller, ncclComm_t comm, ncclComm_t* newcomm, ncclConfig_t* config,
                    bool joins,
                    std::function<weftResult_t(CommState* from, weftConfig_t*, weftComm_t*)> make) {
  std::shared_ptr<CommState> parent;
  if (ncclResult_t r = resolve(comm, caller, &parent); r != ncclSuccess) return r;
  if (newcomm == nullptr) return record(ncclInvalidArgument, caller, "newcomm is NULL");
  *newcomm = nullptr;
  CommOptions options;
  options.blocking = parent->blocking;  // a NULL config inherits the parent's
  if (ncclResult_t r = read_config(config, caller, &options); r != ncclSuccess) return r;
  std::shared_ptr<CommState> child;
  if (joins) {
    child = new_state(options);
    child->gpu = parent->gpu;
    child->device = parent->device;
    *newcomm = make_handle(child);
  }
  CommState* owner = child ? child.get() : parent.get();
  CommState* from = parent.get();
  InitJob job{child, parent,
              [owner, from, make = std::move(make)](weftComm_t* out) {
                weftConfig_t weft = weft_config(*owner);
                return make(from, &weft, out);
              },
              caller};
  return submit_init(std::move(job));
}
}  // namespace

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return record(ncclInvalidArgument, __func__, "color %d is negative and not NCCL_SPLIT_NOCOLOR",
                  color);
  return derive(__func__, comm, newcomm, config, color != NCCL_SPLIT_NOCOLOR,
                [color, key](CommState* from, weftConfig_t* weft, weftComm_t* out) {
                  return weftCommSplit(from->weft, color, key, out, weft);
                });
}
WEFT_NCCL_ALIAS(ncclCommSplit)

// NCCL's flags have Weft's values; the list is copied, since the call may end after this returns.
ncclResult_t pncclCommShrink(ncclComm_t comm, int* exclude_ranks, int exclude_count,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrink_flags) {
  static_assert(NCCL_SHRINK_DEFAULT == WEFT_SHRINK_DEFAULT &&
                NCCL_SHRINK_ABORT == WEFT_SHRINK_ABORT);
  if (exclude_count < 0 || (exclude_count > 0 && exclude_ranks == nullptr))
    return record(ncclInvalidArgument, __func__,
                  "excludeRanksList is NULL or excludeRanksCount %d negative", exclude_count);
  std::vector<int> excluded(exclude_ranks, exclude_ranks + exclude_count);
  return derive(__func__, comm, newcomm, config, true,
                [excluded = std::move(excluded), shrink_flags](CommState* from, weftConfig_t* weft,
                                                               weftComm_t* out) {
                  return weftCommShrink(from->weft, excluded.data(),
                                        static_cast<int>(excluded.size()), out, weft, shrink_flags);
                });
}
WEFT_NCCL_ALIAS(ncclCommShrink)

// Ends the communicator's work in flight (also from another thread) and every
// later call on it; it stays allocated until ncclCommDestroy or ncclCommAbort.
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revoke_flags) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  if (revoke_flags != NCCL_REVOKE_DEFAULT)
    return record(ncclInvalidArgument, __func__, "revokeFlags %d is not NCCL_REVOKE_DEFAULT",
                  revoke_flags);
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->weft == nullptr ? ncclSuccess : from_weft(weftCommRevoke(state->weft), __func__);
}
WEFT_NCCL_ALIAS(ncclCommRevoke)

// Completes this rank's work and tells the peers it leaves: no cross-rank barrier.
ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve_ready(comm, __func__, &state); r != ncclSuccess) return r;
  std::shared_lock<std::shared_mutex> use(state->use);
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->finalized)
      return record(ncclInvalidArgument, __func__, "comm was already finalized");
    state->finalized = true;
  }
  return from_weft(weftCommFinalize(state->weft), __func__);
}
WEFT_NCCL_ALIAS(ncclCommFinalize)

ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve(comm, __func__, &state); r != ncclSuccess) return r;
  if (in_group() && pending_in_group(state.get()))
    return record(ncclInvalidUsage, __func__,
                  "comm is initialised at the end of the enclosing group: end the group first");
  state->wait_ready();  // a failed communicator is destroyed all the same
  std::unique_lock<std::shared_mutex> use(state->use);
  weftComm_t weft;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->retired.exchange(true))
      return record(ncclInvalidUsage, __func__, "comm was already destroyed or aborted");
    weft = state->weft;
    state->weft = nullptr;
  }
  return weft == nullptr ? ncclSuccess : from_weft(weftCommDestroy(weft), __func__);
}
WEFT_NCCL_ALIAS(ncclCommDestroy)

// May come from another thread while a call waits on the communicator (that
// call then fails), or while its init still runs (which then abandons it).
ncclResult_t pncclCommAbort(ncclComm_t comm) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve(comm, __func__, &state); r != ncclSuccess) return r;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->weft == nullptr && state->status.load() == ncclInProgress) {
      state->aborted = true;
      state->retired.store(true);
      return ncclSuccess;
    }
    // Under the mutex, so that a destroy cannot free it meanwhile; it ends the
    // waits of calls holding `use`, so the exclusive lock below comes soon.
    if (state->weft != nullptr) weftCommRevoke(state->weft);
  }
  std::unique_lock<std::shared_mutex> use(state->use);
  weftComm_t weft;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->retired.exchange(true)) return ncclSuccess;
    weft = state->weft;
    state->weft = nullptr;
  }
  if (weft != nullptr) weftCommAbort(weft);
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclCommAbort)

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr) return record(ncclInvalidArgument, __func__, "comm is NULL");
  if (comm->magic != kHandleMagic)
    return record(ncclInvalidArgument, __func__, "comm is not a communicator");
  if (async_error == nullptr) return record(ncclInvalidArgument, __func__, "asyncError is NULL");
  CommState& state = *comm->state;
  if (state.status.load(std::memory_order_acquire) == ncclSuccess) {
    // Weft's communicator fails on its own (a timeout, a dead peer), not only in a call: the
    // watchdog that polls here must see it. An abort or destroy in progress holds `use`.
    std::shared_lock<std::shared_mutex> use(state.use, std::try_to_lock);
    weftResult_t failed = weftSuccess;
    if (use.owns_lock() && state.weft != nullptr &&
        weftCommGetAsyncError(state.weft, &failed) == weftSuccess && failed != weftSuccess)
      state.settle(to_nccl(failed), weftGetLastError(nullptr));
  }
  *async_error = state.status.load(std::memory_order_acquire);
  if (*async_error != ncclSuccess && *async_error != ncclInProgress) {
    std::lock_guard<std::mutex> lock(state.mutex);
    record(*async_error, std::string("ncclCommGetAsyncError: ") + state.error);
  }
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclCommGetAsyncError)

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return query(comm, count, "count", weftCommCount, __func__);
}
WEFT_NCCL_ALIAS(ncclCommCount)

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return query(comm, rank, "rank", weftCommUserRank, __func__);
}
WEFT_NCCL_ALIAS(ncclCommUserRank)

// Host-memory communicators have no device: the one the caller named (InitAll) or 0.
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  std::shared_ptr<CommState> state;
  if (ncclResult_t r = resolve(comm, __func__, &state); r != ncclSuccess) return r;
  if (device == nullptr) return record(ncclInvalidArgument, __func__, "device is NULL");
  *device = state->device;
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclCommCuDevice)

}  // extern "C"
