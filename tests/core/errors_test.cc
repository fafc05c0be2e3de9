// Bad input gets a clear status and a last-error message naming the argument.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>

#include "support/expect_error.h"
#include "support/single_rank.h"
#include "weft/weft.h"

namespace {

class SingleRank : public weft::testing::SingleRankTest {
 protected:
  int buffer_[16] = {};
};

TEST(Errors, VersionAndStrings) {
  int version = 0;
  EXPECT_EQ(weftGetVersion(&version), weftSuccess);
  EXPECT_EQ(version, WEFT_VERSION);
  EXPECT_ERROR(weftGetVersion(nullptr), weftInvalidArgument, "version");
  EXPECT_STREQ(weftGetErrorString(weftTimeout), "timeout");
  EXPECT_STRNE(weftGetErrorString(weftInvalidArgument), weftGetErrorString(weftInvalidUsage));
}

TEST(Errors, InitArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm = nullptr;
  EXPECT_ERROR(weftCommInitRank(nullptr, 1, id, 0), weftInvalidArgument, "comm");
  EXPECT_ERROR(weftCommInitRank(&comm, 0, id, 0), weftInvalidArgument, "nranks");
  EXPECT_ERROR(weftCommInitRank(&comm, 2, id, 2), weftInvalidArgument, "rank 2");
  EXPECT_ERROR(weftCommInitRank(&comm, 2, id, -1), weftInvalidArgument, "rank -1");
  weftUniqueId garbage;
  memset(&garbage, 0x5A, sizeof(garbage));
  EXPECT_ERROR(weftCommInitRank(&comm, 1, garbage, 0), weftInvalidArgument, "commId");
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument, "config");
  config = WEFT_CONFIG_INITIALIZER;
  config.timeoutMs = -5;
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument, "timeoutMs");
  config = WEFT_CONFIG_INITIALIZER;
  config.blocking = 7;
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument, "blocking");
  EXPECT_EQ(comm, nullptr);
  EXPECT_ERROR(weftGetUniqueId(nullptr), weftInvalidArgument, "uniqueId");
}

TEST_F(SingleRank, NullAndForeignCommunicators) {
  int value = 0;
  EXPECT_ERROR(weftCommCount(nullptr, &value), weftInvalidArgument, "comm is NULL");
  EXPECT_ERROR(weftCommUserRank(comm_, nullptr), weftInvalidArgument, "rank");
  EXPECT_ERROR(weftSend(buffer_, 1, weftInt32, 0, nullptr, nullptr), weftInvalidArgument, "comm");
  uint64_t not_a_comm[4] = {1, 2, 3, 4};
  EXPECT_ERROR(weftBarrier(reinterpret_cast<weftComm_t>(not_a_comm), nullptr), weftInvalidArgument,
               "not a communicator");
}

TEST_F(SingleRank, PointToPointArguments) {
  EXPECT_ERROR(weftSend(buffer_, 1, static_cast<weftDataType_t>(12), 0, comm_, nullptr),
               weftInvalidArgument, "datatype 12");
  EXPECT_ERROR(weftRecv(buffer_, 1, static_cast<weftDataType_t>(-1), 0, comm_, nullptr),
               weftInvalidArgument, "datatype -1");
  EXPECT_ERROR(weftSend(buffer_, 1, weftInt32, 1, comm_, nullptr), weftInvalidArgument, "peer 1");
  EXPECT_ERROR(weftRecv(buffer_, 1, weftInt32, -3, comm_, nullptr), weftInvalidArgument, "peer -3");
  EXPECT_ERROR(weftSend(nullptr, 4, weftInt32, 0, comm_, nullptr), weftInvalidArgument, "sendbuff");
  EXPECT_ERROR(weftRecv(nullptr, 4, weftInt32, 0, comm_, nullptr), weftInvalidArgument, "recvbuff");
  EXPECT_ERROR(weftSend(buffer_, SIZE_MAX / 2, weftInt64, 0, comm_, nullptr), weftInvalidArgument,
               "overflows");
  EXPECT_ERROR(weftSend(buffer_, 1, weftInt32, 0, comm_, nullptr), weftInvalidUsage, "self");
  // None of that may have harmed the communicator.
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftSend(buffer_, 16, weftInt32, 0, comm_, nullptr), weftSuccess);
  EXPECT_EQ(weftRecv(buffer_ + 8, 8, weftInt32, 0, comm_, nullptr), weftSuccess);
  // The receive is smaller than the send: reported at the group's end.
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
}

TEST_F(SingleRank, GroupMisuse) {
  EXPECT_ERROR(weftGroupEnd(), weftInvalidUsage, "without a matching weftGroupStart");
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftBarrier(comm_, nullptr), weftSuccess);  // queued with the group
  EXPECT_EQ(weftSend(buffer_, 1, weftInt32, 5, comm_, nullptr), weftInvalidArgument);
  // An invalid call inside a group abandons the group; its end reports it.
  EXPECT_ERROR(weftGroupEnd(), weftInvalidArgument, "group abandoned");
  // The next group is clean.
  int in = 42, out = 0;
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftSend(&in, 1, weftInt32, 0, comm_, nullptr), weftSuccess);
  EXPECT_EQ(weftRecv(&out, 1, weftInt32, 0, comm_, nullptr), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm_);
  EXPECT_EQ(out, 42);
}

TEST_F(SingleRank, SplitArguments) {
  weftComm_t child = nullptr;
  EXPECT_ERROR(weftCommSplit(comm_, -7, 0, &child, nullptr), weftInvalidArgument, "color -7");
  EXPECT_ERROR(weftCommSplit(comm_, 0, 0, nullptr, nullptr), weftInvalidArgument, "newcomm");
  ASSERT_EQ(weftCommSplit(comm_, 3, 0, &child, nullptr), weftSuccess) << weftGetLastError(comm_);
  int size = 0;
  EXPECT_EQ(weftCommCount(child, &size), weftSuccess);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(weftCommDestroy(child), weftSuccess);
}

TEST_F(SingleRank, UseAfterDestroyOrAbortOrFinalize) {
  weftComm_t other = nullptr;
  ASSERT_EQ(weftCommSplit(comm_, 0, 0, &other, nullptr), weftSuccess);
  ASSERT_EQ(weftCommAbort(other), weftSuccess);
  int value = 0;
  EXPECT_ERROR(weftCommCount(other, &value), weftInvalidUsage, "already destroyed or aborted");
  EXPECT_ERROR(weftSend(&value, 1, weftInt32, 0, other, nullptr), weftInvalidUsage,
               "already destroyed or aborted");
  EXPECT_ERROR(weftCommDestroy(other), weftInvalidUsage, "already destroyed or aborted");

  ASSERT_EQ(weftCommFinalize(comm_), weftSuccess);
  EXPECT_ERROR(weftBarrier(comm_, nullptr), weftInvalidUsage, "finalized");
  ASSERT_EQ(weftCommDestroy(comm_), weftSuccess);
  EXPECT_ERROR(weftBarrier(comm_, nullptr), weftInvalidUsage, "already destroyed");
  comm_ = nullptr;
}

TEST_F(SingleRank, CollectiveArguments) {
  EXPECT_ERROR(
      weftAllReduce(buffer_, buffer_, 4, weftInt32, static_cast<weftRedOp_t>(9), comm_, nullptr),
      weftInvalidArgument, "op 9");
  EXPECT_ERROR(
      weftAllReduce(buffer_, buffer_, 4, static_cast<weftDataType_t>(42), weftSum, comm_, nullptr),
      weftInvalidArgument, "datatype 42");
  EXPECT_ERROR(weftAllReduce(buffer_, buffer_, SIZE_MAX / 4, weftInt32, weftSum, comm_, nullptr),
               weftInvalidArgument, "overflows");
  EXPECT_ERROR(weftAllReduce(nullptr, buffer_, 4, weftInt32, weftSum, comm_, nullptr),
               weftInvalidArgument, "sendbuff is NULL");
  EXPECT_ERROR(weftAllGather(buffer_, nullptr, 4, weftInt32, comm_, nullptr), weftInvalidArgument,
               "recvbuff is NULL");
  EXPECT_ERROR(weftBroadcast(buffer_, buffer_, 4, weftInt32, 1, comm_, nullptr),
               weftInvalidArgument, "root 1");
  EXPECT_ERROR(weftReduce(buffer_, buffer_, 4, weftInt32, weftSum, -1, comm_, nullptr),
               weftInvalidArgument, "root -1");
  EXPECT_ERROR(weftGather(buffer_, buffer_, 4, weftInt32, 3, comm_, nullptr), weftInvalidArgument,
               "root 3");
  size_t counts[1] = {static_cast<size_t>(-2)}, displs[1] = {0};
  EXPECT_ERROR(
      weftAllToAllv(buffer_, counts, displs, buffer_, displs, displs, weftInt32, comm_, nullptr),
      weftInvalidArgument, "sendcounts[0]");
  EXPECT_ERROR(
      weftAllToAllv(buffer_, nullptr, displs, buffer_, displs, displs, weftInt32, comm_, nullptr),
      weftInvalidArgument, "sendcounts is NULL");
  // Zero counts with NULL buffers are fine, as in NCCL.
  EXPECT_EQ(weftAllReduce(nullptr, nullptr, 0, weftInt32, weftSum, comm_, nullptr), weftSuccess);
  // Custom ops: wrong dtype, unknown ids, double destroy.
  float scalar = 0.5f;
  weftRedOp_t op;
  ASSERT_EQ(weftRedOpCreatePreMulSum(&op, &scalar, weftFloat32, weftScalarHostImmediate, comm_),
            weftSuccess);
  EXPECT_ERROR(weftAllReduce(buffer_, buffer_, 4, weftInt32, op, comm_, nullptr),
               weftInvalidArgument, "created for float");
  EXPECT_EQ(weftRedOpDestroy(op, comm_), weftSuccess);
  EXPECT_ERROR(weftRedOpDestroy(op, comm_), weftInvalidArgument, "not a custom op");
  EXPECT_ERROR(weftRedOpCreatePreMulSum(&op, nullptr, weftFloat32, weftScalarHostImmediate, comm_),
               weftInvalidArgument, "scalar");
}

TEST(Errors, UnknownOrInapplicableAlgorithms) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm = nullptr;
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.algorithms = "allreduce:warp";
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument,
               "valid: ring");
  config.algorithms = "allgather:binomial";
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument,
               "'binomial' is not an algorithm for allgather");
  config.algorithms = "allsorts:ring";
  EXPECT_ERROR(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument,
               "unknown collective 'allsorts'");
  EXPECT_EQ(comm, nullptr);
}

}  // namespace
