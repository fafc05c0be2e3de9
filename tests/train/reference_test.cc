// The weft-train reference model's backward against central finite differences of its
// forward: the distributed run is only as right as the model it is compared with.

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "model.h"

namespace weft::train {
namespace {

Config tiny() {
  Config c;
  c.layers = 2, c.hidden = 8, c.heads = 2, c.ffn = 16, c.vocab = 12, c.seq = 5, c.batch = 3;
  return c;
}

void expect_finite_differences(const Config& config, float step = 1e-2f) {
  Reference model(config);
  const Batch batch = make_batch(config, 0);
  model.forward_backward(batch);
  std::vector<std::vector<float>> grads;
  for (const Tensor& t : model.params()) grads.push_back(t.grad);

  std::mt19937 rng(7);

  for (size_t p = 0; p < model.params().size(); ++p) {
    std::vector<float>& value = model.params()[p].value;
    const std::vector<float>& grad = grads[p];
    float max_grad = 0;
    for (float g : grad) max_grad = std::max(max_grad, std::abs(g));
    ASSERT_GT(max_grad, 0.0f) << model.specs()[p].name << " has no gradient";
    // The largest element and a few random ones.
    std::vector<size_t> picks{
        size_t(std::max_element(grad.begin(), grad.end(),
                                [](float a, float b) { return std::abs(a) < std::abs(b); }) -
               grad.begin())};
    for (int k = 0; k < 4; ++k) picks.push_back(rng() % value.size());
    for (size_t i : picks) {
      const float saved = value[i];
      value[i] = saved + step;
      const double up = model.forward_backward(batch);
      value[i] = saved - step;
      const double down = model.forward_backward(batch);
      value[i] = saved;
      const double numeric = (up - down) / (2 * step);
      EXPECT_NEAR(numeric, grad[i], 2e-2 * max_grad + 2e-4)
          << model.specs()[p].name << "[" << i << "]";
    }
  }
}

TEST(ReferenceTest, BackwardMatchesFiniteDifferences) {
  expect_finite_differences(tiny());
}

// The MoE MLP (router, top-k softmax weights, experts). Routing is piecewise constant: the
// step must stay below the gaps between this batch's routing logits, which 1e-3 does (at
// 1e-2 a token of the embedding checks changes expert and the loss jumps).
TEST(ReferenceTest, MoeBackwardMatchesFiniteDifferences) {
  Config config = tiny();
  config.experts = 4, config.topk = 2;
  expect_finite_differences(config, 1e-3f);
}

// Compressed attention (mean blocks of 3 every 2 positions over seq 7: positions 0 and 1
// see no block, the others 1 to 3 of them).
TEST(ReferenceTest, CompressedAttentionBackwardMatchesFiniteDifferences) {
  Config config = tiny();
  config.seq = 7, config.compressed = true, config.compress_block = 3, config.compress_stride = 2;
  expect_finite_differences(config);
}

TEST(ReferenceTest, AdamLowersTheLossOnAFixedBatch) {
  const Config config = tiny();
  Reference model(config);
  const Batch batch = make_batch(config, 0);
  const double first = model.forward_backward(batch);
  AdamConfig adam;
  adam.lr = 1e-2f;
  double last = first;
  for (int step = 1; step <= 20; ++step) {
    model.adam(adam, step);
    last = model.forward_backward(batch);
  }
  EXPECT_LT(last, first * 0.9) << "first " << first << " last " << last;
}

TEST(ReferenceTest, DeterministicFromTheSeed) {
  const Config config = tiny();
  Reference a(config), b(config);
  const Batch batch = make_batch(config, 3);
  EXPECT_EQ(a.forward_backward(batch), b.forward_backward(batch));
  for (size_t p = 0; p < a.params().size(); ++p)
    EXPECT_EQ(a.params()[p].grad, b.params()[p].grad) << a.specs()[p].name;
  Config other = config;
  other.seed = 2;
  Reference c(other);
  EXPECT_NE(c.params()[0].value, a.params()[0].value);
}

}  // namespace
}  // namespace weft::train
