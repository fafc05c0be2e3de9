// Small point-to-point messages between the processes of one node, through shared memory
// instead of a transport: for every ordered pair of ranks a ring of slots in the sender's
// region, and a line of acknowledgements in the receiver's. Message i from a sender to a
// receiver (i counts their messages that take the ring) travels in slot i % slots: the sender
// writes its bytes there, then the slot's word (i + 1, the byte count and 16 bits of the
// caller's sequence); the receiver waits for that word, copies the bytes and acknowledges i
// in its region, which frees the slot for message i + slots. Either side may take its
// messages out of order (a group completes them as their peers arrive): a slot's previous
// message is always i - slots. A sender runs at most `slots` messages ahead of its receiver;
// each side rings the other's doorbell after its store, so that a sleeper wakes. Knows
// nothing of communicators.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "transports/shm/shm.h"

namespace weft::shm {

class PairRings {
 public:
  // The largest message a slot carries, and the slots per pair where there is room.
  static constexpr size_t kMessageBytes = 512;
  static constexpr uint64_t kSlots = 16;

  // Bytes of one rank's region for `nranks` ranks and `slots` per pair (a multiple of 64).
  static size_t region_bytes(int nranks, uint64_t slots);
  // Readies a rank's zeroed region before any peer attaches.
  static void construct(std::byte* region, int nranks, uint64_t slots);

  // Every rank's region (own included, by rank) and doorbell; `slots` 0: no rings.
  void attach(int rank, int nranks, uint64_t slots, std::vector<std::byte*> regions,
              std::vector<Doorbell*> bells);

  // Whether a message of `bytes` takes the ring (the same answer on every rank).
  bool carries(size_t bytes) const { return slots_ != 0 && bytes <= kMessageBytes; }
  // The index of the next message to (from) `peer` that takes the ring: call in the order the
  // messages were launched, from the launching thread.
  uint64_t next_send(int peer) { return bump(send_next_[peer]); }
  uint64_t next_recv(int peer) { return bump(recv_next_[peer]); }

  // Writes message `index` to `peer` if its slot is free; true once written.
  bool try_send(int peer, uint64_t index, uint64_t sequence, const void* data, size_t bytes);
  enum class Received : uint8_t { NotYet, Done, WrongSize, WrongSequence };
  // Takes message `index` from `peer` into `data` if it arrived, carrying `sequence` and
  // `bytes` long. If it arrived otherwise it is left there: WrongSequence if it carries
  // another sequence (the pair's ring messages are not the same messages on both sides: an
  // earlier count differed), else WrongSize; *sent: the sender's bytes.
  Received try_recv(int peer, uint64_t index, uint64_t sequence, void* data, size_t bytes,
                    size_t* sent);
  // The byte count of message `index` from `peer` when it arrived carrying `sequence`: a
  // receiver that expected that sequence by the transport learns that the sender's count
  // differs from its own (one side took the ring).
  std::optional<size_t> arrived(int peer, uint64_t index, uint64_t sequence) const;
  // How many ring messages from `peer` this rank has launched receives for.
  uint64_t launched_from(int peer) const {
    return slots_ == 0 ? 0 : recv_next_[peer].load(std::memory_order_relaxed);
  }

 private:
  struct Slot;
  Slot& slot(int sender, int receiver, uint64_t index) const;
  std::atomic<uint64_t>& ack(int receiver, int sender, uint64_t index) const;
  // Whether message `index` to `peer` may be written: from send_free_, else from the
  // acknowledgements, which also tell how many messages after it may.
  bool slot_free(int peer, uint64_t index);
  static uint64_t bump(std::atomic<uint64_t>& counter) {
    const uint64_t value = counter.load(std::memory_order_relaxed);
    counter.store(value + 1, std::memory_order_relaxed);
    return value;
  }

  int rank_ = 0;
  int nranks_ = 0;
  uint64_t slots_ = 0;
  size_t acks_offset_ = 0;  // where a region's acknowledgement lines start
  size_t ack_line_ = 0;     // bytes per sender's acknowledgement line(s)
  std::vector<std::byte*> regions_;
  std::vector<Doorbell*> bells_;
  // Written by the launching thread, read by others (launched_from): relaxed.
  std::unique_ptr<std::atomic<uint64_t>[]> send_next_, recv_next_;
  // Per peer: a run of messages known to have a free slot (their slots' previous messages
  // were acknowledged), first index << 8 | length, so that a send reads the receiver's
  // acknowledgements, a line the receiver writes after every message, only once in up to
  // `slots` sends in order. An acknowledgement is never withdrawn, so any run found stays
  // true; a run replaced by another (sends out of order) only costs a read, as a message
  // outside the run is looked up again.
  std::unique_ptr<std::atomic<uint64_t>[]> send_free_;
};

}  // namespace weft::shm
