// The peer patterns every family builds on: exhaustive structural checks.
#include "algorithms/patterns.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace weft::algo {
namespace {

TEST(Patterns, BlockSpanTilesTheVectorNearEqually) {
  for (uint64_t total : {0, 1, 7, 64, 1001}) {
    for (uint64_t pieces = 1; pieces <= 70; ++pieces) {
      uint64_t next = 0;
      for (uint64_t i = 0; i < pieces; ++i) {
        const Span s = block_span(total, pieces, i);
        EXPECT_EQ(s.offset, next);
        EXPECT_LE(s.count, total / pieces + 1);
        EXPECT_GE(s.count, total / pieces);
        next = s.end();
      }
      EXPECT_EQ(next, total);
      EXPECT_EQ(block_span(total, pieces, pieces).offset, total);
    }
  }
}

TEST(Patterns, ChunksCoverWithoutExceedingTheLimit) {
  for (uint64_t count : {0, 1, 5, 64, 100}) {
    for (uint64_t chunk : {0, 1, 3, 64, 1000}) {
      const uint64_t n = chunk_count(count, chunk);
      uint64_t next = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const Span s = chunk_span(count, chunk, i);
        EXPECT_EQ(s.offset, next);
        EXPECT_GT(s.count, 0u);
        if (chunk) {
          EXPECT_LE(s.count, chunk);
        }
        next = s.end();
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(Patterns, Logarithms) {
  EXPECT_EQ(log2_floor(1), 0);
  EXPECT_EQ(log2_floor(1000), 9);
  EXPECT_EQ(log2_ceil(1), 0);
  EXPECT_EQ(log2_ceil(2), 1);
  EXPECT_EQ(log2_ceil(1000), 10);
  EXPECT_EQ(log2_ceil(1024), 10);
}

// Parent/children agree, every rank hangs off the root, no cycles.
void expect_spanning_tree(int n, const std::vector<TreeLinks>& links) {
  int roots = 0;
  for (int r = 0; r < n; ++r) {
    if (links[r].parent < 0) {
      ++roots;
    } else {
      const auto& siblings = links[links[r].parent].children;
      EXPECT_EQ(std::count(siblings.begin(), siblings.end(), r), 1) << "n=" << n << " r=" << r;
    }
    for (int c : links[r].children) EXPECT_EQ(links[c].parent, r) << "n=" << n;
    int hops = 0;
    for (int at = r; links[at].parent >= 0 && hops <= n; at = links[at].parent) ++hops;
    EXPECT_LT(hops, n) << "cycle above rank " << r << " at n=" << n;
  }
  EXPECT_EQ(roots, 1) << "n=" << n;
}

TEST(Patterns, BinomialTreeIsSpanningWithLogDepth) {
  for (int n = 1; n <= 130; ++n) {
    for (int root : {0, n / 2, n - 1}) {
      std::vector<TreeLinks> links;
      for (int r = 0; r < n; ++r) links.push_back(binomial_tree(n, root, r));
      expect_spanning_tree(n, links);
      EXPECT_EQ(links[root].parent, -1);
      EXPECT_EQ(static_cast<int>(links[root].children.size()), log2_ceil(n));
      for (int r = 0; r < n; ++r) {
        // Subtree sizes add up and children come largest first.
        const int v = wrap_rank(r - root, n);
        int size = 1;
        int previous = n;
        for (int c : links[r].children) {
          const int sub = binomial_subtree(n, wrap_rank(c - root, n));
          EXPECT_LE(sub, previous);
          previous = sub;
          size += sub;
        }
        EXPECT_EQ(size, binomial_subtree(n, v)) << "n=" << n << " r=" << r;
      }
    }
  }
}

TEST(Patterns, ChainVisitsRanksInOrderFromTheRoot) {
  for (int n = 1; n <= 20; ++n) {
    for (int root = 0; root < n; ++root) {
      std::vector<TreeLinks> links;
      for (int r = 0; r < n; ++r) links.push_back(chain_tree(n, root, r));
      expect_spanning_tree(n, links);
      for (int r = 0; r < n; ++r) EXPECT_LE(links[r].children.size(), 1u);
    }
  }
}

TEST(Patterns, DoubleBinaryTreesAreComplementary) {
  for (int n = 1; n <= 300; ++n) {
    std::vector<int> interior(n, 0);
    for (int which = 0; which < 2; ++which) {
      std::vector<TreeLinks> links;
      for (int r = 0; r < n; ++r) links.push_back(double_binary_tree(n, which, r));
      expect_spanning_tree(n, links);
      for (int r = 0; r < n; ++r) {
        EXPECT_LE(links[r].children.size(), 2u);
        if (!links[r].children.empty()) ++interior[r];
        // Depth stays logarithmic.
        int depth = 0;
        for (int at = r; links[at].parent >= 0; at = links[at].parent) ++depth;
        EXPECT_LE(depth, log2_ceil(n) + 1);
      }
    }
    for (int r = 0; r < n; ++r) EXPECT_LE(interior[r], 1) << "n=" << n << " rank " << r;
  }
}

TEST(Patterns, FoldCoversVirtualRanksOnce) {
  for (int n = 1; n <= 130; ++n) {
    std::vector<int> seen;
    for (int r = 0; r < n; ++r) {
      const Fold f = fold_for(n, r);
      EXPECT_EQ(f.pow2 + f.extra, n);
      EXPECT_EQ(f.pow2 & (f.pow2 - 1), 0);
      if (f.vrank < 0) {
        EXPECT_EQ(fold_for(n, f.buddy).buddy, r);
        EXPECT_GE(fold_for(n, f.buddy).vrank, 0);
        continue;
      }
      seen.push_back(f.vrank);
      EXPECT_EQ(fold_first_real(f, f.vrank), r);
      const int next = fold_first_real(f, f.vrank + 1);
      EXPECT_EQ(next - r, f.buddy >= 0 ? 2 : 1);
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(static_cast<int>(seen.size()), fold_for(n, 0).pow2);
    for (int v = 0; v < static_cast<int>(seen.size()); ++v) EXPECT_EQ(seen[v], v);
  }
}

TEST(Patterns, ExchangeMeetsEveryPairOnceMutually) {
  for (int n = 1; n <= 65; ++n) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < exchange_rounds(n); ++round) {
      for (int r = 0; r < n; ++r) {
        const int p = exchange_partner(n, round, r);
        if (p < 0) continue;
        ASSERT_NE(p, r);
        ASSERT_EQ(exchange_partner(n, round, p), r) << "n=" << n << " round " << round;
        EXPECT_TRUE(met.insert({r, p}).second) << "n=" << n;
      }
    }
    EXPECT_EQ(met.size(), static_cast<size_t>(n) * (n - 1));
  }
}

}  // namespace
}  // namespace weft::algo
