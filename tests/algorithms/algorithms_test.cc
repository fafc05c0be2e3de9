// Every (algorithm, collective) pair that supports() allows, run through the
// simulator: all rank counts 1..64 with several counts, chunking, placement
// and roots, then large rank counts; plus the closed-form traffic of the
// classic algorithms.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "algorithms/patterns.h"
#include "algorithms/simulator.h"
#include "test_pairs.h"

namespace weft::algo {
namespace {

struct Case {
  Pair pair;
  int nranks = 1;
  uint64_t count = 0;
  uint64_t chunk = 0;
  bool in_place = false;
  int root = 0;

  Params params() const {
    Params p;
    p.algorithm = pair.first;
    p.collective = pair.second;
    p.nranks = nranks;
    p.count = count;
    p.chunk = chunk;
    p.in_place = in_place;
    p.root = root;
    return p;
  }
  std::string text() const {
    return std::string(algorithm_name(pair.first)) + " " + collective_name(pair.second) +
           " n=" + std::to_string(nranks) + " count=" + std::to_string(count) +
           " chunk=" + std::to_string(chunk) + (in_place ? " in-place" : " out-of-place") +
           " root=" + std::to_string(root);
  }
};

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

// Collectives whose count is the whole vector rather than a per-rank block.
bool whole_vector(Collective c) {
  return c == Collective::AllReduce || c == Collective::Broadcast || c == Collective::Reduce;
}

SimOptions options_for(const Case& c) {
  SimOptions options;
  options.element_size = 4;
  if (c.pair.second == Collective::AllToAllv) {
    // Uneven, with empty pieces; `count` bounds a piece. In-place does not
    // exist for AllToAllv, so that flag picks gaps between pieces instead.
    const int n = c.nranks;
    options.alltoallv_counts.resize(static_cast<size_t>(n) * n);
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        options.alltoallv_counts[s * n + d] = (s * 5 + d * 3 + c.count) % (c.count + 1);
      }
    }
    options.alltoallv_gap = c.in_place ? 2 : 0;
  }
  return options;
}

// Runs one case; below kHazardSweep ranks every program must also have been
// checked for races.
constexpr int kHazardSweep = 64;

void expect_ok(const Case& c, uint64_t order_seed = 0) {
  Case run = c;
  if (c.pair.second == Collective::AllToAllv) run.in_place = false;
  SimOptions options = options_for(c);
  options.order_seed = order_seed;
  Params params = run.params();
  params.all_send_counts = options.alltoallv_counts.data();  // hierarchical AllToAllv needs it
  const SimResult res = simulate(params, options);
  ASSERT_TRUE(res.ok()) << c.text() << "\n" << res.message();
  EXPECT_TRUE(res.values_checked || c.pair.second == Collective::Barrier) << c.text();
  if (c.nranks <= kHazardSweep) {
    EXPECT_TRUE(res.hazards_checked) << c.text();
  }
  if (c.chunk > 0) {
    for (const RankStats& r : res.ranks) ASSERT_LE(r.largest, c.chunk) << c.text();
  }
}

class EveryPair : public ::testing::TestWithParam<Pair> {};

TEST_P(EveryPair, RankCountsUpTo64) {
  const Pair pair = GetParam();
  for (int n = 1; n <= kHazardSweep; ++n) {
    std::vector<int> roots = {0};
    if (rooted(pair.second) && n > 1) roots = {n - 1, n / 3};
    // A count that n does not divide matters where the vector is split
    // among ranks; elsewhere count is already a per-rank block.
    const uint64_t odd = whole_vector(pair.second) ? 3 * n + 1 : 11;
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, odd}) {
      // Chunks of 2 or 3 elements: blocks then differ in their chunk counts.
      for (uint64_t chunk : {uint64_t{0}, uint64_t(2 + n % 2)}) {
        if (chunk > 0 && count < 3) continue;
        for (bool in_place : {false, true}) {
          for (int root : roots) {
            expect_ok(Case{pair, n, count, chunk, in_place, root});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Large rank counts with small vectors: count 1 out of place, and a second
// count in place (for per-rank blocks, whose buffers grow with n, only at
// 128 ranks to keep time and memory down). A pair whose programs would hold more than kStepBudget
// steps in all (the n^2 exchanges) is skipped at 4096 ranks; the 1..64 sweep and the 1000-rank runs
// cover its logic.
TEST_P(EveryPair, LargeRankCounts) {
  constexpr uint64_t kStepBudget = 6'000'000;
  const Pair pair = GetParam();
  for (int n : {128, 1000, 4096}) {
    std::vector<std::pair<uint64_t, bool>> variants = {{1, false}};
    if (whole_vector(pair.second)) {
      variants.push_back({9, true});
    } else if (n == 128) {
      variants.push_back({2, true});
    }
    for (const auto& [count, in_place] : variants) {
      const Case c{pair, n, count, 0, in_place, rooted(pair.second) ? n / 3 : 0};
      if (pair.second != Collective::AllToAllv) {
        Program probe;
        std::string error;
        ASSERT_TRUE(build(c.params(), &probe, &error)) << error;
        if (probe.steps.size() * static_cast<uint64_t>(n) > kStepBudget) {
          EXPECT_EQ(n, 4096) << c.text() << " should fit the budget below 4096 ranks";
          continue;
        }
      } else if (n == 4096) {
        continue;  // its n^2 counts matrix is dense
      }
      // Hazards go unchecked on ranks with long programs here, so ready
      // steps also run in a random order (a race could then show as a
      // wrong value).
      expect_ok(c, /*order_seed=*/n + count);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, EveryPair, ::testing::ValuesIn(supported_pairs()), pair_name);

SimResult run_plain(Algorithm a, Collective c, int n, uint64_t count) {
  Case k{{a, c}, n, count, 0, false, 0};
  SimResult res = simulate(k.params(), options_for(k));
  EXPECT_TRUE(res.ok()) << k.text() << "\n" << res.message();
  return res;
}

// Every rank sends exactly `bytes`, in `messages` messages.
void expect_each_rank(const SimResult& res, uint64_t bytes, uint64_t messages,
                      const std::string& what) {
  for (size_t r = 0; r < res.ranks.size(); ++r) {
    EXPECT_EQ(res.ranks[r].bytes_sent, bytes) << what << " rank " << r;
    EXPECT_EQ(res.ranks[r].messages, messages) << what << " rank " << r;
  }
}

TEST(ClosedForms, RingAllReduceSends2NMinus1OverNOfTheVector) {
  for (int n : {2, 3, 5, 8, 13, 64, 128, 1000}) {
    const uint64_t count = 5 * n;  // S = 20n bytes, divisible by n
    const SimResult res = run_plain(Algorithm::Ring, Collective::AllReduce, n, count);
    const uint64_t s = count * 4;
    expect_each_rank(res, 2 * (n - 1) * s / n, 2 * (n - 1), "ring n=" + std::to_string(n));
    EXPECT_EQ(res.rounds, static_cast<uint32_t>(2 * (n - 1)));
  }
}

TEST(ClosedForms, RabenseifnerMatchesRingBytesInLogSteps) {
  for (int n : {2, 4, 8, 16, 64, 128, 1024}) {
    const uint64_t count = 3 * n;
    const SimResult res = run_plain(Algorithm::Rhd, Collective::AllReduce, n, count);
    const uint64_t s = count * 4;
    const uint64_t steps = 2 * log2_floor(n);
    expect_each_rank(res, 2 * (n - 1) * s / n, steps, "rhd n=" + std::to_string(n));
    EXPECT_EQ(res.rounds, steps);
  }
}

TEST(ClosedForms, RecursiveDoublingSendsTheWholeVectorEachStep) {
  for (int n : {2, 4, 32, 256}) {
    const SimResult res = run_plain(Algorithm::Rd, Collective::AllReduce, n, 11);
    const uint64_t steps = log2_floor(n);
    expect_each_rank(res, steps * 11 * 4, steps, "rd n=" + std::to_string(n));
    EXPECT_EQ(res.rounds, steps);
  }
}

// ceil(log2 n) messages; for non-powers of two the last round only needs
// blocks held from the start, so the critical path can be shorter.
TEST(ClosedForms, BruckAllGatherTakesCeilLog2Steps) {
  std::vector<int> sizes;
  for (int n = 1; n <= 64; ++n) sizes.push_back(n);
  sizes.insert(sizes.end(), {100, 1000, 4096});
  for (int n : sizes) {
    const SimResult res = run_plain(Algorithm::Bruck, Collective::AllGather, n, 3);
    const uint64_t steps = log2_ceil(n);
    expect_each_rank(res, (n - 1) * 3 * 4, steps, "bruck n=" + std::to_string(n));
    EXPECT_LE(res.rounds, steps) << n;
    if ((n & (n - 1)) == 0) {
      EXPECT_EQ(res.rounds, steps) << n;
    }
  }
}

TEST(ClosedForms, RingReduceScatterAndAllGatherSendNMinus1Blocks) {
  for (int n : {2, 7, 64, 300}) {
    for (Collective c : {Collective::ReduceScatter, Collective::AllGather}) {
      const SimResult res = run_plain(Algorithm::Ring, c, n, 6);
      expect_each_rank(res, (n - 1) * 6 * 4, n - 1, "ring n=" + std::to_string(n));
      EXPECT_EQ(res.rounds, static_cast<uint32_t>(n - 1));
    }
  }
}

TEST(ClosedForms, ExchangesSendEachPeerItsBlockOnce) {
  for (int n : {2, 5, 64, 200}) {
    for (Collective c : {Collective::AllToAll, Collective::ReduceScatter}) {
      const SimResult res = run_plain(Algorithm::Pairwise, c, n, 4);
      expect_each_rank(res, (n - 1) * 4 * 4, n - 1, "pairwise n=" + std::to_string(n));
    }
    const SimResult bruck = run_plain(Algorithm::Bruck, Collective::AllToAll, n, 4);
    for (const RankStats& r : bruck.ranks) EXPECT_EQ(r.messages, uint64_t(log2_ceil(n)));
    EXPECT_EQ(bruck.rounds, static_cast<uint32_t>(log2_ceil(n)));
  }
}

// Rounds count dependency depth: a rank's sends to different peers overlap,
// so a binomial tree takes as many rounds as its deepest rank is deep (the
// most set bits of a relative rank below n).
TEST(ClosedForms, LogarithmicRootedAndBarrierDepths) {
  for (int n : {2, 3, 17, 64, 1000}) {
    int depth = 0;
    for (int v = 0; v < n; ++v) depth = std::max(depth, std::popcount(static_cast<unsigned>(v)));
    for (Collective c :
         {Collective::Broadcast, Collective::Reduce, Collective::Gather, Collective::Scatter}) {
      const SimResult res = run_plain(Algorithm::Binomial, c, n, 5);
      EXPECT_EQ(res.rounds, static_cast<uint32_t>(depth)) << collective_name(c) << n;
    }
    const SimResult chain = run_plain(Algorithm::Chain, Collective::Broadcast, n, 5);
    EXPECT_EQ(chain.rounds, static_cast<uint32_t>(n - 1));
    const SimResult barrier = run_plain(Algorithm::Dissemination, Collective::Barrier, n, 0);
    expect_each_rank(barrier, 0, log2_ceil(n), "barrier");
    EXPECT_EQ(barrier.rounds, static_cast<uint32_t>(log2_ceil(n)));
  }
}

TEST(ClosedForms, DoubleBinaryTreeSplitsTheWork) {
  for (int n : {2, 3, 10, 64, 1000}) {
    const uint64_t count = 1000;
    const SimResult res = run_plain(Algorithm::Tree, Collective::AllReduce, n, count);
    // Up and down once per tree: a rank forwards at most its half up and
    // twice its half down in the tree where it is interior, and its half up
    // in the other: 4 halves, twice the vector.
    for (const RankStats& r : res.ranks) EXPECT_LE(r.bytes_sent, 2 * count * 4);
    EXPECT_LE(res.rounds, static_cast<uint32_t>(4 * (log2_ceil(n) + 1)));
  }
}

// Chunks of one message do not wait for each other, so chunking multiplies
// messages but leaves the dependency depth (rounds) alone.
TEST(ClosedForms, ChunkingSplitsMessagesNotRounds) {
  const int n = 8;
  const uint64_t count = 8 * 64;
  Case k{{Algorithm::Ring, Collective::AllReduce}, n, count, 16, false, 0};
  const SimResult res = simulate(k.params(), options_for(k));
  ASSERT_TRUE(res.ok()) << res.message();
  expect_each_rank(res, 2 * (n - 1) * count * 4 / n, 2 * (n - 1) * 4, "chunked ring");
  EXPECT_EQ(res.rounds, static_cast<uint32_t>(2 * (n - 1)));

  Case b{{Algorithm::Chain, Collective::Broadcast}, n, 64, 8, false, 0};
  const SimResult chain = simulate(b.params(), options_for(b));
  ASSERT_TRUE(chain.ok()) << chain.message();
  EXPECT_EQ(chain.rounds, static_cast<uint32_t>(n - 1));
  for (int r = 0; r < n; ++r) EXPECT_EQ(chain.ranks[r].messages, r == n - 1 ? 0u : 8u);
}

}  // namespace
}  // namespace weft::algo
