// Streams and events: ordering, concurrency, cross-stream events, failures
// behind a dead peer, many small operations, draining destroy, the thread's
// lifetime, idle CPU, and communicators used from several threads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

TEST(Streams, OneStreamRunsInOrder) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftStream_t stream;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    std::vector<int64_t> x(100000, context.rank + 1);
    // Each AllReduce reads what the previous one wrote: only in-order execution gives 3^k*6.
    for (int k = 0; k < 5; ++k)
      ASSERT_EQ(weftAllReduce(x.data(), x.data(), x.size(), weftInt64, weftSum, comm, stream),
                weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(weftStreamQuery(stream), weftSuccess);
    EXPECT_EQ(x, std::vector<int64_t>(x.size(), 6 * 81));
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Rank 0 queues a receive (comm A) then, on another stream, a send (comm B).
// Rank 1 first waits for that send, then sends what rank 0's receive awaits:
// if the streams ran one after the other this would deadlock.
TEST(Streams, TwoStreamsRunConcurrently) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t a = init_comm(context, 20000);
    weftComm_t b = nullptr;
    ASSERT_EQ(weftCommSplit(a, 0, context.rank, &b, nullptr), weftSuccess);
    int32_t token = 7, value = -1;
    if (context.rank == 0) {
      weftStream_t first, second;
      ASSERT_EQ(weftStreamCreate(&first), weftSuccess);
      ASSERT_EQ(weftStreamCreate(&second), weftSuccess);
      ASSERT_EQ(weftRecv(&value, 1, weftInt32, 1, a, first), weftSuccess);
      ASSERT_EQ(weftSend(&token, 1, weftInt32, 1, b, second), weftSuccess);
      EXPECT_EQ(weftStreamSynchronize(first), weftSuccess) << weftGetLastError(a);
      EXPECT_EQ(weftStreamSynchronize(second), weftSuccess);
      EXPECT_EQ(value, 42);
      EXPECT_EQ(weftStreamDestroy(first), weftSuccess);
      EXPECT_EQ(weftStreamDestroy(second), weftSuccess);
    } else {
      ASSERT_EQ(weftRecv(&value, 1, weftInt32, 0, b, nullptr), weftSuccess);
      EXPECT_EQ(value, 7);
      int32_t answer = 42;
      ASSERT_EQ(weftSend(&answer, 1, weftInt32, 0, a, nullptr), weftSuccess);
    }
    EXPECT_EQ(weftCommDestroy(b), weftSuccess);
    EXPECT_EQ(weftCommDestroy(a), weftSuccess);
  });
}

TEST(Streams, EventsOrderWorkAcrossStreams) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftComm_t other = nullptr;
    ASSERT_EQ(weftCommSplit(comm, 0, context.rank, &other, nullptr), weftSuccess);
    weftStream_t producer, consumer;
    weftEvent_t ready;
    ASSERT_EQ(weftStreamCreate(&producer), weftSuccess);
    ASSERT_EQ(weftStreamCreate(&consumer), weftSuccess);
    ASSERT_EQ(weftEventCreate(&ready), weftSuccess);
    EXPECT_EQ(weftEventQuery(ready), weftSuccess);  // never recorded: complete
    const size_t count = 1 << 20;
    std::vector<float> x(count, 1.0f), y(count, 0.0f), z(count, 0.0f);
    // A large operation first, so the producer is still busy when the consumer starts.
    std::vector<float> big(4 * count, 1.0f);
    ASSERT_EQ(
        weftAllReduce(big.data(), big.data(), big.size(), weftFloat32, weftSum, comm, producer),
        weftSuccess);
    ASSERT_EQ(weftAllReduce(x.data(), y.data(), count, weftFloat32, weftSum, comm, producer),
              weftSuccess);
    ASSERT_EQ(weftEventRecord(ready, producer), weftSuccess);
    ASSERT_EQ(weftStreamWaitEvent(consumer, ready), weftSuccess);
    ASSERT_EQ(weftAllReduce(y.data(), z.data(), count, weftFloat32, weftSum, other, consumer),
              weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(consumer), weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(weftEventSynchronize(ready), weftSuccess);
    EXPECT_EQ(weftEventQuery(ready), weftSuccess);
    EXPECT_EQ(z, std::vector<float>(count, 4.0f)) << "the consumer ran before the event";
    EXPECT_EQ(weftStreamSynchronize(producer), weftSuccess);
    EXPECT_EQ(weftEventDestroy(ready), weftSuccess);
    EXPECT_EQ(weftStreamDestroy(producer), weftSuccess);
    EXPECT_EQ(weftStreamDestroy(consumer), weftSuccess);
    EXPECT_EQ(weftCommDestroy(other), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

TEST(Streams, TenThousandSmallOperations) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftStream_t stream;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    const int kOps = 10000;
    std::vector<int32_t> in(kOps), out(kOps, -1);
    std::iota(in.begin(), in.end(), context.rank * kOps);
    for (int i = 0; i < kOps; ++i)
      ASSERT_EQ(weftAllReduce(&in[i], &out[i], 1, weftInt32, weftSum, comm, stream), weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
    for (int i = 0; i < kOps; ++i) ASSERT_EQ(out[i], 2 * i + kOps) << "op " << i;
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

TEST(Streams, DestroyDrainsPendingWork) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftStream_t stream;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    std::vector<double> x(1 << 18, 1.0);
    for (int k = 0; k < 4; ++k)
      ASSERT_EQ(weftAllReduce(x.data(), x.data(), x.size(), weftFloat64, weftSum, comm, stream),
                weftSuccess);
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);  // documented: drains first
    EXPECT_EQ(x, std::vector<double>(x.size(), 81.0));
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// This process's threads named `name` (the stream engine names its thread "weft-streams").
int threads_named(const std::string& name) {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    count += std::getline(comm, line) && line == name;
  }
  return count;
}

// threads_named once the kernel has reaped what exited: a joined thread's /proc entry may
// outlive pthread_join by a moment (the join wakes at the thread's exit, the reaping follows).
int settled_threads_named(const std::string& name, int expected) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int count = threads_named(name);
  while (count != expected && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    count = threads_named(name);
  }
  return count;
}

// This process's eventfd descriptors. Only the engine's may come and go here: a rank that hosts
// the bootstrap root also closes sockets on its own schedule, so all descriptors would not do.
int eventfds() {
  int count = 0;
  std::error_code error;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    count += std::filesystem::read_symlink(fd.path(), error).string() == "anon_inode:[eventfd]";
  }
  return count;
}

// The streams' thread and its eventfd live only while a stream does: a process that creates and
// destroys streams in rotation (a soak, PyTorch's per-group streams) keeps nothing, and the next
// stream starts them again.
TEST(Streams, TheLastStreamsDestroyEndsTheThread) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    int32_t x = 1;
    ASSERT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftSuccess);
    const int fds = eventfds();
    ASSERT_EQ(threads_named("weft-streams"), 0);
    for (int round = 0; round < 3; ++round) {
      weftStream_t first, second;
      ASSERT_EQ(weftStreamCreate(&first), weftSuccess);
      ASSERT_EQ(weftStreamCreate(&second), weftSuccess);
      EXPECT_EQ(threads_named("weft-streams"), 1);
      int32_t value = context.rank + round;
      ASSERT_EQ(weftAllReduce(&value, &value, 1, weftInt32, weftSum, comm, first), weftSuccess);
      ASSERT_EQ(weftStreamDestroy(first), weftSuccess);
      EXPECT_EQ(threads_named("weft-streams"), 1);  // the second stream still has it
      EXPECT_EQ(value, 1 + 2 * round);
      ASSERT_EQ(weftStreamDestroy(second), weftSuccess);
      EXPECT_EQ(settled_threads_named("weft-streams", 0), 0) << "round " << round;
      EXPECT_EQ(eventfds(), fds) << "round " << round;
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

TEST(Streams, DeadPeerFailsEverythingQueued) {
  RunOptions options;
  options.expected.assign(2, ExpectedEnd{});
  options.expected[1].signal = SIGKILL;
  run_ranks(
      2,
      [](const RankContext& context) {
        weftComm_t comm = init_comm(context, 60000);
        int32_t token = 0;
        if (context.rank == 1) {
          ASSERT_EQ(weftRecv(&token, 1, weftInt32, 0, comm, nullptr), weftSuccess);
          raise(SIGKILL);
        }
        weftStream_t stream;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        std::vector<float> x(1 << 16, 1.0f);
        for (int k = 0; k < 5; ++k)
          ASSERT_EQ(weftAllReduce(x.data(), x.data(), x.size(), weftFloat32, weftSum, comm, stream),
                    weftSuccess);
        ASSERT_EQ(weftSend(&token, 1, weftInt32, 1, comm, nullptr), weftSuccess);
        auto start = std::chrono::steady_clock::now();
        EXPECT_EQ(weftStreamSynchronize(stream), weftRemoteError);
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
        EXPECT_EQ(weftStreamQuery(stream), weftRemoteError);
        weftResult_t async_error = weftSuccess;
        EXPECT_EQ(weftCommGetAsyncError(comm, &async_error), weftSuccess);
        EXPECT_EQ(async_error, weftRemoteError);
        // ... and says why: the dead rank, by name.
        const std::string why = weftGetLastError(nullptr);
        EXPECT_EQ(why.rfind("weftCommGetAsyncError: ", 0), 0u) << why;
        EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
        EXPECT_EQ(weftStreamDestroy(stream), weftRemoteError);  // drained, reporting the failure
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
      },
      options);
}

// A process with a live communicator and stream, doing nothing, uses
// (almost) no CPU: waits block instead of spinning.
TEST(Streams, IdleCostsNoCpu) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftStream_t stream;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    int32_t x = 1;
    ASSERT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, stream), weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess);
    auto cpu_seconds = [] {
      rusage usage{};
      getrusage(RUSAGE_SELF, &usage);
      return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
             (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
    };
    double before = cpu_seconds();
    // Measuring idleness needs wall time to pass; this sleep synchronises nothing.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    double used = cpu_seconds() - before;
    EXPECT_LT(used, 0.05) << "an idle rank used " << used << " s of CPU in 0.5 s";
    ASSERT_EQ(weftBarrier(comm, nullptr), weftSuccess);
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Different communicators may be used from different threads at once.
TEST(Threads, OneCommunicatorPerThread) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t world = init_comm(context);
    std::vector<weftComm_t> comms(3, nullptr);
    for (weftComm_t& comm : comms)
      ASSERT_EQ(weftCommSplit(world, 0, context.rank, &comm, nullptr), weftSuccess);
    std::vector<std::thread> threads;
    std::vector<int> failures(comms.size(), 0);
    for (size_t t = 0; t < comms.size(); ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 200; ++round) {
          int64_t value = static_cast<int64_t>(t * 1000 + round + context.rank);
          if (weftAllReduce(&value, &value, 1, weftInt64, weftSum, comms[t], nullptr) !=
                  weftSuccess ||
              value != static_cast<int64_t>(2 * (t * 1000 + round) + 1))
            ++failures[t];
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(failures, std::vector<int>(comms.size(), 0));
    for (weftComm_t comm : comms) EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(world), weftSuccess);
  });
}

TEST(Streams, BadHandlesAndMixedGroups) {
  run_ranks(1, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    EXPECT_EQ(weftStreamCreate(nullptr), weftInvalidArgument);
    EXPECT_EQ(weftEventCreate(nullptr), weftInvalidArgument);
    EXPECT_EQ(weftEventRecord(nullptr, nullptr), weftInvalidArgument);
    uint64_t junk[4] = {};
    EXPECT_EQ(weftStreamSynchronize(reinterpret_cast<weftStream_t>(junk)), weftInvalidArgument);
    weftStream_t stream;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    int32_t a = 1, b = 0;
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    EXPECT_EQ(weftSend(&a, 1, weftInt32, 0, comm, stream), weftSuccess);
    EXPECT_EQ(weftRecv(&b, 1, weftInt32, 0, comm, nullptr), weftInvalidUsage);
    EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    EXPECT_EQ(weftSend(&a, 1, weftInt32, 0, comm, stream), weftSuccess);
    EXPECT_EQ(weftRecv(&b, 1, weftInt32, 0, comm, stream), weftSuccess);
    EXPECT_EQ(weftGroupEnd(), weftSuccess);
    EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess);
    EXPECT_EQ(b, 1);
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

}  // namespace
}  // namespace weft::testing
