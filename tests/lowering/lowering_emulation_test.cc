// The lowered stream-operation lists of every collective x algorithm the
// tuner can pick, run on the host emulation (stream_emulation.h) at 1..8
// ranks: exact results against a reference, flow control and deadlock
// freedom. This checks the orchestration the GPU executor will enqueue, not
// CUDA itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/lowering.h"
#include "algorithms/test_pairs.h"
#include "lowering/stream_emulation.h"

namespace weft::algo {
namespace {

constexpr int64_t kWaitTimeoutMs = 30000;
constexpr uint8_t kSentinel = 0xee;

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// A collective's shape, its inputs and where its buffers sit on each rank.
struct Case {
  Params params;
  size_t element_size = 8;
  uint64_t seed = 0;
  std::vector<uint64_t> counts;  // AllToAllv: [sender * n + receiver]
  std::vector<std::vector<uint64_t>> send_counts, send_displs, recv_counts, recv_displs;
};

// Per rank: the buffer (input and output inside it), and the input values.
struct RankData {
  std::vector<std::byte> storage;
  uint64_t input_at = 0, output_at = 0;  // bytes into storage
  uint64_t input_elements = 0, output_elements = 0;
  std::vector<uint64_t> input;  // the input values (masked to the element size)
};

Params rank_params(const Case& c, int r) {
  Params p = c.params;
  p.rank = r;
  if (p.collective == Collective::AllToAllv) {
    p.send_counts = c.send_counts[r].data();
    p.send_displs = c.send_displs[r].data();
    p.recv_counts = c.recv_counts[r].data();
    p.recv_displs = c.recv_displs[r].data();
    p.all_send_counts = c.counts.data();
  }
  return p;
}

uint64_t mask(const Case& c, uint64_t v) {
  return c.element_size == 8 ? v : v & ((uint64_t{1} << (8 * c.element_size)) - 1);
}

uint64_t load(const std::byte* p, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, size);  // little-endian
  return v;
}

// Allocates rank r's buffer with NCCL's in-place aliasing and writes its input.
RankData make_rank(const Case& c, int r) {
  const Params p = rank_params(c, r);
  RankData d;
  d.input_elements = input_count(p);
  d.output_elements = output_count(p);
  const uint64_t count = p.count;
  uint64_t input_offset = 0, output_offset = 0;  // elements
  if (p.in_place) {
    const bool root = r == p.root;
    switch (p.collective) {
      case Collective::AllGather:
        input_offset = r * count;
        break;
      case Collective::ReduceScatter:
        output_offset = r * count;
        break;
      case Collective::Gather:
        if (root) input_offset = p.root * count;
        break;
      case Collective::Scatter:
        if (root) output_offset = p.root * count;
        break;
      default:
        break;
    }
    const uint64_t total =
        std::max(input_offset + d.input_elements, output_offset + d.output_elements);
    d.storage.assign(total * c.element_size, std::byte{kSentinel});
  } else {
    output_offset = d.input_elements;
    d.storage.assign((d.input_elements + d.output_elements) * c.element_size, std::byte{kSentinel});
  }
  d.input_at = input_offset * c.element_size;
  d.output_at = output_offset * c.element_size;
  for (uint64_t i = 0; i < d.input_elements; ++i) {
    const uint64_t v = mask(c, mix(c.seed ^ (uint64_t(r) << 40) ^ i));
    d.input.push_back(v);
    std::memcpy(d.storage.data() + d.input_at + i * c.element_size, &v, c.element_size);
  }
  return d;
}

// The value output element i of rank r must hold; false for an element the
// collective leaves untouched (AllToAllv gaps), which must keep the sentinel.
bool expected(const Case& c, const std::vector<RankData>& data, int r, uint64_t i, uint64_t* out) {
  const Params& p = c.params;
  const int n = p.nranks;
  const uint64_t count = p.count;
  auto sum_at = [&](uint64_t at) {
    uint64_t s = 0;
    for (int q = 0; q < n; ++q) s += data[q].input[at];
    return mask(c, s);
  };
  switch (p.collective) {
    case Collective::AllReduce:
    case Collective::Reduce:
      *out = sum_at(i);
      return true;
    case Collective::ReduceScatter:
      *out = sum_at(r * count + i);
      return true;
    case Collective::AllGather:
    case Collective::Gather:
      *out = data[i / count].input[i % count];
      return true;
    case Collective::Broadcast:
      *out = data[p.root].input[i];
      return true;
    case Collective::AllToAll:
      *out = data[i / count].input[r * count + i % count];
      return true;
    case Collective::Scatter:
      *out = data[p.root].input[r * count + i];
      return true;
    case Collective::AllToAllv:
      for (int q = 0; q < n; ++q) {
        const uint64_t at = c.recv_displs[r][q];
        if (i >= at && i < at + c.recv_counts[r][q]) {
          *out = data[q].input[c.send_displs[q][r] + (i - at)];
          return true;
        }
      }
      return false;
    case Collective::Barrier:
      break;
  }
  return false;
}

// AllToAllv counts with zeros, skew and larger-than-scratch pieces; every
// rank packs its pieces in peer order with one unused element after each.
void make_alltoallv(Case* c) {
  const int n = c->params.nranks;
  const uint64_t base = c->params.count;
  c->counts.resize(n * n);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d)
      c->counts[s * n + d] = (s + 2 * d) % 3 == 0 ? 0 : base * ((s + d) % 3) + d;
  }
  c->send_counts.assign(n, {});
  c->send_displs.assign(n, {});
  c->recv_counts.assign(n, {});
  c->recv_displs.assign(n, {});
  for (int r = 0; r < n; ++r) {
    uint64_t sent = 0, received = 0;
    for (int q = 0; q < n; ++q) {
      c->send_counts[r].push_back(c->counts[r * n + q]);
      c->send_displs[r].push_back(sent);
      sent += c->counts[r * n + q] + 1;
      c->recv_counts[r].push_back(c->counts[q * n + r]);
      c->recv_displs[r].push_back(received);
      received += c->counts[q * n + r] + 1;
    }
  }
}

struct Shape {
  Algorithm algorithm;
  Collective collective;
  int nranks;
  uint64_t count;
  uint64_t chunk;
  bool in_place;
  bool two_nodes;
  size_t element_size;
};

std::string describe(const Shape& s) {
  return std::string(algorithm_name(s.algorithm)) + " " + collective_name(s.collective) +
         " n=" + std::to_string(s.nranks) + " count=" + std::to_string(s.count) +
         " chunk=" + std::to_string(s.chunk) + (s.in_place ? " in-place" : " out-of-place") +
         (s.two_nodes ? " two nodes, zigzag ring" : " one node") +
         " element=" + std::to_string(s.element_size);
}

// Lowers and emulates the calls of `sequence` back to back (each with its
// own data) on one emulated communicator and checks every result. Every
// call has the same rank count, element size and layout; *ran says whether
// every call applies at all.
void emulate(const std::vector<Shape>& sequence, const LowerConfig& base_config,
             uint64_t first_sequence, bool* ran) {
  *ran = false;
  const Shape& first = sequence.front();
  const int nranks = first.nranks;
  const size_t element_size = first.element_size;
  Layout layout;
  if (first.two_nodes) {
    // Two nodes, and a ring that zigzags between the ends: 0, n-1, 1, n-2, ...
    for (int r = 0; r < nranks; ++r) {
      layout.node_of.push_back(r < (nranks + 1) / 2 ? 0 : 1);
      layout.ring.push_back(r % 2 == 0 ? r / 2 : nranks - 1 - r / 2);
    }
  }
  LowerConfig config = base_config;
  config.element_size = element_size;
  const size_t operations = sequence.size();
  std::vector<Case> cases(operations);
  std::vector<std::vector<RankData>> data(operations);
  std::vector<test::EmulatedOp> ops(operations);
  for (size_t k = 0; k < operations; ++k) {
    const Shape& s = sequence[k];
    ASSERT_TRUE(s.nranks == nranks && s.element_size == element_size &&
                s.two_nodes == first.two_nodes);
    Case& c = cases[k];
    c.params.collective = s.collective;
    c.params.algorithm = s.algorithm;
    c.params.nranks = s.nranks;
    c.params.root = s.nranks / 2;
    c.params.count = s.count;
    c.params.chunk = s.chunk;
    c.params.in_place = s.in_place;
    c.params.layout = s.two_nodes ? &layout : nullptr;
    c.element_size = s.element_size;
    c.seed = mix(k + 1);
    if (s.collective == Collective::AllToAllv) make_alltoallv(&c);
    if (!applicable(rank_params(c, 0), nullptr)) return;
    ops[k].dtype = s.element_size == 8 ? weftUint64 : weftUint8;
    ops[k].lists.resize(s.nranks);
    for (int r = 0; r < s.nranks; ++r) {
      std::string error;
      ASSERT_TRUE(lower(rank_params(c, r), config, &ops[k].lists[r], &error))
          << describe(s) << " rank " << r << ": " << error;
      data[k].push_back(make_rank(c, r));
    }
    for (int r = 0; r < s.nranks; ++r) {
      RankData& d = data[k][r];
      test::OpBuffers b;
      b.input = d.storage.data() + d.input_at;
      b.input_bytes = d.input_elements * s.element_size;
      b.output = d.storage.data() + d.output_at;
      b.output_bytes = d.output_elements * s.element_size;
      b.scratch.assign(ops[k].lists[r].scratch_bytes, std::byte{kSentinel});
      ops[k].buffers.push_back(std::move(b));
    }
  }
  *ran = true;
  test::StreamEmulation emulation(nranks, config, first_sequence, kWaitTimeoutMs);
  std::string error;
  ASSERT_TRUE(emulation.run(ops, &error))
      << describe(first) << " (" << operations << " calls): " << error;
  for (size_t k = 0; k < operations; ++k) {
    const Shape& s = sequence[k];
    for (int r = 0; r < nranks; ++r) {
      const RankData& d = data[k][r];
      const std::byte* output = d.storage.data() + d.output_at;
      for (uint64_t i = 0; i < d.output_elements; ++i) {
        uint64_t want = 0;
        const bool written = expected(cases[k], data[k], r, i, &want);
        if (!written) want = mask(cases[k], 0xeeeeeeeeeeeeeeeeull);
        const uint64_t got = load(output + i * element_size, element_size);
        ASSERT_EQ(got, want) << describe(s) << " call " << k << " rank " << r << " output element "
                             << i;
      }
      if (s.in_place) continue;
      // Out of place, the input is the caller's and must be left alone.
      const std::byte* input = d.storage.data() + d.input_at;
      for (uint64_t i = 0; i < d.input_elements; ++i) {
        ASSERT_EQ(load(input + i * element_size, element_size), d.input[i])
            << describe(s) << " call " << k << " rank " << r << " input element " << i
            << " was modified";
      }
    }
  }
}

// Emulates each applicable shape; fails when none applies.
void emulate_all(const std::vector<Shape>& shapes, const LowerConfig& config, int operations) {
  int ran = 0;
  for (const Shape& shape : shapes) {
    bool applied = false;
    emulate(std::vector<Shape>(operations, shape), config, 1, &applied);
    if (::testing::Test::HasFatalFailure()) return;
    ran += applied;
  }
  EXPECT_GT(ran, 0) << "no shape of this pair was applicable";
}

class LoweringEmulation : public ::testing::TestWithParam<Pair> {};

// Scratch far smaller than the messages (6 elements of 8 bytes per slot),
// so large counts travel in many chunks through few slots.
TEST_P(LoweringEmulation, ExactResultsAtOneToEightRanks) {
  const auto [algorithm, collective] = GetParam();
  // These follow neither the nodes nor the ring: a layout would repeat the plain run.
  const bool layout_aware = algorithm != Algorithm::Bruck && algorithm != Algorithm::Pairwise &&
                            algorithm != Algorithm::Rhd && algorithm != Algorithm::Rd &&
                            algorithm != Algorithm::Dissemination;
  std::vector<Shape> shapes;
  for (int n = 1; n <= 8; ++n) {
    for (uint64_t count : {uint64_t{7}, uint64_t{61}}) {
      for (bool in_place : {false, true}) {
        for (bool two_nodes : {false, true}) {
          if (two_nodes && !layout_aware) continue;
          const uint64_t chunk = count > 7 ? 20 : 0;
          shapes.push_back({algorithm, collective, n, count, chunk, in_place, two_nodes, 8});
        }
      }
    }
  }
  LowerConfig config;
  config.slot_bytes = 48;
  config.slots = 2;
  emulate_all(shapes, config, 2);
}

// One-byte elements through a single slot of 5 bytes: every chunk must be
// consumed before the next one is sent, and odd sizes leave short tails.
TEST_P(LoweringEmulation, SingleOddSlotOfBytes) {
  const auto [algorithm, collective] = GetParam();
  std::vector<Shape> shapes;
  for (int n : {2, 3, 5, 8}) shapes.push_back({algorithm, collective, n, 23, 0, false, n >= 4, 1});
  LowerConfig config;
  config.slot_bytes = 5;
  config.slots = 1;
  emulate_all(shapes, config, 3);
}

INSTANTIATE_TEST_SUITE_P(AllPairs, LoweringEmulation, ::testing::ValuesIn(supported_pairs()),
                         pair_name);

// Flag values near the end of the sequence space still order correctly.
TEST(LoweringEmulationSequence, LateSequenceNumbers) {
  LowerConfig config;
  config.slot_bytes = 16;
  config.slots = 2;
  bool ran = false;
  const Shape shape{Algorithm::Ring, Collective::AllReduce, 4, 37, 0, false, false, 8};
  emulate(std::vector<Shape>(3, shape), config, kMaxSequence - 3, &ran);
  EXPECT_TRUE(ran);
}

// Different collectives back to back use different channels: each call's
// opening acks must let the next one reuse slots its predecessor filled.
TEST(LoweringEmulationSequence, DifferentCollectivesBackToBack) {
  LowerConfig config;
  config.slot_bytes = 24;
  config.slots = 2;
  for (int n : {3, 4, 7}) {
    const std::vector<Shape> sequence{
        {Algorithm::Ring, Collective::AllReduce, n, 29, 0, false, false, 8},
        {Algorithm::Pairwise, Collective::AllToAll, n, 11, 0, false, false, 8},
        {Algorithm::Binomial, Collective::Broadcast, n, 31, 0, true, false, 8},
        {Algorithm::Dissemination, Collective::Barrier, n, 0, 0, false, false, 8},
        {Algorithm::Tree, Collective::AllReduce, n, 17, 5, true, false, 8},
        {Algorithm::Bruck, Collective::AllGather, n, 9, 0, false, false, 8},
        {Algorithm::Chain, Collective::Reduce, n, 23, 4, false, false, 8},
    };
    bool ran = false;
    emulate(sequence, config, 1, &ran);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(ran) << "n=" << n;
  }
}

// The instrumentation itself: a second copy into a peer's slot before the
// peer consumed the first is caught, whatever the timing (the peer never
// consumes here).
TEST(LoweringEmulationChecks, OverwritingAnUnconsumedSlotFails) {
  LowerConfig config;
  config.element_size = 8;
  config.slot_bytes = 8;
  config.slots = 1;
  std::vector<std::byte> input(8, std::byte{1});
  test::EmulatedOp op;
  op.lists.resize(2);
  op.buffers.resize(2);
  op.buffers[0].input = input.data();
  op.buffers[0].input_bytes = input.size();
  StreamOp copy;
  copy.kind = OpKind::Copy;
  copy.dst = {Space::PeerInbound, 1, 0};
  copy.a = {Space::Input, -1, 0};
  copy.bytes = 8;
  op.lists[0].ops = {copy, copy};
  std::vector<test::EmulatedOp> ops{op};
  test::StreamEmulation emulation(2, config, 1, kWaitTimeoutMs);
  std::string error;
  ASSERT_FALSE(emulation.run(ops, &error));
  EXPECT_NE(error.find("rank 0 operation 0 stream op 1: overwrites slot 0 of rank 1"),
            std::string::npos)
      << error;
}

// A wait nobody satisfies times out and names the rank, the op and the flag.
TEST(LoweringEmulationChecks, UnsatisfiedWaitTimesOutNamingTheRank) {
  LowerConfig config;
  test::EmulatedOp op;
  op.lists.resize(3);
  op.buffers.resize(3);
  StreamOp wait;
  wait.kind = OpKind::WaitFlag;
  wait.flag = Flag::Inbound;
  wait.peer = 0;
  wait.value = 1;
  op.lists[2].ops = {wait};
  std::vector<test::EmulatedOp> ops{op};
  test::StreamEmulation emulation(3, config, 1, 50);
  std::string error;
  ASSERT_FALSE(emulation.run(ops, &error));
  EXPECT_NE(error.find("rank 2 operation 0 stream op 0: timed out waiting for its inbound flag "
                       "from rank 0"),
            std::string::npos)
      << error;
}

// The lowered form itself: every chunk into a peer's slot is preceded by a
// wait for the acknowledgement that frees it, flags only grow per peer, and
// the message is cut into slot-sized chunks.
TEST(Lowering, SlotCopiesWaitForAcksAndFlagsGrow) {
  Params p;
  p.collective = Collective::AllReduce;
  p.algorithm = Algorithm::Ring;
  p.nranks = 3;
  p.count = 100;
  LowerConfig config;
  config.element_size = 4;
  config.slot_bytes = 32;
  config.slots = 2;
  std::vector<LoweredProgram> all;
  std::string error;
  ASSERT_TRUE(lower_all(p, config, &all, &error)) << error;
  ASSERT_EQ(all.size(), 3u);
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<uint64_t> ack_seen(3, 0), written(3, 0), sent(3, 0);
    std::vector<bool> ack_waited(3, false);
    for (const StreamOp& op : all[r].ops) {
      if (op.kind == OpKind::WaitFlag && op.flag == Flag::Ack) {
        ack_waited[op.peer] = true;
        ack_seen[op.peer] = std::max(ack_seen[op.peer], op.value);
      }
      if (op.kind == OpKind::Copy && op.dst.space == Space::PeerInbound) {
        const int peer = op.dst.peer;
        ASSERT_TRUE(ack_waited[peer]) << "rank " << r << " sends before its peer opened";
        // Chunk `sent` reuses the slot of chunk sent - slots, consumed once
        // the ack reaches sent - slots + 1.
        if (sent[peer] >= config.slots) {
          EXPECT_GE(ack_seen[peer], sent[peer] - config.slots + 1) << "rank " << r;
        }
        EXPECT_EQ(op.dst.offset, sent[peer] % config.slots * config.slot_bytes);
        EXPECT_LE(op.bytes, config.slot_bytes);
        ++sent[peer];
      }
      if (op.kind == OpKind::WriteFlag && op.flag == Flag::Inbound) {
        EXPECT_GT(op.value, written[op.peer]) << "rank " << r << " flag to " << op.peer;
        written[op.peer] = op.value;
      }
    }
    EXPECT_EQ(all[r].chunks_sent, sent[0] + sent[1] + sent[2]);
    EXPECT_GT(all[r].chunks_sent, 2u * 2) << "100 floats in 32-byte slots need many chunks";
  }
}

TEST(Lowering, BadConfigurationsNameTheArgument) {
  Params p;
  p.nranks = 2;
  p.count = 8;
  LoweredProgram out;
  std::string error;
  LowerConfig config;
  config.slots = 0;
  EXPECT_FALSE(lower(p, config, &out, &error));
  EXPECT_NE(error.find("slots"), std::string::npos) << error;
  config = LowerConfig{};
  config.element_size = 8;
  config.slot_bytes = 4;
  EXPECT_FALSE(lower(p, config, &out, &error));
  EXPECT_NE(error.find("slot_bytes"), std::string::npos) << error;
  config = LowerConfig{};
  p.rank = 2;
  EXPECT_FALSE(lower(p, config, &out, &error));
  EXPECT_NE(error.find("rank 2"), std::string::npos) << error;
}

TEST(Lowering, AllToAllvNeedsEveryRanksCounts) {
  const uint64_t counts[2] = {3, 4}, displs[2] = {0, 3};
  Params p;
  p.collective = Collective::AllToAllv;
  p.algorithm = Algorithm::Pairwise;
  p.nranks = 2;
  p.send_counts = p.recv_counts = counts;
  p.send_displs = p.recv_displs = displs;
  LoweredProgram out;
  std::string error;
  EXPECT_FALSE(lower(p, LowerConfig{}, &out, &error));
  EXPECT_NE(error.find("all_send_counts"), std::string::npos) << error;
}

}  // namespace
}  // namespace weft::algo
