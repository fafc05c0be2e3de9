// DP gradient bucketing: bucket layout and views, launch order, exact
// results for sum / avg / scaled sum, the ledger against the closed form,
// and bad input.
#include <functional>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::BucketOptions;
using parallel::DataParallel;
using parallel::Reduction;

const std::vector<size_t> kNumels = {100, 50, 300, 10, 200};  // fp32: 400, 200, 1200, 40, 800 B

float grad_value(int rank, size_t param, size_t i) {
  return static_cast<float>((rank * 5 + param * 3 + i) % 7);
}

void fill_grads(DataParallel& dp, int rank) {
  for (size_t p = 0; p < kNumels.size(); ++p) {
    auto g = dp.grad_as<float>(p);
    for (size_t i = 0; i < g.size(); ++i) g[i] = grad_value(rank, p, i);
  }
}

void expect_reduced(DataParallel& dp, int nranks, Reduction reduction, double scale) {
  for (size_t p = 0; p < kNumels.size(); ++p) {
    auto g = dp.grad_as<float>(p);
    std::vector<float> got(g.begin(), g.end()), want(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < nranks; ++r)
        sum += grad_value(r, p, i) * (reduction == Reduction::scaled_sum ? scale : 1.0);
      want[i] = static_cast<float>(reduction == Reduction::avg ? sum / nranks : sum);
    }
    expect_close(got, want, reduction == Reduction::avg ? 1e-6 : 0.0,
                 ("param " + std::to_string(p)).c_str());
  }
}

class Bucketing : public ::testing::TestWithParam<int> {};

TEST_P(Bucketing, BucketsAreViewsLaunchedInOrderAndExact) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh(world, parallel::MeshShape{});  // dp = world
    parallel::Ledger ledger;
    BucketOptions options;
    options.first_bucket_bytes = 500;
    options.bucket_bytes = 1000;
    options.reduction = Reduction::sum;
    DataParallel dp(Axis(mesh, "dp", &ledger), options);
    for (size_t p = 0; p < kNumels.size(); ++p) dp.add("p" + std::to_string(p), kNumels[p]);
    dp.finalize();
    // Reverse registration order, 1st bucket closing at 500 B.
    ASSERT_EQ(dp.buckets().size(), 3u);
    EXPECT_EQ(dp.buckets()[0].params, (std::vector<size_t>{4}));
    EXPECT_EQ(dp.buckets()[1].params, (std::vector<size_t>{3, 2}));
    EXPECT_EQ(dp.buckets()[2].params, (std::vector<size_t>{1, 0}));
    // Views: a bucket's gradients are adjacent in one storage, no copies.
    EXPECT_EQ(dp.grad_as<float>(3).data() + 10, dp.grad_as<float>(2).data());
    EXPECT_EQ(dp.grad_as<float>(4).data() + 200, dp.grad_as<float>(3).data());
    EXPECT_EQ(dp.grad_as<float>(1).data() + 50, dp.grad_as<float>(0).data());

    // Step 1, backward order: each bucket goes out when its last gradient is ready.
    fill_grads(dp, context.rank);
    dp.mark_ready(4);
    EXPECT_EQ(dp.launch_order(), (std::vector<size_t>{0}));
    dp.mark_ready(3);
    EXPECT_EQ(dp.launch_order().size(), 1u);
    dp.mark_ready(2);
    EXPECT_EQ(dp.launch_order(), (std::vector<size_t>{0, 1}));
    dp.mark_ready(1);
    dp.mark_ready(0);
    EXPECT_EQ(dp.launch_order(), (std::vector<size_t>{0, 1, 2}));
    dp.finish();
    expect_reduced(dp, context.nranks, Reduction::sum, 1);

    // Step 2, forward order: a complete later bucket waits for the earlier ones.
    dp.zero_grad();
    fill_grads(dp, context.rank);
    // (launch_order() shows step 1's until this step's first launch.)
    const std::vector<size_t> step1 = dp.launch_order();
    for (size_t p : {0, 1, 2, 3}) {
      dp.mark_ready(p);
      EXPECT_EQ(dp.launch_order(), step1) << "a bucket launched before bucket 0, at param " << p;
    }
    dp.mark_ready(4);
    EXPECT_EQ(dp.launch_order(), (std::vector<size_t>{0, 1, 2}));
    dp.finish();
    expect_reduced(dp, context.nranks, Reduction::sum, 1);

    // The ledger: one AllReduce per bucket per step, as the closed form says.
    parallel::ModelConfig config;
    config.dp = context.nranks;
    config.param_numels = kNumels;
    config.param_layers.assign(kNumels.size(), 0);
    config.first_bucket_bytes = options.first_bucket_bytes;
    config.bucket_bytes = options.bucket_bytes;
    config.steps = 2;
    auto differences = ledger.compare(parallel::Ledger::expected(config));
    EXPECT_TRUE(differences.empty()) << differences.front() << "\n" << ledger.table();

    // Average and a pre-multiplied sum; gradients never marked still reduce.
    for (auto [reduction, scale] :
         {std::pair{Reduction::avg, 1.0}, {Reduction::scaled_sum, 0.25}}) {
      BucketOptions other = options;
      other.reduction = reduction;
      other.gradient_scale = scale;
      DataParallel dp2(Axis(mesh, "dp"), other);
      for (size_t p = 0; p < kNumels.size(); ++p) dp2.add("p" + std::to_string(p), kNumels[p]);
      dp2.finalize();
      fill_grads(dp2, context.rank);
      dp2.mark_ready(4);
      dp2.finish();
      expect_reduced(dp2, context.nranks, reduction, scale);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Bucketing, ::testing::Values(1, 2, 3));

TEST(BucketingErrors, BadInputIsNamedAndNothingHangs) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh(world, parallel::MeshShape{});
    BucketOptions zero;
    zero.bucket_bytes = 0;
    expect_error([&] { DataParallel dp(Axis(mesh, "dp"), zero); }, "bucket_bytes is 0");
    BucketOptions ints;
    ints.dtype = weftInt32;
    ints.reduction = Reduction::scaled_sum;
    expect_error([&] { DataParallel dp(Axis(mesh, "dp"), ints); }, "gradient_scale needs dtype");
    DataParallel dp(Axis(mesh, "dp"));
    dp.add("w", 4);
    expect_error([&] { dp.add("w", 8); }, "parameter \"w\" is registered twice");
    expect_error([&] { dp.grad(0); }, "before finalize");
    dp.finalize();
    expect_error([&] { dp.add("b", 8); }, "added after finalize");
    dp.grad_as<float>(0)[0] = 1.0f;
    dp.mark_ready(0);
    expect_error([&] { dp.mark_ready(0); }, "marked ready twice");
    expect_error([&] { dp.mark_ready(7); }, "param 7 is not registered");
    dp.finish();
    EXPECT_EQ(dp.grad_as<float>(0)[0], 1.0f);  // avg of 1 and 1
  });
}

}  // namespace
}  // namespace weft::testing
