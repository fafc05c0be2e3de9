// Ranks that call different collectives (another count, datatype, op, root or
// collective) fail on every rank with weftInvalidUsage naming both calls,
// instead of returning garbage or hanging: blocking, in groups, on streams,
// on the direct path and on message schedules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

constexpr int kTimeoutMs = 60000;

// One collective call on comm with buffers of `count` elements (and room for
// the gathered output); returns its result.
using Call = std::function<weftResult_t(weftComm_t, weftStream_t)>;

struct Case {
  const char* name;
  Call usual, odd;                    // what ranks 0 and 2 call, and what rank 1 calls
  const char *usual_says, *odd_says;  // how the messages describe each call
  const char* algorithms = nullptr;   // forced, e.g. a message schedule
  bool on_stream = false;
  // The usual ranks only send, or read a rank that made their call (a small Broadcast's
  // lanes): their call may complete, and their next one, which waits for rank 1, fails.
  bool usual_may_complete = false;
};

std::vector<float> floats(8192, 1.0f), float_out(3 * 8192);
std::vector<int32_t> ints(8192, 1);

Call all_reduce(size_t count, weftDataType_t dtype = weftFloat32, weftRedOp_t op = weftSum) {
  return [=](weftComm_t comm, weftStream_t stream) {
    void* data = dtype == weftInt32 ? static_cast<void*>(ints.data()) : floats.data();
    return weftAllReduce(data, data, count, dtype, op, comm, stream);
  };
}
Call all_gather(size_t count) {
  return [=](weftComm_t comm, weftStream_t stream) {
    return weftAllGather(floats.data(), float_out.data(), count, weftFloat32, comm, stream);
  };
}
Call broadcast(int root) {
  return [=](weftComm_t comm, weftStream_t stream) {
    return weftBcast(floats.data(), 100, weftFloat32, root, comm, stream);
  };
}
// A matching AllReduce, then the given call, in one group.
Call grouped(Call second) {
  return [=](weftComm_t comm, weftStream_t stream) {
    weftGroupStart();
    weftResult_t first = all_reduce(64)(comm, stream);
    weftResult_t then = second(comm, stream);
    weftResult_t end = weftGroupEnd();
    return first != weftSuccess ? first : then != weftSuccess ? then : end;
  };
}

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.name;
}

class Mismatch : public ::testing::TestWithParam<Case> {};

TEST_P(Mismatch, FailsEveryRankNamingBothCalls) {
  const Case& c = GetParam();
  // Rank 1 stays until the usual ranks made their next call (which would otherwise find it
  // gone and name its departure).
  int next_calls[2];
  ASSERT_EQ(pipe(next_calls), 0);
  run_ranks(3, [&c, &next_calls](const RankContext& context) {
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.timeoutMs = kTimeoutMs;
    config.algorithms = c.algorithms;
    weftComm_t comm = nullptr;
    ASSERT_EQ(weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config),
              weftSuccess)
        << weftGetLastError(nullptr);
    // A matching call first: detection must not depend on being the first.
    ASSERT_EQ(all_reduce(10)(comm, nullptr), weftSuccess) << weftGetLastError(comm);
    weftStream_t stream = nullptr;
    if (c.on_stream) {
      ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    }
    const bool odd = context.rank == 1;
    weftResult_t result = (odd ? c.odd : c.usual)(comm, stream);
    if (result == weftSuccess && stream != nullptr) result = weftStreamSynchronize(stream);
    if (c.usual_may_complete && !odd) {
      if (result == weftSuccess) result = all_reduce(10)(comm, nullptr);
      EXPECT_EQ(write(next_calls[1], "x", 1), 1);
    }
    if (c.usual_may_complete && odd)
      for (int i = 0; i < 2; ++i) {
        char byte;
        EXPECT_EQ(read(next_calls[0], &byte, 1), 1);
      }
    EXPECT_EQ(result, weftInvalidUsage) << c.name << ": " << weftGetLastError(comm);
    std::string message = weftGetLastError(comm);
    // The odd rank names whichever usual rank it saw first.
    std::string expected =
        odd ? std::string(" called ") + c.usual_says + " while rank 1 called " + c.odd_says
            : std::string("rank 1 called ") + c.odd_says + " while rank " +
                  std::to_string(context.rank) + " called " + c.usual_says;
    EXPECT_NE(message.find(expected), std::string::npos) << message << "\nexpected: " << expected;
    EXPECT_NE(message.find("sequence 1"), std::string::npos) << message;
    if (stream != nullptr) weftStreamDestroy(stream);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
  close(next_calls[0]);
  close(next_calls[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Calls, Mismatch,
    ::testing::Values(
        Case{"count", all_reduce(1000), all_reduce(2000), "allreduce(count=1000, float, sum)",
             "allreduce(count=2000, float, sum)"},
        Case{"collective", all_reduce(1000), all_gather(1000), "allreduce(count=1000, float, sum)",
             "allgather(count=1000, float)"},
        Case{"datatype", all_reduce(1000), all_reduce(1000, weftInt32),
             "allreduce(count=1000, float, sum)", "allreduce(count=1000, int32, sum)"},
        Case{"op", all_reduce(1000), all_reduce(1000, weftFloat32, weftMax),
             "allreduce(count=1000, float, sum)", "allreduce(count=1000, float, max)"},
        Case{"root", broadcast(0), broadcast(2), "broadcast(count=100, float, root 0)",
             "broadcast(count=100, float, root 2)", nullptr, false, true},
        // Same sizes over a message schedule: without the check this completes with garbage.
        Case{"datatype_ring", all_reduce(4096), all_reduce(4096, weftInt32),
             "allreduce(count=4096, float, sum)", "allreduce(count=4096, int32, sum)",
             "allreduce:ring"},
        Case{"stream", all_reduce(1000), all_gather(1000), "allreduce(count=1000, float, sum)",
             "allgather(count=1000, float)", nullptr, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// In a group the second call is the mismatched one (sequence 2).
TEST(MismatchInGroup, SecondCallOfAGroup) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kTimeoutMs);
    ASSERT_EQ(all_reduce(10)(comm, nullptr), weftSuccess);
    weftResult_t result =
        grouped(context.rank == 1 ? all_gather(500) : all_reduce(500))(comm, nullptr);
    EXPECT_EQ(result, weftInvalidUsage);
    std::string message = weftGetLastError(comm);
    EXPECT_NE(message.find("sequence 2"), std::string::npos) << message;
    EXPECT_NE(message.find(context.rank == 1 ? "rank 0 called allreduce(count=500"
                                             : "rank 1 called allgather(count=500"),
              std::string::npos)
        << message;
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

}  // namespace
}  // namespace weft::testing
