#include "model.h"

#include <random>

#include "moe.h"

namespace weft::train {

std::vector<ParamSpec> param_specs(const Config& c) {
  using I = ParamSpec::Init;
  const int h = c.hidden;
  std::vector<ParamSpec> specs{{"wte", c.vocab, h, I::kNormal, Split::kRows, 0},
                               {"wpe", c.seq, h, I::kNormal, Split::kNone, 0}};
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    auto add = [&](const char* name, int rows, int cols, I init, Split split) {
      specs.push_back({p + name, rows, cols, init, split, 1 + l});
    };
    add("ln1.w", 1, h, I::kOnes, Split::kNone);
    add("ln1.b", 1, h, I::kZeros, Split::kNone);
    add("qkv.w", 3 * h, h, I::kNormal, Split::kRows);
    add("qkv.b", 3 * h, 1, I::kNormal, Split::kRows);
    add("out.w", h, h, I::kNormal, Split::kCols);
    add("out.b", 1, h, I::kNormal, Split::kNone);
    add("ln2.w", 1, h, I::kOnes, Split::kNone);
    add("ln2.b", 1, h, I::kZeros, Split::kNone);
    if (c.experts > 0) {  // the same slots (moe.h): stacked experts and the router
      add("moe.fc1.w", c.experts * c.ffn, h, I::kNormal, Split::kExperts);
      add("moe.router.w", c.experts, h, I::kNormal, Split::kNone);
      add("moe.fc2.w", c.experts * h, c.ffn, I::kNormal, Split::kExperts);
    } else {
      add("fc1.w", c.ffn, h, I::kNormal, Split::kRows);
      add("fc1.b", c.ffn, 1, I::kNormal, Split::kRows);
      add("fc2.w", h, c.ffn, I::kNormal, Split::kCols);
    }
    add("fc2.b", 1, h, I::kNormal, Split::kNone);
  }
  specs.push_back({"lnf.w", 1, h, I::kOnes, Split::kNone, c.layers + 1});
  specs.push_back({"lnf.b", 1, h, I::kZeros, Split::kNone, c.layers + 1});
  specs.push_back({"lm.w", c.vocab, h, I::kNormal, Split::kRows, c.layers + 1});
  return specs;
}

std::vector<float> init_param(const Config& config, const ParamSpec& spec, size_t index) {
  std::vector<float> value(spec.size(), spec.init == ParamSpec::Init::kOnes ? 1.0f : 0.0f);
  if (spec.init == ParamSpec::Init::kNormal) {
    // One stream per parameter, so its value does not depend on which rank builds it.
    std::mt19937_64 rng(config.seed * 1000003 + index);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (float& x : value) x = normal(rng);
  }
  return value;
}

Batch make_batch(const Config& c, int step) {
  // Sequences of a noisy affine recurrence, so there is something to learn.
  std::mt19937_64 rng(c.seed * 7919 + step + 1);
  std::uniform_int_distribution<int32_t> any(0, c.vocab - 1), noise(0, 3);
  Batch batch;
  batch.tokens.resize(size_t(c.seq) * c.batch);
  batch.targets.resize(batch.tokens.size());
  for (int i = 0; i < c.batch; ++i) {
    int32_t token = any(rng);
    for (int t = 0; t < c.seq; ++t) {
      const int32_t next = (token * 5 + 3 + noise(rng)) % c.vocab;
      batch.tokens[size_t(t) * c.batch + i] = token;
      batch.targets[size_t(t) * c.batch + i] = next;
      token = next;
    }
  }
  return batch;
}

Reference::Reference(const Config& config) : config_(config), specs_(param_specs(config)) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    Tensor t;
    t.value = init_param(config_, specs_[i], i);
    t.grad.assign(t.value.size(), 0.0f);
    t.m.assign(t.value.size(), 0.0f);
    t.v.assign(t.value.size(), 0.0f);
    params_.push_back(std::move(t));
  }
}

namespace {

// What one layer's forward keeps for its backward.
struct LayerActs {
  std::vector<float> x, a1, mean1, rstd1, qkv, probs, att, x1, c, mean2, rstd2, u, g;
  MoeActs moe;
};

}  // namespace

double Reference::forward_backward(const Batch& batch) {
  const Config& c = config_;
  const int n = c.seq * c.batch, h = c.hidden, f = c.ffn, v = c.vocab;
  const AttentionShape shape{c.seq, c.batch, c.heads, c.head_dim()};
  auto w = [&](size_t i) { return params_[i].value.data(); };
  auto dw = [&](size_t i) { return params_[i].grad.data(); };
  for (Tensor& t : params_) std::fill(t.grad.begin(), t.grad.end(), 0.0f);

  std::vector<float> x(size_t(n) * h);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < h; ++i)
      x[size_t(r) * h + i] =
          w(kWte)[size_t(batch.tokens[r]) * h + i] + w(kWpe)[(r / c.batch) * h + i];

  std::vector<LayerActs> acts(c.layers);
  std::vector<float> o(x.size());
  for (int l = 0; l < c.layers; ++l) {
    auto p = [&](size_t which) { return w(layer_param(l, which)); };
    LayerActs& a = acts[l];
    a.x = x;
    a.a1.resize(x.size()), a.mean1.resize(n), a.rstd1.resize(n);
    layernorm(n, h, x.data(), p(kLn1W), p(kLn1B), a.a1.data(), a.mean1.data(), a.rstd1.data());
    a.qkv.resize(size_t(n) * 3 * h);
    linear(n, h, 3 * h, a.a1.data(), p(kQkvW), p(kQkvB), a.qkv.data());
    a.att.resize(x.size());
    if (c.compressed) {
      compressed_attention(shape, c.compression(), a.qkv.data(), a.att.data());
    } else {
      a.probs.resize(size_t(c.batch) * c.heads * c.seq * c.seq);
      attention(shape, a.qkv.data(), a.att.data(), a.probs.data());
    }
    linear(n, h, h, a.att.data(), p(kOutW), p(kOutB), o.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    a.x1 = x;
    a.c.resize(x.size()), a.mean2.resize(n), a.rstd2.resize(n);
    layernorm(n, h, x.data(), p(kLn2W), p(kLn2B), a.c.data(), a.mean2.data(), a.rstd2.data());
    if (c.experts > 0) {
      moe_forward(moe_shape(c), c.capacity, dp_groups(c.seq, c.batch, c.capacity_groups), n,
                  a.c.data(), {p(kMoeRouterW), p(kMoeFc1W), p(kMoeFc2W), p(kFc2B)}, o.data(),
                  a.moe);
    } else {
      a.u.resize(size_t(n) * f), a.g.resize(a.u.size());
      linear(n, h, f, a.c.data(), p(kFc1W), p(kFc1B), a.u.data());
      gelu(a.u.size(), a.u.data(), a.g.data());
      linear(n, f, h, a.g.data(), p(kFc2W), p(kFc2B), o.data());
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  auto hw = [&](size_t which) { return w(head_param(c, which)); };
  auto hdw = [&](size_t which) { return dw(head_param(c, which)); };
  std::vector<float> z(x.size()), mean_f(n), rstd_f(n), logits(size_t(n) * v);
  layernorm(n, h, x.data(), hw(kLnfW), hw(kLnfB), z.data(), mean_f.data(), rstd_f.data());
  linear(n, h, v, z.data(), hw(kLmW), nullptr, logits.data());
  std::vector<float> dlogits(logits.size());
  const double loss =
      cross_entropy(n, v, logits.data(), batch.targets.data(), 1.0f / n, dlogits.data()) / n;

  std::vector<float> dz(x.size()), dx(x.size()), tmp(x.size());
  linear_backward_weight(n, h, v, z.data(), dlogits.data(), hdw(kLmW), nullptr);
  linear_backward_input(n, h, v, hw(kLmW), dlogits.data(), dz.data());
  layernorm_backward(n, h, x.data(), hw(kLnfW), mean_f.data(), rstd_f.data(), dz.data(), dx.data(),
                     hdw(kLnfW), hdw(kLnfB));
  for (int l = c.layers - 1; l >= 0; --l) {
    auto p = [&](size_t which) { return w(layer_param(l, which)); };
    auto dp = [&](size_t which) { return dw(layer_param(l, which)); };
    const LayerActs& a = acts[l];
    if (c.experts > 0) {
      moe_backward(moe_shape(c), n, a.c.data(),
                   {p(kMoeRouterW), p(kMoeFc1W), p(kMoeFc2W), p(kFc2B)}, a.moe, dx.data(),
                   dz.data(), {dp(kMoeRouterW), dp(kMoeFc1W), dp(kMoeFc2W), dp(kFc2B)});
    } else {
      std::vector<float> du(a.u.size());
      linear_backward_weight(n, f, h, a.g.data(), dx.data(), dp(kFc2W), dp(kFc2B));
      linear_backward_input(n, f, h, p(kFc2W), dx.data(), du.data());
      gelu_backward(du.size(), a.u.data(), du.data(), du.data());
      linear_backward_weight(n, h, f, a.c.data(), du.data(), dp(kFc1W), dp(kFc1B));
      linear_backward_input(n, h, f, p(kFc1W), du.data(), dz.data());
    }
    layernorm_backward(n, h, a.x1.data(), p(kLn2W), a.mean2.data(), a.rstd2.data(), dz.data(),
                       tmp.data(), dp(kLn2W), dp(kLn2B));
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += tmp[i];
    std::vector<float> datt(x.size()), dqkv(a.qkv.size());
    linear_backward_weight(n, h, h, a.att.data(), dx.data(), dp(kOutW), dp(kOutB));
    linear_backward_input(n, h, h, p(kOutW), dx.data(), datt.data());
    if (c.compressed)
      compressed_attention_backward(shape, c.compression(), a.qkv.data(), datt.data(), dqkv.data());
    else
      attention_backward(shape, a.qkv.data(), a.probs.data(), datt.data(), dqkv.data());
    linear_backward_weight(n, h, 3 * h, a.a1.data(), dqkv.data(), dp(kQkvW), dp(kQkvB));
    linear_backward_input(n, h, 3 * h, p(kQkvW), dqkv.data(), dz.data());
    layernorm_backward(n, h, a.x.data(), p(kLn1W), a.mean1.data(), a.rstd1.data(), dz.data(),
                       tmp.data(), dp(kLn1W), dp(kLn1B));
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += tmp[i];
  }
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < h; ++i) {
      dw(kWte)[size_t(batch.tokens[r]) * h + i] += dx[size_t(r) * h + i];
      dw(kWpe)[size_t(r / c.batch) * h + i] += dx[size_t(r) * h + i];
    }
  return loss;
}

void Reference::adam(const AdamConfig& adam, int step) {
  for (Tensor& t : params_) adam_step(adam, step, t.value, t.grad, t.m, t.v);
}

}  // namespace weft::train
