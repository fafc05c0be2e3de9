// The MoE MLP weft-train puts in place of the dense one (--experts E --topk K): a router
// [E, h] (no bias), top-k of its logits with softmax weights over the chosen k, experts
// y = gelu(x·W1ᵀ)·W2ᵀ (W1 [ffn, h], W2 [h, ffn], no biases), out = Σ_k weight · y + b,
// with b the layer's output bias (fc2.b). A capacity factor F keeps, per group of tokens
// and expert, the first ceil(F · tokens · k / E) (token, slot) pairs in the group's order,
// as weft::parallel::MoeDispatcher does per source rank. The kernels here serve both the
// single-process reference and the distributed run.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"

namespace weft::train {

// The MoE parameters take the dense MLP's slots of a layer (model.h).
enum : size_t { kMoeFc1W = kFc1W, kMoeRouterW = kFc1B, kMoeFc2W = kFc2W };

struct MoeShape {
  int hidden, ffn, experts, topk;
};
inline MoeShape moe_shape(const Config& c) {
  return {c.hidden, c.ffn, c.experts, c.topk};
}

// logits [n, E] → index [n, k] (largest first, ties to the lower expert) and weight [n, k]
// (softmax over the chosen logits).
void route(const MoeShape& s, int n, const float* logits, int32_t* index, float* weight);
// d_weight [n, k] → d_logits [n, E] (overwritten; zero where not chosen).
void route_backward(const MoeShape& s, int n, const int32_t* index, const float* weight,
                    const float* d_weight, float* d_logits);

// One expert over rows rows: u = x·W1ᵀ, g = gelu(u), y = g·W2ᵀ.
void expert_forward(const MoeShape& s, int rows, const float* x, const float* w1, const float* w2,
                    float* u, float* g, float* y);
// dy → dx (overwritten); dW1, dW2 accumulated. du is scratch [rows, ffn].
void expert_backward(const MoeShape& s, int rows, const float* x, const float* u, const float* g,
                     const float* w1, const float* w2, const float* dy, float* du, float* dx,
                     float* dw1, float* dw2);

// Pairs each group may send one expert (the dispatcher's rule).
size_t moe_capacity(double factor, size_t tokens, int topk, int experts);

// The reference MoE MLP over all n rows: groups lists each capacity group's rows in its
// own order.
struct MoeActs {
  std::vector<float> logits, weight, u, g, y;  // u, g, y per (row, slot)
  std::vector<int32_t> index;
  std::vector<char> kept;
};
struct MoeParams {
  const float *router, *w1, *w2, *bias;
};
struct MoeGrads {
  float *router, *w1, *w2, *bias;
};
void moe_forward(const MoeShape& s, double capacity, const std::vector<std::vector<int>>& groups,
                 int n, const float* x, const MoeParams& p, float* out, MoeActs& a);
// dx overwritten, the parameter gradients accumulated.
void moe_backward(const MoeShape& s, int n, const float* x, const MoeParams& p, const MoeActs& a,
                  const float* dout, float* dx, const MoeGrads& g);

// The capacity groups of the global batch [seq, batch] (row = t·batch + i) split over dp
// ranks by sequences: rank d's rows in its local order t·(batch/dp) + i.
std::vector<std::vector<int>> dp_groups(int seq, int batch, int dp);

}  // namespace weft::train
