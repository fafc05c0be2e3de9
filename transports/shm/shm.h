// Shared memory between the processes of one node: named POSIX segments (the
// staging ones exist in /dev/shm only while the peers attach, so nothing
// outlives a crash; longer-lived ones carry their creator's pid, so that
// remove_orphans can clean up after a crash), and a futex doorbell for sleeping until a peer
// publishes. Knows nothing of collectives.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace weft::shm {

// A mapping of a shared segment. Movable; unmaps (and unlinks, if still
// linked and created here) on destruction.
class Segment {
 public:
  Segment() = default;
  Segment(Segment&& other) noexcept { *this = std::move(other); }
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();

  // Creates a new segment of `bytes` under a unique name starting with
  // `prefix`. The memory is reserved up front: a /dev/shm too small for it is
  // an error here (naming /dev/shm, the bytes needed and free), never a SIGBUS
  // at first touch. The memory starts zeroed.
  static Status create(const std::string& prefix, size_t bytes, Segment* out);
  // The same under exactly `name` ("/..."); an existing name is an error.
  static Status create_named(const std::string& name, size_t bytes, Segment* out);
  // Maps a peer's segment by name; it must be exactly `bytes` long.
  static Status open(const std::string& name, size_t bytes, Segment* out);
  // Private anonymous memory with the same interface (a communicator of one).
  static Status anonymous(size_t bytes, Segment* out);

  // Removes the name (idempotent; mappings stay valid). Anyone may unlink a
  // name: whoever gets there first wins, ENOENT is fine.
  static void unlink_name(const std::string& name);
  void unlink();

  // Maps the pages of [offset, offset + bytes) now, writable (MADV_POPULATE_WRITE),
  // so that the first writes do not take a page fault per 4 KiB. Returns false
  // where the kernel cannot (before Linux 5.14): the pages then fault on first
  // touch, as without it.
  bool prefault(size_t offset, size_t bytes) const;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool linked_ = false;  // created here and not yet unlinked
};

// Bytes free in /dev/shm for this process; nullopt when it cannot be read.
std::optional<uint64_t> free_bytes();

// Unlinks the names "/<prefix>-<pid>-..." in /dev/shm whose pid no longer
// exists: what a process that crashed holding named segments left behind.
// Returns how many it removed.
int remove_orphans(const std::string& prefix);

// Waits on a 32-bit word in shared memory (a non-private futex, so any
// process mapping it can wake the sleeper). Returns when woken, when *word no
// longer equals `seen`, on a signal, or after timeout_ms.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, int timeout_ms);
void futex_wake_all(std::atomic<uint32_t>* word);

// A doorbell in shared memory: sleepers announce themselves so that ringing
// costs a system call only when someone sleeps. Usage: seen = arm(); recheck
// the condition; if still unmet, wait(seen, ms); then disarm().
struct Doorbell {
  std::atomic<uint32_t> word{0};
  std::atomic<uint32_t> sleepers{0};

  uint32_t arm() {
    uint32_t seen = word.load(std::memory_order_acquire);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the recheck reads after this
    return seen;
  }
  void disarm() { sleepers.fetch_sub(1, std::memory_order_relaxed); }
  void wait(uint32_t seen, int timeout_ms) { futex_wait(&word, seen, timeout_ms); }
  // Call after publishing (the fence orders the publication before the
  // sleeper check, pairing with arm's seq_cst increment).
  void ring() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ring_fenced();
  }
  // ring() when the caller fenced already (one fence for several doorbells).
  void ring_fenced() {
    if (sleepers.load(std::memory_order_relaxed) == 0) return;
    interrupt();
  }
  // Wakes every sleeper, announced or not yet.
  void interrupt() {
    word.fetch_add(1, std::memory_order_release);
    futex_wake_all(&word);
  }
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace weft::shm
