// Collectives on GPU communicators (weftConfig_t.cudaDevice), ranks as processes and as
// threads sharing one GPU: every collective the GPU path runs, with the dtypes and ops of the
// host path's direct tests, odd counts (several chunks through small slots), in and out of
// place, on a CUDA stream and blocking (NULL), checked exactly; bad input named; a stalled
// rank an error on the others within the timeout; mismatched calls named on every rank. The same
// binary runs on a GPU (label gpu) and, for orchestration only, on the host emulation of the driver
// (label cuda, test names prefixed emulated.): that says nothing about a GPU, whose results come
// from gpu-check.sh.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_loader.h"
#include "support/direct_cases.h"
#include "support/expect_error.h"
#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using tools::gpu_present;
using tools::use_gpu;

using algo::Collective;

struct Mode {
  int nranks;
  bool threads;
  const char* ipc;  // WEFT_CUDA_IPC
};

std::string mode_name(const ::testing::TestParamInfo<Mode>& info) {
  return std::to_string(info.param.nranks) + (info.param.threads ? "_threads_" : "_processes_") +
         std::string(info.param.ipc == std::string("posix-fd") ? "posix_fd" : info.param.ipc);
}

// Device buffers for run_case, on this thread's context.
DeviceBuffers device_buffers(const tools::CudaDriver& d, weftStream_t stream) {
  DeviceBuffers buffers;
  buffers.allocate = [&d](size_t bytes) -> void* {
    unsigned long long p = 0;
    return d.mem_alloc(&p, bytes) == 0 ? reinterpret_cast<void*>(p) : nullptr;
  };
  buffers.free = [&d](void* p) { d.mem_free(reinterpret_cast<unsigned long long>(p)); };
  buffers.to_device = [&d](void* device, const void* host, size_t bytes) {
    d.memcpy(reinterpret_cast<unsigned long long>(device),
             reinterpret_cast<unsigned long long>(host), bytes);
  };
  buffers.to_host = [&d](void* host, const void* device, size_t bytes) {
    d.memcpy(reinterpret_cast<unsigned long long>(host),
             reinterpret_cast<unsigned long long>(device), bytes);
  };
  buffers.stream = stream;
  return buffers;
}

weftComm_t gpu_comm(int nranks, const weftUniqueId& id, int rank, int timeout_ms = 0) {
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.cudaDevice = 0;
  if (timeout_ms > 0) config.timeoutMs = timeout_ms;
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommInitRankConfig(&comm, nranks, id, rank, &config), weftSuccess)
      << "rank " << rank << ": " << weftGetLastError(nullptr);
  return comm;
}

// A rank whose assertion ends it early leaves its peers waiting: they fail within this.
constexpr int kSuiteTimeoutMs = 20000;

// Every case of one rank: each collective × dtype/op × count × placement, on the stream, then
// each collective once blocking.
// One rank of a suite: the driver on this thread, a GPU communicator and a stream of its own,
// released at the end of the rank's scope.
struct GpuRank {
  GpuRank(int rank, int nranks, const weftUniqueId& id) {
    std::string why;
    d = use_gpu(0, &why);
    EXPECT_NE(d, nullptr) << why;
    if (d == nullptr) return;
    comm = gpu_comm(nranks, id, rank, kSuiteTimeoutMs);
    EXPECT_EQ(d->stream_create(&cuda_stream, 1), 0);
    EXPECT_EQ(weftStreamCreateFromCuda(cuda_stream, &stream), weftSuccess);
  }
  ~GpuRank() {
    if (stream != nullptr) {
      EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    }
    if (comm != nullptr) {
      EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    }
    if (cuda_stream != nullptr) d->stream_destroy(cuda_stream);
  }
  bool ready() const { return stream != nullptr && comm != nullptr; }
  const tools::CudaDriver* d = nullptr;
  weftComm_t comm = nullptr;
  void* cuda_stream = nullptr;
  weftStream_t stream = nullptr;
};

// Runs `body(rank, nranks, id)` for every rank of `mode`: processes, or threads of this one.
void run_mode(const Mode& mode, const std::function<void(int, int, const weftUniqueId&)>& body) {
  if (!mode.threads) {
    run_ranks(mode.nranks,
              [&](const RankContext& context) { body(context.rank, context.nranks, context.id); });
    return;
  }
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  std::vector<std::thread> ranks;
  for (int r = 0; r < mode.nranks; ++r) ranks.emplace_back([&, r] { body(r, mode.nranks, id); });
  for (std::thread& rank : ranks) rank.join();
}

void run_every_case(int rank, int nranks, const weftUniqueId& id) {
  GpuRank self(rank, nranks, id);
  ASSERT_TRUE(self.ready());
  const tools::CudaDriver* d = self.d;
  weftComm_t comm = self.comm;
  weftStream_t stream = self.stream;
  const DeviceBuffers on_stream = device_buffers(*d, stream);
  const DeviceBuffers blocking = device_buffers(*d, nullptr);
  for (Collective c :
       {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
        Collective::Broadcast, Collective::Reduce, Collective::AllToAll, Collective::AllToAllv}) {
    for (auto [dtype, op] : dtype_ops(c))
      for (size_t count : {size_t{1}, size_t{7}, size_t{1031}})
        for (bool in_place : {false, true}) {
          if (in_place && c == Collective::AllToAllv) continue;  // it has no in-place form
          const Case one{c, dtype, op, count, in_place, nranks - 1};
          const std::string error = run_case(comm, one, rank, nranks, {}, &on_stream);
          ASSERT_EQ(error, "") << "rank " << rank << ": " << algo::collective_name(c) << " "
                               << dtype << " op " << op << " count " << count
                               << (in_place ? " in place" : "");
        }
    const Case one{c, weftFloat32, weftSum, 333, false, 0};
    ASSERT_EQ(run_case(comm, one, rank, nranks, {}, &blocking), "")
        << "rank " << rank << ": " << algo::collective_name(c) << " blocking";
  }
  const char* algorithm = nullptr;
  double predicted = 0;
  ASSERT_EQ(weftCommLastAlgorithm(comm, &algorithm, &predicted), weftSuccess);
  EXPECT_NE(std::string(algorithm), "");
  EXPECT_GT(predicted, 0);
}

class GpuCollectives : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    // Slots far smaller than the messages: every channel reuses its slots many times.
    setenv("WEFT_CUDA_SLOT_BYTES", "512", 1);
    setenv("WEFT_CUDA_IPC", GetParam().ipc, 1);
  }
  void TearDown() override {
    unsetenv("WEFT_CUDA_SLOT_BYTES");
    unsetenv("WEFT_CUDA_IPC");
  }
};

TEST_P(GpuCollectives, EveryCollectiveIsExact) {
  run_mode(GetParam(), run_every_case);
}

// Point to point: a ring in one group (two messages to each neighbour, one of them larger
// than the slots, one empty), then lone sends and receives between rank pairs, on the stream
// and blocking; every byte checked.
void run_point_to_point(int rank, int nranks, const weftUniqueId& id) {
  GpuRank self(rank, nranks, id);
  ASSERT_TRUE(self.ready());
  const tools::CudaDriver* d = self.d;
  weftComm_t comm = self.comm;
  weftStream_t stream = self.stream;
  constexpr size_t kBig = 3001, kSmall = 5;  // int32 elements
  auto value = [](int from, int message, size_t i) {
    return static_cast<int32_t>(from * 100000 + message * 10000 + static_cast<int>(i));
  };
  auto device_copy = [&](const std::vector<int32_t>& host) {
    unsigned long long p = 0;
    EXPECT_EQ(d->mem_alloc(&p, std::max<size_t>(4, host.size() * 4)), 0);
    if (!host.empty()) {
      EXPECT_EQ(d->memcpy(p, reinterpret_cast<unsigned long long>(host.data()), host.size() * 4),
                0);
    }
    return p;
  };
  auto host_copy = [&](unsigned long long p, size_t n) {
    std::vector<int32_t> host(n);
    if (n > 0) {
      EXPECT_EQ(d->memcpy(reinterpret_cast<unsigned long long>(host.data()), p, n * 4), 0);
    }
    return host;
  };
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  const size_t sizes[3] = {kBig, kSmall, 0};
  std::vector<unsigned long long> out, in;
  for (int m = 0; m < 3; ++m) {
    std::vector<int32_t> mine(sizes[m]);
    for (size_t i = 0; i < sizes[m]; ++i) mine[i] = value(rank, m, i);
    out.push_back(device_copy(mine));
    in.push_back(device_copy(std::vector<int32_t>(sizes[m], -7)));
  }
  for (weftStream_t s : {stream, static_cast<weftStream_t>(nullptr)}) {
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int m = 0; m < 3; ++m) {
      ASSERT_EQ(weftSend(reinterpret_cast<void*>(out[m]), sizes[m], weftInt32, next, comm, s),
                weftSuccess);
      ASSERT_EQ(weftRecv(reinterpret_cast<void*>(in[m]), sizes[m], weftInt32, prev, comm, s),
                weftSuccess);
    }
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    if (s != nullptr) {
      ASSERT_EQ(weftStreamSynchronize(s), weftSuccess);
    }
    for (int m = 0; m < 3; ++m) {
      const std::vector<int32_t> got = host_copy(in[m], sizes[m]);
      for (size_t i = 0; i < sizes[m]; ++i)
        ASSERT_EQ(got[i], value(prev, m, i))
            << "rank " << rank << " message " << m << " element " << i;
    }
  }
  // Lone calls: even ranks send to the next, which receives (both on the stream).
  if (nranks > 1 && !(nranks % 2 == 1 && rank == nranks - 1)) {
    if (rank % 2 == 0)
      ASSERT_EQ(weftSend(reinterpret_cast<void*>(out[0]), kBig, weftInt32, rank + 1, comm, stream),
                weftSuccess);
    else
      ASSERT_EQ(weftRecv(reinterpret_cast<void*>(in[0]), kBig, weftInt32, rank - 1, comm, stream),
                weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess);
    if (rank % 2 == 1) {
      const std::vector<int32_t> got = host_copy(in[0], kBig);
      for (size_t i = 0; i < kBig; ++i) ASSERT_EQ(got[i], value(rank - 1, 0, i));
    }
  }
  weftResult_t async = weftSuccess;
  EXPECT_EQ(weftCommGetAsyncError(comm, &async), weftSuccess);
  EXPECT_EQ(async, weftSuccess);
  for (unsigned long long p : out) d->mem_free(p);
  for (unsigned long long p : in) d->mem_free(p);
}

TEST_P(GpuCollectives, PointToPointIsExact) {
  run_mode(GetParam(), run_point_to_point);
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuCollectives,
                         ::testing::Values(Mode{1, false, "auto"}, Mode{2, false, "auto"},
                                           Mode{3, false, "auto"}, Mode{4, false, "auto"},
                                           Mode{2, false, "legacy"}, Mode{3, false, "legacy"},
                                           Mode{2, true, "auto"}, Mode{4, true, "auto"},
                                           Mode{3, false, "posix-fd"}),
                         mode_name);

class GpuErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

// One rank in a forked child (so that this process never initialises CUDA).
void in_child(const std::function<void(const RankContext&)>& body) {
  run_ranks(1, body);
}

TEST_F(GpuErrors, BadInputIsNamed) {
  in_child([](const RankContext& context) {
    std::string why;
    const tools::CudaDriver* d = use_gpu(0, &why);
    ASSERT_NE(d, nullptr) << why;
    weftComm_t gpu = gpu_comm(1, context.id, 0);
    ASSERT_NE(gpu, nullptr);
    unsigned long long device = 0;
    ASSERT_EQ(d->mem_alloc(&device, 4096), 0);
    void* buffer = reinterpret_cast<void*>(device);
    std::vector<float> host(16);
    void* cuda_stream = nullptr;
    ASSERT_EQ(d->stream_create(&cuda_stream, 1), 0);
    weftStream_t stream = nullptr, host_stream = nullptr;
    ASSERT_EQ(weftStreamCreateFromCuda(cuda_stream, &stream), weftSuccess);
    ASSERT_EQ(weftStreamCreate(&host_stream), weftSuccess);

    EXPECT_ERROR(weftAllReduce(host.data(), buffer, 16, weftFloat32, weftSum, gpu, stream),
                 weftInvalidUsage, "sendbuff");
    EXPECT_ERROR(weftAllReduce(buffer, host.data(), 16, weftFloat32, weftSum, gpu, stream),
                 weftInvalidUsage, "is host memory");
    EXPECT_ERROR(weftAllReduce(buffer, buffer, 16, weftFloat32, weftSum, gpu, host_stream),
                 weftInvalidUsage, "not a host stream");
    // 4096 bytes allocated: 1025 floats do not fit, nor 1024 from byte 8 on.
    EXPECT_ERROR(weftAllReduce(buffer, buffer, 1025, weftFloat32, weftSum, gpu, stream),
                 weftInvalidArgument,
                 "has 4096 bytes to the end of its allocation, but the call "
                 "needs 4100");
    EXPECT_ERROR(
        weftBroadcast(static_cast<char*>(buffer) + 8, buffer, 1024, weftFloat32, 0, gpu, stream),
        weftInvalidArgument, "sendbuff");
    EXPECT_ERROR(weftSend(host.data(), 4, weftFloat32, 0, gpu, stream), weftInvalidUsage,
                 "sendbuff");
    EXPECT_ERROR(weftSend(buffer, 4, weftFloat32, 0, gpu, stream), weftInvalidUsage,
                 "peer 0 is this rank");
    // One group, two streams on one communicator.
    void* second_cuda = nullptr;
    ASSERT_EQ(d->stream_create(&second_cuda, 1), 0);
    weftStream_t second = nullptr;
    ASSERT_EQ(weftStreamCreateFromCuda(second_cuda, &second), weftSuccess);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    EXPECT_EQ(weftSend(buffer, 4, weftFloat32, 0, gpu, stream), weftSuccess);
    EXPECT_ERROR(weftRecv(buffer, 4, weftFloat32, 0, gpu, second), weftInvalidUsage, "same stream");
    EXPECT_NE(weftGroupEnd(), weftSuccess);  // the group failed: nothing was enqueued
    EXPECT_EQ(weftStreamDestroy(second), weftSuccess);
    d->stream_destroy(second_cuda);
    // A group's send to itself is a copy into its receive.
    std::vector<float> values(16), back(16, -1);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i * 3);
    unsigned long long other = 0;
    ASSERT_EQ(d->mem_alloc(&other, 4096), 0);
    ASSERT_EQ(d->memcpy(device, reinterpret_cast<unsigned long long>(values.data()), 64), 0);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    EXPECT_EQ(weftSend(buffer, 16, weftFloat32, 0, gpu, stream), weftSuccess);
    EXPECT_EQ(weftRecv(reinterpret_cast<void*>(other), 16, weftFloat32, 0, gpu, stream),
              weftSuccess);
    EXPECT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(gpu);
    EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess);
    ASSERT_EQ(d->memcpy(reinterpret_cast<unsigned long long>(back.data()), other, 64), 0);
    EXPECT_EQ(back, values);
    d->mem_free(other);
    // A split of a GPU communicator is one too.
    weftComm_t child = nullptr;
    ASSERT_EQ(weftCommSplit(gpu, 0, 0, &child, nullptr), weftSuccess) << weftGetLastError(gpu);
    EXPECT_EQ(weftAllReduce(buffer, buffer, 16, weftFloat32, weftSum, child, stream), weftSuccess)
        << weftGetLastError(child);
    EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess);
    // A CUDA stream or device memory on a host communicator.
    weftConfig_t host_config = WEFT_CONFIG_INITIALIZER;
    weftComm_t plain = nullptr;
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    ASSERT_EQ(weftCommInitRankConfig(&plain, 1, id, 0, &host_config), weftSuccess);
    EXPECT_ERROR(weftAllReduce(buffer, buffer, 16, weftFloat32, weftSum, plain, stream),
                 weftInvalidUsage, "made for host memory");
    EXPECT_ERROR(weftAllReduce(buffer, buffer, 16, weftFloat32, weftSum, plain, nullptr),
                 weftInvalidUsage, "sendbuff is device memory (GPU 0)");
    // A device ordinal that does not exist, or is negative.
    weftConfig_t bad = WEFT_CONFIG_INITIALIZER;
    bad.cudaDevice = 99;
    weftComm_t none = nullptr;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    EXPECT_ERROR(weftCommInitRankConfig(&none, 1, id, 0, &bad), weftInvalidArgument,
                 "config->cudaDevice 99 is not a CUDA device");
    bad.cudaDevice = -3;
    EXPECT_ERROR(weftCommInitRankConfig(&none, 1, id, 0, &bad), weftInvalidArgument,
                 "config->cudaDevice must be");
    EXPECT_EQ(weftCommDestroy(plain), weftSuccess);
    EXPECT_EQ(weftCommDestroy(child), weftSuccess);
    EXPECT_EQ(weftStreamDestroy(host_stream), weftSuccess);
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(gpu), weftSuccess);
    d->stream_destroy(cuda_stream);
    d->mem_free(device);
  });
}

TEST_F(GpuErrors, AStreamOrMemoryOfAnotherGpuIsRefused) {
  in_child([](const RankContext& context) {
    std::string why;
    if (use_gpu(1, &why) == nullptr) GTEST_SKIP() << "one GPU only: " << why;
    const tools::CudaDriver* d = use_gpu(1, &why);
    void* other_stream = nullptr;
    ASSERT_EQ(d->stream_create(&other_stream, 1), 0);
    unsigned long long elsewhere = 0;  // memory of GPU 1
    ASSERT_EQ(d->mem_alloc(&elsewhere, 4096), 0);
    weftStream_t other = nullptr;
    ASSERT_EQ(weftStreamCreateFromCuda(other_stream, &other), weftSuccess);
    ASSERT_NE(use_gpu(0, &why), nullptr) << why;
    weftComm_t gpu = gpu_comm(1, context.id, 0);
    ASSERT_NE(gpu, nullptr);
    unsigned long long device = 0;
    ASSERT_EQ(d->mem_alloc(&device, 4096), 0);
    void* buffer = reinterpret_cast<void*>(device);
    EXPECT_ERROR(weftAllReduce(buffer, buffer, 16, weftFloat32, weftSum, gpu, other),
                 weftInvalidArgument, "stream belongs to GPU 1");
    EXPECT_ERROR(weftAllReduce(reinterpret_cast<void*>(elsewhere), buffer, 16, weftFloat32, weftSum,
                               gpu, nullptr),
                 weftInvalidArgument, "is memory of GPU 1, but this communicator runs on GPU 0");
    EXPECT_EQ(weftStreamDestroy(other), weftSuccess);
    EXPECT_EQ(weftCommDestroy(gpu), weftSuccess);
    d->mem_free(device);
    d->mem_free(elsewhere);
  });
}

// A rank that stops (SIGSTOP) after init: the others' AllReduce on a stream is an error within
// the timeout, naming it, and their streams drain instead of hanging.
TEST_F(GpuErrors, AStalledRankIsAnErrorOnTheOthersWithinTheTimeout) {
  constexpr int kTimeoutMs = 2000;
  RunOptions options;
  options.expected = {{}, {}, {0, SIGKILL}};
  options.kill_after_others = {2};
  options.timeout_s = 60;
  // The root (in rank 0's process) waits this long for the stopped rank at exit, too.
  options.env = {{"WEFT_TIMEOUT_MS", "2000"}};
  run_ranks(
      3,
      [&](const RankContext& context) {
        std::string why;
        const tools::CudaDriver* d = use_gpu(0, &why);
        ASSERT_NE(d, nullptr) << why;
        weftComm_t comm = gpu_comm(3, context.id, context.rank);
        ASSERT_NE(comm, nullptr);
        unsigned long long device = 0;
        ASSERT_EQ(d->mem_alloc(&device, 1 << 16), 0);
        void* buffer = reinterpret_cast<void*>(device);
        // Every rank has made one AllReduce, so each has mapped the others' memory.
        ASSERT_EQ(weftAllReduce(buffer, buffer, 1024, weftFloat32, weftSum, comm, nullptr),
                  weftSuccess)
            << weftGetLastError(comm);
        if (context.rank == 2) raise(SIGSTOP);
        void* cuda_stream = nullptr;
        ASSERT_EQ(d->stream_create(&cuda_stream, 1), 0);
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreateFromCuda(cuda_stream, &stream), weftSuccess);
        const auto start = std::chrono::steady_clock::now();
        ASSERT_EQ(weftAllReduce(buffer, buffer, 1024, weftFloat32, weftSum, comm, stream),
                  weftSuccess);
        EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess);  // drained, not hung
        weftResult_t async = weftSuccess;
        ASSERT_EQ(weftCommGetAsyncError(comm, &async), weftSuccess);
        EXPECT_NE(async, weftSuccess);
        const double seconds = seconds_since(start);
        EXPECT_LT(seconds, kTimeoutMs / 1000.0 + 3) << "the error came late";
        EXPECT_ERROR(weftAllReduce(buffer, buffer, 1024, weftFloat32, weftSum, comm, stream), async,
                     "rank 2");
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        weftCommAbort(comm);
        d->mem_free(device);
      },
      options);
}

// One rank of a mismatch test: a GPU communicator with a long timeout (its error must come
// from the check, not from a stall), 64 KiB of device memory and a stream of its own.
struct MismatchRank {
  const tools::CudaDriver* d = nullptr;
  weftComm_t comm = nullptr;
  unsigned long long device = 0;
  void* buffer = nullptr;
  weftStream_t stream = nullptr;
};

void open_rank(const RankContext& context, MismatchRank* r) {
  std::string why;
  r->d = use_gpu(0, &why);
  ASSERT_NE(r->d, nullptr) << why;
  r->comm = gpu_comm(context.nranks, context.id, context.rank, 60000);
  ASSERT_NE(r->comm, nullptr);
  ASSERT_EQ(r->d->mem_alloc(&r->device, 1 << 16), 0);
  r->buffer = reinterpret_cast<void*>(r->device);
  void* cuda_stream = nullptr;
  ASSERT_EQ(r->d->stream_create(&cuda_stream, 1), 0);
  ASSERT_EQ(weftStreamCreateFromCuda(cuda_stream, &r->stream), weftSuccess);
}

void close_rank(MismatchRank& r) {
  EXPECT_EQ(weftStreamDestroy(r.stream), weftSuccess);
  weftCommAbort(r.comm);
  r.d->mem_free(r.device);
}

// After a rank launched its part of a mismatched call (`launched`, at `start`): its stream
// drains instead of hanging and the communicator fails within seconds, not at the timeout (a
// rank whose part could finish alone, a Broadcast's root, learns of the verdict moments
// later). The rank that found the mismatch has it from its call (weftInvalidUsage), a rank
// that launched after the verdict too (the verdict's code), the others from `next`. Returns
// the error message.
std::string verdict(MismatchRank& r, weftResult_t launched,
                    std::chrono::steady_clock::time_point start,
                    const std::function<weftResult_t()>& next) {
  EXPECT_EQ(weftStreamSynchronize(r.stream), weftSuccess);
  weftResult_t async = weftSuccess;
  while (async == weftSuccess && seconds_since(start) < 10) {
    EXPECT_EQ(weftCommGetAsyncError(r.comm, &async), weftSuccess);
    std::this_thread::yield();
  }
  EXPECT_NE(async, weftSuccess);
  EXPECT_LT(seconds_since(start), 10) << "the error came from a timeout";
  if (launched != weftSuccess)
    EXPECT_TRUE(launched == weftInvalidUsage || launched == async);
  else
    EXPECT_EQ(next(), async);
  return weftGetLastError(r.comm);
}

// Mismatched calls on a GPU communicator (WEFT_CHECK=on, the default): whichever rank launches
// later finds the others' announcements and fails every rank, naming both calls, where the
// streams would otherwise wait for chunks that never come (count, collective, root) or move the
// wrong bytes (datatype). Three ranks as processes, the odd call rank 1's, after a matching one.
TEST_F(GpuErrors, MismatchedCallsAreNamedOnEveryRank) {
  using Call = std::function<weftResult_t(void*, weftComm_t, weftStream_t)>;
  auto all_reduce = [](size_t count, weftDataType_t dtype) -> Call {
    return [=](void* b, weftComm_t comm, weftStream_t stream) {
      return weftAllReduce(b, b, count, dtype, weftSum, comm, stream);
    };
  };
  struct Case {
    const char* name;
    Call usual, odd;
    const char *usual_says, *odd_says;
  };
  const std::vector<Case> cases = {
      {"count", all_reduce(1000, weftFloat32), all_reduce(2000, weftFloat32),
       "allreduce(count=1000, float, sum)", "allreduce(count=2000, float, sum)"},
      {"datatype", all_reduce(1000, weftFloat32), all_reduce(1000, weftInt32),
       "allreduce(count=1000, float, sum)", "allreduce(count=1000, int32, sum)"},
      {"collective", all_reduce(1000, weftFloat32),
       [](void* b, weftComm_t comm, weftStream_t stream) {
         return weftAllGather(b, static_cast<char*>(b) + 4096, 1000, weftFloat32, comm, stream);
       },
       "allreduce(count=1000, float, sum)", "allgather(count=1000, float)"},
      {"root",
       [](void* b, weftComm_t comm, weftStream_t stream) {
         return weftBcast(b, 1000, weftFloat32, 0, comm, stream);
       },
       [](void* b, weftComm_t comm, weftStream_t stream) {
         return weftBcast(b, 1000, weftFloat32, 1, comm, stream);
       },
       "broadcast(count=1000, float, root 0)", "broadcast(count=1000, float, root 1)"}};
  for (const Case& c : cases) {
    RunOptions options;
    options.timeout_s = 60;
    run_ranks(
        3,
        [&](const RankContext& context) {
          MismatchRank r;
          open_rank(context, &r);
          if (::testing::Test::HasFatalFailure()) return;
          auto usual = [&] { return c.usual(r.buffer, r.comm, r.stream); };
          ASSERT_EQ(usual(), weftSuccess) << weftGetLastError(r.comm);
          ASSERT_EQ(weftStreamSynchronize(r.stream), weftSuccess) << weftGetLastError(r.comm);
          const auto start = std::chrono::steady_clock::now();
          const weftResult_t launched =
              context.rank == 1 ? c.odd(r.buffer, r.comm, r.stream) : usual();
          const std::string message = verdict(r, launched, start, usual);
          EXPECT_NE(message.find("mismatched collectives"), std::string::npos) << message;
          EXPECT_NE(message.find(c.usual_says), std::string::npos) << c.name << ": " << message;
          EXPECT_NE(message.find(c.odd_says), std::string::npos) << c.name << ": " << message;
          EXPECT_NE(message.find("sequence 1"), std::string::npos) << c.name << ": " << message;
          close_rank(r);
        },
        options);
  }
}

// GPU calls return at enqueue, so a rank can run many calls ahead of a slow peer: rank 0
// enqueues 20 AllReduces of 1000 floats on its stream before rank 1 (told through a pipe, not
// by time) calls its first with 2000. Rank 0's announcement of that sequence must still be
// there to compare (a ring of 8 had overwritten it twice): both ranks fail naming both calls
// instead of waiting for the timeout.
TEST_F(GpuErrors, AMismatchIsFoundWhenARankRunsTwentyCallsAhead) {
  int ahead[2];
  ASSERT_EQ(pipe(ahead), 0);
  RunOptions options;
  options.timeout_s = 60;
  run_ranks(
      2,
      [&ahead](const RankContext& context) {
        MismatchRank r;
        open_rank(context, &r);
        if (::testing::Test::HasFatalFailure()) return;
        auto all_reduce = [&](size_t count) {
          return weftAllReduce(r.buffer, r.buffer, count, weftFloat32, weftSum, r.comm, r.stream);
        };
        const auto start = std::chrono::steady_clock::now();
        weftResult_t launched = weftSuccess;
        if (context.rank == 0) {
          for (int i = 0; i < 20 && launched == weftSuccess; ++i) launched = all_reduce(1000);
          const char go = 1;
          ASSERT_EQ(write(ahead[1], &go, 1), 1);
        } else {
          char go = 0;
          ASSERT_EQ(read(ahead[0], &go, 1), 1);
          launched = all_reduce(2000);
        }
        const std::string message = verdict(r, launched, start, [&] { return all_reduce(1000); });
        EXPECT_NE(message.find("allreduce(count=1000, float, sum)"), std::string::npos) << message;
        EXPECT_NE(message.find("allreduce(count=2000, float, sum)"), std::string::npos) << message;
        EXPECT_NE(message.find("sequence 0"), std::string::npos) << message;
        close_rank(r);
      },
      options);
}

}  // namespace
}  // namespace weft::testing
