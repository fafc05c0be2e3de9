// algo::lower_p2p: one rank's sends and receives of a group as one stream-operation list.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithms/lowering.h"

namespace weft::algo {
namespace {

LowerConfig slots_of(uint64_t bytes, uint32_t slots) {
  LowerConfig config;
  config.element_size = 1;
  config.slot_bytes = bytes;
  config.slots = slots;
  return config;
}

// Rank 1 of 3 sends 25 bytes to rank 2 and receives 10 from rank 0 through 2 slots of 8 bytes:
// round by round, sends first; a send waits for its slot's previous chunk; addresses absolute.
TEST(LowerP2p, ChannelsAdvanceInRoundsSendsFirst) {
  LoweredProgram list;
  std::string error;
  ASSERT_TRUE(lower_p2p(3, 1, {{2, 1000, 25}}, {{0, 5000, 10}}, slots_of(8, 2), &list, &error))
      << error;
  std::vector<std::string> got;
  for (const StreamOp& op : list.ops) {
    std::string text;
    switch (op.kind) {
      case OpKind::Copy:
        text = "copy " + std::to_string(op.dst.offset) + "<-" + std::to_string(op.a.offset) + " " +
               std::to_string(op.bytes);
        break;
      case OpKind::WriteFlag:
        text = std::string("write ") + (op.flag == Flag::Inbound ? "in" : "ack") + " " +
               std::to_string(op.peer) + " " + std::to_string(op.value);
        break;
      case OpKind::WaitFlag:
        text = std::string("wait ") + (op.flag == Flag::Inbound ? "in" : "ack") + " " +
               std::to_string(op.peer) + " " + std::to_string(op.value);
        break;
      case OpKind::Reduce:
        text = "reduce";
        break;
    }
    got.push_back(text);
  }
  const std::vector<std::string> want{
      // round 0: chunk 0 to rank 2 (slot 0) after every earlier chunk was consumed, then chunk
      // 0 from rank 0
      "wait ack 2 0", "copy 0<-1000 8", "write in 2 1", "wait in 0 1", "copy 5000<-0 8",
      "write ack 0 1",
      // round 1: slot 1 is fresh for this operation
      "copy 8<-1008 8", "write in 2 2", "wait in 0 2", "copy 5008<-8 2", "write ack 0 2",
      // rounds 2 and 3 reuse slots 0 and 1 once their chunks were consumed
      "wait ack 2 1", "copy 0<-1016 8", "write in 2 3", "wait ack 2 2", "copy 8<-1024 1",
      "write in 2 4"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(list.chunks_sent, 4u);
}

TEST(LowerP2p, EmptyMessagesAndSelfCopies) {
  LoweredProgram list;
  std::string error;
  // An empty message is one chunk without a copy; a send to itself a copy into the receive.
  ASSERT_TRUE(
      lower_p2p(2, 0, {{1, 64, 0}, {0, 100, 4}}, {{0, 200, 4}}, slots_of(8, 2), &list, &error))
      << error;
  ASSERT_EQ(list.ops.size(), 3u);  // the copy to itself, the empty chunk's wait and write
  EXPECT_EQ(list.ops[0].kind, OpKind::Copy);
  EXPECT_EQ(list.ops[0].dst.offset, 200u);
  EXPECT_EQ(list.ops[0].a.offset, 100u);
  EXPECT_EQ(list.ops[1].kind, OpKind::WaitFlag);
  EXPECT_EQ(list.ops[2].kind, OpKind::WriteFlag);
  EXPECT_EQ(list.ops[2].value, 1u);
  EXPECT_EQ(list.chunks_sent, 1u);
}

TEST(LowerP2p, BadMessagesAreNamed) {
  LoweredProgram list;
  std::string error;
  EXPECT_FALSE(lower_p2p(2, 0, {{2, 0, 4}}, {}, slots_of(8, 2), &list, &error));
  EXPECT_NE(error.find("peer 2 is outside 0..1"), std::string::npos) << error;
  EXPECT_FALSE(lower_p2p(2, 0, {{0, 0, 4}}, {}, slots_of(8, 2), &list, &error));
  EXPECT_NE(error.find("1 sends to this rank itself but 0 receives"), std::string::npos) << error;
  EXPECT_FALSE(lower_p2p(2, 0, {{0, 0, 4}}, {{0, 8, 3}}, slots_of(8, 2), &list, &error));
  EXPECT_NE(error.find("meets a receive of 3"), std::string::npos) << error;
}

}  // namespace
}  // namespace weft::algo
