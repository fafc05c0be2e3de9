#include "pipeline.h"

#include <cmath>
#include <limits>

#include "checkpoint.h"

namespace weft::train {

namespace par = weft::parallel;

std::string check_pipeline(const Config& c, const Parallelism& p, int dp) {
  auto n = [](int v) { return std::to_string(v); };
  if (p.pp < 1) return "--pp " + n(p.pp) + " must be >= 1";
  if (p.microbatches < 1) return "--microbatches " + n(p.microbatches) + " must be >= 1";
  if (p.virtual_stages < 1) return "--virtual " + n(p.virtual_stages) + " must be >= 1";
  par::PipelineSchedule schedule;
  if (!par::parse_pipeline_schedule(p.schedule, &schedule))
    return "--schedule " + p.schedule + " is not gpipe, 1f1b, interleaved or zb";
  if (p.virtual_stages > 1 && schedule != par::PipelineSchedule::interleaved)
    return "--virtual " + n(p.virtual_stages) + " needs --schedule interleaved";
  const int stages = p.pp * p.virtual_stages;
  if (c.layers % stages != 0)
    return "--layers " + n(c.layers) + " is not divisible by --pp x --virtual = " + n(stages);
  if (schedule == par::PipelineSchedule::interleaved && p.microbatches % p.pp != 0)
    return "--microbatches " + n(p.microbatches) + " must be a multiple of --pp " + n(p.pp) +
           " for the interleaved schedule";
  if ((c.batch / dp) % p.microbatches != 0)
    return "--batch " + n(c.batch) + " over dp " + n(dp) + " is not divisible by --microbatches " +
           n(p.microbatches);
  if (p.sp) return "--sp with --pp or --microbatches is not supported";
  if (p.zero != 0) return "--zero " + n(p.zero) + " with --pp or --microbatches is not supported";
  return "";
}

namespace {

// What one (micro-batch, chunk) keeps from forward to backward.
struct Micro {
  std::vector<std::unique_ptr<TransformerLayer>> layers;  // this chunk's, one micro-batch
  std::unique_ptr<par::VocabParallelEmbedding> embedding;
  std::unique_ptr<par::ColumnParallelLinear> lm_head;
  std::unique_ptr<par::VocabParallelCrossEntropy> loss;
  std::vector<float> x, z, mean_f, rstd_f, logits;
  // Zero-bubble: the weight-gradient GEMMs the backward deferred to W (operands copied).
  std::vector<std::function<void()>> deferred;
};

}  // namespace

struct PipelineModel::State {
  Config config;
  Parallelism par;
  int dp = 1;
  std::vector<ParamSpec> specs;
  std::vector<size_t> offsets;
  std::vector<bool> held;
  par::Ledger ledger;
  par::AdamOptions adam;
  std::unique_ptr<par::Mesh> mesh;
  std::unique_ptr<par::Axis> tp, pp;
  std::unique_ptr<par::DataParallel> ddp;
  std::unique_ptr<par::Pipeline> pipeline;
  std::vector<size_t> ids;  // DataParallel id of each held parameter
  std::vector<std::vector<float>> values, m, v;
  std::vector<Micro> micro;  // [chunk · microbatches + mb]
  std::vector<float> local_grads;
  const Batch* batch = nullptr;  // the step's global batch
  Micro* current = nullptr;      // the backward in progress (zero-bubble deferral)
  bool defer_wgrad = false;
  double loss_sum = 0;
  int step = 0;

  int tp_coord() const { return mesh->coord("tp"); }
  int pp_coord() const { return mesh->coord("pp"); }
  int rows() const { return config.seq * micro_batch(); }
  int micro_batch() const { return config.batch / dp / par.microbatches; }
  int layers_per_stage() const { return config.layers / (par.pp * par.virtual_stages); }
  int first_layer(int chunk) const { return pipeline->stage(chunk) * layers_per_stage(); }
  std::span<float> param(size_t id) { return values[id]; }
  std::span<float> grad(size_t id) { return ddp->grad_as<float>(ids[id]); }
  Micro& at(int mb, int chunk) { return micro[size_t(chunk) * par.microbatches + mb]; }
  // Micro-batch mb of this dp rank's sequences of a global [s, batch] array.
  std::vector<int32_t> slice(const std::vector<int32_t>& global, int mb) const {
    const int b = micro_batch(), first = mesh->coord("dp") * (config.batch / dp) + mb * b;
    std::vector<int32_t> out(size_t(config.seq) * b);
    for (int t = 0; t < config.seq; ++t)
      for (int i = 0; i < b; ++i)
        out[size_t(t) * b + i] = global[size_t(t) * config.batch + first + i];
    return out;
  }
  void place(size_t id, std::span<const float> local, std::vector<float>& global) const;
  void forward(int mb, int chunk, std::span<const float> in, std::span<float> out);
  void backward(int mb, int chunk, std::span<const float> dout, std::span<float> din);
  void gemm_call(bool ta, bool tb, size_t m, size_t n, size_t k, const float* a, const float* b,
                 float* c, bool accumulate);
};

void PipelineModel::State::place(size_t id, std::span<const float> local,
                                 std::vector<float>& global) const {
  place_slice(specs[id], offsets[id], Shard{par.tp, tp_coord()}, local, global);
}

void PipelineModel::State::gemm_call(bool ta, bool tb, size_t m, size_t n, size_t k, const float* a,
                                     const float* b, float* c, bool accumulate) {
  // The linears' weight gradient is their only GEMM with a transposed A (dW += dyᵀ·x):
  // under zero-bubble it waits for W, on copies of dy and x (the caller reuses dy).
  if (defer_wgrad && ta && accumulate) {
    std::vector<float> da(a, a + m * k), db(b, b + n * k);
    current->deferred.push_back([=, da = std::move(da), db = std::move(db)] {
      train::gemm(int(m), int(n), int(k), da.data(), ta, db.data(), tb, c, accumulate);
    });
    return;
  }
  train::gemm(int(m), int(n), int(k), a, ta, b, tb, c, accumulate);
}

PipelineModel::PipelineModel(const Config& config, const Parallelism& p, int dp, weftComm_t world)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config, s.par = p, s.dp = dp, s.specs = param_specs(config);
  par::MeshShape shape;
  shape.tp = p.tp, shape.pp = p.pp, shape.dp = dp;
  s.mesh = std::make_unique<par::Mesh>(world, shape);
  s.tp = std::make_unique<par::Axis>(*s.mesh, "tp", &s.ledger);
  s.pp = std::make_unique<par::Axis>(*s.mesh, "pp", &s.ledger);
  par::PipelineOptions options;
  par::parse_pipeline_schedule(p.schedule, &options.schedule);
  options.microbatches = p.microbatches, options.virtual_stages = p.virtual_stages;
  options.activation_numel = size_t(s.rows()) * config.hidden;
  s.pipeline = std::make_unique<par::Pipeline>(*s.pp, options);
  const AdamConfig reference_adam;
  s.adam.lr = reference_adam.lr, s.adam.beta1 = reference_adam.beta1;
  s.adam.beta2 = reference_adam.beta2, s.adam.eps = reference_adam.eps;
  par::BucketOptions buckets;
  if (p.bucket_kb > 0)
    buckets.bucket_bytes = buckets.first_bucket_bytes = size_t(p.bucket_kb) << 10;
  s.ddp = std::make_unique<par::DataParallel>(par::Axis(*s.mesh, "dp", &s.ledger), buckets);

  // This rank's parameters: its chunks' layers, the embeddings on stage 0, the head on the last.
  const int v = p.virtual_stages, per = s.layers_per_stage();
  s.held.assign(s.specs.size(), false);
  for (int chunk = 0; chunk < v; ++chunk)
    for (int l = s.first_layer(chunk); l < s.first_layer(chunk) + per; ++l)
      for (size_t w = 0; w < kLayerParams; ++w) s.held[layer_param(l, w)] = true;
  if (s.pipeline->first_stage(0)) s.held[kWte] = s.held[kWpe] = true;
  if (s.pipeline->last_stage(v - 1))
    for (size_t w : {kLnfW, kLnfB, kLmW}) s.held[head_param(config, w)] = true;
  size_t offset = 0;
  s.ids.assign(s.specs.size(), 0);
  s.values.resize(s.specs.size()), s.m.resize(s.specs.size()), s.v.resize(s.specs.size());
  for (size_t i = 0; i < s.specs.size(); ++i) {
    s.offsets.push_back(offset);
    offset += s.specs[i].size();
    if (!s.held[i]) continue;
    s.values[i] = slice(s.specs[i], init_param(config, s.specs[i], i), Shard{p.tp, s.tp_coord()});
    s.m[i].assign(s.values[i].size(), 0.0f), s.v[i].assign(s.values[i].size(), 0.0f);
    s.ids[i] = s.ddp->add(s.specs[i].name, s.values[i].size());
  }
  s.ddp->finalize();
  s.local_grads.assign(offset, std::numeric_limits<float>::quiet_NaN());

  par::LinearOptions linear;
  linear.gemm = [&s](bool ta, bool tb, size_t m, size_t n, size_t k, const float* a, const float* b,
                     float* c,
                     bool accumulate) { s.gemm_call(ta, tb, m, n, k, a, b, c, accumulate); };
  par::LinearOptions head = linear;
  head.bias = false;
  s.micro.resize(size_t(v) * p.microbatches);
  for (int chunk = 0; chunk < v; ++chunk)
    for (int mb = 0; mb < p.microbatches; ++mb) {
      Micro& u = s.at(mb, chunk);
      for (int l = 0; l < per; ++l)
        u.layers.push_back(std::make_unique<TransformerLayer>(*s.tp, config, linear));
      if (s.pipeline->first_stage(chunk))
        u.embedding =
            std::make_unique<par::VocabParallelEmbedding>(*s.tp, config.vocab, config.hidden);
      if (s.pipeline->last_stage(chunk)) {
        u.lm_head =
            std::make_unique<par::ColumnParallelLinear>(*s.tp, config.hidden, config.vocab, head);
        u.loss = std::make_unique<par::VocabParallelCrossEntropy>(*s.tp, config.vocab);
      }
    }
}

PipelineModel::~PipelineModel() = default;

void PipelineModel::State::forward(int mb, int chunk, std::span<const float> in,
                                   std::span<float> out) {
  const Config& c = config;
  const int tp_size = par.tp, b = micro_batch(), n = rows(), h = c.hidden;
  const int f = c.ffn / tp_size, vocab = c.vocab / tp_size;
  const AttentionShape shape{c.seq, b, c.heads / tp_size, c.head_dim()};
  const size_t act = size_t(n) * h;
  Micro& u = at(mb, chunk);
  std::vector<float> x(act), o(act);
  if (u.embedding) {
    u.embedding->forward(slice(batch->tokens, mb), param(kWte), x);
    const float* wpe = param(kWpe).data();
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < h; ++i) x[size_t(r) * h + i] += wpe[size_t(r / b) * h + i];
  } else {
    std::copy(in.begin(), in.end(), x.begin());
  }
  for (size_t k = 0; k < u.layers.size(); ++k) {
    TransformerLayer& a = *u.layers[k];
    const int l = first_layer(chunk) + int(k);
    auto p = [&](size_t which) { return param(layer_param(l, which)); };
    a.x = x;
    a.a1.resize(act), a.mean1.resize(n), a.rstd1.resize(n);
    layernorm(n, h, x.data(), p(kLn1W).data(), p(kLn1B).data(), a.a1.data(), a.mean1.data(),
              a.rstd1.data());
    a.qkv_out.resize(size_t(n) * 3 * h / tp_size);
    a.qkv.forward(a.a1, n, p(kQkvW), p(kQkvB), a.qkv_out);
    a.probs.resize(size_t(b) * shape.heads * c.seq * c.seq), a.att.resize(size_t(n) * h / tp_size);
    attention(shape, a.qkv_out.data(), a.att.data(), a.probs.data());
    a.out.forward(a.att, n, p(kOutW), p(kOutB), o);
    a.x1.resize(act), a.c.resize(act), a.mean2.resize(n), a.rstd2.resize(n);
    for (size_t i = 0; i < act; ++i) a.x1[i] = x[i] + o[i];
    layernorm(n, h, a.x1.data(), p(kLn2W).data(), p(kLn2B).data(), a.c.data(), a.mean2.data(),
              a.rstd2.data());
    a.u.resize(size_t(n) * f), a.g.resize(a.u.size());
    a.fc1.forward(a.c, n, p(kFc1W), p(kFc1B), a.u);
    gelu(a.u.size(), a.u.data(), a.g.data());
    a.fc2.forward(a.g, n, p(kFc2W), p(kFc2B), o);
    for (size_t i = 0; i < act; ++i) x[i] = a.x1[i] + o[i];
  }
  if (!u.lm_head) {
    std::copy(x.begin(), x.end(), out.begin());
    return;
  }
  auto hp = [&](size_t which) { return param(head_param(c, which)); };
  u.x = x, u.z.resize(act), u.mean_f.resize(n), u.rstd_f.resize(n);
  u.logits.resize(size_t(n) * vocab);
  layernorm(n, h, x.data(), hp(kLnfW).data(), hp(kLnfB).data(), u.z.data(), u.mean_f.data(),
            u.rstd_f.data());
  u.lm_head->forward(u.z, n, hp(kLmW), {}, u.logits);
  std::vector<float> losses(n);
  u.loss->forward(u.logits, slice(batch->targets, mb), losses);
  for (float l : losses) loss_sum += l;
}

void PipelineModel::State::backward(int mb, int chunk, std::span<const float> dout,
                                    std::span<float> din) {
  const Config& c = config;
  const int b = micro_batch(), n = rows(), h = c.hidden;
  const AttentionShape shape{c.seq, b, c.heads / par.tp, c.head_dim()};
  const size_t act = size_t(n) * h;
  Micro& u = at(mb, chunk);
  current = &u;
  std::vector<float> dx(act), dz(act), tmp(act);
  if (u.lm_head) {
    // The mean over this dp rank's tokens (all its micro-batches); the DP average makes it
    // the global mean.
    auto hp = [&](size_t which) { return param(head_param(c, which)); };
    auto hg = [&](size_t which) { return grad(head_param(c, which)); };
    const float scale = 1.0f / float(size_t(n) * par.microbatches);
    std::vector<float> dloss(n, scale), dlogits(u.logits.size());
    u.loss->backward(dloss, dlogits);
    u.lm_head->backward(dlogits, hp(kLmW), dz, hg(kLmW), {});
    layernorm_backward(n, h, u.x.data(), hp(kLnfW).data(), u.mean_f.data(), u.rstd_f.data(),
                       dz.data(), dx.data(), hg(kLnfW).data(), hg(kLnfB).data());
  } else {
    std::copy(dout.begin(), dout.end(), dx.begin());
  }
  for (size_t k = u.layers.size(); k-- > 0;) {
    TransformerLayer& a = *u.layers[k];
    const int l = first_layer(chunk) + int(k);
    auto p = [&](size_t which) { return param(layer_param(l, which)); };
    auto g = [&](size_t which) { return grad(layer_param(l, which)); };
    std::vector<float> du(a.u.size()), datt(a.att.size()), dqkv(a.qkv_out.size());
    a.fc2.backward(dx, p(kFc2W), du, g(kFc2W), g(kFc2B));
    gelu_backward(du.size(), a.u.data(), du.data(), du.data());
    a.fc1.backward(du, p(kFc1W), dz, g(kFc1W), g(kFc1B));
    layernorm_backward(n, h, a.x1.data(), p(kLn2W).data(), a.mean2.data(), a.rstd2.data(),
                       dz.data(), tmp.data(), g(kLn2W).data(), g(kLn2B).data());
    for (size_t i = 0; i < act; ++i) dx[i] += tmp[i];
    a.out.backward(dx, p(kOutW), datt, g(kOutW), g(kOutB));
    attention_backward(shape, a.qkv_out.data(), a.probs.data(), datt.data(), dqkv.data());
    a.qkv.backward(dqkv, p(kQkvW), dz, g(kQkvW), g(kQkvB));
    layernorm_backward(n, h, a.x.data(), p(kLn1W).data(), a.mean1.data(), a.rstd1.data(), dz.data(),
                       tmp.data(), g(kLn1W).data(), g(kLn1B).data());
    for (size_t i = 0; i < act; ++i) dx[i] += tmp[i];
  }
  if (u.embedding) {
    u.embedding->backward(dx, grad(kWte));
    float* dwpe = grad(kWpe).data();
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < h; ++i) dwpe[size_t(r / b) * h + i] += dx[size_t(r) * h + i];
  } else {
    std::copy(dx.begin(), dx.end(), din.begin());
  }
  current = nullptr;
}

double PipelineModel::step(const Batch& global) {
  State& s = *state_;
  ++s.step;
  s.batch = &global;
  s.loss_sum = 0;
  s.ddp->zero_grad();
  s.defer_wgrad = s.par.schedule == "zb";
  par::StageFunctions fn;
  fn.forward = [&s](int mb, int chunk, std::span<const float> in, std::span<float> out) {
    s.forward(mb, chunk, in, out);
  };
  fn.backward = [&s](int mb, int chunk, std::span<const float> dout, std::span<float> din) {
    s.backward(mb, chunk, dout, din);
  };
  fn.backward_weight = [&s](int mb, int chunk) {
    for (auto& work : s.at(mb, chunk).deferred) work();
    s.at(mb, chunk).deferred.clear();
  };
  s.pipeline->run(fn);
  // Every micro-batch's gradient is in: hand them to the DP reduction, last layer first.
  for (size_t i = s.specs.size(); i-- > 0;) {
    if (!s.held[i]) continue;
    std::span<float> g = s.grad(i);
    if (s.par.perturb_grad && i == head_param(s.config, kLnfW) && s.tp_coord() == s.par.tp - 1)
      g[0] += 1e-3f * (1 + std::abs(g[0]));  // the verdict must FAIL
    s.place(i, g, s.local_grads);
    s.ddp->mark_ready(s.ids[i]);
  }
  s.ddp->finish();
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (s.held[i]) par::adam_step(s.values[i], s.grad(i), s.m[i], s.v[i], s.step, s.adam);
  const bool has_loss = s.pipeline->last_stage(s.par.virtual_stages - 1);
  return has_loss ? s.loss_sum / (double(s.rows()) * s.par.microbatches)
                  : std::numeric_limits<double>::quiet_NaN();
}

par::Ledger& PipelineModel::ledger() {
  return state_->ledger;
}
int PipelineModel::dp_coord() const {
  return state_->mesh->coord("dp");
}
int PipelineModel::pp_coord() const {
  return state_->pp_coord();
}
const std::vector<float>& PipelineModel::local_grads() const {
  return state_->local_grads;
}

std::vector<float> PipelineModel::reduced_grads() const {
  const State& s = *state_;
  std::vector<float> out(s.local_grads.size(), std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (s.held[i]) s.place(i, s.ddp->grad_as<float>(s.ids[i]), out);
  return out;
}

std::vector<float> PipelineModel::params() {
  const State& s = *state_;
  std::vector<float> out(s.local_grads.size(), std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (s.held[i]) s.place(i, s.values[i], out);
  return out;
}

ShardState PipelineModel::shard_state() const {
  const State& s = *state_;
  const Shard shard{s.par.tp, s.tp_coord()};
  ShardState state{s.step, shard, s.values, s.m, s.v};
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (!s.held[i])
      for (auto* tensor : {&state.values[i], &state.m[i], &state.v[i]})
        tensor->assign(size_t(shard.rows(s.specs[i])) * size_t(shard.cols(s.specs[i])),
                       std::numeric_limits<float>::quiet_NaN());
  return state;
}

void PipelineModel::restore(const GlobalState& state) {
  State& s = *state_;
  const Shard shard{s.par.tp, s.tp_coord()};
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (s.held[i]) {
      s.values[i] = slice(s.specs[i], state.values[i], shard);
      s.m[i] = slice(s.specs[i], state.m[i], shard);
      s.v[i] = slice(s.specs[i], state.v[i], shard);
    }
  s.step = state.step;
}

StageProfile PipelineModel::profile() const {
  const par::Pipeline& p = *state_->pipeline;
  return {p.profile().wall_s, p.profile().compute_s, p.simulated_bubble(), p.formula_bubble()};
}

par::ModelConfig pipeline_ledger_model(const Config& c, const Parallelism& p, int dp, int pp_rank) {
  par::ModelConfig m = ledger_model(c, p, dp);
  m.pp = p.pp, m.pp_rank = pp_rank, m.microbatches = p.microbatches;
  m.virtual_stages = p.virtual_stages;
  // This rank's parameters, in registration order, as the stages hold them.
  const std::vector<ParamSpec> specs = param_specs(c);
  const int per = c.layers / (p.pp * p.virtual_stages);
  for (size_t i = 0; i < specs.size(); ++i) {
    const int unit = specs[i].unit;  // 0: embeddings, 1 + l: layer l, L + 1: head
    const bool held = unit == 0              ? pp_rank == 0
                      : unit == c.layers + 1 ? pp_rank == p.pp - 1
                                             : ((unit - 1) / per) % p.pp == pp_rank;
    if (!held) continue;
    m.param_numels.push_back(size_t(Shard{p.tp}.rows(specs[i])) * Shard{p.tp}.cols(specs[i]));
    m.param_layers.push_back(unit);
  }
  return m;
}

}  // namespace weft::train
