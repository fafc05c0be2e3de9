// Point-to-point: exact contents for every dtype and size, groups that would
// deadlock if posted one by one, self messages, barrier ordering.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "support/expect_error.h"
#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

// Bytes that differ per sender, dtype and position, so misplaced or stale data shows.
std::vector<uint8_t> payload(int sender, weftDataType_t dtype, size_t count) {
  std::vector<uint8_t> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 + sender * 17 + static_cast<int>(dtype) * 5 + i / 251);
  return bytes;
}

TEST(P2P, EveryDtypeAndCountArrivesExactly) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    ASSERT_NE(comm, nullptr);
    for (int type = 0; type < weftNumTypes; ++type) {
      auto dtype = static_cast<weftDataType_t>(type);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{(1 << 20) + 3}}) {
        for (int sender = 0; sender < 2; ++sender) {
          std::vector<uint8_t> expected = payload(sender, dtype, count);
          if (context.rank == sender) {
            ASSERT_EQ(weftSend(expected.data(), count, dtype, 1 - sender, comm, nullptr),
                      weftSuccess)
                << weftGetLastError(comm);
          } else {
            std::vector<uint8_t> received(expected.size() + 1, 0xEE);
            ASSERT_EQ(weftRecv(received.data(), count, dtype, sender, comm, nullptr), weftSuccess)
                << weftGetLastError(comm);
            EXPECT_EQ(received.back(), 0xEE) << "receive wrote past its buffer";
            received.pop_back();
            ASSERT_EQ(received, expected) << dtype_name(dtype) << " count " << count;
          }
        }
      }
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

TEST(P2P, SixtyFourMiBMessage) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    const size_t count = (64u << 20) / sizeof(float);
    std::vector<uint8_t> expected = payload(0, weftFloat32, count);
    if (context.rank == 0) {
      ASSERT_EQ(weftSend(expected.data(), count, weftFloat32, 1, comm, nullptr), weftSuccess);
    } else {
      std::vector<uint8_t> received(expected.size());
      ASSERT_EQ(weftRecv(received.data(), count, weftFloat32, 0, comm, nullptr), weftSuccess);
      ASSERT_TRUE(received == expected);
    }
    weftCommDestroy(comm);
  });
}

class GroupRing : public ::testing::TestWithParam<int> {};

// Everyone sends right and receives left at once: blocking calls in this order
// would deadlock for large messages; a group must not.
TEST_P(GroupRing, ExchangeCompletes) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    int right = (context.rank + 1) % context.nranks;
    int left = (context.rank + context.nranks - 1) % context.nranks;
    for (size_t base : {size_t{1000}, size_t{1} << 20}) {
      std::vector<uint8_t> outgoing = payload(context.rank, weftInt32, base + context.rank);
      std::vector<uint8_t> expected = payload(left, weftInt32, base + left);
      std::vector<uint8_t> incoming(expected.size());
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      ASSERT_EQ(weftSend(outgoing.data(), base + context.rank, weftInt32, right, comm, nullptr),
                weftSuccess);
      ASSERT_EQ(weftRecv(incoming.data(), base + left, weftInt32, left, comm, nullptr),
                weftSuccess);
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
      ASSERT_TRUE(incoming == expected) << "from rank " << left;
    }
    weftCommDestroy(comm);
  });
}
INSTANTIATE_TEST_SUITE_P(Ranks, GroupRing, ::testing::Values(2, 3, 5, 8));

TEST(P2P, SelfAndNestedGroupsAndBothDirections) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    int peer = 1 - context.rank;
    const size_t count = 300000;
    std::vector<uint8_t> to_self = payload(10 + context.rank, weftFloat64, count);
    std::vector<uint8_t> to_peer = payload(context.rank, weftFloat64, count);
    std::vector<uint8_t> from_self(to_self.size()), from_peer(to_peer.size());
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftRecv(from_self.data(), count, weftFloat64, context.rank, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftGroupStart(), weftSuccess);  // nested: only the outer end launches
    ASSERT_EQ(weftSend(to_peer.data(), count, weftFloat64, peer, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftSend(to_self.data(), count, weftFloat64, context.rank, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess);
    ASSERT_EQ(weftRecv(from_peer.data(), count, weftFloat64, peer, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    EXPECT_TRUE(from_self == to_self);
    EXPECT_TRUE(from_peer == payload(peer, weftFloat64, count));
    weftCommDestroy(comm);
  });
}

TEST(P2P, MessagesToOnePeerArriveInOrder) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    const int kMessages = 50;
    for (int i = 0; i < kMessages; ++i) {
      int64_t value = context.rank == 0 ? i * 1000 + 7 : -1;
      if (context.rank == 0) {
        ASSERT_EQ(weftSend(&value, 1, weftInt64, 1, comm, nullptr), weftSuccess);
      } else {
        ASSERT_EQ(weftRecv(&value, 1, weftInt64, 0, comm, nullptr), weftSuccess);
        ASSERT_EQ(value, i * 1000 + 7);
      }
    }
    weftCommDestroy(comm);
  });
}

// Every rank destroys its communicator and exits the moment its last
// AllToAllv (large, rendezvous-sized pieces) completes. Every rank's call
// still completes: a destroy delivers the acknowledgements its peers wait for
// before the transport goes (they were once lost, and a sender timed out
// about one run in four).
TEST(P2P, LastTransfersCompleteWhenPeersLeaveAtOnce) {
  for (int run = 0; run < 6; ++run) {
    run_ranks(4, [run](const RankContext& context) {
      const size_t kPiece = (1u << 20) / sizeof(int32_t);
      std::vector<size_t> counts(context.nranks, kPiece), displs(context.nranks);
      for (int q = 0; q < context.nranks; ++q) displs[q] = q * kPiece;
      std::vector<int32_t> sent(kPiece * context.nranks), received(sent.size());
      for (size_t i = 0; i < sent.size(); ++i) sent[i] = context.rank * 1000 + run + (i % 7);
      weftComm_t comm = init_comm(context, 20000);
      ASSERT_EQ(weftAllToAllv(sent.data(), counts.data(), displs.data(), received.data(),
                              counts.data(), displs.data(), weftInt32, comm, nullptr),
                weftSuccess)
          << "run " << run << ": " << weftGetLastError(comm);
      for (int q = 0; q < context.nranks; ++q)
        for (size_t i = 0; i < kPiece; i += 4099)
          ASSERT_EQ(received[q * kPiece + i],
                    static_cast<int32_t>(q * 1000 + run + ((context.rank * kPiece + i) % 7)));
      ASSERT_EQ(weftCommDestroy(comm), weftSuccess);
    });
  }
}

TEST(P2P, ShortSendIsAMismatchError) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    std::vector<int32_t> buffer(100, 1);
    if (context.rank == 0) {
      EXPECT_EQ(weftSend(buffer.data(), 10, weftInt32, 1, comm, nullptr), weftSuccess);
    } else {
      EXPECT_EQ(weftRecv(buffer.data(), 100, weftInt32, 0, comm, nullptr), weftInvalidUsage);
      EXPECT_NE(std::string(weftGetLastError(comm)).find("mismatched counts"), std::string::npos)
          << weftGetLastError(comm);
    }
    weftCommDestroy(comm);
  });
}

// Sizes on both sides of the largest message the shared-memory rings carry (512 bytes), so
// that consecutive messages to one peer take different ways.
constexpr size_t kMixedSizes[] = {8, 600, 0, 512, 513, 4096, 1, 300000, 64, 511};

// Messages to one peer that take the ring and the transport in turn arrive in order, each
// whole, sent one call at a time and all in one group, received either way.
TEST(P2P, RingAndTransportMessagesKeepTheirOrder) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    for (bool grouped : {false, true}) {
      std::vector<std::vector<uint8_t>> buffers;
      for (size_t i = 0; i < std::size(kMixedSizes); ++i)
        buffers.push_back(context.rank == 0
                              ? payload(static_cast<int>(i), weftUint8, kMixedSizes[i])
                              : std::vector<uint8_t>(kMixedSizes[i], 0xEE));
      if (grouped) {
        ASSERT_EQ(weftGroupStart(), weftSuccess);
      }
      for (std::vector<uint8_t>& buffer : buffers)
        ASSERT_EQ(context.rank == 0
                      ? weftSend(buffer.data(), buffer.size(), weftUint8, 1, comm, nullptr)
                      : weftRecv(buffer.data(), buffer.size(), weftUint8, 0, comm, nullptr),
                  weftSuccess)
            << weftGetLastError(comm);
      if (grouped) {
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
      }
      for (size_t i = 0; i < buffers.size(); ++i)
        ASSERT_EQ(buffers[i], payload(static_cast<int>(i), weftUint8, kMixedSizes[i]))
            << "message " << i << " of " << kMixedSizes[i] << " bytes, grouped " << grouped;
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Each rank sends many small messages to every peer (itself too), more than a pair's ring
// has slots, and receives as many, in one group: the senders wait for room while their
// receivers take. Groups of up to 64 such messages take the blocking fast path, larger ones
// the executor.
TEST_P(GroupRing, ManySmallMessagesInOneGroup) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    for (int kMessages : {10, 50}) {
      const int n = context.nranks;
      // A group reads its send buffers when it ends: all of them live until then.
      std::vector<std::vector<uint8_t>> outgoing(kMessages), incoming(n * kMessages);
      for (int m = 0; m < kMessages; ++m)
        outgoing[m] = payload(context.rank * 100 + m, weftInt32, 1 + m % 9);
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (int m = 0; m < kMessages; ++m)
        for (int q = 0; q < n; ++q) {
          ASSERT_EQ(weftSend(outgoing[m].data(), 1 + m % 9, weftInt32, q, comm, nullptr),
                    weftSuccess);
          incoming[q * kMessages + m].assign(outgoing[m].size(), 0xEE);
          ASSERT_EQ(
              weftRecv(incoming[q * kMessages + m].data(), 1 + m % 9, weftInt32, q, comm, nullptr),
              weftSuccess);
        }
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
      for (int q = 0; q < n; ++q)
        for (int m = 0; m < kMessages; ++m)
          ASSERT_EQ(incoming[q * kMessages + m], payload(q * 100 + m, weftInt32, 1 + m % 9))
              << "message " << m << " from rank " << q;
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Rank 0 sends 40 small messages in one group (the fast path), more than its ring to rank 1
// has slots, and rank 1 receives them in one group.
TEST(P2P, GroupedSendsBeyondTheSlotsWaitForRoom) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    const int kMessages = 40;
    std::vector<int64_t> values(kMessages);
    for (int m = 0; m < kMessages; ++m) values[m] = context.rank == 0 ? m * 1000 + 7 : -1;
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int64_t& value : values)
      ASSERT_EQ(context.rank == 0 ? weftSend(&value, 1, weftInt64, 1, comm, nullptr)
                                  : weftRecv(&value, 1, weftInt64, 0, comm, nullptr),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    for (int m = 0; m < kMessages; ++m) ASSERT_EQ(values[m], m * 1000 + 7) << "message " << m;
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// A receive whose count puts the message on the other way than its sender's (one in the
// ring, one by the transport) is a mismatch error, found while waiting, not at the timeout.
TEST(P2P, CountsOnEitherSideOfTheRingAreAMismatchError) {
  for (const auto& [sent, expected] : {std::pair<size_t, size_t>{8, 4096}, {4096, 8}}) {
    run_ranks(2, [sent, expected](const RankContext& context) {
      weftComm_t comm = init_comm(context, 120000);
      std::vector<uint8_t> buffer(4096, 1);
      if (context.rank == 0) {
        const weftResult_t result = weftSend(buffer.data(), sent, weftUint8, 1, comm, nullptr);
        // The send may complete before the receiver finds out, or fail with its verdict.
        EXPECT_TRUE(result == weftSuccess || result == weftRemoteError ||
                    result == weftInvalidUsage)
            << weftGetLastError(comm);
      } else {
        EXPECT_EQ(weftRecv(buffer.data(), expected, weftUint8, 0, comm, nullptr), weftInvalidUsage)
            << "sent " << sent << ", expected " << expected;
        const std::string error = weftGetLastError(comm);
        EXPECT_NE(error.find("rank 0 sent " + std::to_string(sent) + " bytes"), std::string::npos)
            << error;
        EXPECT_NE(error.find("mismatched counts"), std::string::npos) << error;
      }
      weftCommDestroy(comm);
    });
  }
}

// Two messages whose counts put them on other ways at the two ranks (600 bytes by the
// transport then 8 in the ring, received as 8 then 600): the first receive finds the ring's
// first message carrying another sequence, and fails instead of taking the second message.
TEST(P2P, MessagesSwappedBetweenTheWaysAreAMismatchError) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 120000);
    std::vector<uint8_t> large(600, 3), small(8, 4);
    if (context.rank == 0) {
      EXPECT_EQ(weftSend(large.data(), large.size(), weftUint8, 1, comm, nullptr), weftSuccess);
      const weftResult_t result = weftSend(small.data(), small.size(), weftUint8, 1, comm, nullptr);
      EXPECT_TRUE(result == weftSuccess || result == weftRemoteError) << weftGetLastError(comm);
    } else {
      std::vector<uint8_t> received(8, 0xEE);
      EXPECT_EQ(weftRecv(received.data(), 8, weftUint8, 0, comm, nullptr), weftInvalidUsage);
      const std::string error = weftGetLastError(comm);
      EXPECT_NE(error.find("mismatched counts"), std::string::npos) << error;
      EXPECT_EQ(received, std::vector<uint8_t>(8, 0xEE)) << "took the other message's bytes";
    }
    weftCommDestroy(comm);
  });
}

// What a group may hold after its small messages (which it keeps apart from jobs until
// something else joins): a collective, a message the ring does not carry, or another
// communicator's small messages. Every operation still runs, in call order.
enum class Joins { SmallMessage, OtherCommSmallMessage, LargeMessage, AllReduce };

TEST_P(GroupRing, HeldMessagesJoinWhatFollowsThem) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000), other = nullptr;
    ASSERT_EQ(weftCommSplit(comm, 0, context.rank, &other, nullptr), weftSuccess)
        << weftGetLastError(comm);
    const int n = context.nranks;
    const int right = (context.rank + 1) % n, left = (context.rank + n - 1) % n;
    using enum Joins;
    const std::vector<std::vector<Joins>> groups = {
        {SmallMessage, AllReduce, SmallMessage},
        {SmallMessage, LargeMessage, SmallMessage},
        {SmallMessage, OtherCommSmallMessage, SmallMessage},
        {OtherCommSmallMessage, SmallMessage},
        {AllReduce, SmallMessage, SmallMessage}};
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<Joins>& ops = groups[g];
      // A group reads and writes its buffers when it ends: all of them live until then.
      std::vector<std::vector<uint8_t>> outgoing(ops.size()), incoming(ops.size());
      std::vector<int32_t> sums(ops.size() * 7);
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (size_t i = 0; i < ops.size(); ++i) {
        const int seed = static_cast<int>(g * 10 + i);
        if (ops[i] == AllReduce) {
          for (int k = 0; k < 7; ++k) sums[i * 7 + k] = context.rank * 3 + k + seed;
          ASSERT_EQ(weftAllReduce(&sums[i * 7], &sums[i * 7], 7, weftInt32, weftSum, comm, nullptr),
                    weftSuccess);
          continue;
        }
        const size_t count = ops[i] == LargeMessage ? 600 : 40 + i;
        weftComm_t on = ops[i] == OtherCommSmallMessage ? other : comm;
        outgoing[i] = payload(context.rank * 100 + seed, weftUint8, count);
        incoming[i].assign(count, 0xEE);
        ASSERT_EQ(weftSend(outgoing[i].data(), count, weftUint8, right, on, nullptr), weftSuccess);
        ASSERT_EQ(weftRecv(incoming[i].data(), count, weftUint8, left, on, nullptr), weftSuccess);
      }
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
      for (size_t i = 0; i < ops.size(); ++i) {
        const int seed = static_cast<int>(g * 10 + i);
        if (ops[i] == AllReduce) {
          for (int k = 0; k < 7; ++k)
            ASSERT_EQ(sums[i * 7 + k], 3 * n * (n - 1) / 2 + n * (k + seed))
                << "group " << g << ", operation " << i << ", element " << k;
          continue;
        }
        ASSERT_EQ(incoming[i], payload(left * 100 + seed, weftUint8, incoming[i].size()))
            << "group " << g << ", operation " << i;
      }
    }
    EXPECT_EQ(weftCommDestroy(other), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Held messages keep their place ahead of what joins the group: rank 0 sends 8, 600 and 8
// bytes in one group (the first held, then turned into a job ahead of the second), rank 1
// receives them one blocking call at a time in that order. Numbered in another order, a
// receive would find its message carrying another sequence and fail.
TEST(P2P, HeldMessagesKeepTheirPlaceAheadOfWhatJoins) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    const size_t sizes[] = {8, 600, 8};
    std::vector<std::vector<uint8_t>> buffers;
    for (size_t i = 0; i < std::size(sizes); ++i)
      buffers.push_back(context.rank == 0 ? payload(static_cast<int>(i), weftUint8, sizes[i])
                                          : std::vector<uint8_t>(sizes[i], 0xEE));
    if (context.rank == 0) {
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (std::vector<uint8_t>& buffer : buffers)
        ASSERT_EQ(weftSend(buffer.data(), buffer.size(), weftUint8, 1, comm, nullptr), weftSuccess);
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    } else {
      for (size_t i = 0; i < buffers.size(); ++i) {
        ASSERT_EQ(weftRecv(buffers[i].data(), buffers[i].size(), weftUint8, 0, comm, nullptr),
                  weftSuccess)
            << "message " << i << ": " << weftGetLastError(comm);
        ASSERT_EQ(buffers[i], payload(static_cast<int>(i), weftUint8, sizes[i])) << "message " << i;
      }
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// weftCommDestroy inside a group that holds the communicator's operations (held small
// messages, or jobs) is refused and counts them; the group then runs.
TEST(P2P, DestroyInsideAGroupHoldingItsOperationsIsRefused) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    const int peer = 1 - context.rank;
    for (size_t count : {size_t{8}, size_t{600}}) {
      std::vector<uint8_t> outgoing = payload(context.rank, weftUint8, count),
                           incoming(count, 0xEE);
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      ASSERT_EQ(weftSend(outgoing.data(), count, weftUint8, peer, comm, nullptr), weftSuccess);
      ASSERT_EQ(weftRecv(incoming.data(), count, weftUint8, peer, comm, nullptr), weftSuccess);
      EXPECT_ERROR(weftCommDestroy(comm), weftInvalidUsage, "holds 2 operation(s)");
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
      ASSERT_EQ(incoming, payload(peer, weftUint8, count)) << count << " bytes";
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// A group whose small messages use no stream and whose next operation names one is abandoned
// on every rank, and consumes no message numbers: the next exchange pairs as if it never was.
TEST(P2P, AGroupMixingStreamsAfterHeldMessagesIsAbandoned) {
  run_ranks(2, [](const RankContext& context) {
    weftComm_t comm = init_comm(context, 60000);
    weftStream_t stream = nullptr;
    ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
    const int peer = 1 - context.rank;
    std::vector<uint8_t> abandoned = payload(context.rank + 50, weftUint8, 16),
                         outgoing = payload(context.rank, weftUint8, 16), incoming(16, 0xEE);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftSend(abandoned.data(), 16, weftUint8, peer, comm, nullptr), weftSuccess);
    EXPECT_ERROR(weftRecv(incoming.data(), 16, weftUint8, peer, comm, stream), weftInvalidUsage,
                 "same stream");
    EXPECT_ERROR(weftGroupEnd(), weftInvalidUsage, "group abandoned");
    EXPECT_EQ(incoming, std::vector<uint8_t>(16, 0xEE));
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftSend(outgoing.data(), 16, weftUint8, peer, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftRecv(incoming.data(), 16, weftUint8, peer, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(incoming, payload(peer, weftUint8, 16));
    EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

class BarrierRanks : public ::testing::TestWithParam<int> {};

// No rank may leave round k before every rank has entered it.
TEST_P(BarrierRanks, NobodyLeavesEarly) {
  auto* arrivals =
      static_cast<std::atomic<int>*>(mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(arrivals, MAP_FAILED);
  new (arrivals) std::atomic<int>(0);
  run_ranks(GetParam(), [arrivals](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    for (int round = 1; round <= 20; ++round) {
      arrivals->fetch_add(1);
      ASSERT_EQ(weftBarrier(comm, nullptr), weftSuccess) << weftGetLastError(comm);
      ASSERT_GE(arrivals->load(), round * context.nranks) << "left barrier " << round << " early";
      // A second barrier keeps the next round's arrivals from racing this check.
      ASSERT_EQ(weftBarrier(comm, nullptr), weftSuccess);
    }
    weftCommDestroy(comm);
  });
  munmap(arrivals, sizeof(std::atomic<int>));
}
INSTANTIATE_TEST_SUITE_P(Ranks, BarrierRanks, ::testing::Values(1, 2, 3, 5, 8));

}  // namespace
}  // namespace weft::testing
