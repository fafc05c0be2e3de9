// The blocking fast path for small direct collectives (collectives.cc): every call it serves
// takes it (counted by its TRACE line in each process's own log file, so a bypassed path
// fails the count), with exact results for every dtype and op at 1-5 ranks, odd counts, in
// place and out of place; calls it does not serve (a stream, a group, a pre-multiplied sum)
// take the general path; mismatched calls and a silent peer still fail every rank.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "common/dtype.h"
#include "support/direct_cases.h"
#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using algo::Collective;

constexpr const char* kFastLine = "blocking fast path";

const Collective kServed[] = {Collective::AllReduce, Collective::ReduceScatter,
                              Collective::AllGather, Collective::Broadcast,
                              Collective::Reduce,    Collective::AllToAll};

// A fresh directory for the ranks' log files (one per process: WEFT_DEBUG_FILE's %p).
std::string log_directory() {
  std::string dir = ::testing::TempDir() + "weft-fast-path-XXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

RunOptions traced(const std::string& dir) {
  static std::string pattern;  // run_ranks reads the pointers before the children start
  pattern = dir + "/rank-%p.log";
  RunOptions options;
  options.env = {
      {"WEFT_DEBUG", "TRACE"}, {"WEFT_DEBUG_SUBSYS", "COLL"}, {"WEFT_DEBUG_FILE", pattern.c_str()}};
  return options;
}

// Lines of this process's log that say `what`.
int lines_saying(const std::string& dir, const char* what) {
  std::ifstream log(dir + "/rank-" + std::to_string(getpid()) + ".log");
  int found = 0;
  for (std::string line; std::getline(log, line);) found += line.find(what) != std::string::npos;
  return found;
}

class FastPath : public NoLeftovers, public ::testing::WithParamInterface<int> {};

TEST_P(FastPath, TakenWithExactResultsForEveryDtypeOpAndPlacement) {
  const std::string dir = log_directory();
  run_ranks(
      GetParam(),
      [&dir](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int before = lines_saying(dir, kFastLine);
        int expected = 0, failures = 0;
        for (Collective collective : kServed) {
          for (size_t count : {size_t{1}, size_t{7}, size_t{33}}) {
            for (bool in_place : {false, true}) {
              for (int t = 0; t < weftNumTypes; ++t) {
                const auto dtype = static_cast<weftDataType_t>(t);
                const int last_op = is_reduction(collective) ? kPreMulSum : weftSum;
                for (int op = weftSum; op <= last_op; ++op) {
                  Case c{collective, dtype,    op,
                         count,      in_place, static_cast<int>(count % context.nranks)};
                  std::string error = run_case(comm, c, context.rank, context.nranks);
                  if (!error.empty() && ++failures <= 5)
                    ADD_FAILURE() << "rank " << context.rank << " "
                                  << algo::collective_name(collective) << " count " << count << " "
                                  << dtype_name(dtype) << " op " << op
                                  << (in_place ? " in-place: " : ": ") << error;
                  if (error.rfind("call failed", 0) == 0) return;
                  // Pre-multiplied sums stage their input: the general path.
                  expected += op != kPreMulSum;
                }
              }
            }
          }
        }
        EXPECT_GT(expected, 0);
        EXPECT_EQ(lines_saying(dir, kFastLine) - before, expected);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      traced(dir));
}
INSTANTIATE_TEST_SUITE_P(Ranks, FastPath, ::testing::Values(1, 2, 3, 4, 5));

// A stream or an open group needs the general path; the next blocking call takes the fast one.
TEST_F(NoLeftovers, StreamsAndGroupsTakeTheGeneralPath) {
  const std::string dir = log_directory();
  run_ranks(
      3,
      [&dir](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        std::vector<int32_t> data(5, context.rank + 1);
        const int before = lines_saying(dir, kFastLine);
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        ASSERT_EQ(weftAllReduce(data.data(), data.data(), 5, weftInt32, weftSum, comm, stream),
                  weftSuccess);
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess);
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        ASSERT_EQ(weftAllReduce(data.data(), data.data(), 5, weftInt32, weftSum, comm, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess);
        EXPECT_EQ(lines_saying(dir, kFastLine), before);
        ASSERT_EQ(weftAllReduce(data.data(), data.data(), 5, weftInt32, weftSum, comm, nullptr),
                  weftSuccess);
        EXPECT_EQ(lines_saying(dir, kFastLine), before + 1);
        // 1+2+3 = 6, summed three times over three ranks: 6 * 3 * 3.
        EXPECT_EQ(data, std::vector<int32_t>(5, 6 * 3 * 3));
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      traced(dir));
}

// Same sizes, different collectives: each rank's fast-path call completes its rounds, then
// the announcements show the mismatch and every rank fails naming both calls.
TEST_F(NoLeftovers, MismatchedCallsFailEveryRank) {
  const std::string dir = log_directory();
  run_ranks(
      2,
      [&dir](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        std::vector<float> in(2, 1.0f), out(2, 0.0f);
        const int before = lines_saying(dir, kFastLine);
        weftResult_t result =
            context.rank == 0
                ? weftAllReduce(in.data(), out.data(), 1, weftFloat32, weftSum, comm, nullptr)
                : weftBroadcast(in.data(), out.data(), 1, weftFloat32, 0, comm, nullptr);
        EXPECT_EQ(result, weftInvalidUsage);
        std::string message = weftGetLastError(comm);
        EXPECT_NE(message.find("mismatched collectives"), std::string::npos) << message;
        EXPECT_NE(message.find(context.rank == 0 ? "broadcast(count=1" : "allreduce(count=1"),
                  std::string::npos)
            << message;
        EXPECT_EQ(lines_saying(dir, kFastLine), before + 1);
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      traced(dir));
}

// A peer that never calls: the fast path's wait ends at the communicator's timeout, naming
// the silent rank, on the rank that waits (the peer then sees the failure too).
TEST_F(NoLeftovers, SilentPeerIsATimeout) {
  int done[2];
  ASSERT_EQ(pipe(done), 0);
  const std::string dir = log_directory();
  run_ranks(
      2,
      [&](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot, 1000);
        const int before = lines_saying(dir, kFastLine);
        if (context.rank == 0) {
          std::vector<float> data(3, 1.0f);
          EXPECT_EQ(weftAllReduce(data.data(), data.data(), 3, weftFloat32, weftSum, comm, nullptr),
                    weftTimeout);
          std::string message = weftGetLastError(comm);
          EXPECT_NE(message.find("timed out after 1000 ms"), std::string::npos) << message;
          EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
          EXPECT_EQ(lines_saying(dir, kFastLine), before + 1);
          char byte = 1;
          EXPECT_EQ(write(done[1], &byte, 1), 1);
        } else {
          char byte = 0;
          EXPECT_EQ(read(done[0], &byte, 1), 1);  // rank 0 has timed out
        }
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      traced(dir));
  close(done[0]);
  close(done[1]);
}

// Two ranks on one CPU: a wait that spins first only burns the slice the peer needs
// (a 4 KiB AllGather took 15 us instead of 1, docs/performance.md), so a rank whose peer
// last published from its own CPU yields at once (its TRACE line says so); ranks on
// CPUs of their own never do. Results stay exact either way.
constexpr const char* kSharedCpuLine = "a peer runs on this CPU";

void all_gathers_pinned(const std::string& dir, bool one_cpu) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (!one_cpu && cpus < 2) GTEST_SKIP() << "needs two CPUs";
  run_ranks(
      2,
      [&dir, one_cpu](const RankContext& context) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(one_cpu ? 0 : context.rank, &set);
        ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const size_t count = 1024;  // 4 KiB of floats per rank
        std::vector<float> input(count), output(2 * count);
        for (int call = 0; call < 200; ++call) {
          for (size_t i = 0; i < count; ++i)
            input[i] = static_cast<float>(context.rank + call + i % 9);
          ASSERT_EQ(weftAllGather(input.data(), output.data(), count, weftFloat32, comm, nullptr),
                    weftSuccess);
          for (size_t i = 0; i < 2 * count; ++i)
            ASSERT_EQ(output[i], static_cast<float>(i / count + call + i % count % 9)) << i;
        }
        int lines = lines_saying(dir, kSharedCpuLine);
        ASSERT_EQ(weftAllReduce(&lines, &lines, 1, weftInt32, weftSum, world, nullptr),
                  weftSuccess);
        if (one_cpu)
          EXPECT_GT(lines, 0);
        else
          EXPECT_EQ(lines, 0);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      traced(dir));
}

TEST_F(NoLeftovers, RanksOnOneCpuYieldWithoutSpinning) {
  all_gathers_pinned(log_directory(), true);
}

TEST_F(NoLeftovers, RanksOnTheirOwnCpusNeverSeeASharedCpu) {
  all_gathers_pinned(log_directory(), false);
}

}  // namespace
}  // namespace weft::testing
