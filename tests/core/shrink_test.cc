// Revoke and shrink: a revoked communicator fails every rank's work at once;
// the survivors of a killed rank shrink to a communicator of their own, with
// no help from the dead, and its results are exact on the smaller group.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/multirank.h"
#include "support/single_rank.h"
#include "weft/weft.h"
#include "weft/weft.hpp"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLongTimeoutMs = 60000;
// A failure reported through the bootstrap arrives long before this.
constexpr double kPromptSeconds = kLongTimeoutMs / 1000.0 / 4;

// Every rank but `target` sends it a token; `target` returns once it has them all.
void wait_for_tokens_then(weftComm_t comm, int rank, int nranks, int target) {
  int token = 0;
  if (rank != target) {
    ASSERT_EQ(weftSend(&token, 1, weftInt32, target, comm, nullptr), weftSuccess);
    return;
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != target) {
      ASSERT_EQ(weftRecv(&token, 1, weftInt32, peer, comm, nullptr), weftSuccess);
    }
  }
}

// Every rank exits 0 but `victim`, which dies of SIGKILL.
RunOptions victim_killed(int nranks, int victim) {
  RunOptions options;
  options.expected.assign(nranks, ExpectedEnd{});
  options.expected[victim].signal = SIGKILL;
  return options;
}

// AllReduce, AllGather and Broadcast on `comm` give exact results for its size.
void expect_exact_collectives(weftComm_t comm) {
  int rank = -1, size = -1;
  ASSERT_EQ(weftCommUserRank(comm, &rank), weftSuccess);
  ASSERT_EQ(weftCommCount(comm, &size), weftSuccess);
  const size_t count = 1000;
  std::vector<int32_t> mine(count), sum(count);
  for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(pattern_value(rank, i));
  ASSERT_EQ(weftAllReduce(mine.data(), sum.data(), count, weftInt32, weftSum, comm, nullptr),
            weftSuccess)
      << weftGetLastError(comm);
  std::vector<int32_t> gathered(count * size);
  ASSERT_EQ(weftAllGather(mine.data(), gathered.data(), count, weftInt32, comm, nullptr),
            weftSuccess)
      << weftGetLastError(comm);
  const int root = size - 1;
  std::vector<int32_t> broadcast(count);
  ASSERT_EQ(weftBroadcast(mine.data(), broadcast.data(), count, weftInt32, root, comm, nullptr),
            weftSuccess)
      << weftGetLastError(comm);
  for (size_t i = 0; i < count; ++i) {
    int64_t expected = 0;
    for (int r = 0; r < size; ++r) {
      expected += pattern_value(r, i);
      ASSERT_EQ(gathered[r * count + i], pattern_value(r, i))
          << "gathered from " << r << " at " << i;
    }
    ASSERT_EQ(sum[i], expected) << "sum at " << i;
    ASSERT_EQ(broadcast[i], pattern_value(root, i)) << "broadcast at " << i;
  }
}

// Rank `victim` dies; every survivor's collective fails promptly, then they
// shrink: a communicator of nranks - 1, renumbered in old-rank order.
void shrink_after_kill(int nranks, int victim) {
  const RunOptions options = victim_killed(nranks, victim);
  run_ranks(
      nranks,
      [victim](const RankContext& context) {
        weftComm_t comm = init_comm(context, kLongTimeoutMs);
        wait_for_tokens_then(comm, context.rank, context.nranks, victim);
        if (context.rank == victim) raise(SIGKILL);
        int32_t value = 1, sum = 0;
        auto start = Clock::now();
        EXPECT_EQ(weftAllReduce(&value, &sum, 1, weftInt32, weftSum, comm, nullptr),
                  weftRemoteError);
        const double to_error = seconds_since(start);
        EXPECT_LT(to_error, kPromptSeconds) << "took too long to notice";
        const std::string error = weftGetLastError(comm);
        EXPECT_NE(error.find("rank " + std::to_string(victim)), std::string::npos) << error;

        weftComm_t shrunk = nullptr;
        ASSERT_EQ(weftCommShrink(comm, &victim, 1, &shrunk, nullptr, WEFT_SHRINK_DEFAULT),
                  weftSuccess)
            << weftGetLastError(comm);
        ASSERT_NE(shrunk, nullptr);
        std::printf("rank %d of %d: error %.3f s after the victim's death, shrunk after %.3f s\n",
                    context.rank, context.nranks, to_error, seconds_since(start));
        int rank = -1, size = -1;
        EXPECT_EQ(weftCommUserRank(shrunk, &rank), weftSuccess);
        EXPECT_EQ(weftCommCount(shrunk, &size), weftSuccess);
        EXPECT_EQ(size, context.nranks - 1);
        EXPECT_EQ(rank, context.rank < victim ? context.rank : context.rank - 1);
        expect_exact_collectives(shrunk);
        EXPECT_EQ(weftCommDestroy(shrunk), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

TEST(Shrink, AfterKilledNonRootRankOf3) {
  shrink_after_kill(3, 1);
}
TEST(Shrink, AfterKilledNonRootRankOf4) {
  shrink_after_kill(4, 2);
}
TEST(Shrink, AfterKilledNonRootRankOf5) {
  shrink_after_kill(5, 3);
}

// A stalled rank (alive, connected, silent) is excluded just as a dead one:
// the survivors time out, then shrink without asking it anything.
TEST(Shrink, AfterAStalledRankTimesOut) {
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  run_ranks(3, [&release](const RankContext& context) {
    weftComm_t comm = init_comm(context, 2000);
    if (context.rank == 2) {
      char byte = 0;  // silent until the others have shrunk
      EXPECT_EQ(read(release[0], &byte, 1), 1);
      EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      return;
    }
    std::vector<float> data(1024, 1.0f);
    // The first survivor to time out fails the communicator for the other.
    const weftResult_t result =
        weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm, nullptr);
    EXPECT_TRUE(result == weftTimeout || result == weftRemoteError) << weftGetLastError(comm);
    const int stalled = 2;
    weftComm_t shrunk = nullptr;
    ASSERT_EQ(weftCommShrink(comm, &stalled, 1, &shrunk, nullptr, WEFT_SHRINK_DEFAULT), weftSuccess)
        << weftGetLastError(comm);
    expect_exact_collectives(shrunk);
    EXPECT_EQ(weftCommDestroy(shrunk), weftSuccess);
    if (context.rank == 0) {
      EXPECT_EQ(write(release[1], "x", 1), 1);
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
  close(release[0]);
  close(release[1]);
}

// Every rank but `victim` returns `comm` once `victim` died (SIGKILL) and an AllReduce on
// it failed.
weftComm_t comm_after_death_of(const RankContext& context, int victim, int timeout_ms) {
  weftComm_t comm = init_comm(context, timeout_ms);
  wait_for_tokens_then(comm, context.rank, context.nranks, victim);
  if (context.rank == victim) raise(SIGKILL);
  int32_t value = 1, sum = 0;
  EXPECT_EQ(weftAllReduce(&value, &sum, 1, weftInt32, weftSum, comm, nullptr), weftRemoteError);
  return comm;
}

// Rank 0's process hosts the bootstrap root. When it dies, the survivors that exclude it
// agree through the first of them, over their UCX workers: the shrink works as for any rank.
TEST(Shrink, AfterTheRootHostDiedOf3) {
  shrink_after_kill(3, 0);
}
TEST(Shrink, AfterTheRootHostDiedOf4) {
  shrink_after_kill(4, 0);
}

// Keeping the dead root's host among the survivors cannot work (it cannot join): a clear
// error at once, naming the root's host and what to do.
TEST(Shrink, KeepingTheDeadRootHostIsAClearError) {
  const RunOptions options = victim_killed(3, 0);
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t comm = comm_after_death_of(context, 0, kLongTimeoutMs);
        weftComm_t shrunk = nullptr;
        auto start = Clock::now();
        EXPECT_EQ(weftCommShrink(comm, nullptr, 0, &shrunk, nullptr, WEFT_SHRINK_DEFAULT),
                  weftRemoteError);
        EXPECT_LT(seconds_since(start), kPromptSeconds);
        const std::string error = weftGetLastError(comm);
        EXPECT_NE(error.find("cannot shrink: the bootstrap root, hosted by rank 0"),
                  std::string::npos)
            << error;
        EXPECT_NE(error.find("exclude them too"), std::string::npos) << error;
        EXPECT_EQ(shrunk, nullptr);
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
      },
      options);
}

// Without the root, the first survivor compares the lists: survivors that disagree all fail,
// naming both lists.
TEST(Shrink, MismatchedListsWithoutTheRootFailEveryone) {
  const RunOptions options = victim_killed(4, 0);
  run_ranks(
      4,
      [](const RankContext& context) {
        weftComm_t comm = comm_after_death_of(context, 0, kLongTimeoutMs);
        // Rank 3 also excludes rank 2, which does not: rank 1 answers both with the mismatch.
        const std::vector<int> excluded =
            context.rank == 3 ? std::vector<int>{0, 2} : std::vector<int>{0};
        weftComm_t shrunk = nullptr;
        auto start = Clock::now();
        EXPECT_EQ(weftCommShrink(comm, excluded.data(), static_cast<int>(excluded.size()), &shrunk,
                                 nullptr, WEFT_SHRINK_DEFAULT),
                  weftInvalidUsage);
        EXPECT_LT(seconds_since(start), kPromptSeconds);
        const std::string error = weftGetLastError(comm);
        EXPECT_NE(error.find("rank 3 excludes ranks {0,2} while rank 1 excludes {0}"),
                  std::string::npos)
            << error;
        EXPECT_EQ(shrunk, nullptr);
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
      },
      options);
}

// Without the root, a survivor outside the list that never calls (stalled) is named after
// the timeout, on every survivor that did call, and excluding it too then works.
TEST(Shrink, AStalledSurvivorWithoutTheRootIsNamedThenExcluded) {
  constexpr int kTimeoutMs = 2000;
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  RunOptions options = victim_killed(4, 0);
  run_ranks(
      4,
      [&release](const RankContext& context) {
        weftComm_t comm = comm_after_death_of(context, 0, kTimeoutMs);
        if (context.rank == 3) {
          char byte = 0;  // silent until the others have shrunk without it
          EXPECT_EQ(read(release[0], &byte, 1), 1);
          EXPECT_EQ(weftCommAbort(comm), weftSuccess);
          return;
        }
        const int dead = 0;
        weftComm_t shrunk = nullptr;
        auto start = Clock::now();
        EXPECT_EQ(weftCommShrink(comm, &dead, 1, &shrunk, nullptr, WEFT_SHRINK_DEFAULT),
                  weftTimeout);
        EXPECT_LT(seconds_since(start), kTimeoutMs / 1000.0 + 2);
        const std::string error = weftGetLastError(comm);
        EXPECT_NE(error.find("rank 3 (outside excludeRanks) did not call weftCommShrink"),
                  std::string::npos)
            << error;
        const int both[] = {0, 3};
        ASSERT_EQ(weftCommShrink(comm, both, 2, &shrunk, nullptr, WEFT_SHRINK_DEFAULT), weftSuccess)
            << weftGetLastError(comm);
        int size = -1;
        EXPECT_EQ(weftCommCount(shrunk, &size), weftSuccess);
        EXPECT_EQ(size, 2);
        expect_exact_collectives(shrunk);
        EXPECT_EQ(weftCommDestroy(shrunk), weftSuccess);
        if (context.rank == 1) {
          EXPECT_EQ(write(release[1], "xx", 2), 2);
        }
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
      },
      options);
  close(release[0]);
  close(release[1]);
}

// The demo: rank 2 of 4 dies inside an AllReduce loop; the survivors get an
// error, shrink, redo the failed step and finish the loop on three ranks.
TEST(Shrink, TrainingLoopSurvivesAKilledRank) {
  constexpr int kSteps = 40, kKillAt = 15, kVictim = 2;
  const RunOptions options = victim_killed(4, kVictim);
  run_ranks(
      4,
      [](const RankContext& context) {
        weftComm_t comm = init_comm(context, kLongTimeoutMs);
        const size_t count = 4096;
        std::vector<float> grad(count), out(count);
        int failures = 0;
        for (int step = 0; step < kSteps; ++step) {
          if (step == kKillAt && context.rank == kVictim) raise(SIGKILL);
          int rank = -1, size = -1;
          ASSERT_EQ(weftCommUserRank(comm, &rank), weftSuccess);
          ASSERT_EQ(weftCommCount(comm, &size), weftSuccess);
          for (size_t i = 0; i < count; ++i)
            grad[i] = static_cast<float>(pattern_value(rank, i + step));
          auto start = Clock::now();
          weftResult_t result =
              weftAllReduce(grad.data(), out.data(), count, weftFloat32, weftSum, comm, nullptr);
          if (result != weftSuccess) {
            const double to_error = seconds_since(start);
            ASSERT_EQ(result, weftRemoteError) << weftGetLastError(comm);
            ASSERT_EQ(++failures, 1) << "a second failure: " << weftGetLastError(comm);
            EXPECT_LT(to_error, kPromptSeconds);
            int excluded = kVictim;
            weftComm_t shrunk = nullptr;
            start = Clock::now();
            ASSERT_EQ(weftCommShrink(comm, &excluded, 1, &shrunk, nullptr, WEFT_SHRINK_DEFAULT),
                      weftSuccess)
                << weftGetLastError(comm);
            std::printf("rank %d: step %d failed after %.3f s, shrink took %.3f s\n", context.rank,
                        step, to_error, seconds_since(start));
            EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
            comm = shrunk;
            --step;  // redone on the survivors
            continue;
          }
          for (size_t i = 0; i < count; ++i) {
            float expected = 0;
            for (int r = 0; r < size; ++r)
              expected += static_cast<float>(pattern_value(r, i + step));
            ASSERT_EQ(out[i], expected) << "step " << step << " element " << i;
          }
        }
        EXPECT_EQ(failures, 1);
        int size = -1;
        EXPECT_EQ(weftCommCount(comm, &size), weftSuccess);
        EXPECT_EQ(size, 3);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

// Ranks 1 and 2 wait on rank 0, which has a receive queued on a stream;
// rank 0 revokes: all three operations fail at once (no timeout wait), every
// later call fails, and a shrink with nobody excluded starts afresh.
TEST(Revoke, FailsEveryRanksInFlightOperationQuickly) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kLongTimeoutMs);
    int value = 0;
    auto start = Clock::now();
    if (context.rank == 0) {
      wait_for_tokens_then(comm, context.rank, context.nranks, 0);
      // Rank 1 sends nothing more: this waits until the revoke.
      weftStream_t stream = nullptr;
      ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
      ASSERT_EQ(weftRecv(&value, 1, weftInt32, 1, comm, stream), weftSuccess);
      start = Clock::now();
      EXPECT_EQ(weftCommRevoke(comm), weftSuccess);
      EXPECT_EQ(weftStreamSynchronize(stream), weftRemoteError);
      EXPECT_EQ(weftStreamDestroy(stream), weftRemoteError);  // drained, reporting the failure
    } else {
      wait_for_tokens_then(comm, context.rank, context.nranks, 0);
      EXPECT_EQ(weftRecv(&value, 1, weftInt32, 0, comm, nullptr), weftRemoteError);
      const std::string error = weftGetLastError(comm);
      EXPECT_NE(error.find("rank 0 revoked the communicator"), std::string::npos) << error;
    }
    const double to_error = seconds_since(start);
    EXPECT_LT(to_error, kPromptSeconds);
    std::printf("rank %d: in-flight operation failed %.3f s after the revoke began\n", context.rank,
                to_error);
    EXPECT_EQ(weftBarrier(comm, nullptr), weftRemoteError);

    weftComm_t fresh = nullptr;
    ASSERT_EQ(weftCommShrink(comm, nullptr, 0, &fresh, nullptr, WEFT_SHRINK_DEFAULT), weftSuccess)
        << weftGetLastError(comm);
    int size = -1;
    EXPECT_EQ(weftCommCount(fresh, &size), weftSuccess);
    EXPECT_EQ(size, 3);
    expect_exact_collectives(fresh);
    EXPECT_EQ(weftCommDestroy(fresh), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Excluding a live rank: its own call is refused, the others go on without it.
// WEFT_SHRINK_ABORT revokes the parent on the way.
TEST(Shrink, ExcludingALiveRank) {
  run_ranks(4, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kLongTimeoutMs);
    const int excluded = 3;
    int marker = 0;
    weftComm_t shrunk = reinterpret_cast<weftComm_t>(&marker);  // must be reset
    if (context.rank == excluded) {
      EXPECT_EQ(weftCommShrink(comm, &excluded, 1, &shrunk, nullptr, WEFT_SHRINK_ABORT),
                weftInvalidUsage);
      const std::string error = weftGetLastError(comm);
      EXPECT_NE(error.find("rank 3 is in excludeRanks"), std::string::npos) << error;
      EXPECT_EQ(shrunk, nullptr);
    } else {
      ASSERT_EQ(weftCommShrink(comm, &excluded, 1, &shrunk, nullptr, WEFT_SHRINK_ABORT),
                weftSuccess)
          << weftGetLastError(comm);
      int rank = -1;
      EXPECT_EQ(weftCommUserRank(shrunk, &rank), weftSuccess);
      EXPECT_EQ(rank, context.rank);
      expect_exact_collectives(shrunk);
      EXPECT_EQ(weftCommDestroy(shrunk), weftSuccess);
      // ABORT revoked the parent.
      EXPECT_EQ(weftBarrier(comm, nullptr), weftRemoteError);
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// The C++ wrappers: revoke everywhere, then shrink without the last rank,
// whose own call throws.
TEST(Shrink, CppRevokeThenShrink) {
  run_ranks(3, [](const RankContext& context) {
    weft::Comm comm = weft::Comm::adopt(init_comm(context, kLongTimeoutMs));
    comm.revoke();
    EXPECT_EQ(comm.async_error(), weftRemoteError);
    const std::vector<int> excluded{2};
    if (context.rank == 2) {
      try {
        (void)comm.shrink(excluded);
        ADD_FAILURE() << "the excluded rank's shrink succeeded";
      } catch (const weft::Error& error) {
        EXPECT_EQ(error.code(), weftInvalidUsage) << error.what();
      }
      return;
    }
    weft::Comm shrunk = comm.shrink(excluded);
    EXPECT_EQ(shrunk.size(), 2);
    EXPECT_EQ(shrunk.rank(), context.rank);
    std::vector<int32_t> value{context.rank + 1};
    shrunk.all_reduce(value);
    EXPECT_EQ(value[0], 3);
  });
}

// Survivors that disagree on whom to exclude all fail, naming both lists.
TEST(Shrink, MismatchedExclusionListsFailEveryone) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kLongTimeoutMs);
    const int excluded = 2;
    weftComm_t shrunk = nullptr;
    auto start = Clock::now();
    EXPECT_EQ(weftCommShrink(comm, &excluded, context.rank == 0 ? 1 : 0, &shrunk, nullptr,
                             WEFT_SHRINK_DEFAULT),
              weftInvalidUsage);
    EXPECT_LT(seconds_since(start), kPromptSeconds);
    const std::string error = weftGetLastError(comm);
    EXPECT_NE(error.find("excludes ranks"), std::string::npos) << error;
    EXPECT_NE(error.find("{2}"), std::string::npos) << error;
    EXPECT_EQ(shrunk, nullptr);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

using ShrinkArguments = SingleRankTest;

TEST_F(ShrinkArguments, AreNamed) {
  weftComm_t out = nullptr;
  const int minus_one = -1, one = 1, zeros[2] = {0, 0};
  EXPECT_ERROR(weftCommShrink(comm_, &minus_one, 1, &out, nullptr, 0), weftInvalidArgument,
               "excludeRanks[0] = -1");
  EXPECT_ERROR(weftCommShrink(comm_, &one, 1, &out, nullptr, 0), weftInvalidArgument,
               "excludeRanks[0] = 1 is not a rank");
  EXPECT_ERROR(weftCommShrink(comm_, zeros, 2, &out, nullptr, 0), weftInvalidArgument,
               "excludeRanks[1] = 0 is listed twice");
  EXPECT_ERROR(weftCommShrink(comm_, zeros, 1, &out, nullptr, 0), weftInvalidArgument,
               "nobody is left");
  EXPECT_ERROR(weftCommShrink(comm_, nullptr, 1, &out, nullptr, 0), weftInvalidArgument,
               "excludeRanks is NULL");
  EXPECT_ERROR(weftCommShrink(comm_, zeros, -1, &out, nullptr, 0), weftInvalidArgument,
               "nExclude -1");
  EXPECT_ERROR(weftCommShrink(comm_, nullptr, 0, &out, nullptr, 7), weftInvalidArgument,
               "shrinkFlags 7");
  EXPECT_ERROR(weftCommShrink(comm_, nullptr, 0, nullptr, nullptr, 0), weftInvalidArgument,
               "newcomm");
  EXPECT_ERROR(weftCommShrink(nullptr, nullptr, 0, &out, nullptr, 0), weftInvalidArgument, "comm");
  EXPECT_EQ(out, nullptr);
  // The communicator is untouched by refused calls; a one-rank shrink works.
  ASSERT_EQ(weftCommShrink(comm_, nullptr, 0, &out, nullptr, 0), weftSuccess)
      << weftGetLastError(nullptr);
  expect_exact_collectives(out);
  EXPECT_EQ(weftCommDestroy(out), weftSuccess);
}

}  // namespace
}  // namespace weft::testing
