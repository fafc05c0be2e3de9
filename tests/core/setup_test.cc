// Communicator setup in a container's /dev/shm: 64 communicators of 8 ranks
// alive at once in a private 64 MB tmpfs (Docker's default size), each
// running the direct path exactly, and nothing left there afterwards; ranks
// that sized their segments differently agreeing on one layout.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/direct.h"
#include "support/direct_cases.h"
#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

constexpr int kRanks = 8;
constexpr int kComms = 64;
constexpr size_t kCount = 2000;  // 16 KB of int64: several staging rounds when staging is small

std::vector<std::string> shm_entries() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir))
    if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0)
      names.push_back(entry->d_name);
  closedir(dir);
  return names;
}

uint64_t shm_used_bytes() {
  struct statvfs fs {};
  EXPECT_EQ(statvfs("/dev/shm", &fs), 0) << strerror(errno);
  return static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * fs.f_frsize;
}

// This process (and the ranks it forks) gets a /dev/shm of its own, `bytes` large.
// Returns "" or why not.
std::string private_dev_shm(const char* size) {
  if (unshare(CLONE_NEWNS) != 0)
    return std::string("unshare(CLONE_NEWNS): ") + strerror(errno) + " (needs root)";
  // Mounts made here must not propagate back to the host's namespace.
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("making / private: ") + strerror(errno);
  std::string options = std::string("size=") + size + ",mode=1777";
  if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0)
    return std::string("mounting a tmpfs on /dev/shm: ") + strerror(errno);
  return "";
}

void expect_exact_allreduce(weftComm_t comm, int rank, int nranks, int salt) {
  std::vector<int64_t> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = pattern_value(rank, i + salt);
  ASSERT_EQ(weftAllReduce(values.data(), values.data(), kCount, weftInt64, weftSum, comm, nullptr),
            weftSuccess)
      << weftGetLastError(comm);
  for (size_t i = 0; i < kCount; ++i) {
    int64_t want = 0;
    for (int q = 0; q < nranks; ++q) want += pattern_value(q, i + salt);
    ASSERT_EQ(values[i], want) << "element " << i << ", salt " << salt;
  }
}

TEST(ContainerDevShm, SixtyFourCommunicatorsOfEightRanksFitIn64MB) {
  std::string why_not = private_dev_shm("64m");
  if (!why_not.empty()) GTEST_SKIP() << "no private /dev/shm: " << why_not;
  ASSERT_EQ(shm_entries(), std::vector<std::string>());
  const uint64_t used_before = shm_used_bytes();
  RunOptions options;
  options.timeout_s = 240;
  run_ranks(
      kRanks,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        ASSERT_NE(world, nullptr);
        // Forcing oneshot: a communicator left without shared memory would
        // refuse it, so every one of them must have its direct path.
        weftConfig_t config = WEFT_CONFIG_INITIALIZER;
        config.algorithms = "allreduce:oneshot";
        std::vector<weftComm_t> comms(kComms, nullptr);
        for (int c = 0; c < kComms; ++c) {
          ASSERT_EQ(weftCommSplit(world, 0, context.rank, &comms[c], &config), weftSuccess)
              << "split " << c << ": " << weftGetLastError(world);
          expect_exact_allreduce(comms[c], context.rank, context.nranks, c);
        }
        // All alive at once, and all still working.
        for (int c = 0; c < kComms; ++c)
          expect_exact_allreduce(comms[c], context.rank, context.nranks, kComms + c);
        for (weftComm_t comm : comms) EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
  // Every segment was unlinked once attached, and its memory went with its processes.
  EXPECT_EQ(shm_entries(), std::vector<std::string>());
  EXPECT_EQ(shm_used_bytes(), used_before);
}

// Rank 0 sets WEFT_SHM_BYTES, so it takes the staging and rings asked for; the others size
// theirs to the short /dev/shm (less staging; at 8 ranks 64 announcement slots, not 128, and
// kShortLanes lane slots). All must use the fewest slots of each ring and address each
// peer's staging and lanes after that peer's own rings: small Broadcasts and Reduces from
// every root, far more calls than the rings have slots and queued on a stream too, and
// AllReduces through the staging, all exact; then a mismatched AllReduce, named on every
// rank from the announcements.
TEST(ContainerDevShm, RanksWithDifferentRoomAgreeOnTheRings) {
  std::string why_not = private_dev_shm("64m");
  if (!why_not.empty()) GTEST_SKIP() << "no private /dev/shm: " << why_not;
  RunOptions options;
  options.timeout_s = 120;
  options.env = {{"WEFT_CHECK", "on"}};
  run_ranks(
      8,
      [](const RankContext& context) {
        if (context.rank == 0) {
          ASSERT_EQ(setenv("WEFT_SHM_BYTES", "1048576", 1), 0);
        }
        // One-shot forced (the lanes are its small rooted calls), and a short timeout: ranks
        // that disagree on the ring wait for words that never come.
        const int kTimeoutMs = 10000;
        weftComm_t world = init_comm(context, kTimeoutMs);
        ASSERT_NE(world, nullptr);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot, kTimeoutMs);
        ASSERT_NE(comm, nullptr);
        const int n = context.nranks, me = context.rank;
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        const int kCalls = static_cast<int>(3 * kLanes);
        std::vector<std::vector<int32_t>> queued(kCalls, std::vector<int32_t>(8));
        for (int i = 0; i < kCalls; ++i) {
          const int root = i % n;
          std::vector<int32_t> data(8, me == root ? i : -1);
          ASSERT_EQ(weftBroadcast(data.data(), data.data(), 8, weftInt32, root, comm, nullptr),
                    weftSuccess)
              << weftGetLastError(comm);
          ASSERT_EQ(data, std::vector<int32_t>(8, i)) << "call " << i;
          int32_t sum = me + i;
          ASSERT_EQ(weftReduce(&sum, &sum, 1, weftInt32, weftSum, root, comm, nullptr), weftSuccess)
              << weftGetLastError(comm);
          if (me == root) {
            ASSERT_EQ(sum, n * (n - 1) / 2 + n * i) << "call " << i;
          }
          if (i % 100 == 99) expect_exact_allreduce(comm, me, n, i);
          std::fill(queued[i].begin(), queued[i].end(), me == root ? i : -1);
          ASSERT_EQ(
              weftBroadcast(queued[i].data(), queued[i].data(), 8, weftInt32, root, comm, stream),
              weftSuccess);
        }
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
        for (int i = 0; i < kCalls; ++i) ASSERT_EQ(queued[i], std::vector<int32_t>(8, i)) << i;
        // The mismatched call's sequence (one per call so far) has bit 6 set: there 64 slots
        // and 128 put its announcement in different places.
        int calls = 3 * kCalls + kCalls / 100;
        for (; (calls & 64) == 0; ++calls) {
          int32_t x = 1;
          ASSERT_EQ(weftAllReduce(&x, &x, 1, weftInt32, weftSum, comm, nullptr), weftSuccess);
          ASSERT_EQ(x, n);
        }
        std::vector<int32_t> values(16, me);
        EXPECT_EQ(weftAllReduce(values.data(), values.data(), me == 1 ? 16 : 8, weftInt32, weftSum,
                                comm, nullptr),
                  weftInvalidUsage);
        const std::string message = weftGetLastError(comm);
        EXPECT_NE(message.find("mismatched collectives: rank "), std::string::npos) << message;
        EXPECT_NE(message.find("allreduce(count=16, int32, sum)"), std::string::npos) << message;
        EXPECT_NE(message.find("allreduce(count=8, int32, sum)"), std::string::npos) << message;
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
  EXPECT_EQ(shm_entries(), std::vector<std::string>());
}

}  // namespace
}  // namespace weft::testing
