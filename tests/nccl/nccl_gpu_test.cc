// A program written against nccl.h on GPU communicators of the shim (libnccl.so.2 over Weft):
// communicators made while a CUDA context is current run on its device; collectives on a
// cudaStream_t (and on stream 0, the legacy default stream) return at once and are exact once
// the stream is synchronised; groups of collectives and of sends and receives; ncclMemAlloc gives
// device memory; what the GPU path lacks is refused by name. Ranks as processes (ncclCommInitRank)
// and as threads of one process on one GPU (ncclCommInitAll). Runs on a GPU (label gpu) and, for
// orchestration only, on the host emulation of the driver (emulated.*).
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_loader.h"
#include "support/multirank.h"

namespace weft::testing {
namespace {

using tools::gpu_present;
using tools::use_gpu;

#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << #call << ": " << ncclGetLastError(nullptr)

// Rank r's input element i; the sum over n ranks is exact in fp32.
float input(int r, size_t i) {
  return static_cast<float>((r * 3 + i) % 7);
}

// One rank's checks on a GPU communicator of n ranks (this thread has the context current).
// `default_stream`: also on stream 0 (not for ranks that are threads of one process: they would
// share that stream, where each one's collective waits behind the others', as with NCCL).
void exercise(const tools::CudaDriver& d, ncclComm_t comm, int rank, int n, bool default_stream) {
  int device = -1;
  NCCL_OK(ncclCommCuDevice(comm, &device));
  EXPECT_EQ(device, 0);
  constexpr size_t kCount = 1003;
  void* cuda_stream = nullptr;
  ASSERT_EQ(d.stream_create(&cuda_stream, 1), 0);
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  void* send = nullptr;
  void* recv = nullptr;
  void* gathered = nullptr;
  NCCL_OK(ncclMemAlloc(&send, kCount * sizeof(float)));
  NCCL_OK(ncclMemAlloc(&recv, kCount * sizeof(float)));
  NCCL_OK(ncclMemAlloc(&gathered, n * kCount * sizeof(float)));
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = input(rank, i);
  auto to_device = [&](void* dst, const void* src, size_t bytes) {
    ASSERT_EQ(d.memcpy(reinterpret_cast<unsigned long long>(dst),
                       reinterpret_cast<unsigned long long>(src), bytes),
              0);
  };
  to_device(send, host.data(), kCount * sizeof(float));

  std::vector<cudaStream_t> streams{stream};
  if (default_stream) streams.push_back(nullptr);
  for (cudaStream_t s : streams) {
    NCCL_OK(ncclAllReduce(send, recv, kCount, ncclFloat, ncclSum, comm, s));
    ASSERT_EQ(d.stream_synchronize(s), 0);
    std::vector<float> out(kCount);
    to_device(out.data(), recv, kCount * sizeof(float));
    for (size_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += input(r, i);
      ASSERT_EQ(out[i], want) << "rank " << rank << " element " << i;
    }
  }
  // A group of two collectives on one stream.
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllGather(send, gathered, kCount, ncclFloat, comm, stream));
  NCCL_OK(ncclBroadcast(send, recv, kCount, ncclFloat, n - 1, comm, stream));
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(d.stream_synchronize(stream), 0);
  std::vector<float> all(n * kCount), root(kCount);
  to_device(all.data(), gathered, all.size() * sizeof(float));
  to_device(root.data(), recv, kCount * sizeof(float));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(all[r * kCount + i], input(r, i));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(root[i], input(n - 1, i));

  // Send to the next rank, receive from the previous, as one group (PyTorch's all_to_all and
  // pipeline transfers are such groups).
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(send, kCount, ncclFloat, next, comm, stream));
  NCCL_OK(ncclRecv(recv, kCount, ncclFloat, prev, comm, stream));
  NCCL_OK(ncclGroupEnd());
  ASSERT_EQ(d.stream_synchronize(stream), 0);
  to_device(root.data(), recv, kCount * sizeof(float));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(root[i], input(prev, i)) << "element " << i;

  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT_EQ(async, ncclSuccess);
  // Host memory on a GPU communicator is refused, naming the argument.
  EXPECT_EQ(ncclAllReduce(host.data(), recv, kCount, ncclFloat, ncclSum, comm, stream),
            ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("host memory"), std::string::npos)
      << ncclGetLastError(comm);
  NCCL_OK(ncclMemFree(send));
  NCCL_OK(ncclMemFree(recv));
  NCCL_OK(ncclMemFree(gathered));
  d.stream_destroy(cuda_stream);
}

// Skips without a GPU (or the emulated driver).
template <typename Base>
class OnGpu : public Base {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};
using NcclGpu = OnGpu<::testing::TestWithParam<int>>;
using NcclGpuErrors = OnGpu<::testing::Test>;

TEST_P(NcclGpu, RanksAsProcesses) {
  // Rank 0's process makes the id (Weft's and NCCL's are the same 128 bytes), so that no
  // process forks once it has threads.
  run_ranks(GetParam(), [](const RankContext& context) {
    std::string why;
    const tools::CudaDriver* d = use_gpu(0, &why);
    ASSERT_NE(d, nullptr) << why;
    ncclUniqueId id;
    static_assert(sizeof(id) == sizeof(context.id));
    memcpy(&id, &context.id, sizeof(id));
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, context.nranks, id, context.rank));
    exercise(*d, comm, context.rank, context.nranks, true);
    NCCL_OK(ncclCommDestroy(comm));
  });
}

TEST_P(NcclGpu, RanksAsThreadsOnOneGpu) {
  const int n = GetParam();
  // In a child: this test's process must not initialise CUDA (RanksAsProcesses forks).
  const pid_t child = fork();
  if (child == 0) {
    std::string why;
    const tools::CudaDriver* d = use_gpu(0, &why);
    if (d == nullptr) _exit(3);
    std::vector<ncclComm_t> comms(n);
    std::vector<int> devices(n, 0);  // every rank on GPU 0
    if (ncclCommInitAll(comms.data(), n, devices.data()) != ncclSuccess) _exit(4);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r)
      ranks.emplace_back([&, r] {
        ASSERT_NE(use_gpu(0, &why), nullptr);
        exercise(*d, comms[r], r, n, false);
      });
    for (std::thread& rank : ranks) rank.join();
    const bool failed = ::testing::Test::HasFailure();
    for (ncclComm_t comm : comms)
      if (ncclCommDestroy(comm) != ncclSuccess) _exit(5);
    _exit(failed ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclGpu, ::testing::Values(1, 2, 3));

// A rank that stops (SIGSTOP) after init: the others' collective returns at once (it is
// queued), and ncclCommGetAsyncError, which PyTorch's watchdog polls, turns to an error naming
// that rank within the timeout; ncclCommAbort then drains the stream instead of leaving it hung.
TEST_F(NcclGpuErrors, AStalledPeerIsAnAsyncError) {
  constexpr int kTimeoutMs = 2000;
  RunOptions options;
  options.expected = {{}, {}, {0, SIGKILL}};
  options.kill_after_others = {2};
  options.timeout_s = 60;
  options.env = {{"WEFT_TIMEOUT_MS", "2000"}};  // kTimeoutMs
  run_ranks(
      3,
      [](const RankContext& context) {
        std::string why;
        const tools::CudaDriver* d = use_gpu(0, &why);
        ASSERT_NE(d, nullptr) << why;
        ncclUniqueId id;
        memcpy(&id, &context.id, sizeof(id));
        ncclComm_t comm = nullptr;
        NCCL_OK(ncclCommInitRank(&comm, context.nranks, id, context.rank));
        void* buffer = nullptr;
        NCCL_OK(ncclMemAlloc(&buffer, 1 << 16));
        void* cuda_stream = nullptr;
        ASSERT_EQ(d->stream_create(&cuda_stream, 1), 0);
        auto stream = static_cast<cudaStream_t>(cuda_stream);
        NCCL_OK(ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream));
        ASSERT_EQ(d->stream_synchronize(stream), 0);
        if (context.rank == 2) raise(SIGSTOP);
        const auto start = std::chrono::steady_clock::now();
        NCCL_OK(ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream));
        // The watchdog's loop: the error is asynchronous, so it is asked for until it comes.
        ncclResult_t async = ncclSuccess;
        while (async == ncclSuccess && std::chrono::steady_clock::now() - start <
                                           std::chrono::milliseconds(kTimeoutMs + 5000)) {
          NCCL_OK(ncclCommGetAsyncError(comm, &async));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        EXPECT_EQ(async, ncclRemoteError);
        EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 2"), std::string::npos)
            << ncclGetLastError(nullptr);
        NCCL_OK(ncclCommAbort(comm));
        EXPECT_EQ(d->stream_synchronize(stream), 0);  // drained, not hung
        NCCL_OK(ncclMemFree(buffer));
        d->stream_destroy(cuda_stream);
      },
      options);
}

}  // namespace
}  // namespace weft::testing
