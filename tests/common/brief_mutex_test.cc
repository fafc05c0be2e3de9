#include "common/brief_mutex.h"

#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft {
namespace {

// More threads than the machine has cores, so that holders are descheduled while they hold
// it and the waiters take the sleeping path as well as the spinning one.
TEST(BriefMutex, NoTwoThreadsHoldItAndNoIncrementIsLost) {
  BriefMutex mutex;
  const int threads_count = static_cast<int>(std::max(6u, std::thread::hardware_concurrency() + 2));
  const int rounds = 300000 / threads_count;
  long counter = 0;  // not atomic: only the mutex orders the increments
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<BriefMutex> lock(mutex);
        if (inside.fetch_add(1, std::memory_order_relaxed) != 0)
          overlaps.fetch_add(1, std::memory_order_relaxed);
        ++counter;
        inside.fetch_sub(1, std::memory_order_relaxed);
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, long{threads_count} * rounds);
}

TEST(BriefMutex, TryLockFailsWhileHeld) {
  BriefMutex mutex;
  ASSERT_TRUE(mutex.try_lock());
  bool other = true;
  std::thread([&] { other = mutex.try_lock(); }).join();
  EXPECT_FALSE(other);
  mutex.unlock();
  std::thread([&] { other = mutex.try_lock(); }).join();
  EXPECT_TRUE(other);
  mutex.unlock();
}

// The scheduler state of one of this process's threads ('S': asleep, here on the futex).
char thread_state(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t name_end = line.rfind(')');
  return name_end == std::string::npos || name_end + 2 >= line.size() ? '?' : line[name_end + 2];
}

// Waiters that gave up spinning sleep on the word; the holder's unlock must wake one, and
// that one's unlock the next (a lost wake-up hangs this test until ctest's timeout). The
// waiters are seen asleep in the kernel first, past any spinning of their own or of
// std::atomic::wait. Two of them: a woken waiter that took the lock as merely held, without
// the sleepers' mark, would never wake the second.
TEST(BriefMutex, EachUnlockWakesASleepingWaiter) {
  BriefMutex mutex;
  mutex.lock();
  constexpr int kWaiters = 2;
  std::atomic<int> acquired{0};
  std::atomic<pid_t> tids[kWaiters] = {};
  std::vector<std::thread> waiters;
  for (int w = 0; w < kWaiters; ++w)
    waiters.emplace_back([&, w] {
      tids[w].store(static_cast<pid_t>(syscall(SYS_gettid)));
      mutex.lock();
      acquired.fetch_add(1);
      mutex.unlock();
    });
  auto asleep = [&](int w) { return tids[w].load() != 0 && thread_state(tids[w].load()) == 'S'; };
  while (!mutex.has_sleepers() || !asleep(0) || !asleep(1)) std::this_thread::yield();
  EXPECT_EQ(acquired.load(), 0);
  mutex.unlock();
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(acquired.load(), kWaiters);
  EXPECT_FALSE(mutex.has_sleepers());
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

}  // namespace
}  // namespace weft
