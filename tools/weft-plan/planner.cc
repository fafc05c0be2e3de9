#include "planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "algorithms/schedule.h"
#include "core/tuner.h"
#include "topo/cluster.h"

namespace weft::plan {

namespace par = weft::parallel;

namespace {

std::string num(double value) {
  char text[32];
  snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace

bool preset(std::string_view name, ModelSpec* out) {
  ModelSpec m;
  m.name = std::string(name);
  if (name == "llama3-8b") {  // Meta-Llama-3-8B config.json
    m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn = 14336, m.vocab = 128256;
  } else if (name == "llama3-70b") {  // Meta-Llama-3-70B config.json
    m.layers = 80, m.hidden = 8192, m.heads = 64, m.kv_heads = 8, m.ffn = 28672, m.vocab = 128256;
  } else if (name == "mixtral-8x7b") {  // Mixtral-8x7B-v0.1 config.json
    m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn = 14336, m.vocab = 32000;
    m.experts = 8, m.topk = 2, m.moe_ffn = 14336;
  } else if (name == "deepseek-v3") {  // DeepSeek-V3 config.json (MTP module left out)
    m.arch = "mla";
    m.layers = 61, m.hidden = 7168, m.heads = 128, m.kv_heads = 128, m.ffn = 18432;
    m.vocab = 129280, m.experts = 256, m.topk = 8, m.moe_ffn = 2048, m.shared_experts = 1;
    m.dense_layers = 3, m.q_lora = 1536, m.kv_lora = 512, m.qk_nope = 128, m.qk_rope = 64;
    m.v_head = 128;
  } else {
    return false;
  }
  *out = m;
  return true;
}

const char* preset_names() {
  return "llama3-8b, llama3-70b, mixtral-8x7b, deepseek-v3";
}

namespace {

// One layer's parameters (whole, unsharded), by how TP splits them.
struct LayerShape {
  double attn_col = 0, attn_row = 0, attn_replicated = 0, norms = 0;
  double mlp_col = 0, mlp_row = 0;         // dense MLP, or the shared experts
  double router = 0, expert = 0;           // MoE: router, one routed expert
  double attn_qk_dim = 0, attn_v_dim = 0;  // per head, for the attention FLOPs
  bool moe = false;
};

LayerShape layer_shape(const ModelSpec& m, int layer) {
  LayerShape s;
  const double h = m.hidden, heads = m.heads;
  if (m.arch == "mla") {
    const double qk = m.qk_nope + m.qk_rope;
    s.attn_replicated = h * m.q_lora + m.q_lora + h * (m.kv_lora + m.qk_rope) + m.kv_lora;
    s.attn_col = m.q_lora * heads * qk + m.kv_lora * heads * (m.qk_nope + m.v_head);
    s.attn_row = heads * m.v_head * h;
    s.attn_qk_dim = qk, s.attn_v_dim = m.v_head;
  } else {
    const double hd = h / heads, kv = m.kv_heads > 0 ? m.kv_heads : heads;
    s.attn_col = h * (heads + 2 * kv) * hd;
    s.attn_row = heads * hd * h;
    s.attn_qk_dim = s.attn_v_dim = hd;
  }
  s.norms = 2 * h;
  s.moe = m.experts > 0 && layer >= m.dense_layers;
  const double ffn = s.moe ? double(m.moe_ffn) * m.shared_experts : m.ffn;
  s.mlp_col = 2 * h * ffn, s.mlp_row = h * ffn;
  if (s.moe) s.router = h * m.experts, s.expert = 3 * h * m.moe_ffn;
  return s;
}

// This rank's parameters of one stage, in forward order (the Ledger's
// param_numels: routed experts left out, they reduce over expert-dp), and the
// routed experts' elements it holds.
struct StageParams {
  std::vector<size_t> numels, expert_numels;  // expert_numels: per MoE layer
  std::vector<int> units;
  double dense = 0, experts = 0;
};

StageParams stage_params(const ModelSpec& m, int tp, int ep, int pp, int stage) {
  StageParams out;
  const size_t h = m.hidden, t = tp;
  auto add = [&](double numel, int unit) {
    out.numels.push_back(static_cast<size_t>(numel));
    out.units.push_back(unit);
    out.dense += numel;
  };
  const int per_stage = m.layers / pp;
  if (stage == 0) add(double(m.vocab / tp) * h, 0);
  for (int l = stage * per_stage; l < (stage + 1) * per_stage; ++l) {
    const LayerShape s = layer_shape(m, l);
    const int unit = l - stage * per_stage + 1;
    add(h, unit);
    if (s.attn_replicated > 0) add(s.attn_replicated, unit);
    add(s.attn_col / t, unit);
    add(s.attn_row / t, unit);
    add(h, unit);
    if (s.router > 0) add(s.router, unit);
    if (s.mlp_col > 0) add(s.mlp_col / t, unit), add(s.mlp_row / t, unit);
    if (s.moe) out.expert_numels.push_back(static_cast<size_t>(s.expert * (m.experts / ep)));
    out.experts += s.expert * (m.experts / ep);
  }
  if (stage == pp - 1) add(h, per_stage + 1), add(double(m.vocab / tp) * h, per_stage + 1);
  return out;
}

// Whole-model parameters and those one token uses (active), and the matmul
// FLOPs per token of a forward pass (2 per weight used; attention over `seq`
// keys, halved for causal masks).
struct ModelFlops {
  double params = 0, active = 0, dense_flops = 0, expert_flops = 0, col_fraction = 0;
};

ModelFlops model_flops(const ModelSpec& m, double seq, bool causal) {
  ModelFlops f;
  double col = 0, matmul = 0;
  for (int l = 0; l < m.layers; ++l) {
    const LayerShape s = layer_shape(m, l);
    const double dense =
        s.attn_col + s.attn_row + s.attn_replicated + s.mlp_col + s.mlp_row + s.router;
    f.params += dense + s.norms + s.expert * m.experts;
    f.active += dense + s.norms + s.expert * m.topk;
    f.dense_flops +=
        2 * dense + 2 * seq * m.heads * (s.attn_qk_dim + s.attn_v_dim) * (causal ? 0.5 : 1.0);
    f.expert_flops += 2 * s.expert * m.topk;
    col += s.attn_col + s.mlp_col + s.expert * m.topk * 2 / 3;
    matmul += dense + s.expert * m.topk;
  }
  const double embed = double(m.vocab) * m.hidden;
  f.params += 2 * embed + m.hidden, f.active += 2 * embed + m.hidden;
  f.dense_flops += 2 * embed;  // the LM head
  f.col_fraction = matmul > 0 ? col / matmul : 0;
  return f;
}

// How a ledger pattern runs in a step: the share of its calls in the
// forward pass, per micro-batch or per step, and what compute it can hide
// behind (the overlap rules of docs/parallel.md and of the adapters as they
// run). Patterns not listed are counted exposed, per micro-batch. The CP ring
// shifts are posted before the block of attention they overlap ("attn",
// "attn-bwd"); the pipeline's sends are asynchronous, only receives are waited
// for ("pp"); collectives that feed the compute next to them are exposed: the
// MoE AllToAllv (the experts wait for their dispatch, the next layer for its
// combine), CP's AllGather, AllToAll and state exchanges.
struct Rule {
  const char* pattern;
  const char* primitive;  // nullptr: any
  double forward;         // 1, 0, or Ulysses's 4 of 8 AllToAll
  bool per_microbatch;
  const char* window;  // Entry::window
};
constexpr Rule kRules[] = {
    {"tp.embedding", nullptr, 1, true, "-"},
    {"tp.reduce_from", nullptr, 1, true, "-"},
    {"tp.copy_to", nullptr, 0, true, "wgrad"},
    {"tp.cross_entropy", nullptr, 0, true, "-"},
    {"tp.sp_grads", nullptr, 0, false, "-"},
    {"sp.embedding", "reducescatter", 1, true, "-"},
    {"sp.embedding", "allgather", 0, true, "-"},
    {"sp.gather_from", "allgather", 1, true, "-"},
    {"sp.gather_from", "reducescatter", 0, true, "wgrad"},
    {"sp.regather", nullptr, 0, true, "wgrad"},
    {"sp.reduce_scatter_to", "reducescatter", 1, true, "-"},
    {"sp.reduce_scatter_to", "allgather", 0, true, "-"},
    {"dp.bucket", nullptr, 0, false, "bwd"},
    {"zero1.grads", nullptr, 0, false, "-"},
    {"zero1.params", nullptr, 0, false, "-"},
    {"zero2.grads", nullptr, 0, false, "bwd"},
    {"zero2.params", nullptr, 0, false, "-"},
    {"zero3.gather_fwd", nullptr, 1, true, "fwd"},
    {"zero3.gather_bwd", nullptr, 0, true, "bwd"},
    {"zero3.grads", nullptr, 0, true, "bwd"},
    {"hsdp.grads", nullptr, 0, true, "-"},
    {"pp.forward", nullptr, 1, true, "pp"},
    {"pp.backward", nullptr, 0, true, "pp"},
    {"cp.ring_kv", nullptr, 1, true, "attn"},
    {"cp.ring_kv_bwd", nullptr, 0, true, "attn-bwd"},
    {"cp.ring_dkv", nullptr, 0, true, "attn-bwd"},
    {"cp.passq_q", nullptr, 1, true, "attn"},
    {"cp.passq_out", nullptr, 1, true, "-"},
    {"cp.passq_bwd", nullptr, 0, true, "attn-bwd"},
    {"cp.passq_dq", nullptr, 0, true, "-"},
    {"cp.allgather_kv", nullptr, 1, true, "-"},
    {"cp.allgather_kv_bwd", nullptr, 0, true, "-"},
    {"cp.allgather_dkv", nullptr, 0, true, "-"},
    {"cp.ulysses", nullptr, 0.5, true, "-"},
    {"cp.affine_state", nullptr, 1, true, "-"},
    {"cp.affine_grad", nullptr, 0, true, "-"},
    {"cp.compressed_halo", nullptr, 1, true, "-"},
    {"cp.compressed_blocks", nullptr, 1, true, "-"},
    {"cp.compressed_blocks_grad", nullptr, 0, true, "-"},
    {"cp.compressed_halo_grad", nullptr, 0, true, "-"},
    {"ep.counts", nullptr, 1, true, "-"},
    {"ep.dispatch", nullptr, 1, true, "-"},
    {"ep.combine", nullptr, 1, true, "-"},
    {"ep.combine_backward", nullptr, 0, true, "-"},
    {"ep.dispatch_backward", nullptr, 0, true, "-"},
};

const Rule* find_rule(const par::LedgerEntry& e) {
  // The hierarchical dispatch's two stages run as the flat dispatch does.
  std::string pattern = e.pattern;
  if (pattern.starts_with("ep.inter.") || pattern.starts_with("ep.intra."))
    pattern = "ep." + pattern.substr(9);
  for (const Rule& r : kRules)
    if (pattern == r.pattern && (r.primitive == nullptr || e.primitive == r.primitive)) return &r;
  return nullptr;
}

int data_replicas(const Options& o) {
  return o.dp * o.ep;
}

int world_of(const Options& o) {
  return o.tp * o.cp * o.ep * o.dp * o.pp;
}

// The dense parameters' gradient reduction group: every rank of a stage that
// holds the same TP shard (cp, ep and dp together, contiguous in the mesh).
int reduction_ranks(const Options& o) {
  return o.cp * o.ep * o.dp;
}

double bytes_of(weftDataType_t dtype) {
  return static_cast<double>(par::dtype_bytes(dtype));
}

}  // namespace

int ranks_per_node(const Options& o, const topo::Cluster& cluster, std::string_view dim) {
  std::map<int, int> per_node;
  for (int r : group_ranks(o, dim)) ++per_node[cluster.ranks[r].node];
  const int first = per_node.begin()->second;
  for (const auto& [node, count] : per_node)
    if (count != first) return 0;
  return first;
}

ParameterCounts parameter_counts(const ModelSpec& model) {
  const ModelFlops f = model_flops(model, 1, true);
  return {f.params, f.active};
}

par::ModelConfig ledger_config(const Options& o) {
  par::ModelConfig c;
  const ModelSpec& m = o.model;
  const bool train = o.work == Work::train;
  c.layers = m.layers;
  c.hidden = m.hidden, c.heads = m.heads, c.ffn = m.ffn, c.vocab = m.vocab;
  c.seq = train ? o.seq : o.work == Work::prefill ? o.context : 1;
  c.batch = train ? o.micro_batch : o.batch;
  c.dtype = o.comm;
  // The data-parallel ranks (ep of them share experts) and the CP ranks
  // together reduce the dense gradients (dim "dp" or "dp-cp").
  c.dp = o.ep * o.dp, c.cp = o.cp, c.ep = o.ep, c.tp = o.tp;
  c.sp = o.sp, c.zero = o.zero, c.hsdp = o.hsdp;
  c.kv_heads = m.kv_heads;
  if (o.cp_algo == "affine")
    c.cp_mixer = par::CpMixer::affine;
  else if (o.cp_algo == "compressed")
    c.cp_mixer = par::CpMixer::compressed;
  else
    c.cp_algorithm = par::parse_cp_algorithm(o.cp_algo);
  c.cp_node_ranks = std::max(1, o.cp_node_ranks);
  c.compressed_block = o.cp_block, c.compressed_stride = o.cp_stride;
  c.pp = o.pp, c.pp_rank = 0, c.virtual_stages = o.virtual_stages;
  c.experts = m.experts, c.topk = m.topk, c.ep_sync_free = o.ep_sync_free;
  c.dense_layers = m.dense_layers;
  c.ep_hier = o.ep_dispatch == "hier", c.ep_node_ranks = std::max(1, o.ep_node_ranks);
  c.bucket_bytes = o.bucket_bytes, c.first_bucket_bytes = o.first_bucket_bytes;
  c.steps = 1;
  if (m.arch != "reference") {
    StageParams s = stage_params(m, o.tp, o.ep, o.pp, 0);
    c.param_numels = s.numels, c.param_layers = s.units, c.expert_param_numels = s.expert_numels;
    // Sequence-parallel parameters: the norms (their gradients AllReduced over tp).
    c.sp_numel = static_cast<size_t>(m.layers / o.pp) * 2 * m.hidden + m.hidden;
  }
  return c;
}

std::vector<int> group_ranks(const Options& o, std::string_view dims) {
  const int red = reduction_ranks(o), shard = red / o.hsdp;
  // The ledger's names: "dp-cp" is the whole gradient group (as "dp"),
  // "expert:ep" the EP group, "expert:edp" the ranks holding the same experts.
  if (dims == "dp-cp") dims = "dp";
  if (dims.starts_with("expert:")) dims.remove_prefix(7);
  std::vector<int> ranks{0};
  size_t start = 0;
  while (start <= dims.size()) {
    size_t end = dims.find('-', start);
    if (end == std::string_view::npos) end = dims.size();
    const std::string_view d = dims.substr(start, end - start);
    int stride = 0, size = 1;
    if (d == "tp")
      stride = 1, size = o.tp;
    else if (d == "cp")
      stride = o.tp, size = o.cp;
    else if (d == "cp.node")  // hier: the CP ranks of a node, then one of each node
      stride = o.tp, size = std::max(1, o.cp_node_ranks);
    else if (d == "cp.ring")
      stride = o.tp * std::max(1, o.cp_node_ranks), size = o.cp / std::max(1, o.cp_node_ranks);
    else if (d == "ep")
      stride = o.tp * o.cp, size = o.ep;
    else if (d == "ep.node")  // hierarchical dispatch: the EP ranks of a node
      stride = o.tp * o.cp, size = std::max(1, o.ep_node_ranks);
    else if (d == "edp")
      stride = o.tp * o.cp * o.ep, size = o.dp;
    else if (d == "dp")
      stride = o.tp, size = red;  // the ledger's dp: the reduction group
    else if (d == "dp_shard")
      stride = o.tp, size = shard;
    else if (d == "dp_replicate")
      stride = o.tp * shard, size = o.hsdp;
    else if (d == "pp")
      stride = o.tp * red, size = o.pp;
    std::vector<int> grown;
    for (int i = 0; i < size; ++i)
      for (int base : ranks) grown.push_back(base + i * stride);
    ranks = std::move(grown);
    start = end + 1;
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

struct Predictor::State {
  const topo::Cluster* cluster;
  std::map<std::vector<int>, std::unique_ptr<Tuner>> tuners;  // one per group
  std::map<std::tuple<std::vector<int>, std::string, size_t>, CallPrediction> calls;
};

Predictor::Predictor(const topo::Cluster& cluster) : state_(std::make_unique<State>()) {
  state_->cluster = &cluster;
}
Predictor::~Predictor() = default;

CallPrediction Predictor::predict(const std::vector<int>& ranks, std::string_view primitive,
                                  size_t bytes_per_call, size_t element_bytes) {
  CallPrediction out;
  algo::Collective collective;
  if (!algo::parse_collective(primitive, &collective) || ranks.size() < 2) return out;
  auto [known, added] = state_->calls.try_emplace({ranks, std::string(primitive), bytes_per_call});
  if (!added) return known->second;
  const topo::Cluster& cluster = *state_->cluster;
  std::unique_ptr<Tuner>& tuner = state_->tuners[ranks];
  if (!tuner) {
    topo::Cluster group = cluster;
    group.ranks.clear();
    for (int r : ranks) group.ranks.push_back(cluster.ranks[r]);
    TuneContext context = tune_context(group, false);
    // Reductions and copies run at the device's memory speed when the file
    // gives it (a reduction streams three vectors), else at the host executor's.
    if (cluster.device.memory_gb_s > 0)
      context.memory.bandwidth_gb_s = cluster.device.memory_gb_s / 3;
    tuner = std::make_unique<Tuner>(std::move(context));
  }
  // The communicator plans AllGather and ReduceScatter by their per-rank
  // count, AllToAll by its per-peer count; an AllToAllv of uniform pieces is
  // timed as every peer getting its 1/n of the buffer (the cost model's
  // AllToAllv without counts).
  const uint64_t n = ranks.size();
  const bool per_rank =
      collective == algo::Collective::AllGather || collective == algo::Collective::ReduceScatter ||
      collective == algo::Collective::AllToAll || collective == algo::Collective::AllToAllv;
  tuner->plan(collective, per_rank ? bytes_per_call / n : bytes_per_call, element_bytes);
  out.algorithm = tuner->last_algorithm();
  out.us = tuner->last_predicted_us();
  known->second = out;
  return out;
}

CallPrediction predict_call(const topo::Cluster& cluster, const std::vector<int>& ranks,
                            std::string_view primitive, size_t bytes_per_call,
                            size_t element_bytes) {
  return Predictor(cluster).predict(ranks, primitive, bytes_per_call, element_bytes);
}

double usable_memory(const Options& o, const topo::Cluster& cluster) {
  return cluster.device.memory_gb > 0 ? (cluster.device.memory_gb - o.reserve_gb) * 1e9 : 0;
}

std::string check_reserve(const Options& o, const topo::Cluster& cluster) {
  if (o.reserve_gb < 0 || (o.reserve_gb > 0 && !(o.reserve_gb < cluster.device.memory_gb)))
    return "--reserve-gb=" + num(o.reserve_gb) + " must be at least 0 and below the device's " +
           num(cluster.device.memory_gb) + " GB";
  return "";
}

std::string validate(const Options& o, const topo::Cluster& cluster) {
  const ModelSpec& m = o.model;
  for (auto [name, value] : {std::pair<const char*, int>{"--layers", m.layers},
                             {"--hidden", m.hidden},
                             {"--heads", m.heads},
                             {"--ffn", m.ffn},
                             {"--vocab", m.vocab}})
    if (value <= 0) return std::string(name) + "=" + std::to_string(value) + " must be positive";
  for (auto [name, value] : {std::pair<const char*, int>{"--tp", o.tp},
                             {"--pp", o.pp},
                             {"--cp", o.cp},
                             {"--ep", o.ep},
                             {"--hsdp", o.hsdp},
                             {"--virtual", o.virtual_stages}})
    if (value <= 0) return std::string(name) + "=" + std::to_string(value) + " must be positive";
  if (o.dp < 0) return "--dp=" + std::to_string(o.dp) + " must be positive";
  if (m.hidden % m.heads != 0)
    return "--hidden=" + std::to_string(m.hidden) +
           " does not divide by --heads=" + std::to_string(m.heads);
  const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (m.heads % o.tp != 0)
    return "--tp=" + std::to_string(o.tp) + ": heads=" + std::to_string(m.heads) +
           " do not divide by tp";
  if (kv % o.tp != 0 && o.tp % kv != 0)
    return "--tp=" + std::to_string(o.tp) + ": kv-heads=" + std::to_string(kv) +
           " neither divide by tp nor divide it";
  for (auto [name, value] : {std::pair<const char*, int>{"ffn", m.ffn}, {"vocab", m.vocab}})
    if (value % o.tp != 0)
      return "--tp=" + std::to_string(o.tp) + ": " + name + "=" + std::to_string(value) +
             " does not divide by tp";
  if (m.layers % (o.pp * o.virtual_stages) != 0)
    return "--pp=" + std::to_string(o.pp) + " --virtual=" + std::to_string(o.virtual_stages) +
           ": layers=" + std::to_string(m.layers) +
           " do not divide by pp·virtual=" + std::to_string(o.pp * o.virtual_stages);
  if (o.ep > 1 && m.experts == 0)
    return "--ep=" + std::to_string(o.ep) + ": the model has no experts";
  if (m.experts > 0 && m.experts % o.ep != 0)
    return "--ep=" + std::to_string(o.ep) + ": experts=" + std::to_string(m.experts) +
           " do not divide by ep";
  if (m.experts > 0 && (m.topk <= 0 || m.topk > m.experts))
    return "--topk=" + std::to_string(m.topk) +
           " must be in [1, experts=" + std::to_string(m.experts) + "]";
  if (m.arch == "reference" && m.experts > 0 && o.tp > 1)
    return "--tp=" + std::to_string(o.tp) +
           " with --experts on --arch reference: its MoE "
           "layout is unsharded (tp 1)";
  if (m.arch == "reference" && o.sp && o.pp > 1)
    return "--sp with --pp=" + std::to_string(o.pp) +
           " on --arch reference: its sequence-parallel parameters are the whole model's";
  if (o.ep_sync_free && m.experts == 0) return "--ep-sync-free: the model has no experts";
  if (o.ep_dispatch != "flat" && o.ep_dispatch != "hier")
    return "--ep-dispatch=" + o.ep_dispatch + " is not flat or hier";
  if (o.ep_dispatch == "hier" && o.ep_sync_free)
    return "--ep-dispatch hier with --ep-sync-free: the hierarchical dispatcher exchanges counts";
  if (o.zero < 0 || o.zero > 3) return "--zero=" + std::to_string(o.zero) + " is not 0, 1, 2 or 3";
  if (o.hsdp > 1 && o.zero != 3) return "--hsdp=" + std::to_string(o.hsdp) + " needs --zero 3";
  if (o.sp && o.zero == 3)
    return "--sp with --zero 3: ZeRO-3 frees a unit's gradients before the sequence-parallel "
           "AllReduce (as weft-train)";
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved" &&
      o.schedule != "zb")
    return "--schedule=" + o.schedule + " is not gpipe, 1f1b, interleaved or zb";
  if ((o.virtual_stages > 1) != (o.schedule == "interleaved"))
    return "--virtual=" + std::to_string(o.virtual_stages) +
           ": --schedule interleaved needs --virtual > 1, other schedules --virtual 1";
  if (o.recompute != "none" && o.recompute != "selective" && o.recompute != "full")
    return "--recompute=" + o.recompute + " is not none, selective or full";
  bool known_cp = o.cp_algo == "affine" || o.cp_algo == "compressed";
  for (par::CpAlgorithm a :
       {par::CpAlgorithm::ring, par::CpAlgorithm::zigzag, par::CpAlgorithm::passq,
        par::CpAlgorithm::allgather, par::CpAlgorithm::ulysses, par::CpAlgorithm::hier,
        par::CpAlgorithm::automatic})
    known_cp = known_cp || o.cp_algo == par::cp_algorithm_name(a);
  if (!known_cp)
    return "--cp-algo=" + o.cp_algo +
           " is not ring, zigzag, passq, allgather, ulysses, hier, auto, affine or compressed";
  if (o.cp > 1 && o.cp_algo == "compressed") {
    if (o.work == Work::decode)
      return "--cp-algo compressed: the library's compressed-attention CP has no decode step; "
             "plan it with --train or --prefill";
    if (o.cp_block <= 0 || o.cp_stride <= 0 || o.cp_stride > o.cp_block)
      return "--cp-block=" + std::to_string(o.cp_block) +
             " --cp-stride=" + std::to_string(o.cp_stride) + ": need 0 < stride <= block";
    const bool train = o.work == Work::train;
    const int seq = train ? o.seq : o.context;
    if (seq / o.cp < o.cp_block - 1)
      return "--cp-block=" + std::to_string(o.cp_block) + ": " + (train ? "seq" : "context") +
             "/cp=" + std::to_string(seq / o.cp) + " positions per rank are fewer than the halo " +
             "block-1=" + std::to_string(o.cp_block - 1);
  }
  if (std::string bad = check_reserve(o, cluster); !bad.empty()) return bad;
  if (o.hot_expert_share < 0 || o.hot_expert_share > 1)
    return "--hot-expert=" + num(o.hot_expert_share) + " must be in [0, 1]";
  const int seq = o.work == Work::train ? o.seq : o.context;
  if (seq <= 0)
    return std::string(o.work == Work::train ? "--train" : "--prefill/--decode") +
           ": the sequence (context) length must be positive";
  if (o.work == Work::decode && o.cp > 1) return "--cp with --decode: one token is not sharded";
  const bool zigzag = o.cp_algo == "zigzag";
  if (o.cp > 1 && seq % (zigzag ? 2 * o.cp : o.cp) != 0)
    return "--cp=" + std::to_string(o.cp) + ": seq=" + std::to_string(seq) +
           " does not divide by " + (zigzag ? "2·cp (zigzag)" : "cp");
  if (o.cp > 1 && o.cp_algo == "ulysses" && m.heads % (o.tp * o.cp) != 0)
    return "--cp=" + std::to_string(o.cp) + " --cp-algo ulysses: heads=" + std::to_string(m.heads) +
           " do not divide by tp·cp";
  if (o.cp > 1 && o.cp_algo == "ulysses" && std::max(1, kv / o.tp) % o.cp != 0)
    return "--cp=" + std::to_string(o.cp) + " --cp-algo ulysses: kv-heads per tp rank " +
           std::to_string(std::max(1, kv / o.tp)) + " do not divide by cp";
  const int nranks = static_cast<int>(cluster.ranks.size());
  if (nranks == 0) return "--cluster: the file places no ranks (give \"ranks\" per node)";
  const int others = o.tp * o.cp * o.ep * o.pp;
  if (others > nranks)
    return "--tp/--cp/--ep/--pp: tp·cp·ep·pp=" + std::to_string(others) +
           " is larger than the cluster (" + std::to_string(nranks) + " ranks)";
  if (o.dp == 0 && nranks % others != 0)
    return "--dp: the cluster's " + std::to_string(nranks) +
           " ranks do not divide by tp·cp·ep·pp=" + std::to_string(others);
  const int dp = o.dp > 0 ? o.dp : nranks / others;
  if (others * dp > nranks)
    return "--tp/--cp/--ep/--dp/--pp: the mesh (tp·cp·ep·dp·pp=" + std::to_string(others * dp) +
           " ranks) is larger than the cluster (" + std::to_string(nranks) + " ranks)";
  if (o.cp > 1 && o.cp_algo == "hier") {
    Options resolved = o;
    resolved.dp = dp;
    const int per_node = ranks_per_node(resolved, cluster, "cp");
    if (per_node == 0)
      return "--cp-algo hier: the cluster's nodes hold different numbers of rank 0's cp=" +
             std::to_string(o.cp) + " ranks";
    if ((m.heads / o.tp) % per_node != 0 || std::max(1, kv / o.tp) % per_node != 0)
      return "--cp-algo hier: heads and kv-heads per tp rank (" + std::to_string(m.heads / o.tp) +
             ", " + std::to_string(std::max(1, kv / o.tp)) + ") do not divide by the " +
             std::to_string(per_node) + " cp ranks of a node";
  }
  if (o.ep > 1 && o.ep_dispatch == "hier") {
    Options resolved = o;
    resolved.dp = dp;
    if (ranks_per_node(resolved, cluster, "ep") == 0)
      return "--ep-dispatch hier: the cluster's nodes hold different numbers of rank 0's ep=" +
             std::to_string(o.ep) + " ranks";
  }
  if ((o.cp * o.ep * dp) % o.hsdp != 0)
    return "--hsdp=" + std::to_string(o.hsdp) +
           " does not divide the gradient group cp·ep·dp=" + std::to_string(o.cp * o.ep * dp);
  if (o.work == Work::train) {
    if (o.micro_batch <= 0) return "--train: the micro-batch must be positive";
    const int replicas = dp * o.ep;
    if (o.global_batch <= 0 || o.global_batch % (o.micro_batch * replicas) != 0)
      return "--train: global batch " + std::to_string(o.global_batch) +
             " does not divide by micro-batch·dp·ep=" + std::to_string(o.micro_batch * replicas);
    const int mb = o.global_batch / (o.micro_batch * replicas);
    if (o.microbatches > 0 && o.microbatches != mb)
      return "--microbatches=" + std::to_string(o.microbatches) + " disagrees with global batch/" +
             "(micro-batch·dp·ep)=" + std::to_string(mb);
    if (o.schedule == "interleaved" && mb % o.pp != 0)
      return "--schedule interleaved: micro-batches=" + std::to_string(mb) +
             " do not divide by pp=" + std::to_string(o.pp);
    if (o.sp && (size_t(o.micro_batch) * (seq / o.cp)) % o.tp != 0)
      return "--sp: micro-batch·seq/cp=" + std::to_string(o.micro_batch * (seq / o.cp)) +
             " tokens do not divide by tp=" + std::to_string(o.tp);
  } else if (o.batch <= 0) {
    return "--prefill/--decode: the batch must be positive";
  }
  if (!(cluster.device.tflops > 0))
    return "--cluster: no device.tflops (peak TFLOP/s per device) in the file; give it there or "
           "with --tflops";
  if (o.work == Work::decode && !(cluster.device.memory_gb_s > 0))
    return "--decode: no device.memory_gb_s (memory bandwidth) in the cluster file or "
           "--memory-gbps";
  return "";
}

namespace {

// One call of ledger entry `e` over `ranks`, timed by the tuner. An
// AllToAllv is timed by what leaves the rank: equal pieces to every peer
// whose n − 1 remote ones add up to the call's bytes sent (the flat MoE
// dispatch: its routed rows over n, as an AllToAll of them; the hierarchical
// one's stages: only the rows that cross to other nodes, or ranks). A point-to-point transfer
// (send, sendrecv) of B bytes is timed as the Broadcast of B from rank 0 to its neighbour along the
// dim: one message of B on their link, a pipeline hop or a ring shift (whose opposite direction
// runs at the same time on a full-duplex link). A recv is its send's other
// end, not timed again.
CallPrediction predict_entry(Predictor& predict, const std::vector<int>& ranks,
                             const par::LedgerEntry& e, double element_bytes) {
  const auto element = static_cast<size_t>(element_bytes);
  if (e.primitive == "send" || e.primitive == "sendrecv")
    return predict.predict({ranks[0], ranks[1]}, "broadcast", e.bytes_per_call, element);
  if (e.primitive == "recv") return {"(at send)", 0};
  const size_t n = ranks.size();
  const size_t bytes = e.primitive == "alltoallv" && n > 1 && e.calls > 0
                           ? e.bytes_sent / e.calls / (n - 1) * n
                           : e.bytes_per_call;
  const CallPrediction call = predict.predict(ranks, e.primitive, bytes, element);
  if (call.us < 0 && e.primitive == "alltoallv")
    return predict.predict(ranks, "alltoall", bytes, element);
  return call;
}

}  // namespace

Result plan(const Options& input, const topo::Cluster& cluster, Predictor* predictor,
            double memory_limit) {
  Predictor own(cluster);
  Predictor& predict = predictor != nullptr ? *predictor : own;
  Options o = input;
  Result r;
  const ModelSpec& m = o.model;
  if (o.dp == 0) o.dp = static_cast<int>(cluster.ranks.size()) / (o.tp * o.cp * o.ep * o.pp);
  if (o.cp_algo == "hier" && o.cp_node_ranks == 0)
    o.cp_node_ranks = ranks_per_node(o, cluster, "cp");
  if (o.ep_dispatch == "hier" && o.ep_node_ranks == 0)
    o.ep_node_ranks = ranks_per_node(o, cluster, "ep");
  const bool train = o.work == Work::train;
  r.world = world_of(o), r.dp = o.dp;
  r.layers_per_stage = m.layers / o.pp;
  r.microbatches = train ? o.global_batch / (o.micro_batch * data_replicas(o)) : 1;
  const int mbs = r.microbatches;
  const double seq = train ? o.seq : o.context;
  const double batch = train ? o.micro_batch : o.batch;

  // The closed forms: one micro-batch, one step.
  const par::ModelConfig config = ledger_config(o);
  const par::Ledger ledger = par::Ledger::expected(config);

  // Compute per micro-batch on this rank, at the device's peak.
  const double decode_tokens = o.work == Work::decode ? 1 : seq;
  const ModelFlops flops = model_flops(m, seq, o.work != Work::decode);
  r.params = flops.params, r.active_params = flops.active;
  if (m.experts > 0) {
    const double x = o.hot_expert_share, e = m.experts, local = e / o.ep;
    if (x > 0) r.imbalance = (x + (1 - x) * (local - 1) / (e - 1)) * o.ep;
  }
  const double tokens = batch * decode_tokens;  // one micro-batch of one data replica
  const double peak = cluster.device.tflops * 1e12;
  const double shards = double(o.tp) * o.cp * o.pp;
  const double fwd_s =
      tokens * (flops.dense_flops + flops.expert_flops * r.imbalance) / shards / peak;
  const double passes = train ? (o.recompute == "full" ? 4.0 : 3.0) : 1.0;
  double mb_compute = fwd_s * passes;

  // Memory per rank (the heaviest stage).
  double dense = 0, experts = 0;
  for (int stage = 0; stage < o.pp; ++stage) {
    const StageParams s =
        m.arch == "reference" ? StageParams{} : stage_params(m, o.tp, o.ep, o.pp, stage);
    if (s.dense + s.experts > dense + experts) dense = s.dense, experts = s.experts;
  }
  if (m.arch == "reference")
    for (const par::ParamSpec& p : par::transformer_parameters(config)) dense += double(p.numel);
  r.stage_params = dense + experts;
  const double shard = double(reduction_ranks(o)) / o.hsdp;
  const double expert_shard = shard / o.ep;  // expert-dp: the reduction group over ep
  auto sharded = [&](bool on) {
    return on ? dense / shard + experts / expert_shard : r.stage_params;
  };
  auto memory = [&](bool sp, const std::string& recompute) {
    Memory mem;
    mem.weights = sharded(o.zero == 3) * bytes_of(o.weights);
    if (!train) {
      const double kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
      const double per_token = m.arch == "mla" ? double(m.kv_lora + m.qk_rope)
                                               : 2 * kv_heads * (double(m.hidden) / m.heads) /
                                                     std::min<double>(o.tp, kv_heads);
      mem.kv_cache = per_token * r.layers_per_stage * o.context * o.batch * bytes_of(o.comm);
      return mem;
    }
    mem.grads = sharded(o.zero >= 2) * bytes_of(o.grads);
    // Adam: m and v (fp32, or narrower as DeepSeek-V3's bf16), plus an fp32 master copy
    // when the weights are narrower.
    mem.optimizer =
        sharded(o.zero >= 1) * (2 * bytes_of(o.moments) + (bytes_of(o.weights) < 4 ? 4 : 0));
    // Per layer and micro-batch (Korthikanti et al. 2022, 16-bit activations).
    const double s = seq / o.cp, b = batch, h = m.hidden, a = m.heads, t = o.tp;
    const double sbh = s * b * h, scores = 5 * a * s / h;
    double layer = 0;
    if (recompute == "full")
      layer = sp ? 2 * sbh / t : 2 * sbh;
    else if (sp)
      layer = sbh / t * (34 + (recompute == "none" ? scores : 0));
    else
      layer = sbh * (10 + 24 / t + (recompute == "none" ? scores / t : 0));
    layer *= bytes_of(o.comm) / 2;
    double in_flight = o.schedule == "gpipe" ? mbs : std::min(mbs, o.pp);
    if (o.schedule == "interleaved") in_flight *= 1 + (o.pp - 1.0) / (o.pp * o.virtual_stages);
    mem.activations = layer * r.layers_per_stage * in_flight;
    return mem;
  };
  r.memory = memory(o.sp, o.recompute);
  r.memory_no_sp_recompute = memory(false, "none");
  if (memory_limit > 0 && r.memory.total() > memory_limit) return r;

  // The entries, timed by the tuner on the group's ranks.
  const double layer_calls = double(r.layers_per_stage);
  double window_s[3] = {fwd_s, fwd_s * flops.col_fraction, 2 * fwd_s};  // fwd, wgrad, bwd
  double per_mb_exposed = 0, per_step_exposed = 0;
  std::map<std::string, double> hidden_budget_used;
  std::set<std::string> pp_directions;  // pp.forward, pp.backward: fill and drain counted
  for (const par::LedgerEntry& e : ledger.entries()) {
    const Rule* rule = find_rule(e);
    if (!train && (rule == nullptr || rule->forward == 0)) continue;
    Entry p;
    p.ledger = e;
    if (!train && rule->forward < 1) {  // the forward pass's share of the calls
      const auto calls = static_cast<size_t>(double(e.calls) * rule->forward);
      p.ledger.bytes_sent = e.bytes_sent / e.calls * calls, p.ledger.calls = calls;
    }
    const std::vector<int> ranks = group_ranks(o, e.dim);
    p.group = static_cast<int>(ranks.size());
    p.per_microbatch = rule != nullptr ? rule->per_microbatch : true;
    p.window = rule != nullptr ? rule->window : "-";
    if (rule == nullptr) r.notes.push_back(e.pattern + ": no overlap rule, counted exposed");
    const bool layer_pattern = e.pattern.starts_with("tp.") || e.pattern.starts_with("sp.") ||
                               e.pattern.starts_with("cp.") || e.pattern.starts_with("ep.");
    if (layer_pattern && e.pattern != "tp.embedding" && e.pattern != "sp.embedding" &&
        e.pattern != "tp.cross_entropy" && e.pattern != "tp.sp_grads")
      p.calls_per_layer = double(p.ledger.calls) / layer_calls;
    const size_t repeat = p.per_microbatch ? static_cast<size_t>(mbs) : 1;
    p.ledger.calls *= repeat, p.ledger.bytes_sent *= repeat;
    const CallPrediction call = predict_entry(predict, ranks, e, bytes_of(o.comm));
    p.algorithm = call.algorithm;
    p.call_us = call.us;
    if (call.us < 0)
      r.notes.push_back(e.pattern + " " + e.primitive + ": not modelled by the tuner, not timed");
    p.total_s = std::max(0.0, call.us) * 1e-6 * double(p.ledger.calls);
    r.comm_s += p.total_s;
    const double per_unit = p.total_s / double(repeat);
    if (p.window == "pp") {
      // The fill and the drain: the first micro-batch's activations cross each of the pp − 1
      // links in turn before the last stage starts, the last one's gradients back before
      // the first stage ends (interleaved too: the chunks' later crossings meet a busy
      // rank). A receive waits for its peer's send of the same bytes; a direction's hops
      // are counted once, on its first entry.
      const double hop_us = e.primitive == "recv"
                                ? predict
                                      .predict({ranks[0], ranks[1]}, "broadcast", e.bytes_per_call,
                                               static_cast<size_t>(bytes_of(o.comm)))
                                      .us
                                : call.us;
      if (pp_directions.insert(e.pattern).second) {
        p.exposed_s = (o.pp - 1) * std::max(0.0, hop_us) * 1e-6;
        per_step_exposed += p.exposed_s;
      }
    } else if (p.window != "attn" && p.window != "attn-bwd") {
      // Hideable work hides behind its window (per micro-batch or in the last
      // micro-batch's backward for per-step work), its last call never.
      double exposed = per_unit;
      const int w = p.window == "fwd" ? 0 : p.window == "wgrad" ? 1 : p.window == "bwd" ? 2 : -1;
      if (w >= 0 && train) {
        const double budget = std::max(0.0, window_s[w] - hidden_budget_used[p.window]);
        const double hidden = std::min(per_unit - p.call_us * 1e-6, budget);
        hidden_budget_used[p.window] += std::max(0.0, hidden);
        exposed = per_unit - std::max(0.0, hidden);
      }
      p.exposed_s = exposed * double(repeat);
      (p.per_microbatch ? per_mb_exposed : per_step_exposed) += exposed;
    }
    r.entries.push_back(std::move(p));
  }

  // The CP ring: each step's shifts (of every entry in the window: in backward the K/V
  // and the dK/dV accumulators travel together) run while the rank computes attention on
  // the block it holds, one of the steps + 1 blocks of the layer; what the block does not
  // cover is exposed, shared among the entries by their time.
  if (o.cp > 1) {
    const LayerShape shape = layer_shape(m, 0);
    // The rank's queries over every key, halved by the causal mask (no CP with --decode).
    const double attn_fwd_s = tokens / o.cp * 2 * seq * (double(m.heads) / o.tp) *
                              (shape.attn_qk_dim + shape.attn_v_dim) * 0.5 / peak;
    for (const std::string_view window : {"attn", "attn-bwd"}) {
      double steps = 0, comm_s = 0;  // per layer and micro-batch
      for (const Entry& p : r.entries)
        if (p.window == window) {
          steps = std::max(steps, p.calls_per_layer);
          comm_s += std::max(0.0, p.call_us) * 1e-6 * p.calls_per_layer;
        }
      if (steps == 0 || comm_s == 0) continue;
      const double block_s = (window == "attn" ? 1 : 2) * attn_fwd_s / (steps + 1);
      const double exposed_layer = std::max(0.0, comm_s - steps * block_s);
      for (Entry& p : r.entries)
        if (p.window == window)
          p.exposed_s = exposed_layer * layer_calls * mbs *
                        (std::max(0.0, p.call_us) * 1e-6 * p.calls_per_layer / comm_s);
      per_mb_exposed += exposed_layer * layer_calls;
    }
  }

  if (o.pp > 1)
    r.notes.push_back(
        "pp: the ledger is world rank 0's (stage 0: no forward recv, no backward send); "
        "a send is timed as the tuner's Broadcast to the next stage, its recv not again; "
        "sends are asynchronous, so only the fill's and the drain's pp-1 hops are exposed");
  if (o.cp > 1 && (o.cp_algo == "ring" || o.cp_algo == "zigzag" || o.cp_algo == "passq" ||
                   o.cp_algo == "hier" || o.cp_algo == "auto" || o.cp_algo == "compressed"))
    r.notes.push_back("cp (" + o.cp_algo +
                      "): each sendrecv shift is timed as the tuner's Broadcast of the block from "
                      "rank 0 to its ring neighbour");
  if (o.cp > 1 && (o.cp_algo == "affine" || o.cp_algo == "compressed"))
    r.notes.push_back("cp (" + o.cp_algo +
                      "): its exchange is the library's (fp32 states and blocks); compute and "
                      "memory are planned as softmax attention's");
  if (m.experts > 0 && o.tp > 1)
    r.notes.push_back("ep with tp > 1: the MoE layers book the dense MLP's TP collectives too");
  if (m.experts > 0 && r.imbalance > 1)
    r.notes.push_back("routing skew: hot expert share " + num(o.hot_expert_share) +
                      ", busiest EP rank " + num(r.imbalance) + "x the mean expert tokens");
  if (o.pp > 1)
    r.notes.push_back(
        "stages are taken as balanced; the first holds the embedding, the last "
        "the head (the heaviest one's memory is shown)");

  // The step: micro-batches through the pipeline, then the per-step collectives.
  const double t_mb = mb_compute + per_mb_exposed;
  const double p = o.pp;
  double bubble_units = p - 1;
  if (o.schedule == "interleaved") bubble_units /= o.virtual_stages;
  if (o.schedule == "zb") bubble_units /= 3;  // ZB-H1: a third of 1F1B's bubble
  if (o.work == Work::decode) {
    // One token per sequence: at least the weights and the KV cache stream from memory.
    const double bytes = r.memory.weights + r.memory.kv_cache;
    mb_compute = std::max(mb_compute, bytes / (cluster.device.memory_gb_s * 1e9));
  }
  if (train) {
    r.bubble_s = bubble_units * t_mb;
    r.step_s = mbs * t_mb + r.bubble_s + per_step_exposed;
    r.bubble_fraction = r.bubble_s / (mbs * t_mb + r.bubble_s);
  } else {
    // One batch through every stage.
    r.step_s = p * (mb_compute + per_mb_exposed) + per_step_exposed;
    r.bubble_s = (p - 1) * (mb_compute + per_mb_exposed);
    r.bubble_fraction = (p - 1) / p;
  }
  r.compute_s = mbs * mb_compute;
  r.exposed_s = mbs * per_mb_exposed + per_step_exposed;
  // Model FLOPs (no recomputation) over the cluster's peak for the step.
  const double step_tokens =
      train ? double(o.global_batch) * seq : double(o.batch) * decode_tokens * data_replicas(o);
  const double model = step_tokens * (flops.dense_flops + flops.expert_flops) * (train ? 3 : 1);
  r.mfu = r.step_s > 0 ? model / (r.step_s * r.world * peak) : 0;
  return r;
}

namespace {

// The pipeline schedules the search tries at pp stages: 1F1B; with pp > 1 also zero-bubble
// (ZB-H1) and interleaved 1F1B with 2 chunks per rank when the layers split that finely.
// GPipe is left out: the same bubble as 1F1B with more activations in flight.
std::vector<std::pair<std::string, int>> schedules_for(int pp, int layers) {
  std::vector<std::pair<std::string, int>> out{{"1f1b", 1}};
  if (pp == 1) return out;
  out.push_back({"zb", 1});
  if (layers % (2 * pp) == 0) out.push_back({"interleaved", 2});
  return out;
}

// ZeRO-3 sharding choices: over all the reduction ranks (hsdp 1), or HSDP with each shard
// group inside a node (the node's ranks over tp) and replicas across nodes.
std::vector<int> hsdp_for(int zero, int tp, int reduction, int per_node) {
  std::vector<int> out{1};
  if (zero != 3 || per_node % tp != 0) return out;
  const int shard = std::min(reduction, per_node / tp);
  if (shard >= 1 && reduction % shard == 0 && reduction / shard > 1)
    out.push_back(reduction / shard);
  return out;
}

}  // namespace

std::vector<Candidate> search(const Options& base, const topo::Cluster& cluster) {
  std::vector<Candidate> out;
  Predictor predictor(cluster);
  const int nranks = static_cast<int>(cluster.ranks.size());
  int per_node = 0;
  for (const topo::RankSpec& rank : cluster.ranks) per_node += rank.node == cluster.ranks[0].node;
  const ModelSpec& m = base.model;
  std::vector<int> eps{1};
  for (int e = 2; m.experts > 0 && e <= std::min(m.experts, nranks); e *= 2) eps.push_back(e);
  const int seq = std::max(1, base.work == Work::train ? base.seq : base.context);
  auto add = [&](Options o) {
    Candidate c;
    o.dp = 0, o.microbatches = 0;
    c.options = o;
    if (o.tp > per_node) {
      c.rejected = "tp=" + std::to_string(o.tp) + " crosses nodes (" + std::to_string(per_node) +
                   " ranks per node)";
    } else {
      c.rejected = validate(o, cluster);
    }
    if (c.rejected.empty()) {
      const double limit = usable_memory(o, cluster);
      c.result = plan(o, cluster, &predictor, limit);
      if (limit > 0 && c.result.memory.total() > limit && o.work == Work::train &&
          o.recompute != "full") {
        // Recomputing every layer's activations trades a fourth pass for the memory.
        c.options.recompute = "full";
        c.result = plan(c.options, cluster, &predictor, limit);
      }
      if (limit > 0 && c.result.memory.total() > limit)
        c.rejected = "does not fit: " + num(c.result.memory.total() / 1e9) + " GB per rank > " +
                     num(limit / 1e9) + " GB" +
                     (o.reserve_gb > 0 ? " (" + num(o.reserve_gb) + " GB reserved)" : "") +
                     (c.options.recompute == "full" ? " with full recomputation" : "");
    }
    out.push_back(std::move(c));
  };
  for (int tp = 1; tp <= std::min(nranks, 2 * per_node); tp *= 2)
    for (int cp = 1; cp <= base.cp && tp * cp <= nranks && seq % (2 * cp) == 0; cp *= 2)
      for (int ep : eps)
        for (int pp = 1; pp <= std::min(m.layers, 32) && tp * cp * ep * pp <= nranks; ++pp) {
          if (nranks % (tp * cp * ep * pp) != 0) continue;
          const int reduction = nranks / (tp * pp);  // cp · ep · dp
          for (const auto& [schedule, chunks] : schedules_for(pp, m.layers))
            for (int zero : {0, 1, 2, 3})
              for (int hsdp : hsdp_for(zero, tp, reduction, per_node))
                for (bool sp : {false, true}) {
                  if (sp && (tp == 1 || zero == 3)) continue;
                  Options o = base;
                  o.tp = tp, o.cp = cp, o.ep = ep, o.pp = pp, o.zero = zero, o.sp = sp;
                  o.hsdp = hsdp, o.schedule = schedule, o.virtual_stages = chunks;
                  add(o);
                }
        }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.rejected.empty() != b.rejected.empty()) return a.rejected.empty();
    return a.rejected.empty() && a.result.step_s < b.result.step_s;
  });
  return out;
}

}  // namespace weft::plan
