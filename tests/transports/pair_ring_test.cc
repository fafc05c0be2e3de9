// shm::PairRings on its own: three ranks' regions in this process's memory, each rank a
// PairRings over them. Slots are reused only once taken, messages move out of order, a
// count or sequence that differs is reported and the message left in place, and arrived()
// sees a message by its sequence.
#include "transports/shm/pair_ring.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace weft::shm {
namespace {

constexpr int kRanks = 3;
constexpr uint64_t kSlots = PairRings::kSlots;

struct Node {
  std::vector<std::unique_ptr<std::byte[], decltype(&free)>> regions;
  Doorbell bells[kRanks];
  PairRings rings[kRanks];

  explicit Node(uint64_t slots = kSlots) {
    const size_t bytes = PairRings::region_bytes(kRanks, slots);
    EXPECT_EQ(bytes % 64, 0u);
    for (int r = 0; r < kRanks; ++r) {
      auto* memory = static_cast<std::byte*>(aligned_alloc(64, bytes));
      memset(memory, 0, bytes);
      PairRings::construct(memory, kRanks, slots);
      regions.emplace_back(memory, &free);
    }
    for (int r = 0; r < kRanks; ++r) {
      std::vector<std::byte*> all;
      std::vector<Doorbell*> doorbells;
      for (int q = 0; q < kRanks; ++q) {
        all.push_back(regions[q].get());
        doorbells.push_back(&bells[q]);
      }
      rings[r].attach(r, kRanks, slots, all, doorbells);
    }
  }
};

std::vector<uint8_t> message(int sender, uint64_t index, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(sender * 59 + index * 7 + i);
  return data;
}

// Messages from..to-1 of 8 bytes each from rank `from_rank` to `to_rank`, each carrying its
// index as its sequence: sent in order, or taken in order and compared.
::testing::AssertionResult send_messages(Node& node, int from_rank, int to_rank, uint64_t from,
                                         uint64_t to) {
  for (uint64_t i = from; i < to; ++i) {
    const std::vector<uint8_t> data = message(from_rank, i, 8);
    if (!node.rings[from_rank].try_send(to_rank, i, i, data.data(), data.size()))
      return ::testing::AssertionFailure() << "message " << i << " did not go";
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult take_messages(Node& node, int from_rank, int to_rank, uint64_t from,
                                         uint64_t to) {
  std::vector<uint8_t> got(8);
  size_t sent = 0;
  for (uint64_t i = from; i < to; ++i) {
    if (node.rings[to_rank].try_recv(from_rank, i, i, got.data(), got.size(), &sent) !=
        PairRings::Received::Done)
      return ::testing::AssertionFailure() << "message " << i << " was not taken";
    if (got != message(from_rank, i, 8))
      return ::testing::AssertionFailure() << "message " << i << " arrived with other bytes";
  }
  return ::testing::AssertionSuccess();
}

TEST(PairRings, CarriesUpToItsMessageSizeAndNothingWithoutSlots) {
  Node node;
  EXPECT_TRUE(node.rings[0].carries(0));
  EXPECT_TRUE(node.rings[0].carries(PairRings::kMessageBytes));
  EXPECT_FALSE(node.rings[0].carries(PairRings::kMessageBytes + 1));
  PairRings none;
  EXPECT_FALSE(none.carries(0));
  EXPECT_FALSE(none.arrived(1, 0, 0).has_value());
  EXPECT_EQ(none.launched_from(1), 0u);
}

TEST(PairRings, SlotsAreReusedOnlyOnceTaken) {
  Node node;
  PairRings& sender = node.rings[0];
  PairRings& receiver = node.rings[2];
  for (uint64_t i = 0; i < kSlots; ++i) {
    const std::vector<uint8_t> data = message(0, i, 1 + i * 31 % PairRings::kMessageBytes);
    ASSERT_TRUE(sender.try_send(2, i, 1000 + i, data.data(), data.size())) << "message " << i;
  }
  // Every slot holds a message not taken yet: the next one waits, also after rank 1 (another
  // pair) took nothing.
  const std::vector<uint8_t> next = message(0, kSlots, 24);
  EXPECT_FALSE(sender.try_send(2, kSlots, 1000 + kSlots, next.data(), next.size()));
  // Taken out of order: message 1's slot frees first, and only message kSlots + 1 may use it.
  std::vector<uint8_t> got(PairRings::kMessageBytes);
  size_t sent = 0;
  const std::vector<uint8_t> first = message(0, 1, 1 + 31 % PairRings::kMessageBytes);
  ASSERT_EQ(receiver.try_recv(0, 1, 1001, got.data(), first.size(), &sent),
            PairRings::Received::Done);
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + first.size()), first);
  EXPECT_FALSE(sender.try_send(2, kSlots, 1000 + kSlots, next.data(), next.size()));
  EXPECT_TRUE(sender.try_send(2, kSlots + 1, 1001 + kSlots, next.data(), next.size()));
  // A receive waits for its own index: slot 2 still holds message 2.
  EXPECT_EQ(receiver.try_recv(0, kSlots + 2, 1002 + kSlots, got.data(), next.size(), &sent),
            PairRings::Received::NotYet);
  for (uint64_t i = 0; i < kSlots; ++i) {
    if (i == 1) continue;
    const std::vector<uint8_t> data = message(0, i, 1 + i * 31 % PairRings::kMessageBytes);
    ASSERT_EQ(receiver.try_recv(0, i, 1000 + i, got.data(), data.size(), &sent),
              PairRings::Received::Done);
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + data.size()), data) << i;
  }
  EXPECT_TRUE(sender.try_send(2, kSlots, 1000 + kSlots, next.data(), next.size()));
  for (uint64_t i : {kSlots, kSlots + 1}) {
    ASSERT_EQ(receiver.try_recv(0, i, 1000 + i, got.data(), next.size(), &sent),
              PairRings::Received::Done);
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + next.size()), next);
  }
}

// A sender remembers the run of free slots it found from one message on, and reads the
// acknowledgements again only past it; the run says nothing of messages before it (a group
// sends out of order).
TEST(PairRings, ARunOfFreeSlotsFreesNoEarlierMessage) {
  Node node;
  ASSERT_TRUE(send_messages(node, 1, 0, 0, kSlots));
  ASSERT_TRUE(take_messages(node, 1, 0, 1, kSlots));
  // Messages kSlots + 1 .. 2 kSlots - 1 may go (their slots' messages were taken) ...
  ASSERT_TRUE(send_messages(node, 1, 0, kSlots + 1, 2 * kSlots));
  // ... but not message kSlots, whose slot still holds message 0.
  EXPECT_FALSE(send_messages(node, 1, 0, kSlots, kSlots + 1));
  ASSERT_TRUE(take_messages(node, 1, 0, 0, 1));
  EXPECT_TRUE(send_messages(node, 1, 0, kSlots, kSlots + 1));
  ASSERT_TRUE(take_messages(node, 1, 0, kSlots, 2 * kSlots));
  // The run found from message 2 kSlots covers the next kSlots messages, sent in order.
  ASSERT_TRUE(send_messages(node, 1, 0, 2 * kSlots, 3 * kSlots));
  EXPECT_FALSE(send_messages(node, 1, 0, 3 * kSlots, 3 * kSlots + 1));
}

// The first messages of a pair have no previous messages in their slots: they may go
// whichever run the sender found last (an executor sends a group's messages out of order).
TEST(PairRings, TheFirstMessagesGoAfterALaterRunWasFound) {
  Node node;
  ASSERT_TRUE(send_messages(node, 2, 1, 0, 1));
  ASSERT_TRUE(take_messages(node, 2, 1, 0, 1));
  ASSERT_TRUE(send_messages(node, 2, 1, kSlots, kSlots + 1));
  ASSERT_TRUE(send_messages(node, 2, 1, 1, kSlots));
  ASSERT_TRUE(take_messages(node, 2, 1, 1, kSlots + 1));
}

TEST(PairRings, PairsAndDirectionsAreApart) {
  Node node;
  // Message 0 of every ordered pair, self included, each with its own bytes.
  for (int s = 0; s < kRanks; ++s)
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<uint8_t> data = message(s * kRanks + r, 0, 40 + r);
      ASSERT_TRUE(node.rings[s].try_send(r, 0, 0, data.data(), data.size()));
    }
  for (int r = 0; r < kRanks; ++r)
    for (int s = kRanks - 1; s >= 0; --s) {
      const std::vector<uint8_t> data = message(s * kRanks + r, 0, 40 + r);
      std::vector<uint8_t> got(data.size());
      size_t sent = 0;
      ASSERT_EQ(node.rings[r].try_recv(s, 0, 0, got.data(), got.size(), &sent),
                PairRings::Received::Done);
      EXPECT_EQ(got, data) << s << " to " << r;
    }
}

TEST(PairRings, ADifferentCountOrSequenceIsReportedAndLeftInPlace) {
  Node node;
  const std::vector<uint8_t> data = message(1, 0, 40);
  ASSERT_TRUE(node.rings[1].try_send(0, 0, 77, data.data(), data.size()));
  std::vector<uint8_t> got(400, 0xEE);
  size_t sent = 0;
  EXPECT_EQ(node.rings[0].try_recv(1, 0, 77, got.data(), 400, &sent),
            PairRings::Received::WrongSize);
  EXPECT_EQ(sent, 40u);
  EXPECT_EQ(got, std::vector<uint8_t>(400, 0xEE)) << "a mismatched receive wrote its buffer";
  // A receive that expects another message in this place (its sequence differs) is told so.
  EXPECT_EQ(node.rings[0].try_recv(1, 0, 78, got.data(), 40, &sent),
            PairRings::Received::WrongSequence);
  EXPECT_EQ(sent, 40u);
  EXPECT_EQ(got, std::vector<uint8_t>(400, 0xEE)) << "a mismatched receive wrote its buffer";
  // Not taken: the slot stays the sender's, and the message can still be read whole.
  for (uint64_t i = 1; i < kSlots; ++i)
    ASSERT_TRUE(node.rings[1].try_send(0, i, 77 + i, data.data(), data.size()));
  EXPECT_FALSE(node.rings[1].try_send(0, kSlots, 77, data.data(), data.size()));
  ASSERT_EQ(node.rings[0].try_recv(1, 0, 77, got.data(), 40, &sent), PairRings::Received::Done);
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + 40), data);
}

TEST(PairRings, ArrivedNamesAMessageByItsSequence) {
  Node node;
  EXPECT_FALSE(node.rings[0].arrived(2, 0, 5).has_value());
  const std::vector<uint8_t> data = message(2, 0, 13);
  ASSERT_TRUE(node.rings[2].try_send(0, 0, 5, data.data(), data.size()));
  EXPECT_EQ(node.rings[0].arrived(2, 0, 5), std::optional<size_t>(13));
  EXPECT_FALSE(node.rings[0].arrived(2, 0, 6).has_value()) << "another sequence";
  EXPECT_FALSE(node.rings[0].arrived(2, 1, 5).has_value()) << "another index";
  EXPECT_FALSE(node.rings[1].arrived(2, 0, 5).has_value()) << "another receiver";
}

TEST(PairRings, LaunchCountersArePerPeer) {
  Node node;
  EXPECT_EQ(node.rings[0].next_send(1), 0u);
  EXPECT_EQ(node.rings[0].next_send(1), 1u);
  EXPECT_EQ(node.rings[0].next_send(2), 0u);
  EXPECT_EQ(node.rings[0].launched_from(1), 0u);
  EXPECT_EQ(node.rings[0].next_recv(1), 0u);
  EXPECT_EQ(node.rings[0].launched_from(1), 1u);
  EXPECT_EQ(node.rings[0].launched_from(2), 0u);
}

TEST(PairRings, SendAndReceiveRingTheOthersDoorbell) {
  Node node;
  const uint32_t receiver_seen = node.bells[1].arm();
  const std::vector<uint8_t> data = message(0, 0, 8);
  ASSERT_TRUE(node.rings[0].try_send(1, 0, 0, data.data(), data.size()));
  EXPECT_NE(node.bells[1].word.load(), receiver_seen) << "the receiver's sleep was not ended";
  node.bells[1].disarm();
  const uint32_t sender_seen = node.bells[0].arm();
  std::vector<uint8_t> got(8);
  size_t sent = 0;
  ASSERT_EQ(node.rings[1].try_recv(0, 0, 0, got.data(), 8, &sent), PairRings::Received::Done);
  EXPECT_NE(node.bells[0].word.load(), sender_seen) << "the sender's sleep was not ended";
  node.bells[0].disarm();
}

}  // namespace
}  // namespace weft::shm
