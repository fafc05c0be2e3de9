// weft-overlap's arithmetic: the efficiency is at most 100% whatever the
// (noisy) times, and the compute kernel really does its iterations.
#include "overlap_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace weft::overlap {
namespace {

TEST(OverlapEfficiency, KnownCases) {
  // Perfect overlap: the AllReduce finished inside the compute, which did not slow.
  EXPECT_DOUBLE_EQ(efficiency({4, 2, 4, 4}), 1);
  // None: the thread waited the whole AllReduce after its compute.
  EXPECT_DOUBLE_EQ(efficiency({4, 2, 6, 4}), 0);
  // Half of the AllReduce exposed after the compute.
  EXPECT_DOUBLE_EQ(efficiency({4, 2, 5, 4}), 0.5);
  // Hidden, but the compute took 0.5 longer sharing the cores: a quarter lost.
  EXPECT_DOUBLE_EQ(efficiency({4, 2, 4.5, 4.5}), 0.75);
  // Overlapping costs more than running one after the other: 7 against 6,
  // half the AllReduce's time lost.
  EXPECT_DOUBLE_EQ(efficiency({4, 2, 7, 5}), -0.5);
}

TEST(OverlapEfficiency, NoiseNeverExceedsOneHundredPercent) {
  // The run the issue reported: overlapped faster than compute alone
  // (4.28 ms alone, 1.89 ms together). The old formula,
  // (compute + comm - both) / min(compute, comm), gave 900% here.
  EXPECT_LE(efficiency({4.28e-3, 0.3e-3, 1.89e-3, 1.85e-3}), 1);
  EXPECT_DOUBLE_EQ(efficiency({4.28e-3, 0.3e-3, 1.89e-3, 1.89e-3}), 1);
  std::mt19937_64 random(17);
  std::uniform_real_distribution<double> time(1e-6, 1e-2);
  for (int i = 0; i < 100000; ++i) {
    Times t{time(random), time(random), 0, time(random)};
    t.both = t.compute_in_both + time(random) * (i % 2);  // the compute runs inside `both`
    ASSERT_LE(efficiency(t), 1.0) << t.compute << " " << t.comm << " " << t.both;
  }
}

TEST(OverlapCompute, DoesEveryIteration) {
  // x -> 0.999x + 0.001 gives x_k = 1 - (1 - x_0) 0.999^k per element.
  const auto run = [](long iterations) {
    std::vector<float> data(4096);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 97) * 0.01f;
    return compute(data, iterations);
  };
  for (long k : {0L, 1L, 10L, 300L}) {
    double expected = 0;
    for (size_t i = 0; i < 4096; ++i)
      expected += 1 - (1 - static_cast<float>(i % 97) * 0.01f) * std::pow(0.999, k);
    EXPECT_NEAR(run(k), expected, expected * 1e-4) << k << " iterations";
  }
  EXPECT_NE(run(300), run(301));
}

TEST(OverlapSpread, MedianAndRange) {
  const Spread odd = spread({5, 1, 3});
  EXPECT_EQ(odd.median, 3);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 5);
  EXPECT_EQ(spread({4, 1, 2, 3}).median, 2.5);
}

}  // namespace
}  // namespace weft::overlap
