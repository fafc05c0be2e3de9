// A peer that leaves on purpose (finalize or destroy) while others still wait
// for it is not a stall: their work fails at once, naming it, instead of at
// the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Long enough that an error seen well before it cannot be the timeout.
constexpr int kTimeoutMs = 60000;
constexpr double kPromptSeconds = kTimeoutMs / 1000.0 / 4;

void expect_names_leaver(const std::string& message, const char* what) {
  EXPECT_NE(message.find("rank 1 ("), std::string::npos) << message;
  EXPECT_NE(message.find("left the communicator"), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

void all_reduce_ok(weftComm_t comm, std::vector<float>& data) {
  ASSERT_EQ(
      weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm, nullptr),
      weftSuccess)
      << weftGetLastError(comm);
}

// Rank 1 takes part in two AllReduces and destroys its communicator; the
// others call a third, blocking (rank 0) and on a stream (rank 2).
TEST(Departure, DestroyWhilePeersWaitInACollective) {
  for (int count : {16, 1 << 20}) {  // direct path and staged rounds / schedules
    run_ranks(3, [count](const RankContext& context) {
      weftComm_t comm = init_comm(context, kTimeoutMs);
      std::vector<float> data(count, 1.0f);
      all_reduce_ok(comm, data);
      all_reduce_ok(comm, data);
      if (context.rank == 1) {
        ASSERT_EQ(weftCommDestroy(comm), weftSuccess);
        return;
      }
      auto start = Clock::now();
      weftResult_t result;
      if (context.rank == 0) {
        result = weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm,
                               nullptr);
      } else {
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        result = weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm,
                               stream);
        if (result == weftSuccess) result = weftStreamSynchronize(stream);
        weftStreamDestroy(stream);  // returns the stream's error again
      }
      EXPECT_EQ(result, weftRemoteError);
      EXPECT_LT(seconds_since(start), kPromptSeconds) << "waited for the timeout";
      expect_names_leaver(weftGetLastError(comm), "after 2 collectives");
      weftResult_t async_error = weftSuccess;
      EXPECT_EQ(weftCommGetAsyncError(comm, &async_error), weftSuccess);
      EXPECT_EQ(async_error, weftRemoteError);
      EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    });
  }
}

// Rank 1 sends one message to rank 0 and leaves; rank 0 waits for a second.
TEST(Departure, FinalizeWhileAPeerWaitsToReceive) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kTimeoutMs);
    int token = 7;
    if (context.rank == 1) {
      ASSERT_EQ(weftSend(&token, 1, weftInt32, 0, comm, nullptr), weftSuccess);
      ASSERT_EQ(weftCommFinalize(comm), weftSuccess);
      ASSERT_EQ(weftCommDestroy(comm), weftSuccess);
      return;
    }
    int got = 0;
    ASSERT_EQ(weftRecv(&got, 1, weftInt32, 1, comm, nullptr), weftSuccess);
    EXPECT_EQ(got, token);
    auto start = Clock::now();
    EXPECT_EQ(weftRecv(&got, 1, weftInt32, 1, comm, nullptr), weftRemoteError);
    EXPECT_LT(seconds_since(start), kPromptSeconds) << "waited for the timeout";
    expect_names_leaver(weftGetLastError(comm), "after sending 1 messages to rank 0");
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Leaving after every rank finished the same work is no error for anyone, in
// whatever order the ranks leave and whatever they do meanwhile.
TEST(Departure, LeavingAfterTheSameWorkIsNoError) {
  run_ranks(4, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, kTimeoutMs);
    std::vector<float> data(1000, 1.0f);
    for (int i = 0; i < 3; ++i) all_reduce_ok(comm, data);
    int mine = context.rank, from_left = -1;
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftSend(&mine, 1, weftInt32, (context.rank + 1) % 4, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftRecv(&from_left, 1, weftInt32, (context.rank + 3) % 4, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess);
    EXPECT_EQ(from_left, (context.rank + 3) % 4);
    weftComm_t half = nullptr;
    ASSERT_EQ(weftCommSplit(comm, context.rank % 2, context.rank, &half, nullptr), weftSuccess)
        << weftGetLastError(comm);
    if (context.rank % 2 == 1) {  // the odd ranks leave first
      EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      EXPECT_EQ(weftCommDestroy(half), weftSuccess);
      return;
    }
    all_reduce_ok(half, data);
    EXPECT_EQ(data[0], 2 * 64.0f);
    weftResult_t async_error = weftInternalError;
    EXPECT_EQ(weftCommGetAsyncError(comm, &async_error), weftSuccess);
    EXPECT_EQ(async_error, weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(half), weftSuccess);
  });
}

}  // namespace
}  // namespace weft::testing
