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
bool forked_child = false;
}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// In a forked child the parent's threads are gone but their heap memory is not:
// LeakSanitizer would report it, so the check runs in the parent only.
extern "C" int __lsan_is_turned_off() {
  return forked_child ? 1 : 0;
}
#endif

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
  if (waitpid(child, &status, 0) != child) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Exits 1 after naming the check that failed.
void require(bool ok, const char* what) {
  if (ok) return;
  fprintf(stderr, "failed: %s: %s\n", what, weftGetLastError(nullptr));
  std::exit(1);
}

// Forks after weftGetUniqueId and weftStreamCreate: an idle child that just exits,
// then one that joins the parent's rendezvous as rank 1 and receives from it.
[[noreturn]] void fork_after_get_unique_id() {
  setenv("WEFT_TIMEOUT_MS", "20000", 1);
  weftUniqueId id;
  require(weftGetUniqueId(&id) == weftSuccess, "weftGetUniqueId");
  weftStream_t stream = nullptr;
  require(weftStreamCreate(&stream) == weftSuccess, "weftStreamCreate");
  pid_t idle = fork();
  require(idle >= 0, "fork");
  if (idle == 0) {
    forked_child = true;
    std::exit(0);  // runs the static destructors, as a real program does
  }
  require(wait_for(idle) == 0, "the idle child's exit status");

  pid_t peer = fork();
  require(peer >= 0, "fork");
  if (peer == 0) {
    forked_child = true;
    weftComm_t comm = nullptr;
    int value = 0;
    require(weftCommInitRank(&comm, 2, id, 1) == weftSuccess, "child: init");
    require(weftRecv(&value, 1, weftInt32, 0, comm, nullptr) == weftSuccess && value == 42,
            "child: receive");
    require(weftCommDestroy(comm) == weftSuccess, "child: destroy");
    std::exit(0);
  }
  weftComm_t comm = nullptr;
  require(weftCommInitRank(&comm, 2, id, 0) == weftSuccess, "parent: init");
  const int value = 42;
  require(weftSend(&value, 1, weftInt32, 1, comm, stream) == weftSuccess, "parent: send");
  require(weftStreamSynchronize(stream) == weftSuccess, "parent: synchronize");
  require(weftStreamDestroy(stream) == weftSuccess, "parent: stream destroy");
  require(weftCommDestroy(comm) == weftSuccess, "parent: destroy");
  require(wait_for(peer) == 0, "the joining child's exit status");
  std::exit(0);
}

// A child forked after weftGetUniqueId (and weftStreamCreate) owns none of the
// parent's threads: it exits cleanly (no abort joining a thread it does not have),
// can join the parent's rendezvous as a rank, and the parent's rendezvous keeps
// working. In a fresh process: a transport that existed before a fork (any earlier
// communicator's) does not work in the child.
// (It once hung about one run in 150 under load: the joining child blocked in
// ucp_init on UCX's memory-event lock; Weft now turns those events off.)
TEST(LifecycleDeathTest, ForkAfterGetUniqueId) {
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's AddressSanitizer does not hold its allocator's locks across fork, as glibc's
  // malloc does: a child forked while another thread of the parent allocates inherits a held
  // lock, and its first allocation of that size waits forever (seen 1 run in 40-80 under
  // load, with and without the change that first met it in CI; stacks: two child threads
  // in SizeClassAllocator64::GetFromAllocator on a lock no child thread holds).
  GTEST_SKIP() << "fork with threads running is not safe under GCC 12's AddressSanitizer";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fork_after_get_unique_id(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
