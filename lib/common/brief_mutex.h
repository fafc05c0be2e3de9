// A mutex for critical sections of a few hundred instructions taken on every call (the
// transport's posts and progress): lock and unlock are one atomic operation each, inline,
// where std::mutex adds two library calls and their checks (about 55 instructions a pair,
// five pairs per send/receive exchange). A contended lock spins briefly, then sleeps on
// the word (a futex), so that a holder descheduled on an oversubscribed core is waited for,
// not spun on. Three states, as in Drepper's "Futexes Are Tricky": free, held, held with
// sleepers; only an unlock that finds sleepers wakes one. Under ThreadSanitizer it is
// annotated as a mutex, so that lock-order inversions and double locks are reported as they
// are for std::mutex.
#pragma once

#include <atomic>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace weft {

class BriefMutex {
 public:
#if defined(__SANITIZE_THREAD__)
  BriefMutex() {
    __tsan_mutex_create(this, 0);
  }
  ~BriefMutex() {
    __tsan_mutex_destroy(this, 0);
  }
#else
  BriefMutex() = default;
#endif
  BriefMutex(const BriefMutex&) = delete;
  BriefMutex& operator=(const BriefMutex&) = delete;

  void lock() {
#if defined(__SANITIZE_THREAD__)
    __tsan_mutex_pre_lock(this, 0);
#endif
    if (!take()) lock_contended();
#if defined(__SANITIZE_THREAD__)
    __tsan_mutex_post_lock(this, 0, 0);
#endif
  }
  bool try_lock() {
#if defined(__SANITIZE_THREAD__)
    __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
    const bool taken = take();
    __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (taken ? 0 : __tsan_mutex_try_lock_failed),
                           0);
    return taken;
#else
    return take();
#endif
  }
  void unlock() {
#if defined(__SANITIZE_THREAD__)
    __tsan_mutex_pre_unlock(this, 0);
#endif
    // Sequentially consistent (the same instruction as release on x86): the sleeper
    // announces itself to std::atomic::wait's waiter count before it reads the word, and
    // this exchange must not be ordered after notify_one's read of that count.
    if (state_.exchange(kFree, std::memory_order_seq_cst) == kSleepers) state_.notify_one();
#if defined(__SANITIZE_THREAD__)
    __tsan_mutex_post_unlock(this, 0);
#endif
  }
  // Whether a thread has gone (or is going) to sleep waiting for it: for tests.
  bool has_sleepers() const {
    return state_.load(std::memory_order_relaxed) == kSleepers;
  }

 private:
  static constexpr int kFree = 0, kHeld = 1, kSleepers = 2;
  // A few microseconds: longer than the sections this guards, shorter than a time slice.
  static constexpr int kSpins = 128;

  bool take() {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  [[gnu::noinline]] void lock_contended() {
    for (int i = 0; i < kSpins; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (state_.load(std::memory_order_relaxed) == kFree && take()) return;
    }
    // Marked as having sleepers before sleeping, so that the holder's unlock wakes one; a
    // thread that gets the lock this way keeps the mark (it may wake one sleeper too many,
    // never too few: with the mark dropped, a second sleeper would never be woken).
    while (state_.exchange(kSleepers, std::memory_order_acquire) != kFree)
      state_.wait(kSleepers, std::memory_order_relaxed);
  }

  std::atomic<int> state_{kFree};
};

}  // namespace weft
