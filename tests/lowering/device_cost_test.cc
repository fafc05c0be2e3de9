// algo::count_lowered and algo::predict_device_us: what a lowered list does, counted by kind,
// and the device cost model's time from those counts, each figure of the model weighing its own
// count (the GPU executor chooses algorithms by it, weft-sim -G prints it).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithms/lowering.h"

namespace weft::algo {
namespace {

StreamOp copy(Space to, uint64_t bytes) {
  StreamOp op;
  op.kind = OpKind::Copy;
  op.dst.space = to;
  op.dst.peer = to == Space::PeerInbound ? 1 : -1;
  op.bytes = bytes;
  return op;
}

StreamOp flag(OpKind kind) {
  StreamOp op;
  op.kind = kind;
  op.peer = 1;
  op.value = 1;
  return op;
}

// Two copies (one into a peer's slot), a reduction of 10 elements, a counter write and a wait.
LoweredProgram hand_made() {
  LoweredProgram list;
  StreamOp reduce;
  reduce.kind = OpKind::Reduce;
  reduce.count = 10;
  list.ops = {copy(Space::PeerInbound, 100), flag(OpKind::WriteFlag), flag(OpKind::WaitFlag),
              reduce, copy(Space::Output, 50)};
  return list;
}

TEST(LoweredStats, CountsEveryKindAndItsBytes) {
  const LoweredStats s = count_lowered(hand_made(), 4);
  EXPECT_EQ(s.ops, 5u);
  EXPECT_EQ(s.copies, 2u);
  EXPECT_EQ(s.bytes_copied, 150u);
  EXPECT_EQ(s.bytes_to_peers, 100u);
  EXPECT_EQ(s.flag_writes, 1u);
  EXPECT_EQ(s.flag_waits, 1u);
  EXPECT_EQ(s.reductions, 1u);
  EXPECT_EQ(s.bytes_reduced, 3u * 10 * 4);  // two vectors read, one written
}

TEST(DeviceCostModel, EachFigureWeighsItsOwnCount) {
  const LoweredProgram list = hand_made();
  constexpr double kFree = 1e300;  // bytes per microsecond that cost nothing
  DeviceCostModel m{0, 0, 0, kFree, kFree};
  m.copy_us = 1;
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4, m), 2);
  m = {0, 1, 0, kFree, kFree};
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4, m), 2);  // a write and a wait
  m = {0, 0, 1, kFree, kFree};
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4, m), 1);
  m = {0, 0, 0, 50, kFree};
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4, m), 3);  // 150 bytes at 50 per microsecond
  m = {0, 0, 0, kFree, 40};
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4, m), 3);  // 120 bytes at 40 per microsecond
  // The defaults: 2 copies, 1 kernel, 2 counter operations and their bytes.
  EXPECT_DOUBLE_EQ(predict_device_us(list, 4), 2 * 2.5 + 150 / 1.5e6 + 3 + 120 / 1e6 + 2 * 1.0);
}

// A ring AllReduce through slots as large as a block: every rank writes 2(n − 1) blocks of
// B/n into its peer's slots (reduce-scatter, then all-gather), each chunk announced by a
// counter write and its slot freed by an acknowledgement.
TEST(LoweredStats, RingAllReduceSendsTwoNMinusOneBlocks) {
  for (int n : {2, 3, 4, 8}) {
    Params params;
    params.collective = Collective::AllReduce;
    params.algorithm = Algorithm::Ring;
    params.nranks = n;
    params.count = 1024 * static_cast<uint64_t>(n);
    LowerConfig config;
    config.element_size = 4;
    config.slot_bytes = 4096;
    std::vector<LoweredProgram> all;
    std::string error;
    ASSERT_TRUE(lower_all(params, config, &all, &error)) << error;
    for (const LoweredProgram& list : all) {
      const LoweredStats s = count_lowered(list, 4);
      EXPECT_EQ(s.bytes_to_peers, 2u * (n - 1) * 4096) << n;
      EXPECT_EQ(s.reductions, static_cast<uint64_t>(n - 1)) << n;
    }
  }
}

}  // namespace
}  // namespace weft::algo
