#include "distributed.h"

#include "checkpoint.h"
#include "cp_attention.h"

#include <time.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "moe.h"

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
  if (p.cp < 1) return fail("--cp " + std::to_string(p.cp) + " must be >= 1");
  const bool compressed = p.cp_algo == "compressed";
  try {
    if (!compressed) par::parse_cp_algorithm(p.cp_algo);
  } catch (const weft::Error&) {
    return fail("--cp-algo '" + p.cp_algo +
                "' is not ring, zigzag, passq, allgather, ulysses, hier, compressed or auto");
  }
  if (compressed &&
      (c.compress_block < 1 || c.compress_stride < 1 || c.compress_stride > c.compress_block))
    return fail("--compress-stride " + std::to_string(c.compress_stride) +
                " must be in [1, --compress-block " + std::to_string(c.compress_block) + "]");
  // Every CP segment but the last sends the next one its last block − 1 positions.
  if (compressed && p.cp > 1 && c.seq / p.cp < c.compress_block - 1)
    return fail("--seq " + std::to_string(c.seq) + " / --cp " + std::to_string(p.cp) +
                " is fewer positions than --compress-block " + std::to_string(c.compress_block) +
                " - 1 (the halo of compressed attention)");
  if (compressed && (p.pp > 1 || p.microbatches > 1))
    return fail("--cp-algo compressed with --pp or --microbatches is not supported");
  const bool zigzag = p.cp_algo == "zigzag";
  if (c.seq % (zigzag ? 2 * p.cp : p.cp) != 0)
    return fail("--seq " + std::to_string(c.seq) + " is not divisible by " +
                (zigzag ? "2 x --cp " : "--cp ") + std::to_string(zigzag ? 2 * p.cp : p.cp));
  if (p.cp_algo == "ulysses" && (c.heads / std::max(p.tp, 1)) % p.cp != 0)
    return fail("--heads " + std::to_string(c.heads) + " / --tp does not divide by --cp " +
                std::to_string(p.cp) + " (ulysses shards the heads)");
  if (p.nodes < 0 || (p.nodes > 0 && world % p.nodes != 0))
    return fail("--nodes " + std::to_string(p.nodes) + " does not divide the world size " +
                std::to_string(world));
  if (p.cp > 1 && p.hsdp > 1) return fail("--hsdp with --cp is not supported");
  if (p.dp < 0) return fail("--dp " + std::to_string(p.dp) + " must be >= 1");
  if (p.zero < 0 || p.zero > 3) return fail("--zero " + std::to_string(p.zero) + " is not 0-3");
  if (p.hsdp < 1) return fail("--hsdp " + std::to_string(p.hsdp) + " must be >= 1");
  if (p.bucket_kb < 0) return fail("--bucket-kb " + std::to_string(p.bucket_kb) + " must be >= 0");
  if (p.pp < 1) return fail("--pp " + std::to_string(p.pp) + " must be >= 1");
  if (p.cp > 1 && p.pp > 1) return fail("--cp with --pp is not supported");
  if (p.cp > 1 && c.experts > 0) return fail("--cp with --experts is not supported");
  const std::string cp_factor = (p.cp > 1 ? " x --cp " + std::to_string(p.cp) : "") +
                                (p.pp > 1 ? " x --pp " + std::to_string(p.pp) : "");
  if (world % (p.tp * p.cp * p.pp) != 0)
    return fail("--tp " + std::to_string(p.tp) + cp_factor + " does not divide the world size " +
                std::to_string(world));
  plan.tp = p.tp, plan.cp = p.cp;
  plan.dp = p.dp == 0 ? world / (p.tp * p.cp * p.pp) : p.dp;
  if (plan.dp * plan.tp * plan.cp * p.pp != world)
    return fail("--dp " + std::to_string(plan.dp) + " x --tp " + std::to_string(plan.tp) +
                cp_factor + " = " + std::to_string(plan.dp * plan.tp * plan.cp * p.pp) +
                " is not the world size " + std::to_string(world));
  for (auto [name, value] : {std::pair{"--hidden", c.hidden},
                             {"--heads", c.heads},
                             {"--ffn", c.ffn},
                             {"--vocab", c.vocab}})
    if (value % p.tp != 0)
      return fail(std::string(name) + " " + std::to_string(value) + " is not divisible by --tp " +
                  std::to_string(p.tp));
  if (p.sp && (c.seq / p.cp) % p.tp != 0)
    return fail("--seq " + std::to_string(c.seq) +
                (p.cp > 1 ? " / --cp " + std::to_string(p.cp) : "") + " is not divisible by --tp " +
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
  if (p.ep < 1) return fail("--ep " + std::to_string(p.ep) + " must be >= 1");
  if (c.experts < 0) return fail("--experts " + std::to_string(c.experts) + " must be >= 0");
  if (c.experts == 0) {
    if (p.ep > 1 || p.ep_sync_free) return fail("--ep and --ep-sync-free need --experts");
    return plan;
  }
  if (c.topk < 1 || c.topk > c.experts)
    return fail("--topk " + std::to_string(c.topk) + " is not in [1, --experts " +
                std::to_string(c.experts) + "]");
  if (!(c.capacity >= 0)) return fail("--capacity " + std::to_string(c.capacity) + " must be >= 0");
  if (plan.dp % p.ep != 0)
    return fail("--ep " + std::to_string(p.ep) + " does not divide dp " + std::to_string(plan.dp));
  if (c.experts % p.ep != 0)
    return fail("--experts " + std::to_string(c.experts) + " is not divisible by --ep " +
                std::to_string(p.ep));
  if (p.tp > 1 || p.sp || p.zero != 0)
    return fail(
        "--experts needs --tp 1, no --sp and --zero 0 (the MoE MLP is data and expert "
        "parallel only)");
  return plan;
}

par::ModelConfig ledger_model(const Config& c, const Parallelism& p, int dp) {
  par::ModelConfig m;
  m.layers = c.layers, m.hidden = c.hidden, m.heads = c.heads, m.ffn = c.ffn;
  m.vocab = c.vocab, m.seq = c.seq, m.batch = c.batch / dp;
  m.dp = dp, m.tp = p.tp, m.cp = p.cp, m.sp = p.sp, m.zero = p.zero, m.hsdp = p.hsdp;
  if (c.compressed) {
    m.cp_mixer = par::CpMixer::compressed;
    m.compressed_block = c.compress_block, m.compressed_stride = c.compress_stride;
  } else {
    m.cp_algorithm = par::parse_cp_algorithm(p.cp_algo);
  }
  m.steps = c.steps;
  if (p.bucket_kb > 0) m.bucket_bytes = m.first_bucket_bytes = size_t(p.bucket_kb) << 10;
  if (c.experts > 0) {
    // The dense parameters bucket over dp, the local experts' over expert-DP.
    m.ep = p.ep, m.experts = c.experts, m.topk = c.topk, m.ep_sync_free = p.ep_sync_free;
    for (const ParamSpec& s : param_specs(c)) {
      if (s.split == Split::kExperts) {
        m.expert_param_numels.push_back(s.size() / size_t(p.ep));
      } else {
        m.param_numels.push_back(s.size());
        m.param_layers.push_back(s.unit);
      }
    }
  }
  return m;
}

// This rank's slice of a full parameter value.
std::vector<float> slice(const ParamSpec& s, const std::vector<float>& full, const Shard& shard) {
  const int rows = shard.rows(s), cols = shard.cols(s);
  const int r0 = shard.row0(s), c0 = shard.col0(s);
  std::vector<float> out(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col)
      out[size_t(r) * cols + col] = full[size_t(r + r0) * s.cols + col + c0];
  return out;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

TransformerLayer::TransformerLayer(const par::Axis& tp, const Config& c,
                                   const par::LinearOptions& options)
    : qkv(tp, c.hidden, 3 * c.hidden, options),
      fc1(tp, c.hidden, c.ffn, options),
      out(tp, c.hidden, c.hidden, options),
      fc2(tp, c.ffn, c.hidden, options) {}

TransformerLayer::~TransformerLayer() = default;

Distributed::Distributed(const Config& config, const Parallelism& p, int dp, weftComm_t world)
    : config_(config), par_(p), specs_(param_specs(config)) {
  par::MeshShape shape;
  shape.tp = p.tp, shape.cp = p.cp, shape.dp = dp, shape.hsdp = p.hsdp, shape.expert_ep = p.ep;
  // With CP the data-parallel reductions run over dp-cp: every rank of it holds partial
  // gradients of its sequence shard.
  const char* dp_dims = p.cp > 1 ? "dp-cp" : "dp";
  if (p.cp > 1) shape.groups = {"dp-cp"};
  int world_size = 0;
  check(weftCommCount(world, &world_size));
  for (int r = 0; p.nodes > 0 && r < world_size; ++r)
    shape.hosts.push_back("node" + std::to_string(r / (world_size / p.nodes)));
  mesh_ = std::make_unique<par::Mesh>(world, shape);
  tp_ = std::make_unique<par::Axis>(*mesh_, "tp", &ledger_);
  cp_ = std::make_unique<par::Axis>(*mesh_, "cp", &ledger_);
  // The reference's Adam settings, so that both optimisers take the same step.
  const AdamConfig reference_adam;
  adam_.lr = reference_adam.lr, adam_.beta1 = reference_adam.beta1;
  adam_.beta2 = reference_adam.beta2, adam_.eps = reference_adam.eps;
  if (p.zero == 0) {
    par::BucketOptions buckets;
    if (p.bucket_kb > 0)
      buckets.bucket_bytes = buckets.first_bucket_bytes = size_t(p.bucket_kb) << 10;
    ddp_ = std::make_unique<par::DataParallel>(par::Axis(*mesh_, dp_dims, &ledger_), buckets);
    if (config.experts > 0) {
      // An expert's gradient sums its EP group's sources; over expert-DP it sums every
      // rank's, and the DP mean divides by dp.
      buckets.reduction = par::Reduction::scaled_sum;
      buckets.gradient_scale = 1.0 / dp;
      expert_ddp_ =
          std::make_unique<par::DataParallel>(par::Axis::expert(*mesh_, "edp", &ledger_), buckets);
      ep_ = std::make_unique<par::Axis>(par::Axis::expert(*mesh_, "ep", &ledger_));
      par::MoeOptions moe;
      moe.experts = config.experts, moe.topk = config.topk, moe.hidden = size_t(config.hidden);
      moe.capacity_factor = config.capacity;
      if (p.ep_sync_free) moe.max_tokens = size_t(config.seq) * size_t(config.batch / dp);
      moe_ = std::make_unique<par::MoeDispatcher>(*ep_, moe);
    }
  } else {
    par::ZeroOptions options;
    options.stage = p.zero, options.adam = adam_;
    if (p.bucket_kb > 0) options.bucket_bytes = size_t(p.bucket_kb) << 10;
    if (p.hsdp > 1)
      zero_ = std::make_unique<par::Zero>(par::Axis(*mesh_, "dp_shard", &ledger_),
                                          par::Axis(*mesh_, "dp_replicate", &ledger_), options);
    else
      zero_ = std::make_unique<par::Zero>(par::Axis(*mesh_, dp_dims, &ledger_), options);
  }
  size_t offset = 0;
  std::vector<std::vector<float>> initial;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    offsets_.push_back(offset);
    offset += s.size();
    initial.push_back(slice(s, init_param(config_, s, i), shard()));
    const size_t numel = initial.back().size();
    ids_.push_back(ddp_ ? ddp_of(i).add(s.name, numel) : zero_->add(s.name, numel, s.unit));
  }
  local_grads_.assign(offset, std::numeric_limits<float>::quiet_NaN());
  if (ddp_) {
    ddp_->finalize();
    if (expert_ddp_) expert_ddp_->finalize();
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
  std::vector<std::string> cp_hosts;
  for (int r : mesh_->group_ranks("cp", mesh_->world_rank())) cp_hosts.push_back(mesh_->hosts()[r]);
  const int heads = config_.heads / p.tp, batch = config_.batch / dp;
  for (int l = 0; l < config_.layers; ++l) {
    layers_.push_back(std::make_unique<Layer>(*tp_, config_, options));
    // Compressed attention always runs through the adapter (over one rank without CP).
    if (config_.compressed)
      layers_.back()->cp = std::make_unique<CpAttention>(*cp_, config_.compression(), config_.seq,
                                                         batch, heads, config_.head_dim());
    else if (p.cp > 1)
      layers_.back()->cp =
          std::make_unique<CpAttention>(*cp_, par::parse_cp_algorithm(p.cp_algo), cp_hosts,
                                        config_.seq, batch, heads, config_.head_dim());
  }
  if (p.cp > 1) positions_ = layers_[0]->cp->positions();
  par::LinearOptions head = options;
  head.bias = false;
  lm_head_ = std::make_unique<par::ColumnParallelLinear>(*tp_, config_.hidden, config_.vocab, head);
  loss_ = std::make_unique<par::VocabParallelCrossEntropy>(*tp_, config_.vocab);
}

Distributed::~Distributed() = default;

int Distributed::cp_node_ranks() const {
  const std::string& mine = mesh_->hosts()[mesh_->world_rank()];
  int count = 0;
  for (int r : mesh_->group_ranks("cp", mesh_->world_rank())) count += mesh_->hosts()[r] == mine;
  return count;
}

int Distributed::cp_coord() const {
  return mesh_->coord("cp");
}
int Distributed::dp_coord() const {
  return mesh_->coord("dp");
}
int Distributed::replica_coord() const {
  return mesh_->coord(par_.cp > 1 ? "dp-cp" : "dp");
}
int Distributed::tp_coord() const {
  return mesh_->coord("tp");
}
int Distributed::ep_coord() const {
  return mesh_->expert_coord("ep");
}
Shard Distributed::shard() const {
  return Shard{par_.tp, tp_coord(), par_.ep, ep_coord()};
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
  return ddp_ ? ddp_of(id).grad_as<float>(ids_[id]) : zero_->grad(ids_[id]);
}

void place_slice(const ParamSpec& s, size_t offset, const Shard& shard,
                 std::span<const float> local, std::vector<float>& global) {
  const int rows = shard.rows(s), cols = shard.cols(s), r0 = shard.row0(s), c0 = shard.col0(s);
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col)
      global[offset + size_t(r + r0) * s.cols + col + c0] = local[size_t(r) * cols + col];
}

void Distributed::place(size_t id, std::span<const float> local, std::vector<float>& global) const {
  place_slice(specs_[id], offsets_[id], shard(), local, global);
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
    ddp_of(id).mark_ready(ids_[id]);
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
  const int tp = par_.tp, dp = mesh_->size("dp"), b = c.batch / dp, s = c.seq / par_.cp, n = s * b;
  const int h = c.hidden, f = c.ffn / tp, v = c.vocab / tp;
  const int rows = par_.sp ? n / tp : n, r0 = par_.sp ? tp_coord() * rows : 0;
  const AttentionShape shape{c.seq, b, c.heads / tp, c.head_dim()};
  const size_t act = size_t(rows) * h;

  // This dp rank's sequences [d·b, (d+1)·b) of the global batch, at its CP positions.
  std::vector<int32_t> tokens(n), targets(n);
  auto position = [&](int t) { return par_.cp > 1 ? positions_[size_t(t)] : t; };
  for (int t = 0; t < s; ++t)
    for (int i = 0; i < b; ++i) {
      const size_t from = size_t(position(t)) * c.batch + dp_coord() * b + i;
      tokens[size_t(t) * b + i] = global.tokens[from];
      targets[size_t(t) * b + i] = global.targets[from];
    }
  if (ddp_) ddp_->zero_grad();
  if (expert_ddp_) expert_ddp_->zero_grad();

  // Forward.
  phase_ = "forward";
  std::vector<float> x(act);
  unit_forward_begin(0);
  embedding_->forward(tokens, param(kWte), x);
  const float* wpe = param(kWpe).data();
  timed_compute([&] {
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < h; ++i)
        x[size_t(r) * h + i] += wpe[size_t(position((r0 + r) / b)) * h + i];
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
    a.att.resize(size_t(n) * h / tp);
    if (a.cp) {
      a.cp->forward(a.qkv_out.data(), a.att.data());
    } else {
      a.probs.resize(size_t(b) * shape.heads * c.seq * c.seq);
      timed_compute([&] { attention(shape, a.qkv_out.data(), a.att.data(), a.probs.data()); });
    }
    a.out.forward(a.att, n, p(kOutW), p(kOutB), o);
    a.x1.resize(act), a.c.resize(act), a.mean2.resize(rows), a.rstd2.resize(rows);
    timed_compute([&] {
      for (size_t i = 0; i < act; ++i) a.x1[i] = x[i] + o[i];
      layernorm(rows, h, a.x1.data(), p(kLn2W).data(), p(kLn2B).data(), a.c.data(), a.mean2.data(),
                a.rstd2.data());
    });
    if (moe_) {
      moe_forward(a, l, o);
    } else {
      a.u.resize(size_t(n) * f), a.g.resize(a.u.size());
      a.fc1.forward(a.c, n, p(kFc1W), p(kFc1B), a.u);
      timed_compute([&] { gelu(a.u.size(), a.u.data(), a.g.data()); });
      a.fc2.forward(a.g, n, p(kFc2W), p(kFc2B), o);
    }
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
    std::vector<float> datt(a.att.size()), dqkv(a.qkv_out.size());
    if (moe_) {
      moe_backward(a, l, dx, dz);
      done({kFc2W, kFc2B, kFc1W, kFc1B});
    } else {
      std::vector<float> du(a.u.size());
      a.fc2.backward(dx, p(kFc2W), du, g(kFc2W), g(kFc2B));
      done({kFc2W, kFc2B});
      timed_compute([&] { gelu_backward(du.size(), a.u.data(), du.data(), du.data()); });
      a.fc1.backward(du, p(kFc1W), dz, g(kFc1W), g(kFc1B));
      done({kFc1W, kFc1B});
    }
    timed_compute([&] {
      layernorm_backward(rows, h, a.x1.data(), p(kLn2W).data(), a.mean2.data(), a.rstd2.data(),
                         dz.data(), tmp.data(), g(kLn2W).data(), g(kLn2B).data());
      for (size_t i = 0; i < act; ++i) dx[i] += tmp[i];
    });
    done({kLn2W, kLn2B});
    a.out.backward(dx, p(kOutW), datt, g(kOutW), g(kOutB));
    done({kOutW, kOutB});
    if (a.cp)
      a.cp->backward(datt.data(), dqkv.data());
    else
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
      for (int i = 0; i < h; ++i)
        dwpe[size_t(position((r0 + r) / b)) * h + i] += dx[size_t(r) * h + i];
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
    if (expert_ddp_) expert_ddp_->finish();
    for (size_t i = 0; i < specs_.size(); ++i)
      par::adam_step(values_[i], grad(i), m_[i], v_[i], step_, adam_);
  } else {
    zero_->step();
  }
  return loss;
}

void Distributed::moe_forward(Layer& a, int l, std::vector<float>& o) {
  const Config& c = config_;
  const MoeShape s = moe_shape(c);
  const int n = int(a.c.size()) / c.hidden, h = c.hidden, f = c.ffn;
  auto p = [&](size_t which) { return param(layer_param(l, which)).data(); };
  a.logits.resize(size_t(n) * c.experts);
  a.index.resize(size_t(n) * c.topk), a.weight.resize(a.index.size());
  timed_compute([&] {
    linear(n, h, c.experts, a.c.data(), p(kMoeRouterW), nullptr, a.logits.data());
    route(s, n, a.logits.data(), a.index.data(), a.weight.data());
  });
  a.handle = moe_->dispatch(a.c, size_t(n), a.index, a.weight);
  const size_t rows = a.handle.rows();
  const float* in = a.handle.expert_input().data();
  a.u.assign(rows * f, 0.0f), a.g.assign(rows * f, 0.0f), a.y.assign(rows * h, 0.0f);
  timed_compute([&] {
    for (int e = 0; e < moe_->local_experts(); ++e) {
      const size_t at = a.handle.expert_offset(e);
      expert_forward(s, int(a.handle.expert_rows(e)), in + at * h, p(kMoeFc1W) + size_t(e) * f * h,
                     p(kMoeFc2W) + size_t(e) * h * f, &a.u[at * f], &a.g[at * f], &a.y[at * h]);
    }
  });
  moe_->combine(a.handle, a.y, o);
  const float* bias = p(kFc2B);
  timed_compute([&] {
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < h; ++i) o[size_t(r) * h + i] += bias[i];
  });
}

void Distributed::moe_backward(Layer& a, int l, const std::vector<float>& dx,
                               std::vector<float>& dz) {
  const Config& c = config_;
  const MoeShape s = moe_shape(c);
  const int n = int(a.c.size()) / c.hidden, h = c.hidden, f = c.ffn;
  auto p = [&](size_t which) { return param(layer_param(l, which)).data(); };
  auto g = [&](size_t which) { return grad(layer_param(l, which)).data(); };
  timed_compute([&] {
    float* dbias = g(kFc2B);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < h; ++i) dbias[i] += dx[size_t(r) * h + i];
  });
  const size_t rows = a.handle.rows();
  std::vector<float> dy(rows * h), du(rows * f), din(rows * h);
  moe_->combine_backward(a.handle, dx, dy);
  const float* in = a.handle.expert_input().data();
  timed_compute([&] {
    for (int e = 0; e < moe_->local_experts(); ++e) {
      const size_t at = a.handle.expert_offset(e), fe = size_t(e) * f * h;
      expert_backward(s, int(a.handle.expert_rows(e)), in + at * h, &a.u[at * f], &a.g[at * f],
                      p(kMoeFc1W) + fe, p(kMoeFc2W) + fe, &dy[at * h], &du[at * f], &din[at * h],
                      g(kMoeFc1W) + fe, g(kMoeFc2W) + fe);
    }
  });
  std::vector<float> d_weight(a.weight.size()), d_logits(a.logits.size()), through(dz.size());
  moe_->dispatch_backward(a.handle, din, dz, d_weight);
  timed_compute([&] {
    route_backward(s, n, a.index.data(), a.weight.data(), d_weight.data(), d_logits.data());
    linear_backward_weight(n, h, c.experts, a.c.data(), d_logits.data(), g(kMoeRouterW), nullptr);
    linear_backward_input(n, h, c.experts, p(kMoeRouterW), d_logits.data(), through.data());
    for (size_t i = 0; i < dz.size(); ++i) dz[i] += through[i];
  });
}

std::vector<float> Distributed::reduced_grads() const {
  std::vector<float> out(local_grads_.size(), std::numeric_limits<float>::quiet_NaN());
  if (ddp_)
    for (size_t i = 0; i < specs_.size(); ++i) place(i, ddp_of(i).grad_as<float>(ids_[i]), out);
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

ShardState Distributed::shard_state() const {
  if (!zero_) return ShardState{step_, shard(), values_, m_, v_};
  // ZeRO: the tp slice of each parameter, NaN where another rank of the shard group owns it
  // (the checkpoint's reader takes each element from the rank that holds it).
  const parallel::ZeroShard owned = zero_->export_shard();
  ShardState state{owned.steps, shard(), {}, {}, {}};
  for (const ParamSpec& s : specs_)
    for (auto* tensor : {&state.values, &state.m, &state.v})
      tensor->emplace_back(size_t(shard().rows(s)) * size_t(shard().cols(s)),
                           std::numeric_limits<float>::quiet_NaN());
  std::vector<size_t> spec_of(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) spec_of[ids_[i]] = i;
  size_t at = 0;
  for (const parallel::ShardRange& range : owned.ranges) {
    const size_t i = spec_of[range.param], count = range.end - range.begin;
    for (auto [from, to] : {std::pair{&owned.params, &state.values[i]},
                            {&owned.m, &state.m[i]},
                            {&owned.v, &state.v[i]}})
      std::copy_n(from->begin() + at, count, to->begin() + range.begin);
    at += count;
  }
  return state;
}

void Distributed::restore(const GlobalState& state) {
  parallel::ZeroShard whole;  // ZeRO: every parameter's tp slice, each rank keeps its shard
  whole.steps = state.step;
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::vector<float> values = slice(specs_[i], state.values[i], shard()),
                       m = slice(specs_[i], state.m[i], shard()),
                       v = slice(specs_[i], state.v[i], shard());
    if (!zero_) {
      values_[i] = std::move(values), m_[i] = std::move(m), v_[i] = std::move(v);
      continue;
    }
    whole.ranges.push_back({ids_[i], 0, values.size()});
    whole.params.insert(whole.params.end(), values.begin(), values.end());
    whole.m.insert(whole.m.end(), m.begin(), m.end());
    whole.v.insert(whole.v.end(), v.begin(), v.end());
  }
  if (zero_) zero_->import_shard(whole);
  step_ = state.step;
}

bool Distributed::coverage_ok() const {
  return zero_ ? zero_->coverage_ok() : true;
}

}  // namespace weft::train
