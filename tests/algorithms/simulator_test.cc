// The checker must be able to fail: hand-made broken programs, each with one
// defect, are caught and named.
#include "algorithms/simulator.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "test_pairs.h"

namespace weft::algo {
namespace {

Step make(StepKind kind, int peer, Range a, Range b, Range dst) {
  Step s;
  s.kind = kind;
  s.peer = peer;
  s.a = a;
  s.b = b;
  s.dst = dst;
  return s;
}
Step send(int peer, Range a) {
  return make(StepKind::Send, peer, a, {}, {});
}
Step recv(int peer, Range dst) {
  return make(StepKind::Recv, peer, {}, {}, dst);
}
Step reduce(Range dst, Range a, Range b) {
  return make(StepKind::Reduce, -1, a, b, dst);
}
Step copy(Range dst, Range a) {
  return make(StepKind::Copy, -1, a, {}, dst);
}
Range in(uint64_t off, uint64_t n) {
  return Range{off, n, Buf::Input};
}
Range out(uint64_t off, uint64_t n) {
  return Range{off, n, Buf::Output};
}
Range scratch(uint64_t off, uint64_t n) {
  return Range{off, n, Buf::Scratch};
}

Params two_rank_allreduce(uint64_t count) {
  Params p;
  p.collective = Collective::AllReduce;
  p.nranks = 2;
  p.count = count;
  return p;
}

// A correct two-rank AllReduce, the baseline the broken variants start from.
bool good_allreduce(const Params& p, Program* prog, std::string*) {
  *prog = Program{};
  prog->scratch_count = p.count;
  const int peer = 1 - p.rank;
  const uint32_t s = prog->add(send(peer, in(0, p.count)));
  const uint32_t r = prog->add(recv(peer, scratch(0, p.count)));
  // Lower rank first on both sides: same bits everywhere.
  const Range mine = in(0, p.count), theirs = scratch(0, p.count);
  prog->add(reduce(out(0, p.count), p.rank == 0 ? mine : theirs, p.rank == 0 ? theirs : mine),
            {r, s});
  return true;
}

// The correct AllReduce with one defect applied on every rank.
ProgramBuilder mutated(std::function<void(const Params&, Program*)> change) {
  return [change](const Params& p, Program* prog, std::string* e) {
    good_allreduce(p, prog, e);
    change(p, prog);
    return true;
  };
}

TEST(Simulator, AcceptsACorrectProgramAndCounts) {
  SimOptions options;
  options.element_size = 8;
  const SimResult res = simulate(two_rank_allreduce(5), options, good_allreduce);
  ASSERT_TRUE(res.ok()) << res.message();
  EXPECT_TRUE(res.values_checked);
  EXPECT_TRUE(res.hazards_checked);
  EXPECT_EQ(res.rounds, 1u);
  for (const RankStats& r : res.ranks) {
    EXPECT_EQ(r.steps, 3u);
    EXPECT_EQ(r.messages, 1u);
    EXPECT_EQ(r.bytes_sent, 40u);
  }
}

TEST(Simulator, DetectsDeadlock) {
  // Both ranks wait to receive before they send.
  auto broken = [](const Params& p, Program* prog, std::string*) {
    *prog = Program{};
    prog->scratch_count = p.count;
    const int peer = 1 - p.rank;
    const uint32_t r = prog->add(recv(peer, scratch(0, p.count)));
    prog->add(send(peer, in(0, p.count)), {r});
    prog->add(reduce(out(0, p.count), in(0, p.count), scratch(0, p.count)), {r});
    return true;
  };
  const SimResult res = simulate(two_rank_allreduce(3), {}, broken);
  EXPECT_TRUE(res.has(kSimDeadlock)) << res.message();
  EXPECT_NE(res.message().find("rank 0 step 1"), std::string::npos) << res.message();
  EXPECT_NE(res.message().find("rank 1"), std::string::npos) << res.message();
}

TEST(Simulator, DetectsSizeMismatch) {
  auto broken = mutated([](const Params& p, Program* prog) {
    if (p.rank == 1) prog->steps[0].a.count = p.count - 1;
  });
  const SimResult res = simulate(two_rank_allreduce(4), {}, broken);
  EXPECT_TRUE(res.has(kSimSizeMismatch)) << res.message();
}

TEST(Simulator, DetectsUnmatchedMessages) {
  auto broken = mutated([](const Params& p, Program* prog) {
    if (p.rank == 0) prog->add(send(1, in(0, 1)));
  });
  const SimResult res = simulate(two_rank_allreduce(4), {}, broken);
  EXPECT_TRUE(res.has(kSimUnmatched)) << res.message();
}

TEST(Simulator, DetectsMissingDependency) {
  // The reduce reads the received data without waiting for the receive.
  auto broken = mutated([](const Params&, Program* prog) { prog->steps[2].num_deps = 0; });
  const SimResult res = simulate(two_rank_allreduce(4), {}, broken);
  EXPECT_TRUE(res.has(kSimHazard)) << res.message();
}

TEST(Simulator, DetectsWriteAfterReadRace) {
  // Values come out right in the simulator's order, but the receive may
  // overwrite Output while the send still reads it.
  auto broken = [](const Params& p, Program* prog, std::string*) {
    *prog = Program{};
    prog->scratch_count = p.count;
    const int peer = 1 - p.rank;
    const uint32_t c = prog->add(copy(out(0, p.count), in(0, p.count)));
    prog->add(send(peer, out(0, p.count)), {c});
    const uint32_t r = prog->add(recv(peer, scratch(0, p.count)), {c});
    prog->add(reduce(out(0, p.count), out(0, p.count), scratch(0, p.count)), {r});
    return true;
  };
  const SimResult res = simulate(two_rank_allreduce(4), {}, broken);
  EXPECT_TRUE(res.has(kSimHazard)) << res.message();
}

TEST(Simulator, RandomOrderExposesRacesTheHazardCheckSkipped) {
  // The reduce may run before the receive lands; with the hazard check off,
  // some execution orders give a wrong sum.
  auto broken = mutated([](const Params&, Program* prog) { prog->steps[2].num_deps = 0; });
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SimOptions options;
    options.hazard_step_limit = 0;
    options.order_seed = seed;
    const SimResult res = simulate(two_rank_allreduce(4), options, broken);
    EXPECT_FALSE(res.hazards_checked);
    EXPECT_FALSE(res.has(kSimHazard));
    wrong += res.has(kSimWrongResult);
  }
  EXPECT_GT(wrong, 0);
}

TEST(Simulator, DetectsWrongResult) {
  auto broken = [](const Params& p, Program* prog, std::string*) {
    *prog = Program{};
    prog->add(copy(out(0, p.count), in(0, p.count)));
    return true;
  };
  const SimResult res = simulate(two_rank_allreduce(4), {}, broken);
  EXPECT_TRUE(res.has(kSimWrongResult)) << res.message();
  EXPECT_FALSE(res.has(kSimHazard));
}

TEST(Simulator, DetectsOperandOrderDifferences) {
  // Both ranks put their own value first: exact for integers, but on floats
  // the two ranks could end with different bits.
  auto mine_first = [](const Params& p, Program* prog, std::string*) {
    *prog = Program{};
    prog->scratch_count = p.count;
    const int peer = 1 - p.rank;
    const uint32_t s = prog->add(send(peer, in(0, p.count)));
    const uint32_t r = prog->add(recv(peer, scratch(0, p.count)));
    prog->add(reduce(out(0, p.count), in(0, p.count), scratch(0, p.count)), {r, s});
    return true;
  };
  const SimResult res = simulate(two_rank_allreduce(4), {}, mine_first);
  EXPECT_TRUE(res.has(kSimOrderDiffers)) << res.message();
  EXPECT_FALSE(res.has(kSimWrongResult));
}

TEST(Simulator, DetectsOutOfBoundsAndBadSteps) {
  auto oob = mutated([](const Params&, Program* prog) { prog->steps[2].dst.offset = 1; });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, oob).has(kSimOutOfBounds));
  auto scratchless = mutated([](const Params&, Program* prog) { prog->scratch_count = 0; });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, scratchless).has(kSimOutOfBounds));
  auto forward_dep = mutated([](const Params&, Program* prog) { prog->deps[0] = 2; });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, forward_dep).has(kSimInvalidStep));
  auto self_send = mutated([](const Params& p, Program* prog) { prog->steps[0].peer = p.rank; });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, self_send).has(kSimInvalidStep));
  auto partial_alias = mutated([](const Params& p, Program* prog) {
    prog->scratch_count = 2 * p.count;
    prog->steps[2] = reduce(scratch(1, p.count), scratch(0, p.count), in(0, p.count));
  });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, partial_alias).has(kSimInvalidStep));
}

TEST(Simulator, ChecksInputIsReadOnlyOutOfPlace) {
  auto clobber = mutated([](const Params& p, Program* prog) {
    prog->add(copy(in(0, p.count), out(0, p.count)), {2});
  });
  EXPECT_TRUE(simulate(two_rank_allreduce(4), {}, clobber).has(kSimWrongResult));
}

TEST(Simulator, ChecksInPlaceAliasing) {
  // In place Input and Output are one buffer: reading the input after the
  // output was written sees the result, not the input.
  auto reread = [](const Params& p, Program* prog, std::string* e) {
    if (p.rank == 0) return good_allreduce(p, prog, e);
    *prog = Program{};
    prog->scratch_count = p.count;
    const uint32_t r = prog->add(recv(0, scratch(0, p.count)));
    const uint32_t d = prog->add(reduce(out(0, p.count), scratch(0, p.count), in(0, p.count)), {r});
    prog->add(send(0, in(0, p.count)), {d});
    return true;
  };
  Params p = two_rank_allreduce(4);
  EXPECT_TRUE(simulate(p, {}, reread).ok());  // out of place it is fine
  p.in_place = true;
  EXPECT_TRUE(simulate(p, {}, reread).has(kSimWrongResult));
}

TEST(Simulator, DetectsBarrierThatDoesNotSynchronise) {
  // Everyone tells the next rank and listens to the previous one, but
  // nothing waits, so news travels one hop only.
  auto broken = [](const Params& p, Program* prog, std::string*) {
    *prog = Program{};
    prog->add(send((p.rank + 1) % p.nranks, in(0, 0)));
    prog->add(recv((p.rank + p.nranks - 1) % p.nranks, in(0, 0)));
    return true;
  };
  Params p;
  p.collective = Collective::Barrier;
  p.algorithm = Algorithm::Dissemination;
  p.nranks = 4;
  const SimResult res = simulate(p, {}, broken);
  EXPECT_TRUE(res.has(kSimNoSync)) << res.message();
  EXPECT_TRUE(simulate(p).ok());
}

TEST(Simulator, ReportsBuildFailures) {
  auto failing = [](const Params&, Program*, std::string* e) {
    *e = "nope";
    return false;
  };
  const SimResult res = simulate(two_rank_allreduce(1), {}, failing);
  EXPECT_TRUE(res.has(kSimBuildFailed));
  EXPECT_NE(res.message().find("nope"), std::string::npos);
}

// Every real algorithm relies on its dependencies: with all of them removed
// the checker must object (race, deadlock-free but wrong, or unsynchronised).
class StrippedDeps : public ::testing::TestWithParam<Pair> {};

TEST_P(StrippedDeps, AreCaught) {
  const auto [algorithm, collective] = GetParam();
  Params p;
  p.algorithm = algorithm;
  p.collective = collective;
  p.nranks = 6;
  p.count = 13;
  p.root = 1;
  p.chunk = 4;
  SimOptions options;
  options.alltoallv_counts.resize(36);
  for (int i = 0; i < 36; ++i) options.alltoallv_counts[i] = 1 + i % 4;
  p.all_send_counts = options.alltoallv_counts.data();
  ASSERT_TRUE(simulate(p, options).ok());
  auto stripped = [](const Params& q, Program* prog, std::string* e) {
    if (!build(q, prog, e)) return false;
    for (Step& s : prog->steps) s.num_deps = 0;
    return true;
  };
  const SimResult res = simulate(p, options, stripped);
  // Out-of-place exchanges have no hazards at all (hierarchical AllToAll is
  // the pairwise one without a layout); everything else must fail.
  const bool independent =
      (collective == Collective::AllToAll || collective == Collective::AllToAllv) &&
      (algorithm == Algorithm::Pairwise || algorithm == Algorithm::Hierarchical);
  EXPECT_NE(res.ok(), !independent) << res.message();
}

INSTANTIATE_TEST_SUITE_P(AllPairs, StrippedDeps, ::testing::ValuesIn(supported_pairs()), pair_name);

}  // namespace
}  // namespace weft::algo
