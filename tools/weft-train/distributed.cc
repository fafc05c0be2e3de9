#include "distributed.h"

#include <time.h>

#include <chrono>
#include <cmath>
#include <limits>

namespace weft::train {

namespace par = weft::parallel;

MeshPlan plan_mesh(const Config& c, const Parallelism& p, int world) {
  MeshPlan plan;
  auto fail = [&](std::string message) {
    plan.error = std::move(message);
    return plan;
  };
  for (auto [name, value] : {std::pair{"--layers", c.layers},
                             {"--hidden", c.hidden},
                             {"--heads", c.heads},
                             {"--ffn", c.ffn},
                             {"--vocab", c.vocab},
                             {"--seq", c.seq},
                             {"--batch", c.batch},
                             {"--steps", c.steps}})
    if (value < 1) return fail(std::string(name) + " " + std::to_string(value) + " must be >= 1");
  if (c.hidden % c.heads != 0)
    return fail("--hidden " + std::to_string(c.hidden) + " is not divisible by --heads " +
                std::to_string(c.heads));
  if (p.tp < 1) return fail("--tp " + std::to_string(p.tp) + " must be >= 1");
  if (p.dp < 0) return fail("--dp " + std::to_string(p.dp) + " must be >= 1");
  if (p.zero < 0 || p.zero > 3) return fail("--zero " + std::to_string(p.zero) + " is not 0-3");
  if (p.hsdp < 1) return fail("--hsdp " + std::to_string(p.hsdp) + " must be >= 1");
  if (p.bucket_kb < 0) return fail("--bucket-kb " + std::to_string(p.bucket_kb) + " must be >= 0");
  if (world % p.tp != 0)
    return fail("--tp " + std::to_string(p.tp) + " does not divide the world size " +
                std::to_string(world));
  plan.tp = p.tp;
  plan.dp = p.dp == 0 ? world / p.tp : p.dp;
  if (plan.dp * plan.tp != world)
    return fail("--dp " + std::to_string(plan.dp) + " x --tp " + std::to_string(plan.tp) + " = " +
                std::to_string(plan.dp * plan.tp) + " is not the world size " +
                std::to_string(world));
  for (auto [name, value] : {std::pair{"--hidden", c.hidden},
                             {"--heads", c.heads},
                             {"--ffn", c.ffn},
                             {"--vocab", c.vocab}})
    if (value % p.tp != 0)
      return fail(std::string(name) + " " + std::to_string(value) + " is not divisible by --tp " +
                  std::to_string(p.tp));
  if (p.sp && c.seq % p.tp != 0)
    return fail("--seq " + std::to_string(c.seq) + " is not divisible by --tp " +
                std::to_string(p.tp) + " (--sp shards the sequence)");
  if (c.batch % plan.dp != 0)
    return fail("--batch " + std::to_string(c.batch) + " is not divisible by dp " +
                std::to_string(plan.dp));
  if (p.hsdp > 1 && p.zero != 3) return fail("--hsdp needs --zero 3");
  // ZeRO-3 frees a unit's gradients at its backward_end, before the one AllReduce over tp
  // that the sequence-parallel parameters' gradients get per step.
  if (p.sp && p.zero == 3) return fail("--sp with --zero 3 is not supported");
  if (plan.dp % p.hsdp != 0)
    return fail("--hsdp " + std::to_string(p.hsdp) + " does not divide dp " +
                std::to_string(plan.dp));
  return plan;
}

par::ModelConfig ledger_model(const Config& c, const Parallelism& p, int dp) {
  par::ModelConfig m;
  m.layers = c.layers, m.hidden = c.hidden, m.heads = c.heads, m.ffn = c.ffn;
  m.vocab = c.vocab, m.seq = c.seq, m.batch = c.batch / dp;
  m.dp = dp, m.tp = p.tp, m.sp = p.sp, m.zero = p.zero, m.hsdp = p.hsdp;
  m.steps = c.steps;
  if (p.bucket_kb > 0) m.bucket_bytes = m.first_bucket_bytes = size_t(p.bucket_kb) << 10;
  return m;
}

namespace {

int local_rows(const ParamSpec& s, int tp) {
  return s.split == Split::kRows ? s.rows / tp : s.rows;
}
int local_cols(const ParamSpec& s, int tp) {
  return s.split == Split::kCols ? s.cols / tp : s.cols;
}

// This TP rank's slice of a full parameter value.
std::vector<float> tp_slice(const ParamSpec& s, const std::vector<float>& full, int tp, int rank) {
  const int rows = local_rows(s, tp), cols = local_cols(s, tp);
  const int r0 = s.split == Split::kRows ? rank * rows : 0;
  const int c0 = s.split == Split::kCols ? rank * cols : 0;
  std::vector<float> out(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col)
      out[size_t(r) * cols + col] = full[size_t(r + r0) * s.cols + col + c0];
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

struct Distributed::Layer {
  Layer(const par::Axis& tp, const Config& c, const par::LinearOptions& options)
      : qkv(tp, c.hidden, 3 * c.hidden, options),
        fc1(tp, c.hidden, c.ffn, options),
        out(tp, c.hidden, c.hidden, options),
        fc2(tp, c.ffn, c.hidden, options) {}
  par::ColumnParallelLinear qkv, fc1;
  par::RowParallelLinear out, fc2;
  // Saved for the backward (rows: this rank's; qkv_out, att, u, g: all tokens).
  std::vector<float> x, a1, mean1, rstd1, qkv_out, probs, att, x1, c, mean2, rstd2, u, g;
};

Distributed::Distributed(const Config& config, const Parallelism& p, int dp, weftComm_t world)
    : config_(config), par_(p), specs_(param_specs(config)) {
  par::MeshShape shape;
  shape.tp = p.tp, shape.dp = dp, shape.hsdp = p.hsdp;
  mesh_ = std::make_unique<par::Mesh>(world, shape);
  tp_ = std::make_unique<par::Axis>(*mesh_, "tp", &ledger_);
  // The reference's Adam settings, so that both optimisers take the same step.
  const AdamConfig reference_adam;
  adam_.lr = reference_adam.lr, adam_.beta1 = reference_adam.beta1;
  adam_.beta2 = reference_adam.beta2, adam_.eps = reference_adam.eps;
  if (p.zero == 0) {
    par::BucketOptions buckets;
    if (p.bucket_kb > 0)
      buckets.bucket_bytes = buckets.first_bucket_bytes = size_t(p.bucket_kb) << 10;
    ddp_ = std::make_unique<par::DataParallel>(par::Axis(*mesh_, "dp", &ledger_), buckets);
  } else {
    par::ZeroOptions options;
    options.stage = p.zero, options.adam = adam_;
    if (p.bucket_kb > 0) options.bucket_bytes = size_t(p.bucket_kb) << 10;
    if (p.hsdp > 1)
      zero_ = std::make_unique<par::Zero>(par::Axis(*mesh_, "dp_shard", &ledger_),
                                          par::Axis(*mesh_, "dp_replicate", &ledger_), options);
    else
      zero_ = std::make_unique<par::Zero>(par::Axis(*mesh_, "dp", &ledger_), options);
  }
  size_t offset = 0;
  std::vector<std::vector<float>> initial;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    offsets_.push_back(offset);
    offset += s.size();
    initial.push_back(tp_slice(s, init_param(config_, s, i), p.tp, tp_coord()));
    const size_t numel = initial.back().size();
    ids_.push_back(ddp_ ? ddp_->add(s.name, numel) : zero_->add(s.name, numel, s.unit));
  }
  local_grads_.assign(offset, std::numeric_limits<float>::quiet_NaN());
  if (ddp_) {
    ddp_->finalize();
    values_ = std::move(initial);
    for (const auto& value : values_) {
      m_.emplace_back(value.size(), 0.0f);
      v_.emplace_back(value.size(), 0.0f);
    }
  } else {
    zero_->finalize();
    for (size_t i = 0; i < specs_.size(); ++i) zero_->set_param(ids_[i], initial[i]);
  }

  par::LinearOptions options;
  options.sequence_parallel = p.sp;
  options.gemm = [this](bool ta, bool tb, size_t m, size_t n, size_t k, const float* a,
                        const float* b, float* c, bool accumulate) {
    timed_compute([&] { gemm(int(m), int(n), int(k), a, ta, b, tb, c, accumulate); });
  };
  embedding_ =
      std::make_unique<par::VocabParallelEmbedding>(*tp_, config_.vocab, config_.hidden, p.sp);
  for (int l = 0; l < config_.layers; ++l)
    layers_.push_back(std::make_unique<Layer>(*tp_, config_, options));
  par::LinearOptions head = options;
  head.bias = false;
  lm_head_ = std::make_unique<par::ColumnParallelLinear>(*tp_, config_.hidden, config_.vocab, head);
  loss_ = std::make_unique<par::VocabParallelCrossEntropy>(*tp_, config_.vocab);
}

Distributed::~Distributed() = default;

int Distributed::dp_coord() const {
  return mesh_->coord("dp");
}
int Distributed::tp_coord() const {
  return mesh_->coord("tp");
}

void Distributed::timed_compute(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  work();
  ledger_.add_compute(phase_, seconds_since(start));
  // CPU time too: on a loaded machine the wall time includes time descheduled.
  ledger_.add_compute(std::string(phase_) + ".cpu", thread_cpu_seconds() - cpu_start);
}

std::span<float> Distributed::param(size_t id) {
  return ddp_ ? std::span<float>(values_[id]) : zero_->param(ids_[id]);
}

std::span<float> Distributed::grad(size_t id) {
  return ddp_ ? ddp_->grad_as<float>(ids_[id]) : zero_->grad(ids_[id]);
}

void Distributed::place(size_t id, std::span<const float> local, std::vector<float>& global) const {
  const ParamSpec& s = specs_[id];
  const int rows = local_rows(s, par_.tp), cols = local_cols(s, par_.tp);
  const int r0 = s.split == Split::kRows ? tp_coord() * rows : 0;
  const int c0 = s.split == Split::kCols ? tp_coord() * cols : 0;
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col)
      global[offsets_[id] + size_t(r + r0) * s.cols + col + c0] = local[size_t(r) * cols + col];
}

void Distributed::ready(size_t id) {
  // Sequence-parallel parameters wait for reduce_sp_grads: their gradients are partial
  // over tp until then.
  if (!(par_.sp && specs_[id].split == Split::kNone)) hand_over(id);
}

void Distributed::hand_over(size_t id) {
  std::span<float> g = grad(id);
  if (par_.perturb_grad && id == head_param(config_, kLnfW) &&
      mesh_->world_rank() == mesh_->world_size() - 1)
    g[0] += 1e-3f * (1 + std::abs(g[0]));
  place(id, g, local_grads_);
  if (ddp_)
    ddp_->mark_ready(ids_[id]);
  else if (par_.zero < 3)
    zero_->mark_ready(ids_[id]);
}

void Distributed::reduce_sp_grads() {
  if (!par_.sp) return;
  std::vector<size_t> sp_params;
  size_t total = 0;
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].split == Split::kNone) {
      sp_params.push_back(i);
      total += specs_[i].size();
    }
  // One AllReduce per step for all of them, packed.
  std::vector<float> packed(total);
  size_t at = 0;
  for (size_t i : sp_params) {
    std::span<float> g = grad(i);
    std::copy(g.begin(), g.end(), packed.begin() + at);
    at += g.size();
  }
  par::all_reduce(*tp_, par::view(packed.data(), {total}), "tp.sp_grads");
  at = 0;
  for (size_t i : sp_params) {
    std::span<float> g = grad(i);
    std::copy_n(packed.begin() + at, g.size(), g.begin());
    at += g.size();
    hand_over(i);
  }
}

void Distributed::unit_forward_begin(int unit) {
  if (par_.zero == 3) zero_->forward_begin(unit);
}
void Distributed::unit_forward_end(int unit) {
  if (par_.zero == 3) zero_->forward_end(unit);
}
void Distributed::unit_backward_begin(int unit) {
  if (par_.zero == 3) zero_->backward_begin(unit);
}
void Distributed::unit_backward_end(int unit) {
  if (par_.zero == 3) zero_->backward_end(unit);
}

double Distributed::step(const Batch& global) {
  ++step_;
  const Config& c = config_;
  const int tp = par_.tp, dp = mesh_->size("dp"), b = c.batch / dp, n = c.seq * b;
  const int h = c.hidden, f = c.ffn / tp, v = c.vocab / tp;
  const int rows = par_.sp ? n / tp : n, r0 = par_.sp ? tp_coord() * rows : 0;
  const AttentionShape shape{c.seq, b, c.heads / tp, c.head_dim()};
  const size_t act = size_t(rows) * h;

  // This dp rank's sequences [d·b, (d+1)·b) of the global batch.
  std::vector<int32_t> tokens(n), targets(n);
  for (int t = 0; t < c.seq; ++t)
    for (int i = 0; i < b; ++i) {
      tokens[size_t(t) * b + i] = global.tokens[size_t(t) * c.batch + dp_coord() * b + i];
      targets[size_t(t) * b + i] = global.targets[size_t(t) * c.batch + dp_coord() * b + i];
    }
  if (ddp_) ddp_->zero_grad();

  // Forward.
  phase_ = "forward";
  std::vector<float> x(act);
  unit_forward_begin(0);
  embedding_->forward(tokens, param(kWte), x);
  const float* wpe = param(kWpe).data();
  timed_compute([&] {
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < h; ++i) x[size_t(r) * h + i] += wpe[size_t((r0 + r) / b) * h + i];
  });
  unit_forward_end(0);
  std::vector<float> o(act);
  for (int l = 0; l < c.layers; ++l) {
    Layer& a = *layers_[l];
    auto p = [&](size_t which) { return param(layer_param(l, which)); };
    unit_forward_begin(1 + l);
    a.x = x;
    a.a1.resize(act), a.mean1.resize(rows), a.rstd1.resize(rows);
    timed_compute([&] {
      layernorm(rows, h, x.data(), p(kLn1W).data(), p(kLn1B).data(), a.a1.data(), a.mean1.data(),
                a.rstd1.data());
    });
    a.qkv_out.resize(size_t(n) * 3 * h / tp);
    a.qkv.forward(a.a1, n, p(kQkvW), p(kQkvB), a.qkv_out);
    a.probs.resize(size_t(b) * shape.heads * c.seq * c.seq), a.att.resize(size_t(n) * h / tp);
    timed_compute([&] { attention(shape, a.qkv_out.data(), a.att.data(), a.probs.data()); });
    a.out.forward(a.att, n, p(kOutW), p(kOutB), o);
    a.x1.resize(act), a.c.resize(act), a.mean2.resize(rows), a.rstd2.resize(rows);
    timed_compute([&] {
      for (size_t i = 0; i < act; ++i) a.x1[i] = x[i] + o[i];
      layernorm(rows, h, a.x1.data(), p(kLn2W).data(), p(kLn2B).data(), a.c.data(), a.mean2.data(),
                a.rstd2.data());
    });
    a.u.resize(size_t(n) * f), a.g.resize(a.u.size());
    a.fc1.forward(a.c, n, p(kFc1W), p(kFc1B), a.u);
    timed_compute([&] { gelu(a.u.size(), a.u.data(), a.g.data()); });
    a.fc2.forward(a.g, n, p(kFc2W), p(kFc2B), o);
    for (size_t i = 0; i < act; ++i) x[i] = a.x1[i] + o[i];
    unit_forward_end(1 + l);
  }
  const int head = c.layers + 1;
  auto hp = [&](size_t which) { return param(head_param(c, which)); };
  auto hg = [&](size_t which) { return grad(head_param(c, which)); };
  std::vector<float> z(act), mean_f(rows), rstd_f(rows), logits(size_t(n) * v), losses(n);
  unit_forward_begin(head);
  timed_compute([&] {
    layernorm(rows, h, x.data(), hp(kLnfW).data(), hp(kLnfB).data(), z.data(), mean_f.data(),
              rstd_f.data());
  });
  lm_head_->forward(z, n, hp(kLmW), {}, logits);
  loss_->forward(logits, targets, losses);
  unit_forward_end(head);
  double loss = 0;
  for (float l : losses) loss += l;
  loss /= n;

  // Backward. The mean over this rank's tokens; the DP average makes it the global mean.
  phase_ = "backward";
  std::vector<float> dloss(n, 1.0f / n), dlogits(logits.size()), dz(act), dx(act), tmp(act);
  loss_->backward(dloss, dlogits);
  unit_backward_begin(head);
  lm_head_->backward(dlogits, hp(kLmW), dz, hg(kLmW), {});
  ready(head_param(c, kLmW));
  timed_compute([&] {
    layernorm_backward(rows, h, x.data(), hp(kLnfW).data(), mean_f.data(), rstd_f.data(), dz.data(),
                       dx.data(), hg(kLnfW).data(), hg(kLnfB).data());
  });
  ready(head_param(c, kLnfW));
  ready(head_param(c, kLnfB));
  unit_backward_end(head);
  for (int l = c.layers - 1; l >= 0; --l) {
    Layer& a = *layers_[l];
    auto p = [&](size_t which) { return param(layer_param(l, which)); };
    auto g = [&](size_t which) { return grad(layer_param(l, which)); };
    auto done = [&](std::initializer_list<size_t> which) {
      for (size_t w : which) ready(layer_param(l, w));
    };
    unit_backward_begin(1 + l);
    std::vector<float> du(a.u.size()), datt(a.att.size()), dqkv(a.qkv_out.size());
    a.fc2.backward(dx, p(kFc2W), du, g(kFc2W), g(kFc2B));
    done({kFc2W, kFc2B});
    timed_compute([&] { gelu_backward(du.size(), a.u.data(), du.data(), du.data()); });
    a.fc1.backward(du, p(kFc1W), dz, g(kFc1W), g(kFc1B));
    done({kFc1W, kFc1B});
    timed_compute([&] {
      layernorm_backward(rows, h, a.x1.data(), p(kLn2W).data(), a.mean2.data(), a.rstd2.data(),
                         dz.data(), tmp.data(), g(kLn2W).data(), g(kLn2B).data());
      for (size_t i = 0; i < act; ++i) dx[i] += tmp[i];
    });
    done({kLn2W, kLn2B});
    a.out.backward(dx, p(kOutW), datt, g(kOutW), g(kOutB));
    done({kOutW, kOutB});
    timed_compute([&] {
      attention_backward(shape, a.qkv_out.data(), a.probs.data(), datt.data(), dqkv.data());
    });
    a.qkv.backward(dqkv, p(kQkvW), dz, g(kQkvW), g(kQkvB));
    done({kQkvW, kQkvB});
    timed_compute([&] {
      layernorm_backward(rows, h, a.x.data(), p(kLn1W).data(), a.mean1.data(), a.rstd1.data(),
                         dz.data(), tmp.data(), g(kLn1W).data(), g(kLn1B).data());
      for (size_t i = 0; i < act; ++i) dx[i] += tmp[i];
    });
    done({kLn1W, kLn1B});
    unit_backward_end(1 + l);
  }
  unit_backward_begin(0);
  embedding_->backward(dx, grad(kWte));
  ready(kWte);
  float* dwpe = grad(kWpe).data();
  timed_compute([&] {
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < h; ++i) dwpe[size_t((r0 + r) / b) * h + i] += dx[size_t(r) * h + i];
  });
  ready(kWpe);
  reduce_sp_grads();
  unit_backward_end(0);
  if (par_.extra_call) {
    float probe = 0;
    par::all_reduce(*tp_, par::view(&probe, {1}), "debug.extra");
  }

  if (ddp_) {
    ddp_->finish();
    for (size_t i = 0; i < specs_.size(); ++i)
      par::adam_step(values_[i], grad(i), m_[i], v_[i], step_, adam_);
  } else {
    zero_->step();
  }
  return loss;
}

std::vector<float> Distributed::reduced_grads() const {
  std::vector<float> out(local_grads_.size(), std::numeric_limits<float>::quiet_NaN());
  if (ddp_)
    for (size_t i = 0; i < specs_.size(); ++i) place(i, ddp_->grad_as<float>(ids_[i]), out);
  return out;
}

std::vector<float> Distributed::params() {
  std::vector<float> out(local_grads_.size(), std::numeric_limits<float>::quiet_NaN());
  for (int unit = 0; unit <= config_.layers + 1; ++unit) {
    unit_forward_begin(unit);
    for (size_t i = 0; i < specs_.size(); ++i)
      if (specs_[i].unit == unit) place(i, param(i), out);
    unit_forward_end(unit);
  }
  return out;
}

bool Distributed::coverage_ok() const {
  return zero_ ? zero_->coverage_ok() : true;
}

}  // namespace weft::train
