/* Weft: collective communication for distributed training and inference.
 *
 * The C ABI is Weft's stable contract. It is shaped like NCCL's (same numeric
 * values for status codes, data types and reduction ops) so that the NCCL-ABI
 * shim stays a thin translation layer. Every entry point returns a weftResult_t
 * and, on failure, records a message naming the cause (weftGetLastError). */
#ifndef WEFT_WEFT_H_
#define WEFT_WEFT_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_MAJOR 0
#define WEFT_MINOR 1
#define WEFT_PATCH 0
#define WEFT_VERSION_CODE(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define WEFT_VERSION WEFT_VERSION_CODE(WEFT_MAJOR, WEFT_MINOR, WEFT_PATCH)

/* Status codes: 0..7 equal ncclResult_t; weftTimeout is Weft's own. */
typedef enum {
  weftSuccess = 0,
  weftUnhandledCudaError = 1,
  weftSystemError = 2,
  weftInternalError = 3,
  weftInvalidArgument = 4,
  weftInvalidUsage = 5,
  weftRemoteError = 6,
  weftInProgress = 7,
  weftTimeout = 8,
  weftNumResults = 9
} weftResult_t;

/* Data types: values equal ncclDataType_t. */
typedef enum {
  weftInt8 = 0,
  weftChar = 0,
  weftUint8 = 1,
  weftInt32 = 2,
  weftInt = 2,
  weftUint32 = 3,
  weftInt64 = 4,
  weftUint64 = 5,
  weftFloat16 = 6,
  weftHalf = 6,
  weftFloat32 = 7,
  weftFloat = 7,
  weftFloat64 = 8,
  weftDouble = 8,
  weftBfloat16 = 9,
  weftFloat8e4m3 = 10,
  weftFloat8e5m2 = 11,
  weftNumTypes = 12
} weftDataType_t;

/* Reduction ops: values equal ncclRedOp_t. Values >= weftNumOps are created
 * with weftRedOpCreatePreMulSum. */
typedef enum {
  weftSum = 0,
  weftProd = 1,
  weftMax = 2,
  weftMin = 3,
  weftAvg = 4,
  weftNumOps = 5,
  weftMaxRedOp = 0x7fffffff
} weftRedOp_t;

#define WEFT_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[WEFT_UNIQUE_ID_BYTES];
} weftUniqueId;

typedef struct weftComm* weftComm_t;
/* An ordered queue of operations run by Weft's progress thread. Passing NULL
 * instead makes a call complete before it returns. */
typedef struct weftStream* weftStream_t;
typedef struct weftEvent* weftEvent_t;

#define WEFT_SPLIT_NOCOLOR (-1)
#define WEFT_CONFIG_UNDEF_INT INT_MIN
#define WEFT_CONFIG_UNDEF_PTR NULL
#define WEFT_CONFIG_MAGIC 0x77656674u /* "weft" */

/* Per-communicator configuration. Initialise with WEFT_CONFIG_INITIALIZER;
 * fields left undefined take the environment's or the built-in default. The
 * library reads the struct by its size and version, so fields can be added at
 * the end without breaking older callers. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;         /* 1 (default): calls complete before they return */
  int timeoutMs;        /* bound on every wait; default WEFT_TIMEOUT_MS */
  const char* commName; /* shown in log lines */
  /* Forced algorithms, "collective:algorithm[,...]" as WEFT_ALGO (which it
   * overrides), e.g. "allreduce:ring,allgather:bruck". */
  const char* algorithms;
  /* A GPU communicator: the CUDA device ordinal its ranks' memory lives on (docs/gpu.md).
   * Its collectives then take device memory only, on a stream from weftStreamCreateFromCuda
   * (or NULL). Undefined (the default): a host-memory communicator. Needs every rank on one
   * node, and the CUDA driver loaded in the process (initialise CUDA first). */
  int cudaDevice;
} weftConfig_t;

#define WEFT_CONFIG_INITIALIZER                                                                    \
  {                                                                                                \
    sizeof(weftConfig_t), WEFT_CONFIG_MAGIC, WEFT_VERSION, WEFT_CONFIG_UNDEF_INT,                  \
        WEFT_CONFIG_UNDEF_INT, WEFT_CONFIG_UNDEF_PTR, WEFT_CONFIG_UNDEF_PTR, WEFT_CONFIG_UNDEF_INT \
  }

/* Version as WEFT_VERSION_CODE(major, minor, patch). */
WEFT_API weftResult_t weftGetVersion(int* version);
WEFT_API const char* weftGetErrorString(weftResult_t result);
/* The message recorded by the calling thread's last failed call ("" if none). */
WEFT_API const char* weftGetLastError(weftComm_t comm);

/* Bootstrap. The caller of weftGetUniqueId hosts the rendezvous point: keep
 * the process alive until every rank has initialised. fork: the rendezvous
 * (and the stream thread) stay with the parent. A child forked after
 * weftGetUniqueId exits normally and, if the parent had no communicator yet,
 * may join with the id as another rank; it must not use communicators or
 * streams created before the fork (they are the parent's, and their transport
 * does not survive the fork). */
WEFT_API weftResult_t weftGetUniqueId(weftUniqueId* uniqueId);
WEFT_API weftResult_t weftCommInitRank(weftComm_t* comm, int nranks, weftUniqueId commId, int rank);
WEFT_API weftResult_t weftCommInitRankConfig(weftComm_t* comm, int nranks, weftUniqueId commId,
                                             int rank, weftConfig_t* config);
/* Rank, size and rendezvous from WEFT_RANK/WEFT_NRANKS/WEFT_ROOT, or from the
 * Open MPI (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID/SLURM_NTASKS) variables.
 * One rank needs no WEFT_ROOT. */
WEFT_API weftResult_t weftCommInitFromEnv(weftComm_t* comm, weftConfig_t* config);
/* Collective over comm: ranks passing the same color form a new communicator,
 * ordered by key then by rank in comm. color WEFT_SPLIT_NOCOLOR gives NULL. */
WEFT_API weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t* newcomm,
                                    weftConfig_t* config);
WEFT_API weftResult_t weftCommCount(const weftComm_t comm, int* count);
WEFT_API weftResult_t weftCommUserRank(const weftComm_t comm, int* rank);
/* Completes outstanding work and tells the peers this rank leaves on purpose. */
WEFT_API weftResult_t weftCommFinalize(weftComm_t comm);
/* Inside a group that holds operations of comm: weftInvalidUsage, and comm
 * stays usable (end the group first). Ending a thread or the process with a
 * group open drops its operations, with a warning. */
WEFT_API weftResult_t weftCommDestroy(weftComm_t comm);
/* Abandons outstanding work and frees the communicator; always returns. */
WEFT_API weftResult_t weftCommAbort(weftComm_t comm);
/* Stops comm everywhere: every operation in flight or to come on it fails
 * (weftRemoteError, naming the revoking rank), here and on every peer, which
 * learn of it through the bootstrap. Does not free comm, so it may come from
 * another thread while a call on comm runs; afterwards weftCommShrink,
 * weftCommDestroy or weftCommAbort (the NCCL shim's ncclCommRevoke). */
WEFT_API weftResult_t weftCommRevoke(weftComm_t comm);
/* weftCommShrink flags, as NCCL's: wait for comm's queued work first, or
 * revoke comm first (ending its work in flight). */
#define WEFT_SHRINK_DEFAULT 0x00
#define WEFT_SHRINK_ABORT 0x01
/* Called by every rank of comm except the excludeRanks (nExclude distinct
 * ranks of comm; they need not be alive): a new communicator of the others,
 * renumbered densely in comm's rank order. Works on a failed communicator
 * (a dead peer); agrees through comm's bootstrap root, so it fails when the
 * root's process (comm's rank 0, or its split leader) is gone. An excluded
 * rank's call returns weftInvalidUsage. config NULL inherits comm's. */
WEFT_API weftResult_t weftCommShrink(weftComm_t comm, const int* excludeRanks, int nExclude,
                                     weftComm_t* newcomm, weftConfig_t* config, int shrinkFlags);
/* weftSuccess while healthy; otherwise the error that failed the communicator,
 * and weftGetLastError then says why. Asked after a call completed (its
 * stream synchronised), it includes the failure notices that had reached this
 * rank by then: a peer's failure that let the call complete is reported. */
WEFT_API weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t* asyncError);
/* Weft extension: the algorithm the tuner chose for the last collective
 * launched on comm ("" before the first; a static string) and, if
 * predictedUs is not NULL, the cost model's predicted time in microseconds
 * at that call's size (negative when it could not be modelled; computing it
 * runs the model, so ask outside timed loops). */
WEFT_API weftResult_t weftCommLastAlgorithm(weftComm_t comm, const char** algorithm,
                                            double* predictedUs);
/* Weft extension: the cost model's time in microseconds for `collective`
 * (a WEFT_ALGO name: "allreduce", "allgather", ...) of `bytes` (its count
 * times the element size) on comm, with the algorithm the tuner would pick;
 * negative when it cannot be modelled. Launches nothing (the NCCL shim's
 * ncclGroupSimulateEnd). */
WEFT_API weftResult_t weftCommPredictTime(weftComm_t comm, const char* collective, size_t bytes,
                                          double* predictedUs);

/* Point to point. Inside weftGroupStart/End, sends and receives are posted
 * together so that exchange patterns cannot deadlock. */
WEFT_API weftResult_t weftSend(const void* sendbuff, size_t count, weftDataType_t datatype,
                               int peer, weftComm_t comm, weftStream_t stream);
WEFT_API weftResult_t weftRecv(void* recvbuff, size_t count, weftDataType_t datatype, int peer,
                               weftComm_t comm, weftStream_t stream);
WEFT_API weftResult_t weftGroupStart(void);
WEFT_API weftResult_t weftGroupEnd(void);
WEFT_API weftResult_t weftBarrier(weftComm_t comm, weftStream_t stream);

/* Collectives. Counts are in elements, as in NCCL: AllReduce/Broadcast/Reduce
 * the whole vector; ReduceScatter the per-rank result (input is nranks times
 * larger); AllGather the per-rank input (output nranks times larger);
 * AllToAll/Gather/Scatter the piece exchanged with each rank. In-place calls
 * follow NCCL's layouts (e.g. AllGather sendbuff == recvbuff + rank*count). */
WEFT_API weftResult_t weftAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                    weftStream_t stream);
WEFT_API weftResult_t weftReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                        weftStream_t stream);
WEFT_API weftResult_t weftAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    weftDataType_t datatype, weftComm_t comm, weftStream_t stream);
WEFT_API weftResult_t weftBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    weftDataType_t datatype, int root, weftComm_t comm,
                                    weftStream_t stream);
/* In-place broadcast of buff (NCCL's legacy ncclBcast). */
WEFT_API weftResult_t weftBcast(void* buff, size_t count, weftDataType_t datatype, int root,
                                weftComm_t comm, weftStream_t stream);
WEFT_API weftResult_t weftReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root, weftComm_t comm,
                                 weftStream_t stream);
WEFT_API weftResult_t weftAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                   weftDataType_t datatype, weftComm_t comm, weftStream_t stream);
/* Per-peer counts and displacements, in elements. */
WEFT_API weftResult_t weftAllToAllv(const void* sendbuff, const size_t sendcounts[],
                                    const size_t sdispls[], void* recvbuff,
                                    const size_t recvcounts[], const size_t rdispls[],
                                    weftDataType_t datatype, weftComm_t comm, weftStream_t stream);
WEFT_API weftResult_t weftGather(const void* sendbuff, void* recvbuff, size_t count,
                                 weftDataType_t datatype, int root, weftComm_t comm,
                                 weftStream_t stream);
WEFT_API weftResult_t weftScatter(const void* sendbuff, void* recvbuff, size_t count,
                                  weftDataType_t datatype, int root, weftComm_t comm,
                                  weftStream_t stream);

/* Thread safety: different communicators may be used from different threads
 * at the same time. One communicator must be used by one thread at a time (as
 * in NCCL); work it has queued on streams proceeds in Weft's progress thread
 * meanwhile. Groups are per thread. Streams and events may be shared between
 * threads.
 *
 * Streams and events. A stream runs its operations in order; different
 * streams run concurrently; an operation enqueued on a stream returns at once
 * and its buffers must stay valid until the stream passes it. Failures reach
 * weftStreamSynchronize / weftEventSynchronize (and weftCommGetAsyncError);
 * after a failure every operation queued behind it completes with that error.
 * Every operation of a group must use the same stream; the group runs on it
 * as one unit. weftStreamDestroy drains the stream's work first. */
WEFT_API weftResult_t weftStreamCreate(weftStream_t* stream);
WEFT_API weftResult_t weftStreamDestroy(weftStream_t stream);
WEFT_API weftResult_t weftStreamSynchronize(weftStream_t stream);
/* weftSuccess when all queued work is done, weftInProgress while some is
 * pending, or the stream's error. */
WEFT_API weftResult_t weftStreamQuery(weftStream_t stream);
/* The stream waits (without blocking the caller) until the event's last
 * record has been reached; an event never recorded is no wait at all. */
WEFT_API weftResult_t weftStreamWaitEvent(weftStream_t stream, weftEvent_t event);
WEFT_API weftResult_t weftEventCreate(weftEvent_t* event);
WEFT_API weftResult_t weftEventRecord(weftEvent_t event, weftStream_t stream);
WEFT_API weftResult_t weftEventSynchronize(weftEvent_t event);
WEFT_API weftResult_t weftEventQuery(weftEvent_t event);
WEFT_API weftResult_t weftEventDestroy(weftEvent_t event);

/* GPU memory and CUDA streams (docs/gpu.md). No CUDA header is needed: a
 * cudaStream_t is passed as void*. Weft never links or initialises the CUDA
 * driver; it uses the one the program has loaded, so these calls work (and
 * answer "host") on machines without a GPU or driver.
 *
 * weftPointerGetMemoryType: where ptr lies. weftMemoryHost also covers
 * memory CUDA does not know; device is the CUDA ordinal for device and
 * managed memory, else -1 (device may be NULL).
 *
 * weftStreamCreateFromCuda wraps a cudaStream_t (NULL: the legacy default
 * stream) after checking it: weftInvalidArgument if it is not a valid CUDA
 * stream, weftInvalidUsage if it is capturing a CUDA graph (not supported
 * yet). weftStreamSynchronize and weftStreamQuery on it also wait for / ask
 * the CUDA stream; weftStreamDestroy leaves the cudaStream_t alive.
 *
 * Collectives on a GPU communicator (weftConfig_t.cudaDevice) take device (or
 * managed) memory of that device and either such a stream, on which they are
 * enqueued in its order and return at once, or NULL, which runs them after
 * the legacy default stream's work and returns once they completed. A
 * communicator's failure (a timeout, a dead peer) shows in
 * weftCommGetAsyncError and its next call; its queued work then drains with
 * meaningless results instead of hanging the stream. A group's sends and
 * receives on a GPU communicator run as one operation. Refused with
 * weftInvalidUsage and a message saying so: GPU communicators spanning nodes
 * and Weft events on CUDA streams (not supported yet), device memory on a
 * host communicator and host memory on a GPU one. */
typedef enum { weftMemoryHost = 0, weftMemoryDevice = 1, weftMemoryManaged = 2 } weftMemoryType_t;
WEFT_API weftResult_t weftPointerGetMemoryType(const void* ptr, weftMemoryType_t* type,
                                               int* device);
WEFT_API weftResult_t weftStreamCreateFromCuda(void* cudaStream, weftStream_t* stream);

/* Buffers peers on this node can read in place. weftMemAlloc returns
 * page-aligned host memory backed by a POSIX shared-memory segment
 * (/dev/shm/weft-mem-<pid>-<n>, linked while allocated so that peers can map
 * it); weftMemFree unmaps and removes it, and names still allocated at exit
 * are removed then. A process that crashes leaves its names behind: the next
 * process's first weftMemAlloc on the node removes those whose pid is gone.
 * weftCommRegister records any host buffer with a communicator (the handle
 * is for weftCommDeregister). When every rank's input of a direct
 * (shared-memory) collective lies in registered weftMemAlloc memory, the
 * peers read it in place instead of through staging, and the call returns
 * once every peer finished reading: OneShot AllReduce and Reduce out of
 * place, AllGather and Broadcast in or out of place, from
 * WEFT_SHM_ZERO_COPY_BYTES per rank up. Everything else (other registered
 * memory included) is still staged. */
WEFT_API weftResult_t weftMemAlloc(void** ptr, size_t size);
WEFT_API weftResult_t weftMemFree(void* ptr);
WEFT_API weftResult_t weftCommRegister(const weftComm_t comm, void* buff, size_t size,
                                       void** handle);
WEFT_API weftResult_t weftCommDeregister(const weftComm_t comm, void* handle);

/* Pre-multiplied sum: every rank's input is multiplied by *scalar (one value
 * of datatype) before summing. Values equal ncclScalarResidence_t. */
typedef enum { weftScalarDevice = 0, weftScalarHostImmediate = 1 } weftScalarResidence_t;
WEFT_API weftResult_t weftRedOpCreatePreMulSum(weftRedOp_t* op, void* scalar,
                                               weftDataType_t datatype,
                                               weftScalarResidence_t residence, weftComm_t comm);
WEFT_API weftResult_t weftRedOpDestroy(weftRedOp_t op, weftComm_t comm);

/* Weft extension: bytes per element of datatype in *size (weftInvalidArgument
 * for a value that is not a weftDataType_t). */
WEFT_API weftResult_t weftDataTypeSize(weftDataType_t datatype, size_t* size);

/* Weft extension: conversions between float and the floating datatypes
 * (weftFloat16, weftBfloat16, weftFloat8e4m3, weftFloat8e5m2, weftFloat32,
 * weftFloat64), count elements each, with the rounding Weft's reductions use
 * (round to nearest even; fp8 saturates to its largest finite value, as
 * CUDA's default fp8 conversions do). Other datatypes are weftInvalidArgument. */
WEFT_API weftResult_t weftConvertFromFloat(weftDataType_t datatype, const float* in, void* out,
                                           size_t count);
WEFT_API weftResult_t weftConvertToFloat(weftDataType_t datatype, const void* in, float* out,
                                         size_t count);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_WEFT_H_ */
