// The direct (shared-memory) algorithms: every collective they implement at
// several rank counts, with staging small enough that larger messages take
// many rounds, in and out of place, checked exactly; bit-identical float
// results; groups and streams; a killed peer; /dev/shm errors; the lanes
// (small Broadcasts and Reduces whose senders run ahead) and how they compare
// calls; and no segment left in /dev/shm, whatever happened.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "core/direct.h"
#include "core/timed_choice.h"
#include "support/direct_cases.h"
#include "support/multirank.h"
#include "support/trace_logs.h"
#include "support/typed_values.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using algo::Collective;
using Clock = std::chrono::steady_clock;

constexpr const char* kSmallStaging = "4096";
constexpr size_t kStagingBytes = 4096;

struct Combo {
  algo::Algorithm algorithm;
  Collective collective;
};
const Combo kCombos[] = {
    {algo::Algorithm::OneShot, Collective::AllReduce},
    {algo::Algorithm::TwoShot, Collective::AllReduce},
    {algo::Algorithm::OneShot, Collective::ReduceScatter},
    {algo::Algorithm::OneShot, Collective::Reduce},
    {algo::Algorithm::OneShot, Collective::AllGather},
    {algo::Algorithm::OneShot, Collective::Broadcast},
    {algo::Algorithm::OneShot, Collective::AllToAll},
    {algo::Algorithm::OneShot, Collective::AllToAllv},
};

class DirectMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

// Counts 0, 1, 7, 14 (with 4-byte elements, what fits beside a ready word: one-shot ops up
// to 56 bytes travel there, and past it on more ranks or wider types), 1000 and one past the
// (4 KiB) staging of every dtype, in that order, so that small and staged ops alternate;
// `check`: WEFT_CHECK (small Broadcasts and Reduces take the lanes either way); `stream_bytes`:
// WEFT_SHM_STREAM_BYTES (the default never streams rounds of this small staging).
// `cache_bytes`: WEFT_CACHE_BYTES ("1": every staged AllGather, Broadcast and AllToAll(v)
// that does not read its output writes it with streaming stores).
void run_matrix(int nranks, const char* check, const char* stream_bytes = "1M",
                const char* cache_bytes = "1G") {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging},
                 {"WEFT_CHECK", check},
                 {"WEFT_SHM_STREAM_BYTES", stream_bytes},
                 {"WEFT_CACHE_BYTES", cache_bytes}};
  run_ranks(
      nranks,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t one_shot = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        weftComm_t two_shot = direct_comm(world, context.rank, algo::Algorithm::TwoShot);
        int failures = 0;
        for (const Combo& combo : kCombos) {
          weftComm_t comm = combo.algorithm == algo::Algorithm::OneShot ? one_shot : two_shot;
          for (size_t count :
               {size_t{0}, size_t{1}, size_t{7}, size_t{14}, size_t{1000}, kStagingBytes + 5}) {
            for (bool in_place : {false, true}) {
              if (in_place && combo.collective == Collective::AllToAllv) continue;
              for (const auto& [dtype, op] : dtype_ops(combo.collective)) {
                Case c{combo.collective,
                       dtype,
                       op,
                       count,
                       in_place,
                       static_cast<int>(count % context.nranks)};
                std::string error = run_case(comm, c, context.rank, context.nranks);
                if (!error.empty() && ++failures <= 5)
                  ADD_FAILURE() << "rank " << context.rank << " "
                                << algo::algorithm_name(combo.algorithm) << " "
                                << algo::collective_name(c.collective) << " count " << count << " "
                                << dtype_name(dtype) << " op " << op
                                << (in_place ? " in-place: " : ": ") << error;
                if (error.rfind("call failed", 0) == 0) return;
              }
            }
          }
        }
        EXPECT_EQ(weftCommDestroy(two_shot), weftSuccess);
        EXPECT_EQ(weftCommDestroy(one_shot), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

TEST_P(DirectMatrix, EveryCollectiveCountDtypeOpInAndOutOfPlace) {
  run_matrix(GetParam(), "on");
}
INSTANTIATE_TEST_SUITE_P(Ranks, DirectMatrix, ::testing::Values(1, 2, 3, 4, 5, 8));

class UncheckedDirectMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

TEST_P(UncheckedDirectMatrix, EveryCollectiveCountDtypeOpInAndOutOfPlace) {
  run_matrix(GetParam(), "off");
}
INSTANTIATE_TEST_SUITE_P(Ranks, UncheckedDirectMatrix, ::testing::Values(2, 3, 4, 5, 8));

// The rounds of every one-shot op whose first round writes 64 bytes or more are timed; the
// kinds of store take turns at first and later once per block of rounds (a TimedChoice), so
// the matrix's ops run with both kinds, checked exactly (LargeRoundsTryStreamingStores...
// proves that some rounds stream). Ranks that outnumber the cores never stream, so only rank
// counts up to this machine's two cores exercise it.
class StreamedDirectMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

TEST_P(StreamedDirectMatrix, EveryCollectiveCountDtypeOpInAndOutOfPlace) {
  run_matrix(GetParam(), "on", "64");
}
INSTANTIATE_TEST_SUITE_P(Ranks, StreamedDirectMatrix, ::testing::Values(1, 2));

// Staged outputs written with streaming stores, at rank counts that outnumber the cores too
// (the choice is untimed): the matrix exact (StagedOutputsStreamPastTheCache proves which ops
// stream).
class StreamedOutputsMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

TEST_P(StreamedOutputsMatrix, EveryCollectiveCountDtypeOpInAndOutOfPlace) {
  run_matrix(GetParam(), "on", "1M", "1");
}
INSTANTIATE_TEST_SUITE_P(Ranks, StreamedOutputsMatrix, ::testing::Values(2, 3, 4));

// Broadcasts and Reduces small enough for the lanes, whose senders run up to kLaneWindow - 1
// calls ahead (WEFT_CHECK on then compares every lane round's calls), interleaved with
// calls that take the staging's rounds (larger counts, AllReduce), every root in turn, in
// and out of place, blocking and on a stream: every result exact.
class Lanes : public NoLeftovers,
              public ::testing::WithParamInterface<std::tuple<int, const char*>> {};

TEST_P(Lanes, RootedCallsRunAheadExactly) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}, {"WEFT_CHECK", std::get<1>(GetParam())}};
  run_ranks(
      std::get<0>(GetParam()),
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks, me = context.rank;
        // 128 int32 fill a lane slot; 129 and 3000 take the staging's rounds.
        const size_t counts[] = {1, 7, 128, 129, 3000};
        std::vector<int32_t> in(3000), out(3000);
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        for (int i = 0; i < 600; ++i) {
          const size_t count = counts[(i / 7) % 5];
          const int root = i % n;
          const bool in_place = i % 3 == 0;
          weftStream_t on = i % 5 == 4 ? stream : nullptr;
          auto value = [&](int rank, size_t j) {
            return static_cast<int32_t>(rank * 1000 + j + i);
          };
          for (size_t j = 0; j < count; ++j) in[j] = value(me, j);
          std::fill(out.begin(), out.end(), -1);
          int32_t* dst = in_place ? in.data() : out.data();
          if (i % 2 == 0) {
            ASSERT_EQ(weftBroadcast(in.data(), dst, count, weftInt32, root, comm, on), weftSuccess)
                << weftGetLastError(comm);
            if (on != nullptr) {
              ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess);
            }
            for (size_t j = 0; j < count; ++j)
              ASSERT_EQ(dst[j], value(root, j)) << "broadcast " << i << " element " << j;
          } else {
            ASSERT_EQ(weftReduce(in.data(), dst, count, weftInt32, weftSum, root, comm, on),
                      weftSuccess)
                << weftGetLastError(comm);
            if (on != nullptr) {
              ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess);
            }
            if (me == root)
              for (size_t j = 0; j < count; ++j) {
                int32_t sum = 0;
                for (int q = 0; q < n; ++q) sum += value(q, j);
                ASSERT_EQ(dst[j], sum) << "reduce " << i << " element " << j;
              }
          }
          if (i % 50 == 49) {
            int32_t x = me;
            ASSERT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftSuccess);
            ASSERT_EQ(x, n * (n - 1) / 2);
          }
        }
        // Queued without waiting in between: a stream's lane calls run ahead too.
        // More than two windows: the senders' acks compare the peers' words (their calls).
        const int kQueued = static_cast<int>(2 * kLaneWindow) + 8;
        std::vector<std::vector<int32_t>> queued(kQueued, std::vector<int32_t>(8));
        for (int i = 0; i < kQueued; ++i) {
          std::fill(queued[i].begin(), queued[i].end(), me == i % n ? i : -1);
          ASSERT_EQ(
              weftBroadcast(queued[i].data(), queued[i].data(), 8, weftInt32, i % n, comm, stream),
              weftSuccess);
        }
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
        for (int i = 0; i < kQueued; ++i) EXPECT_EQ(queued[i], std::vector<int32_t>(8, i)) << i;
        // Blocking calls behind queued lane calls: the blocking one waits for the stream's
        // ops (its checks leave their lanes alone: TSan's build runs this too).
        for (int i = 0; i < 20; ++i) {
          for (int k = 0; k < 4; ++k) {
            std::fill(queued[k].begin(), queued[k].end(), me == k % n ? i + k : -1);
            ASSERT_EQ(weftBroadcast(queued[k].data(), queued[k].data(), 8, weftInt32, k % n, comm,
                                    stream),
                      weftSuccess);
          }
          int32_t x = me + i;
          ASSERT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftSuccess)
              << weftGetLastError(comm);
          ASSERT_EQ(x, n * (n - 1) / 2 + n * i);
          ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
          for (int k = 0; k < 4; ++k) EXPECT_EQ(queued[k], std::vector<int32_t>(8, i + k)) << i;
        }
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}
INSTANTIATE_TEST_SUITE_P(RanksAndCheck, Lanes,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::Values("off", "on")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "_ranks_check_" +
                                  std::get<1>(info.param);
                         });

// A rank stops taking a root's Broadcasts; the others run ahead as far as their lanes allow
// (kLaneWindow - 1 calls, with mismatch detection on or off), then fail within about a
// timeout, naming it.
class StoppedLaneReceiver : public NoLeftovers,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(StoppedLaneReceiver, IsNamedAfterTheWindow) {
  const int window = static_cast<int>(kLaneWindow);
  int victim_pid[2];
  ASSERT_EQ(pipe(victim_pid), 0);
  RunOptions options;
  // Staging as asked, so the window is kLaneWindow however short /dev/shm is.
  options.env = {{"WEFT_CHECK", GetParam()}, {"WEFT_SHM_BYTES", kSmallStaging}};
  options.expected.assign(3, ExpectedEnd{});
  options.expected[2].signal = SIGKILL;
  run_ranks(
      3,
      [&victim_pid, window](const RankContext& context) {
        const int kTimeoutMs = 2000;
        weftComm_t world = init_comm(context, kTimeoutMs);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot, kTimeoutMs);
        int32_t x = context.rank;
        for (int i = 0; i < 5; ++i)
          ASSERT_EQ(weftBroadcast(&x, &x, 1, weftInt32, 0, comm, nullptr), weftSuccess);
        if (context.rank == 2) {
          pid_t self = getpid();
          ASSERT_EQ(write(victim_pid[1], &self, sizeof(self)), static_cast<ssize_t>(sizeof(self)));
          raise(SIGSTOP);  // killed by rank 0 once it has given up
          return;
        }
        weftResult_t result = weftSuccess;
        int calls = 0;
        auto start = Clock::now();
        for (; result == weftSuccess && calls < 1000; ++calls)
          result = weftBroadcast(&x, &x, 1, weftInt32, 0, comm, nullptr);
        const std::string error = weftGetLastError(comm);
        EXPECT_TRUE(result == weftTimeout || result == weftRemoteError) << error;
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(),
                  kTimeoutMs / 1000.0 + 2)
            << error;
        EXPECT_NE(error.find("timed out"), std::string::npos) << error;
        EXPECT_NE(error.find("rank 2 (direct lane round"), std::string::npos) << error;
        // Rank 2 took 5 lane rounds: the others publish up to round 5 + window - 1, so each
        // completes window - 1 more calls and waits in the next.
        EXPECT_EQ(calls, window) << error;
        if (context.rank == 0) {
          pid_t victim = 0;
          ASSERT_EQ(read(victim_pid[0], &victim, sizeof(victim)),
                    static_cast<ssize_t>(sizeof(victim)));
          kill(victim, SIGKILL);
        }
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      options);
  close(victim_pid[0]);
  close(victim_pid[1]);
}
INSTANTIATE_TEST_SUITE_P(Check, StoppedLaneReceiver, ::testing::Values("off", "on"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

constexpr int kCheckTimeoutMs = 60000;

// Staging as asked, so the window is kLaneWindow however short /dev/shm is.
RunOptions checked_options() {
  RunOptions options;
  options.env = {{"WEFT_CHECK", "on"}, {"WEFT_SHM_BYTES", kSmallStaging}};
  return options;
}

// A lane Broadcast from root 0 in which rank 1 asks for 8 elements where the others ask for 4.
weftResult_t broadcast_rank_1_differs(const RankContext& context, weftComm_t comm,
                                      std::vector<int32_t>* data) {
  const size_t count = context.rank == 1 ? 8 : 4;
  return weftBroadcast(data->data(), data->data(), count, weftInt32, 0, comm, nullptr);
}

// Lanes (a Broadcast or Reduce of at most 512 bytes): a rank that only sends returns at once
// and compares its peers' calls later. Every rank takes a Broadcast for its own root, so none
// reads anything; each fails its next call (which waits for every rank) naming another's.
TEST(CheckedLanes, RanksThatOnlySentFailTheirNextCall) {
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t comm = init_comm(context, kCheckTimeoutMs);
        std::vector<int32_t> data(4, context.rank);
        ASSERT_EQ(
            weftBroadcast(data.data(), data.data(), 4, weftInt32, context.rank, comm, nullptr),
            weftSuccess)
            << weftGetLastError(comm);
        int32_t x = 1;
        EXPECT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftInvalidUsage);
        const std::string message = weftGetLastError(comm);
        const std::string mine = "while rank " + std::to_string(context.rank) +
                                 " called broadcast(count=4, int32, root " +
                                 std::to_string(context.rank) + "), sequence 0";
        EXPECT_NE(message.find("mismatched collectives: rank "), std::string::npos) << message;
        EXPECT_NE(message.find(mine), std::string::npos) << message;
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      checked_options());
}

// A root that keeps broadcasting after rank 1 took its first Broadcast with another count:
// rank 1 fails that call; the root's first kLaneWindow - 1 calls complete (it runs that many
// lane rounds ahead of its slowest peer), and the next, which first compares rank 1's word of
// round 1, fails naming rank 1's call. Rank 2 (the root's count) fails by then too.
TEST(CheckedLanes, ARootRunningAheadFailsWithinItsWindow) {
  // Every rank stays until all three are done (one that found a peer gone would name that
  // instead): rank 2 may lag the root by its whole window, and rank 1 must not leave first.
  constexpr int kRanks = 3;
  int done[kRanks][2];
  for (auto& pipe_fds : done) ASSERT_EQ(pipe(pipe_fds), 0);
  run_ranks(
      kRanks,
      [&done](const RankContext& context) {
        weftComm_t comm = init_comm(context, kCheckTimeoutMs);
        std::vector<int32_t> data(8, context.rank);
        weftResult_t result = broadcast_rank_1_differs(context, comm, &data);
        int calls = 1;
        if (context.rank == 1) {
          EXPECT_EQ(result, weftInvalidUsage) << weftGetLastError(comm);
        } else {
          for (; result == weftSuccess && calls < 1000; ++calls)
            result = weftBroadcast(data.data(), data.data(), 4, weftInt32, 0, comm, nullptr);
          EXPECT_EQ(result, weftInvalidUsage) << weftGetLastError(comm);
          const std::string message = weftGetLastError(comm);
          EXPECT_NE(message.find("mismatched collectives: rank 1 called broadcast(count=8, int32, "
                                 "root 0) while rank " +
                                 std::to_string(context.rank) +
                                 " called broadcast(count=4, int32, root 0), sequence 0"),
                    std::string::npos)
              << message;
          // Rank 2 may wait for the root in its first call, and compare rank 1's then.
          if (context.rank == 0) {
            EXPECT_EQ(calls, static_cast<int>(kLaneWindow)) << message;
          } else {
            EXPECT_LE(calls, static_cast<int>(kLaneWindow)) << message;
          }
        }
        for (int q = 0; q < kRanks; ++q) {
          if (q != context.rank) {
            EXPECT_EQ(write(done[q][1], "x", 1), 1);
          }
        }
        char bytes[kRanks - 1];
        size_t got = 0;
        while (got < sizeof(bytes)) {
          const ssize_t n = read(done[context.rank][0], bytes + got, sizeof(bytes) - got);
          ASSERT_GT(n, 0);
          got += static_cast<size_t>(n);
        }
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      checked_options());
  for (auto& pipe_fds : done) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
  }
}

// The peer that made another call fails and leaves before the rank that only sent calls
// again: that call, which finds it gone, still names the mismatch (the launch compares the
// lanes before naming a departure, or the wait does).
TEST(CheckedLanes, ASenderNamesTheMismatchAfterThePeerLeft) {
  int left[2];
  ASSERT_EQ(pipe(left), 0);
  run_ranks(
      2,
      [&left](const RankContext& context) {
        weftComm_t comm = init_comm(context, kCheckTimeoutMs);
        std::vector<int32_t> data(8, context.rank);
        weftResult_t result = broadcast_rank_1_differs(context, comm, &data);
        if (context.rank == 1) {
          EXPECT_EQ(result, weftInvalidUsage) << weftGetLastError(comm);
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(write(left[1], "x", 1), 1);
          return;
        }
        EXPECT_EQ(result, weftSuccess) << weftGetLastError(comm);
        char byte;
        EXPECT_EQ(read(left[0], &byte, 1), 1);
        int32_t x = 1;
        EXPECT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftInvalidUsage);
        const std::string message = weftGetLastError(comm);
        EXPECT_NE(message.find("mismatched collectives: rank 1 called broadcast(count=8, int32, "
                               "root 0) while rank 0 called broadcast(count=4, int32, root 0), "
                               "sequence 0"),
                  std::string::npos)
            << message;
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      checked_options());
  close(left[0]);
  close(left[1]);
}

// Random floats (where the reduction order changes the bits): every rank of
// one-shot and two-shot holds the same bits, and both equal a reduction in
// rank order computed here.
TEST_F(NoLeftovers, FloatResultsAreBitIdenticalInRankOrder) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      3,
      [](const RankContext& context) {
        const size_t count = 3001;
        auto value = [](int q, size_t i) {
          std::mt19937 random(static_cast<unsigned>(q * 100003 + i));
          return std::uniform_real_distribution<float>(-1, 1)(random);
        };
        std::vector<float> input(count), want(count);
        for (size_t i = 0; i < count; ++i) {
          input[i] = value(context.rank, i);
          float sum = value(0, i);
          for (int q = 1; q < context.nranks; ++q) sum += value(q, i);
          want[i] = sum;
        }
        weftComm_t world = init_comm(context);
        for (algo::Algorithm algorithm : {algo::Algorithm::OneShot, algo::Algorithm::TwoShot}) {
          weftComm_t comm = direct_comm(world, context.rank, algorithm);
          std::vector<float> got(count);
          ASSERT_EQ(
              weftAllReduce(input.data(), got.data(), count, weftFloat32, weftSum, comm, nullptr),
              weftSuccess);
          EXPECT_EQ(memcmp(got.data(), want.data(), count * sizeof(float)), 0)
              << algo::algorithm_name(algorithm);
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        }
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Unmapped, the staging made the first two 1 MiB AllReduces (one per staging
// half) each take a page fault per 4 KiB of staging written (about 270 per call
// at 2 ranks). The first call that stages a size now maps both halves as far as
// it writes (one madvise, whose pages rusage counts as faults too), so the
// second call faults only where peers' pages are first read, 16 pages at a
// time. The inputs and outputs are written before, so every fault counted is
// the library's.
// Under ASan and TSan the count is their shadow memory's and allocator's faults (about 350
// and 4100 on the first calls), not the staging's, so those builds check the results only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

TEST_F(NoLeftovers, TheSecondLargeCallDoesNotFaultInTheStaging) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t world = init_comm(context);
    weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
    const size_t count = (1 << 20) / sizeof(float);
    std::vector<float> input(count), output(count, 0);
    for (size_t i = 0; i < count; ++i) input[i] = static_cast<float>(context.rank + i % 5);
    for (int call = 0; call < 2; ++call) {
      rusage before{}, after{};
      getrusage(RUSAGE_SELF, &before);
      ASSERT_EQ(
          weftAllReduce(input.data(), output.data(), count, weftFloat32, weftSum, comm, nullptr),
          weftSuccess);
      getrusage(RUSAGE_SELF, &after);
      if (!kSanitized && call == 1) {
        EXPECT_LT(after.ru_minflt - before.ru_minflt, 64);
      }
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(output[i], static_cast<float>(1 + 2 * (i % 5))) << "element " << i;
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(world), weftSuccess);
  });
}

// With WEFT_SHM_STREAM_BYTES at or under the bytes a round writes (half the staging), every
// round of a one-shot AllReduce and of an AllToAllv is timed, and the kinds of store take
// turns at first (a TimedChoice), so some rounds stream; the results stay exact. Over it, or
// at 0, no round is timed. Each rank counts its rounds in its own TRACE log. Ranks that
// outnumber the cores never stream, and only x86-64 builds have streaming stores.
TEST_F(NoLeftovers, LargeRoundsTryStreamingStoresAndStayExact) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "streaming stores are used on x86-64 builds only";
#endif
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "2 ranks need 2 cores not to stage alike";
  TraceLogs logs({{"WEFT_SHM_BYTES", kSmallStaging}});
  const std::string round_bytes = std::to_string(kStagingBytes / 2);
  const std::string over_round = std::to_string(kStagingBytes / 2 + 1);
  for (const char* floor : {"64", round_bytes.c_str(), over_round.c_str(), "0"}) {
    const bool times_rounds = std::stoul(floor) != 0 && std::stoul(floor) <= kStagingBytes / 2;
    run_ranks(
        2,
        [times_rounds](const RankContext& context) {
          weftComm_t world = init_comm(context);
          weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
          // One-shot AllReduce rounds fill a staging half: 8 rounds a call (and as many of
          // AllToAllv's below).
          const size_t rounds = 8, calls = 4, count = rounds * kStagingBytes / 2 / sizeof(float);
          std::vector<float> input(count), output(count);
          for (size_t call = 0; call < calls; ++call) {
            for (size_t i = 0; i < count; ++i)
              input[i] = static_cast<float>(context.rank * 3 + (i + call) % 7);
            ASSERT_EQ(weftAllReduce(input.data(), output.data(), count, weftFloat32, weftSum, comm,
                                    nullptr),
                      weftSuccess);
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(output[i], static_cast<float>(3 + 2 * ((i + call) % 7)))
                  << "call " << call << " element " << i;
          }
          // AllToAllv's rounds are chosen alike: 2 ranks, a staging half's slot per peer of
          // each one's input to the other, rounds after rounds.
          const size_t per_peer = count / 2;
          std::vector<size_t> counts(2, per_peer), displs{0, per_peer};
          for (size_t call = 0; call < calls; ++call) {
            for (size_t i = 0; i < count; ++i)
              input[i] = static_cast<float>(context.rank * 5 + (i + call) % 11);
            ASSERT_EQ(weftAllToAllv(input.data(), counts.data(), displs.data(), output.data(),
                                    counts.data(), displs.data(), weftFloat32, comm, nullptr),
                      weftSuccess);
            for (int q = 0; q < 2; ++q)
              for (size_t i = 0; i < per_peer; ++i)
                ASSERT_EQ(output[q * per_peer + i],
                          static_cast<float>(q * 5 + (context.rank * per_peer + i + call) % 11))
                    << "AllToAllv call " << call << " from rank " << q << " element " << i;
          }
          const long streamed = logged_lines("bytes with streaming stores took");
          const long timed = streamed + logged_lines("bytes with ordinary stores took");
          if (times_rounds) {
            EXPECT_EQ(timed, static_cast<long>(2 * rounds * calls));
            EXPECT_GE(streamed, static_cast<long>(TimedChoice::kWindow));
            EXPECT_LE(streamed, timed);
          } else {
            EXPECT_EQ(timed, 0);
          }
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        logs.options({{"WEFT_SHM_STREAM_BYTES", floor}}));
  }
}

// A staged AllGather, Broadcast or AllToAll(v) writes its output with streaming stores once
// its buffers over the node's ranks reach WEFT_CACHE_BYTES, unless the output is input the
// rank reads (an in-place AllToAll); never with WEFT_SHM_STREAM_BYTES=0, nor any other
// collective; and each such op streams every byte it copies into its output. 4 ranks: on
// this machine more than its cores, where nothing else streams.
TEST_F(NoLeftovers, StagedOutputsStreamPastTheCache) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "streaming stores are used on x86-64 builds only";
#endif
  TraceLogs logs({{"WEFT_SHM_BYTES", kSmallStaging}, {"WEFT_SHM_CMA_BYTES", "0"}});
  static constexpr int kRanks = 4, kCalls = 3;
  static constexpr size_t kCount = 1000;  // floats per block: many rounds of the staging
  // Bytes of buffers over the node: an AllToAll's, in and out of 4 blocks on each rank,
  // 128 * kCount; an in-place AllGather's 80 * kCount; a Broadcast's 32 * kCount.
  struct Case {
    const char* cache;
    const char* stream_bytes;
    long streamed_per_call;  // ops of the call's six that stream
    long bytes_per_call;     // what they copy into their outputs
  };
  const std::string all_to_all = std::to_string(128 * kCount);
  const std::string all_gather = std::to_string(80 * kCount);
  const std::string over_all_gather = std::to_string(80 * kCount + 1);
  const std::string broadcast = std::to_string(32 * kCount);
  // An AllToAll(v) out of place copies its 4 blocks, its own one included; an AllGather in
  // place the 3 others; a Broadcast, its root out of place too, the one.
  constexpr long kAllToAll = 4 * 4 * kCount, kAllGather = 3 * 4 * kCount, kBroadcast = 4 * kCount;
  const Case cases[] = {{broadcast.c_str(), "1M", 4, 2 * kAllToAll + kAllGather + kBroadcast},
                        {all_gather.c_str(), "1M", 3, 2 * kAllToAll + kAllGather},
                        {over_all_gather.c_str(), "1M", 2, 2 * kAllToAll},
                        {all_to_all.c_str(), "1M", 2, 2 * kAllToAll},
                        {broadcast.c_str(), "0", 0, 0},
                        {"1G", "1M", 0, 0}};
  for (const Case& c : cases) {
    run_ranks(
        kRanks,
        [&c](const RankContext& context) {
          weftComm_t world = init_comm(context);
          weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
          const int n = context.nranks, me = context.rank;
          auto value = [](int rank, size_t i, int call) {
            return static_cast<float>(rank * 7 + static_cast<int>(i % 13) + call);
          };
          std::vector<float> in(n * kCount), out(n * kCount), block(kCount);
          for (int call = 0; call < kCalls; ++call) {
            // Out of place, then in place: AllToAll block q of rank r is value(r, q * kCount + i).
            for (bool in_place : {false, true}) {
              for (size_t i = 0; i < n * kCount; ++i) in[i] = value(me, i, call);
              float* dst = in_place ? in.data() : out.data();
              ASSERT_EQ(weftAllToAll(in.data(), dst, kCount, weftFloat32, comm, nullptr),
                        weftSuccess)
                  << weftGetLastError(comm);
              for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < kCount; ++i)
                  ASSERT_EQ(dst[q * kCount + i], value(q, me * kCount + i, call))
                      << "AllToAll in place " << in_place << " from rank " << q << " element " << i;
            }
            // AllToAllv with equal counts, out of place.
            std::vector<size_t> counts(n, kCount), displs(n);
            for (int q = 0; q < n; ++q) displs[q] = q * kCount;
            for (size_t i = 0; i < n * kCount; ++i) in[i] = value(me, i, call);
            ASSERT_EQ(weftAllToAllv(in.data(), counts.data(), displs.data(), out.data(),
                                    counts.data(), displs.data(), weftFloat32, comm, nullptr),
                      weftSuccess);
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < kCount; ++i)
                ASSERT_EQ(out[q * kCount + i], value(q, me * kCount + i, call))
                    << "AllToAllv from rank " << q << " element " << i;
            // AllGather in place: the rank's block is already in its output.
            for (size_t i = 0; i < kCount; ++i) out[me * kCount + i] = value(me, i, call);
            ASSERT_EQ(weftAllGather(out.data() + me * kCount, out.data(), kCount, weftFloat32, comm,
                                    nullptr),
                      weftSuccess);
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < kCount; ++i)
                ASSERT_EQ(out[q * kCount + i], value(q, i, call))
                    << "AllGather from rank " << q << " element " << i;
            // Broadcast from rank 1, out of place.
            for (size_t i = 0; i < kCount; ++i) in[i] = value(me, i, call);
            ASSERT_EQ(weftBroadcast(in.data(), block.data(), kCount, weftFloat32, 1, comm, nullptr),
                      weftSuccess);
            for (size_t i = 0; i < kCount; ++i)
              ASSERT_EQ(block[i], value(1, i, call)) << "Broadcast element " << i;
            // AllReduce never streams its output.
            ASSERT_EQ(
                weftAllReduce(in.data(), out.data(), kCount, weftFloat32, weftSum, comm, nullptr),
                weftSuccess);
          }
          EXPECT_EQ(logged_lines("bytes of its output with streaming stores"),
                    c.streamed_per_call * kCalls)
              << "WEFT_CACHE_BYTES=" << c.cache << " WEFT_SHM_STREAM_BYTES=" << c.stream_bytes;
          EXPECT_EQ(logged_sum(" wrote "), c.bytes_per_call * kCalls)
              << "WEFT_CACHE_BYTES=" << c.cache << " WEFT_SHM_STREAM_BYTES=" << c.stream_bytes;
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        logs.options({{"WEFT_CACHE_BYTES", c.cache}, {"WEFT_SHM_STREAM_BYTES", c.stream_bytes}}));
  }
}

// Unset, WEFT_SHM_BYTES gives each rank cache / (2 * ranks) of staging, between 512 KiB and
// 4 MiB, of the cache WEFT_CACHE_BYTES names; set, it is taken as asked.
TEST_F(NoLeftovers, DefaultStagingFitsTheCache) {
  TraceLogs logs;
  struct Case {
    int nranks;
    const char* cache;
    const char* shm_bytes;  // nullptr: unset
    long staging;
  };
  const Case cases[] = {{2, "8M", nullptr, 2 << 20}, {4, "8M", nullptr, 1 << 20},
                        {3, "8M", nullptr, 1396736}, {4, "2M", nullptr, 512 << 10},
                        {2, "1G", nullptr, 4 << 20}, {4, "8M", "4194304", 4 << 20}};
  // Unset WEFT_SHM_BYTES also takes no more than 1/64 of /dev/shm's free room over the ranks:
  // 1 GiB free leaves every case below its cache-sized staging.
  struct statvfs shm {};
  ASSERT_EQ(statvfs("/dev/shm", &shm), 0);
  const uint64_t room = static_cast<uint64_t>(shm.f_bavail) * shm.f_frsize;
  if (room < 64 * 4 * (uint64_t{4} << 20))
    GTEST_SKIP() << "/dev/shm has " << room << " bytes free: the staging would follow the room";
  for (const Case& c : cases) {
    TraceLogs::Env env = {{"WEFT_CACHE_BYTES", c.cache}, {"WEFT_DEBUG_SUBSYS", "INIT"}};
    env.push_back({"WEFT_SHM_BYTES", c.shm_bytes != nullptr ? c.shm_bytes : ""});  // "": unset
    run_ranks(
        c.nranks,
        [&c](const RankContext& context) {
          weftComm_t world = init_comm(context);
          EXPECT_EQ(logged_sum("direct algorithms over "), c.staging)
              << c.nranks << " ranks, WEFT_CACHE_BYTES=" << c.cache;
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        logs.options(env));
  }
}

// Direct ops mixed with message-based ones in a group, and queued on a
// stream, complete in launch order.
TEST_F(NoLeftovers, GroupsAndStreams) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      4,
      [](const RankContext& context) {
        weftComm_t plain = init_comm(context);
        weftComm_t direct = direct_comm(plain, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks;
        const size_t count = 3000;
        std::vector<int32_t> a(count, context.rank + 1), b(count, 2 * context.rank), sum_a(count),
            sum_b(count), gathered(n * count);
        int32_t token = context.rank, incoming = -1;
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        ASSERT_EQ(weftAllReduce(a.data(), sum_a.data(), count, weftInt32, weftSum, direct, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftSend(&token, 1, weftInt32, (context.rank + 1) % n, plain, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftRecv(&incoming, 1, weftInt32, (context.rank + n - 1) % n, plain, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftAllReduce(b.data(), sum_b.data(), count, weftInt32, weftSum, direct, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(direct);
        EXPECT_EQ(sum_a, std::vector<int32_t>(count, n * (n + 1) / 2));
        EXPECT_EQ(sum_b, std::vector<int32_t>(count, n * (n - 1)));
        EXPECT_EQ(incoming, (context.rank + n - 1) % n);

        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        for (int round = 0; round < 20; ++round) {
          std::fill(a.begin(), a.end(), context.rank + round);
          ASSERT_EQ(weftAllReduce(a.data(), a.data(), count, weftInt32, weftMax, direct, stream),
                    weftSuccess);
          ASSERT_EQ(weftAllGather(a.data(), gathered.data(), count, weftInt32, direct, stream),
                    weftSuccess);
          ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(direct);
          EXPECT_EQ(gathered, std::vector<int32_t>(n * count, n - 1 + round));
        }
        // A blocking call behind a queued one on the same communicator runs
        // after it on every rank, whichever thread gets there first.
        std::vector<int32_t> queued(count, 1), blocking(count, context.rank);
        ASSERT_EQ(
            weftAllReduce(queued.data(), queued.data(), count, weftInt32, weftSum, direct, stream),
            weftSuccess);
        ASSERT_EQ(weftAllReduce(blocking.data(), blocking.data(), count, weftInt32, weftMax, direct,
                                nullptr),
                  weftSuccess)
            << weftGetLastError(direct);
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(direct);
        EXPECT_EQ(queued, std::vector<int32_t>(count, n));
        EXPECT_EQ(blocking, std::vector<int32_t>(count, n - 1));
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(direct), weftSuccess);
        EXPECT_EQ(weftCommDestroy(plain), weftSuccess);
      },
      options);
}

// A rank killed while its peers run direct collectives: every survivor
// returns an error well within the timeout, and nothing stays in /dev/shm.
TEST_F(NoLeftovers, KilledPeerIsAnErrorOnEverySurvivor) {
  constexpr int kTimeoutMs = 20000;
  RunOptions options;
  options.expected.assign(3, ExpectedEnd{});
  options.expected[2].signal = SIGKILL;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context, kTimeoutMs);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::TwoShot, kTimeoutMs);
        std::vector<float> data(5000, 1.0f);
        // Rounds in lockstep: the victim dies in the middle of the 50th op.
        for (int op = 0; op < 50; ++op)
          ASSERT_EQ(weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftMin, comm,
                                  nullptr),
                    weftSuccess);
        if (context.rank == 2) raise(SIGKILL);
        auto start = Clock::now();
        weftResult_t result = weftSuccess;
        for (int op = 0; op < 1000 && result == weftSuccess; ++op)
          result = weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftMin, comm,
                                 nullptr);
        EXPECT_NE(result, weftSuccess);
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(),
                  kTimeoutMs / 1000.0 / 2)
            << "took too long to notice: " << weftGetLastError(comm);
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      options);
}

// Staging that cannot exist is a clear error at init on every rank.
TEST_F(NoLeftovers, StagingBelowTheMinimumFailsInitClearly) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", "100"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        weftComm_t comm = nullptr;
        EXPECT_EQ(weftCommInitRank(&comm, context.nranks, context.id, context.rank),
                  weftInvalidUsage);
        std::string error = weftGetLastError(nullptr);
        EXPECT_NE(error.find("WEFT_SHM_BYTES"), std::string::npos) << error;
      },
      options);
}

// One rank cannot reserve its staging (as in a container with a small
// /dev/shm): every rank still gets a working communicator, on the message
// path, and a forced direct algorithm says why it cannot run.
TEST_F(NoLeftovers, NoRoomInDevShmFallsBackToTheMessagePath) {
  run_ranks(3, [](const RankContext& context) {
    if (context.rank == 1) setenv("WEFT_SHM_BYTES", "1125899906842624", 1);  // 1 PiB
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    weftComm_t comm = nullptr;
    ASSERT_EQ(weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config),
              weftSuccess)
        << weftGetLastError(nullptr);
    std::vector<int64_t> values(1000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = pattern_value(context.rank, i);
    ASSERT_EQ(weftAllReduce(values.data(), values.data(), values.size(), weftInt64, weftSum, comm,
                            nullptr),
              weftSuccess)
        << weftGetLastError(comm);
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t want = 0;
      for (int q = 0; q < context.nranks; ++q) want += pattern_value(q, i);
      ASSERT_EQ(values[i], want) << "element " << i;
    }
    weftComm_t forced = nullptr;
    config.algorithms = "allreduce:oneshot";
    ASSERT_EQ(weftCommSplit(comm, 0, context.rank, &forced, &config), weftSuccess)
        << weftGetLastError(comm);
    EXPECT_EQ(weftAllReduce(values.data(), values.data(), 1, weftInt64, weftSum, forced, nullptr),
              weftInvalidUsage);
    EXPECT_NE(std::string(weftGetLastError(forced)).find("/dev/shm"), std::string::npos)
        << weftGetLastError(forced);
    EXPECT_EQ(weftCommDestroy(forced), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Without shared memory, forcing a direct algorithm is a usage error naming it.
TEST_F(NoLeftovers, DisabledSharedMemoryRefusesDirectAlgorithms) {
  RunOptions options;
  options.env = {{"WEFT_SHM_DISABLE", "1"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        weftConfig_t config = WEFT_CONFIG_INITIALIZER;
        config.algorithms = "allreduce:twoshot";
        weftComm_t comm = nullptr;
        ASSERT_EQ(weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config),
                  weftSuccess);
        float x = 1;
        EXPECT_EQ(weftAllReduce(&x, &x, 1, weftFloat32, weftSum, comm, nullptr), weftInvalidUsage);
        EXPECT_NE(std::string(weftGetLastError(comm)).find("twoshot"), std::string::npos)
            << weftGetLastError(comm);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

}  // namespace
}  // namespace weft::testing
