// Communicators and processes ending at awkward moments: destroyed or aborted
// inside a group that holds their work, a process ending with a group open, and
// a process forked after weftGetUniqueId.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "weft/weft.h"

namespace {

class Lifecycle : public ::testing::Test {
 protected:
  // A failure must not leave a test waiting for the default five minutes.
  void SetUp() override { setenv("WEFT_TIMEOUT_MS", "20000", 1); }
  void TearDown() override { unsetenv("WEFT_TIMEOUT_MS"); }

  static weftComm_t one_rank_comm() {
    weftUniqueId id;
    EXPECT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
    weftComm_t comm = nullptr;
    EXPECT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
    return comm;
  }
};

// The group's AllReduce is neither dropped nor run on a freed communicator: the
// destroy is refused, the group's end runs it, and then the destroy works.
TEST_F(Lifecycle, DestroyInsideAGroupWithItsWorkIsRefused) {
  weftComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  std::vector<float> in(64), out(64, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftAllReduce(in.data(), out.data(), in.size(), weftFloat32, weftSum, comm, nullptr),
            weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("weftGroupEnd"), std::string::npos)
      << weftGetLastError(comm);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
  EXPECT_EQ(out, in);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess) << weftGetLastError(comm);
}

// A destroy inside a group that holds nothing of the communicator goes ahead.
TEST_F(Lifecycle, DestroyInsideAnEmptyGroupWorks) {
  weftComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess) << weftGetLastError(comm);
  EXPECT_EQ(weftGroupEnd(), weftSuccess);
}

// An abort cannot be refused: the group then fails at its end, naming the abort.
TEST_F(Lifecycle, AbortInsideAGroupFailsTheGroup) {
  weftComm_t comm = one_rank_comm();
  ASSERT_NE(comm, nullptr);
  std::vector<float> in(8, 1.0f), out(8, -1.0f);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftAllReduce(in.data(), out.data(), in.size(), weftFloat32, weftSum, comm, nullptr),
            weftSuccess);
  EXPECT_EQ(weftCommAbort(comm), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("weftCommAbort"), std::string::npos)
      << weftGetLastError(nullptr);
  EXPECT_EQ(out, std::vector<float>(8, -1.0f));
}

TEST(LifecycleDeathTest, ExitingWithAGroupOpenSaysSo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        weftGroupStart();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "WARN INIT a thread ended inside weftGroupStart");
}

int wait_for(pid_t child) {
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A child forked after weftGetUniqueId (and weftStreamCreate) owns none of the
// parent's threads: it exits cleanly (no abort joining a thread it does not have),
// can join the parent's rendezvous as a rank, and the parent's rendezvous keeps working.
TEST_F(Lifecycle, ForkAfterGetUniqueId) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftStream_t stream = nullptr;
  ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
  pid_t idle = fork();
  ASSERT_GE(idle, 0);
  if (idle == 0) std::exit(0);  // runs the static destructors, as a real program does
  EXPECT_EQ(wait_for(idle), 0);

  pid_t peer = fork();
  ASSERT_GE(peer, 0);
  if (peer == 0) {
    weftComm_t comm = nullptr;
    int value = 0;
    bool ok = weftCommInitRank(&comm, 2, id, 1) == weftSuccess &&
              weftRecv(&value, 1, weftInt32, 0, comm, nullptr) == weftSuccess && value == 42 &&
              weftCommDestroy(comm) == weftSuccess;
    std::exit(ok ? 0 : 1);
  }
  weftComm_t comm = nullptr;
  ASSERT_EQ(weftCommInitRank(&comm, 2, id, 0), weftSuccess) << weftGetLastError(nullptr);
  const int value = 42;
  EXPECT_EQ(weftSend(&value, 1, weftInt32, 1, comm, stream), weftSuccess);
  EXPECT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
  EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  EXPECT_EQ(wait_for(peer), 0);
}

}  // namespace
