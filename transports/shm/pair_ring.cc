#include "transports/shm/pair_ring.h"

#include <cstring>
#include <new>

namespace weft::shm {

namespace {

constexpr size_t kLine = 64;

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

// A slot's word: the message's index + 1 (low 32 bits: a slot's messages are `slots` apart,
// never 2^32), its byte count (16 bits) and the low 16 bits of the caller's sequence.
uint64_t slot_word(uint64_t index, size_t bytes, uint64_t sequence) {
  return ((index + 1) & 0xFFFFFFFFu) | (static_cast<uint64_t>(bytes) << 32) |
         ((sequence & 0xFFFF) << 48);
}
bool holds(uint64_t word, uint64_t index) {
  return static_cast<uint32_t>(word) == static_cast<uint32_t>(index + 1);
}
bool carries_sequence(uint64_t word, uint64_t sequence) {
  return (word >> 48) == (sequence & 0xFFFF);
}
size_t bytes_of(uint64_t word) {
  return (word >> 32) & 0xFFFF;
}

}  // namespace

// The word leads the data on its cache line: a message of up to 56 bytes moves one line.
struct alignas(kLine) PairRings::Slot {
  std::atomic<uint64_t> word{0};
  std::byte data[kMessageBytes];
};
static_assert(PairRings::kMessageBytes < (1u << 16), "a slot word keeps 16 bits of count");
static_assert(PairRings::kSlots < (1u << 8), "a run of free slots keeps 8 bits of length");

// A region: the slots of its owner's messages, by receiver then slot; then by sender, a line
// (or more) of acknowledgements, the last index + 1 taken from each slot.
size_t PairRings::region_bytes(int nranks, uint64_t slots) {
  const size_t acks = round_up(slots * sizeof(uint64_t), kLine);
  return static_cast<size_t>(nranks) * (slots * sizeof(Slot) + acks);
}

void PairRings::construct(std::byte* region, int nranks, uint64_t slots) {
  auto* slot = reinterpret_cast<Slot*>(region);
  for (uint64_t i = 0; i < nranks * slots; ++i) new (&slot[i]) Slot();
  auto* acks = reinterpret_cast<std::atomic<uint64_t>*>(region + nranks * slots * sizeof(Slot));
  const size_t words =
      (region_bytes(nranks, slots) - nranks * slots * sizeof(Slot)) / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) new (&acks[i]) std::atomic<uint64_t>(0);
}

void PairRings::attach(int rank, int nranks, uint64_t slots, std::vector<std::byte*> regions,
                       std::vector<Doorbell*> bells) {
  rank_ = rank;
  nranks_ = nranks;
  slots_ = slots;
  acks_offset_ = static_cast<size_t>(nranks) * slots * sizeof(Slot);
  ack_line_ = round_up(slots * sizeof(uint64_t), kLine);
  regions_ = std::move(regions);
  bells_ = std::move(bells);
  send_next_ = std::make_unique<std::atomic<uint64_t>[]>(nranks);
  recv_next_ = std::make_unique<std::atomic<uint64_t>[]>(nranks);
  send_free_ = std::make_unique<std::atomic<uint64_t>[]>(nranks);
  // Messages 0 .. slots - 1 have no previous messages: a run from 0.
  for (int peer = 0; peer < nranks; ++peer)
    send_free_[peer].store(slots, std::memory_order_relaxed);
}

inline PairRings::Slot& PairRings::slot(int sender, int receiver, uint64_t index) const {
  auto* slots = reinterpret_cast<Slot*>(regions_[sender]);
  return slots[static_cast<uint64_t>(receiver) * slots_ + index % slots_];
}

inline std::atomic<uint64_t>& PairRings::ack(int receiver, int sender, uint64_t index) const {
  auto* line = reinterpret_cast<std::atomic<uint64_t>*>(regions_[receiver] + acks_offset_ +
                                                        static_cast<size_t>(sender) * ack_line_);
  return line[index % slots_];
}

bool PairRings::slot_free(int peer, uint64_t index) {
  // Acquire pairs with the release below: another thread's finding orders this write after
  // the receiver's copy too.
  const uint64_t run = send_free_[peer].load(std::memory_order_acquire);
  if (index - (run >> 8) < (run & 0xFF)) return true;
  // Message j's slot is free once its previous message, j - slots, was taken (the first
  // `slots` messages have none). The receiver may take out of order: the run of free slots
  // from `index` ends at the first one not.
  auto free = [&](uint64_t j) {
    return j < slots_ || ack(peer, rank_, j).load(std::memory_order_acquire) == j - slots_ + 1;
  };
  uint64_t length = 0;
  while (length < slots_ && free(index + length)) ++length;
  if (length == 0) return false;
  send_free_[peer].store(index << 8 | length, std::memory_order_release);
  return true;
}

bool PairRings::try_send(int peer, uint64_t index, uint64_t sequence, const void* data,
                         size_t bytes) {
  if (!slot_free(peer, index)) return false;
  Slot& target = slot(rank_, peer, index);
  if (bytes != 0) memcpy(target.data, data, bytes);
  target.word.store(slot_word(index, bytes, sequence), std::memory_order_release);
  bells_[peer]->ring();
  return true;
}

PairRings::Received PairRings::try_recv(int peer, uint64_t index, uint64_t sequence, void* data,
                                        size_t bytes, size_t* sent) {
  Slot& source = slot(peer, rank_, index);
  const uint64_t word = source.word.load(std::memory_order_acquire);
  if (!holds(word, index)) return Received::NotYet;
  *sent = bytes_of(word);
  if (!carries_sequence(word, sequence)) return Received::WrongSequence;
  if (*sent != bytes) return Received::WrongSize;
  if (bytes != 0) memcpy(data, source.data, bytes);
  ack(rank_, peer, index).store(index + 1, std::memory_order_release);
  bells_[peer]->ring();
  return Received::Done;
}

std::optional<size_t> PairRings::arrived(int peer, uint64_t index, uint64_t sequence) const {
  if (slots_ == 0) return std::nullopt;
  const uint64_t word = slot(peer, rank_, index).word.load(std::memory_order_acquire);
  if (!holds(word, index) || !carries_sequence(word, sequence)) return std::nullopt;
  return bytes_of(word);
}

}  // namespace weft::shm
