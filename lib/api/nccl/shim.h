// The NCCL-ABI shim (libnccl.so.2) over Weft's C ABI: shared state of its
// translation units. A ncclComm_t is a handle to a CommState; the shim adds
// what NCCL callers rely on and Weft's C ABI does not have: non-blocking
// init, split and group end, init deferred to the end of a group, and
// communicators that another thread may abort while a call waits.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "weft/weft.h"

// Every ncclX is a weak alias of its strong pncclX, as in the real library,
// so that profilers can interpose on either name.
#define WEFT_NCCL_ALIAS(name) \
  extern "C" decltype(p##name) name __attribute__((weak, alias("p" #name)));

namespace weft::nccl {

inline constexpr int kNcclVersion = NCCL_VERSION_CODE;  // 22809 for 2.28.9

struct CommState {
  // Success, InProgress (init, split or a non-blocking group pending) or the
  // error that failed the communicator: ncclCommGetAsyncError loads it.
  std::atomic<ncclResult_t> status{ncclInProgress};
  bool blocking = true;
  std::string name;  // commName from the config, for Weft's log lines
  int device = 0;    // what ncclCommCuDevice reports (host memory: no real device)
  // Made while a CUDA context was current: a Weft GPU communicator on `device`, whose calls
  // take device memory and run on their cudaStream_t.
  bool gpu = false;

  // Guards weft, aborted, finalized, error; signals the end of InProgress.
  std::mutex mutex;
  std::condition_variable changed;
  weftComm_t weft = nullptr;
  bool aborted = false;              // ncclCommAbort came while init was still running
  bool finalized = false;            // ncclCommFinalize was called
  std::atomic<bool> retired{false};  // destroyed or aborted: every later call is refused
  std::string error;                 // the message of the failure in `status`

  // Calls that hand work to Weft hold it shared; destroy and abort hold it
  // exclusively, so Weft's communicator is never freed under a submitting
  // call. Waiting for completion happens outside it, so abort can end waits.
  std::shared_mutex use;

  // Blocks while the communicator is InProgress; its status then.
  ncclResult_t wait_ready();
  // Ends an InProgress spell (or records a failure) and wakes waiters.
  void settle(ncclResult_t result, const std::string& message);
};

// Resolves a handle; on failure records a message naming `function`.
ncclResult_t resolve(ncclComm_t comm, const char* function, std::shared_ptr<CommState>* out);
// resolve + wait until it is ready + a live Weft communicator behind it.
ncclResult_t resolve_ready(ncclComm_t comm, const char* function, std::shared_ptr<CommState>* out);
ncclComm_t make_handle(std::shared_ptr<CommState> state);

// The thread's last error (ncclGetLastError); record() sets it and returns result.
ncclResult_t record(ncclResult_t result, const std::string& message);
ncclResult_t record(ncclResult_t result, const char* function, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
// A failed Weft call: its last error, renamed from weftX to the NCCL call.
ncclResult_t from_weft(weftResult_t result, const char* function);
// Weft's result as NCCL's: NCCL has no timeout code, a stalled peer is a remote failure.
inline ncclResult_t to_nccl(weftResult_t result) {
  return result == weftTimeout || result >= weftNumResults ? ncclRemoteError
                                                           : static_cast<ncclResult_t>(result);
}
const char* last_error();

// Maps NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_ALGO and NCCL_SOCKET_IFNAME onto
// their WEFT_ equivalents (when those are unset) once, before Weft reads them.
void apply_nccl_env();

// Device memory on a host communicator is refused with a message naming the argument.
bool is_device_memory(const void* pointer);
ncclResult_t check_host_memory(const void* pointer, const char* argument, const char* function);
// A CUDA context is current on this thread (the program expects device memory).
bool cuda_context_current();
// The current context's device, if a context is current.
bool current_cuda_device(int* device);
// Device memory of the current context's device for ncclMemAlloc, and its release.
ncclResult_t device_alloc(void** ptr, size_t size, const char* function);
ncclResult_t device_free(void* ptr, const char* function);
// The Weft stream standing for a cudaStream_t (made at its first use, kept for the process).
ncclResult_t weft_stream_for(cudaStream_t stream, const char* function, weftStream_t* out);

size_t dtype_bytes(ncclDataType_t dtype);

// An enum argument's value as the caller passed it. C callers can pass any
// int; reading the bytes (not the enum) keeps out-of-range values defined.
template <typename Enum>
int raw_value(const Enum& value) {
  static_assert(sizeof(int) == sizeof(Enum));
  int raw;
  memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// A communicator init or split, run at once, in the background (non-blocking)
// or at the end of the enclosing group.
struct InitJob {
  std::shared_ptr<CommState> child;   // null for a split with NCCL_SPLIT_NOCOLOR
  std::shared_ptr<CommState> parent;  // split only
  std::function<weftResult_t(weftComm_t*)> run;
  const char* function;
};
// Runs it now (blocking), in the background (non-blocking: InProgress), or
// defers it to the end of the open group.
ncclResult_t submit_init(InitJob job);
// Runs it on this thread; settles the parent too when it was marked InProgress.
std::pair<ncclResult_t, std::string> run_init(const InitJob& job, bool settle_parent);
// Keeps it for the end of the open group.
ncclResult_t defer_init(InitJob job);
// Its init is deferred to the end of this thread's open group.
bool pending_in_group(const CommState* state);

// One collective or point-to-point call, kept until its group ends.
struct Call {
  enum class Kind { Collective, Send, Recv };
  Kind kind;
  algo::Collective collective;  // for Kind::Collective
  const char* function;
  const void* send;
  void* recv;
  size_t count;
  int dtype;  // as the caller passed them (raw_value): maybe out of range
  int op;
  int root;                                   // peer for Send/Recv
  std::shared_ptr<CommState> comm = nullptr;  // set by submit_call
  cudaStream_t stream = nullptr;              // a GPU communicator's calls run on it
};

// Validates the handle and arguments, then runs the call (outside a group)
// or adds it to the open group.
ncclResult_t submit_call(ncclComm_t comm, Call call);

bool in_group();

}  // namespace weft::nccl
