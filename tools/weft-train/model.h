// The decoder-only transformer weft-train trains: its configuration, parameters, synthetic
// data and the single-process reference (fp32, CPU) that the distributed run is checked
// against.
//
// Token and position embeddings; per layer (pre-norm) x += out(attn(qkv(LN1(x)))) and
// x += fc2(gelu(fc1(LN2(x)))); then LNf and an LM head that is not tied to the token
// embedding (each is vocabulary-parallel on its own, with no gradient shared by the two).
// Linear weights are [out, in] (y = x·Wᵀ + b), the LM head has no bias: the same parameter
// list as weft::parallel::transformer_parameters, whose closed forms the ledger checks.
// Activations are [s, b, h] (row = t·b + i), so a sequence shard is a contiguous row range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace weft::train {

struct Config {
  int layers = 2, hidden = 64, heads = 8, ffn = 128, vocab = 128, seq = 16, batch = 8;
  int steps = 2;
  uint64_t seed = 1;
  // MoE MLP in place of the dense one when experts > 0 (moe.h): top-k routing with a
  // capacity factor (0: none) applied per group of tokens; the groups are the DP ranks'
  // shares of the batch, so the reference drops what the distributed run drops.
  int experts = 0, topk = 2;
  double capacity = 0;
  int capacity_groups = 1;
  // Compressed attention (kernels.h) in place of full attention: blocks of compress_block
  // positions every compress_stride, as --cp-algo compressed runs it over CP.
  bool compressed = false;
  int compress_block = 4, compress_stride = 2;
  int head_dim() const { return hidden / heads; }
  Compression compression() const { return {compress_block, compress_stride}; }
};

// How tensor parallelism shards a parameter stored [rows, cols] row-major: column-parallel
// weights and biases split their rows (the output dim), row-parallel weights their columns.
// Unsplit parameters are replicated; under sequence parallelism they are the ones applied to
// sequence shards, whose gradients are partial per rank.
// kExperts: stacked per-expert weights whose rows split over the EP ranks (each holds its
// local experts' rows).
enum class Split { kNone, kRows, kCols, kExperts };

struct ParamSpec {
  std::string name;
  int rows, cols;
  enum class Init { kNormal, kOnes, kZeros } init;
  Split split;
  int unit;  // 0: embeddings, 1 + l: layer l, layers + 1: final norm and LM head
  size_t size() const { return size_t(rows) * cols; }
};

// Parameter indices: embeddings, then kLayerParams per layer from layer_param(l, 0), then
// the head's from head_param(config, 0).
enum : size_t { kWte, kWpe };
enum : size_t {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kOutW,
  kOutB,
  kLn2W,
  kLn2B,
  kFc1W,
  kFc1B,
  kFc2W,
  kFc2B,
  kLayerParams
};
enum : size_t { kLnfW, kLnfB, kLmW };
inline size_t layer_param(int layer, size_t which) {
  return 2 + kLayerParams * layer + which;
}
inline size_t head_param(const Config& c, size_t which) {
  return layer_param(c.layers, which);
}

// All parameters in registration (forward) order.
std::vector<ParamSpec> param_specs(const Config& config);
// The full (unsharded) initial value of parameter index, from the seed alone.
std::vector<float> init_param(const Config& config, const ParamSpec& spec, size_t index);

// One step's global batch: tokens and next-token targets, both [s, b].
struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(const Config& config, int step);

struct Tensor {
  std::vector<float> value, grad, m, v;
};

// The model on one process over the full global batch.
class Reference {
 public:
  explicit Reference(const Config& config);
  // Forward and backward; returns the mean loss and leaves the gradients in params().
  double forward_backward(const Batch& batch);
  void adam(const AdamConfig& adam, int step);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  std::vector<Tensor>& params() { return params_; }

 private:
  Config config_;
  std::vector<ParamSpec> specs_;
  std::vector<Tensor> params_;
};

}  // namespace weft::train
