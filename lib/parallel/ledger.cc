// The traffic ledger, the reference transformer's parameter list, and the
// closed forms of a step's communication (Ledger::expected).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <tuple>

#include "parallel/internal.h"

namespace weft::parallel {

using detail::require;

struct Ledger::State {
  std::vector<LedgerEntry> entries;
  std::vector<std::pair<std::string, double>> compute;
  std::vector<std::pair<std::string, double>> notes;
};

Ledger::Ledger() : state_(std::make_unique<State>()) {}
Ledger::~Ledger() = default;
Ledger::Ledger(const Ledger& other) : state_(std::make_unique<State>(*other.state_)) {}
Ledger& Ledger::operator=(const Ledger& other) {
  if (this != &other) *state_ = *other.state_;
  return *this;
}

void Ledger::record(std::string_view pattern, std::string_view primitive, std::string_view dim,
                    size_t bytes_per_call, size_t bytes_sent, std::string_view algorithm,
                    double comm_s, double exposed_s) {
  auto& entries = state_->entries;
  auto it = std::find_if(entries.begin(), entries.end(), [&](const LedgerEntry& e) {
    return e.bytes_per_call == bytes_per_call && e.pattern == pattern && e.primitive == primitive &&
           e.dim == dim;
  });
  if (it == entries.end()) {
    LedgerEntry entry;
    entry.pattern = pattern;
    entry.primitive = primitive;
    entry.dim = dim;
    entry.bytes_per_call = bytes_per_call;
    entries.push_back(std::move(entry));
    it = entries.end() - 1;
  }
  ++it->calls;
  it->bytes_sent += bytes_sent;
  it->algorithm = algorithm;
  it->comm_s += comm_s;
  it->exposed_s += exposed_s;
}

void Ledger::add_compute(std::string_view pattern, double seconds) {
  for (auto& [name, total] : state_->compute)
    if (name == pattern) {
      total += seconds;
      return;
    }
  state_->compute.emplace_back(pattern, seconds);
}

void Ledger::clear() {
  state_->entries.clear();
  state_->compute.clear();
  state_->notes.clear();
}

const std::vector<LedgerEntry>& Ledger::entries() const {
  return state_->entries;
}

double Ledger::compute_s(std::string_view pattern) const {
  for (const auto& [name, total] : state_->compute)
    if (name == pattern) return total;
  return 0;
}

void Ledger::note(std::string_view name, double value) {
  for (auto& [key, stored] : state_->notes)
    if (key == name) {
      stored = value;
      return;
    }
  state_->notes.emplace_back(name, value);
}

double Ledger::noted(std::string_view name) const {
  for (const auto& [key, value] : state_->notes)
    if (key == name) return value;
  return 0;
}

const std::vector<std::pair<std::string, double>>& Ledger::notes() const {
  return state_->notes;
}

namespace {

std::string key_text(const LedgerEntry& e) {
  return e.pattern + " " + e.primitive + " over " + e.dim + " of " +
         std::to_string(e.bytes_per_call) + " B";
}

}  // namespace

std::vector<std::string> Ledger::compare(const Ledger& expected) const {
  std::vector<std::string> differences;
  auto find = [](const Ledger& ledger, const LedgerEntry& e) -> const LedgerEntry* {
    for (const LedgerEntry& other : ledger.entries())
      if (other.bytes_per_call == e.bytes_per_call && other.pattern == e.pattern &&
          other.primitive == e.primitive && other.dim == e.dim)
        return &other;
    return nullptr;
  };
  for (const LedgerEntry& want : expected.entries()) {
    const LedgerEntry* got = find(*this, want);
    if (got == nullptr)
      differences.push_back(key_text(want) + ": " + std::to_string(want.calls) +
                            " calls expected, none made");
    else if (got->calls != want.calls)
      differences.push_back(key_text(want) + ": " + std::to_string(got->calls) + " calls, " +
                            std::to_string(want.calls) + " expected");
  }
  for (const LedgerEntry& got : entries())
    if (find(expected, got) == nullptr)
      differences.push_back(key_text(got) + ": " + std::to_string(got.calls) +
                            " calls, none expected");
  return differences;
}

std::string Ledger::table(const Ledger* expected) const {
  std::string text;
  char line[512];
  snprintf(line, sizeof(line), "# %-22s %-13s %-14s %7s %12s %14s %-9s %10s %10s%s\n", "pattern",
           "primitive", "dim", "calls", "bytes/call", "sent", "algorithm", "comm ms", "exposed ms",
           expected != nullptr ? "   expected calls" : "");
  text += line;
  auto expected_calls = [&](const LedgerEntry& e) -> std::string {
    if (expected == nullptr) return "";
    for (const LedgerEntry& want : expected->entries())
      if (want.bytes_per_call == e.bytes_per_call && want.pattern == e.pattern &&
          want.primitive == e.primitive && want.dim == e.dim)
        return "   " + std::to_string(want.calls);
    return "   (none)";
  };
  for (const LedgerEntry& e : entries()) {
    snprintf(line, sizeof(line), "  %-22s %-13s %-14s %7zu %12zu %14zu %-9s %10.3f %10.3f%s\n",
             e.pattern.c_str(), e.primitive.c_str(), e.dim.c_str(), e.calls, e.bytes_per_call,
             e.bytes_sent, e.algorithm.empty() ? "-" : e.algorithm.c_str(), e.comm_s * 1e3,
             e.exposed_s * 1e3, expected_calls(e).c_str());
    text += line;
  }
  if (expected != nullptr)
    for (const LedgerEntry& want : expected->entries()) {
      bool seen = std::any_of(entries().begin(), entries().end(), [&](const LedgerEntry& e) {
        return e.bytes_per_call == want.bytes_per_call && e.pattern == want.pattern &&
               e.primitive == want.primitive && e.dim == want.dim;
      });
      if (seen) continue;
      snprintf(line, sizeof(line), "  %-22s %-13s %-14s %7d %12zu %14s %-9s %10s %10s   %zu\n",
               want.pattern.c_str(), want.primitive.c_str(), want.dim.c_str(), 0,
               want.bytes_per_call, "-", "-", "-", "-", want.calls);
      text += line;
    }
  return text;
}

// ---------------------------------------------------------------------------

std::vector<ParamSpec> transformer_parameters(const ModelConfig& c) {
  for (auto [name, value] : std::initializer_list<std::pair<const char*, int>>{{"layers", c.layers},
                                                                               {"hidden", c.hidden},
                                                                               {"heads", c.heads},
                                                                               {"ffn", c.ffn},
                                                                               {"vocab", c.vocab},
                                                                               {"seq", c.seq},
                                                                               {"batch", c.batch},
                                                                               {"tp", c.tp}})
    require(value > 0, std::string(name) + "=" + std::to_string(value) + " must be positive");
  require(c.hidden % c.heads == 0, "hidden=" + std::to_string(c.hidden) +
                                       " does not divide by heads=" + std::to_string(c.heads));
  for (auto [name, value] : std::initializer_list<std::pair<const char*, int>>{
           {"hidden", c.hidden}, {"heads", c.heads}, {"ffn", c.ffn}, {"vocab", c.vocab}})
    require(value % c.tp == 0, std::string(name) + "=" + std::to_string(value) +
                                   " does not divide by tp=" + std::to_string(c.tp));
  require(c.experts == 0 || c.tp == 1, "experts=" + std::to_string(c.experts) +
                                           " with tp=" + std::to_string(c.tp) +
                                           ": the MoE layout is unsharded (tp 1)");
  auto h = static_cast<size_t>(c.hidden), f = static_cast<size_t>(c.ffn),
       v = static_cast<size_t>(c.vocab), s = static_cast<size_t>(c.seq),
       t = static_cast<size_t>(c.tp);
  std::vector<ParamSpec> specs = {{"embed.token", v / t * h, 0}, {"embed.position", s * h, 0}};
  for (int l = 0; l < c.layers; ++l) {
    std::string p = "layer" + std::to_string(l) + ".";
    auto add = [&](const char* name, size_t numel) { specs.push_back({p + name, numel, l + 1}); };
    add("ln1.w", h), add("ln1.b", h), add("qkv.w", 3 * h / t * h), add("qkv.b", 3 * h / t);
    add("attn_out.w", h * (h / t)), add("attn_out.b", h), add("ln2.w", h), add("ln2.b", h);
    if (c.experts > 0 && l >= c.dense_layers)
      add("moe.router.w", static_cast<size_t>(c.experts) * h);
    else
      add("fc1.w", f / t * h), add("fc1.b", f / t), add("fc2.w", h * (f / t));
    add("fc2.b", h);
  }
  int last = c.layers + 1;
  specs.push_back({"ln_f.w", h, last});
  specs.push_back({"ln_f.b", h, last});
  specs.push_back({"head.w", v / t * h, last});
  return specs;
}

std::vector<ParamSpec> expert_parameters(const ModelConfig& c) {
  require(c.experts > 0 && c.ep > 0 && c.experts % c.ep == 0,
          "experts=" + std::to_string(c.experts) + " do not divide by ep=" + std::to_string(c.ep));
  const size_t local = static_cast<size_t>(c.experts / c.ep) * c.ffn * c.hidden;
  std::vector<ParamSpec> specs;
  for (int l = c.dense_layers; l < c.layers; ++l) {
    std::string p = "layer" + std::to_string(l) + ".moe.";
    specs.push_back({p + "fc1.w", local, l + 1});
    specs.push_back({p + "fc2.w", local, l + 1});
  }
  return specs;
}

size_t sequence_parallel_numel(const ModelConfig& c) {
  auto h = static_cast<size_t>(c.hidden);
  return static_cast<size_t>(c.seq) * h + static_cast<size_t>(c.layers) * 6 * h + 2 * h;
}

namespace {

// Books `calls` calls of the ring's closed form.
void expect(Ledger& ledger, std::string_view pattern, std::string_view primitive,
            std::string_view dim, int nranks, size_t bytes, size_t calls) {
  for (size_t i = 0; i < calls; ++i)
    ledger.record(pattern, primitive, dim, bytes,
                  detail::bytes_sent(primitive, "ring", nranks, bytes), "", 0, 0);
}

size_t round_up(size_t value, size_t quantum) {
  return (value + quantum - 1) / quantum * quantum;
}

// Whether pipeline rank c.pp_rank holds stage-3 unit `unit` (0: embeddings,
// 1 + l: layer l, layers + 1: the head): chunk c of rank r is stage c·pp + r.
bool stage_holds(const ModelConfig& c, int unit) {
  const int per = c.layers / (c.pp * c.virtual_stages);
  if (unit == 0) return c.pp_rank == 0;
  if (unit == c.layers + 1) return c.pp_rank == c.pp - 1;
  return ((unit - 1) / per) % c.pp == c.pp_rank;
}

// MoE layers (experts > 0, DP bucketing): per layer and micro-batch the
// count AllGather and four AllToAllv over the EP group (bytes per call: the
// routed rows T·k·h·dtype; sent under uniform routing T·k·(1 − 1/ep)·h·dtype),
// and per step the expert parameters' buckets AllReduced over expert-DP only.
void expect_moe(Ledger& e, const ModelConfig& c, size_t micro,
                const std::vector<size_t>& expert_numels) {
  if (c.experts == 0) return;
  size_t L = 0;  // this pipeline rank's MoE layers
  for (int l = c.dense_layers; l < c.layers; ++l) L += stage_holds(c, l + 1) ? 1 : 0;
  require(c.ep > 0 && c.dp % c.ep == 0,
          "ep=" + std::to_string(c.ep) + " does not divide dp=" + std::to_string(c.dp));
  size_t esize = dtype_bytes(c.dtype), ep = static_cast<size_t>(c.ep);
  // Each CP rank routes the tokens of its own positions.
  size_t rows = static_cast<size_t>(c.batch / c.microbatches) * (c.seq / std::max(c.cp, 1)) *
                static_cast<size_t>(c.topk),
         row = c.hidden * esize;
  // One count AllGather and four AllToAllv of `rows` routed rows over `group`
  // ranks; `remote` of the rows leave the rank.
  auto stage = [&](const std::string& prefix, const std::string& dim, size_t group, size_t experts,
                   size_t stage_rows, double remote, bool counts) {
    if (counts)
      expect(e, prefix + ".counts", "allgather", dim, static_cast<int>(group),
             group * (experts + group) * sizeof(uint64_t), L * micro);
    for (const char* pass : {".dispatch", ".combine", ".combine_backward", ".dispatch_backward"})
      for (size_t i = 0; i < L * micro; ++i)
        e.record(prefix + pass, "alltoallv", dim, stage_rows * row,
                 static_cast<size_t>(remote * double(row)), "", 0, 0);
  };
  if (ep > 1 && !c.ep_hier) {
    stage("ep", "expert:ep", ep, size_t(c.experts), rows, double(rows * (ep - 1) / ep),
          !c.ep_sync_free);
  } else if (ep > 1) {
    // HierMoeDispatcher: a token goes once to each node its k slots reach, and
    // the proxy there (the rank at the source's node position) sends it once to
    // each other rank of the node that one of its slots names. Under uniform
    // routing a token misses a set of `own` experts with probability
    // C(E − own, k)/C(E, k) (0 when fewer than k experts lie outside it).
    auto l = static_cast<size_t>(c.ep_node_ranks), nodes = ep / l;
    auto experts = static_cast<size_t>(c.experts), k = static_cast<size_t>(c.topk);
    auto miss = [&](size_t own) {
      double p = 1;
      for (size_t j = 0; j < k; ++j)
        p *= j + own < experts ? double(experts - own - j) / double(experts - j) : 0;
      return p;
    };
    const double tokens = double(rows / k), reach = 1 - miss(experts / nodes);
    stage("ep.inter", "expert:ep", ep, experts, rows, tokens * double(nodes - 1) * reach, true);
    // The proxy's buffer: the tokens of its N sources that reach the node, k slots each.
    const auto proxy = static_cast<size_t>(std::llround(tokens * double(nodes) * reach));
    if (l > 1)
      stage("ep.intra", "expert:ep.node", l, experts / nodes, proxy * k,
            tokens * double(nodes) * double(l - 1) * (1 - miss(experts / ep)), true);
  }
  int edp = c.dp / c.ep;
  if (edp > 1)
    for (const auto& bucket :
         assign_buckets(expert_numels, esize, c.first_bucket_bytes, c.bucket_bytes)) {
      size_t numel = 0;
      for (size_t p : bucket) numel += expert_numels[p];
      expect(e, "dp.bucket", "allreduce", "expert:edp", edp, numel * esize,
             static_cast<size_t>(c.steps));
    }
}

// The affine-state and compressed recurrences over cp (c.cp_mixer): per
// layer and micro-batch their own closed forms (fp32, as their kernels).
void expect_cp_recurrence(Ledger& ledger, const ModelConfig& c, const AttentionShape& shape,
                          size_t calls) {
  for (size_t i = 0; i < calls; ++i) {
    if (c.cp_mixer == CpMixer::affine) {
      AffineShape affine{shape.batch, shape.heads, shape.head_dim, shape.head_dim};
      add_affine_cp_expected(ledger, affine, c.cp, true);
    } else {
      CompressedConfig compressed;
      compressed.seq = static_cast<size_t>(c.seq);
      compressed.block = static_cast<size_t>(c.compressed_block);
      compressed.stride = static_cast<size_t>(c.compressed_stride);
      add_compressed_cp_expected(ledger, shape, compressed, c.cp, c.cp_rank, true);
    }
  }
}

// Context-parallel attention (cp > 1): per layer and micro-batch the calls
// listed at ContextParallelAttention, on blocks of seq/cp · batch rows of
// hidden/heads-wide heads, heads/tp of them for Q and the output, kv_heads/tp
// for K and V (fp32 in the library's kernels; c.dtype's size is what a
// planned run in another dtype moves), and log-sum-exp rows of fp32.
void expect_cp(Ledger& ledger, const ModelConfig& c, size_t L, size_t micro) {
  if (c.cp <= 1) return;
  const int kv_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
  require(c.seq % c.cp == 0 && c.heads % c.tp == 0 && c.hidden % c.tp == 0,
          "seq=" + std::to_string(c.seq) + ", heads=" + std::to_string(c.heads) +
              ", hidden=" + std::to_string(c.hidden) +
              " must divide by cp=" + std::to_string(c.cp) + " and tp=" + std::to_string(c.tp));
  require(c.heads % kv_heads == 0 && (kv_heads % c.tp == 0 || c.tp % kv_heads == 0),
          "kv_heads=" + std::to_string(kv_heads) + " must divide heads=" + std::to_string(c.heads) +
              " and divide by or divide tp=" + std::to_string(c.tp));
  auto p = static_cast<size_t>(c.cp);
  AttentionShape shape;
  shape.batch = static_cast<size_t>(c.batch / c.microbatches);
  shape.heads = static_cast<size_t>(c.heads / c.tp);
  shape.kv_heads = static_cast<size_t>(std::max(1, kv_heads / c.tp));
  shape.head_dim = static_cast<size_t>(c.hidden / c.heads);
  if (c.cp_mixer != CpMixer::attention) return expect_cp_recurrence(ledger, c, shape, L * micro);
  size_t rows = static_cast<size_t>(c.seq) / p * shape.batch;
  size_t block = rows * shape.heads * shape.head_dim * dtype_bytes(c.dtype),
         kv_block = rows * shape.kv_heads * shape.head_dim * dtype_bytes(c.dtype),
         lse = rows * shape.heads * sizeof(float);
  CpAlgorithm algorithm = c.cp_algorithm;
  if (algorithm == CpAlgorithm::automatic)  // without a KV cache, as the attention resolves it
    algorithm = choose_cp_algorithm(shape, static_cast<size_t>(c.seq), 0, c.cp);
  auto book = [&](std::string_view pattern, std::string_view primitive, size_t bytes, size_t calls,
                  std::string_view dim = "cp", size_t group = 0) {
    if (group == 0) group = p;
    size_t sent = primitive == "alltoall" ? bytes / group * (group - 1)
                                          : detail::bytes_sent(primitive, "ring", c.cp, bytes);
    for (size_t i = 0; i < calls * L * micro; ++i)
      ledger.record(pattern, primitive, dim, bytes, sent, "", 0, 0);
  };
  switch (algorithm) {
    case CpAlgorithm::passq:
      book("cp.passq_q", "sendrecv", block, p - 1);
      book("cp.passq_out", "alltoall", p * (block + lse), 1);
      book("cp.passq_bwd", "sendrecv", 2 * block + 2 * lse, p - 1);
      book("cp.passq_dq", "alltoall", p * block, 1);
      break;
    case CpAlgorithm::allgather:
      book("cp.allgather_kv", "allgather", p * 2 * kv_block, 1);
      book("cp.allgather_kv_bwd", "allgather", p * 2 * kv_block, 1);
      book("cp.allgather_dkv", "reducescatter", p * 2 * kv_block, 1);
      break;
    case CpAlgorithm::ulysses:
      // q, k, v and the output forward; dout, dq, dk and dv backward.
      book("cp.ulysses", "alltoall", block, 4);
      book("cp.ulysses", "alltoall", kv_block, 4);
      break;
    case CpAlgorithm::hier: {
      // Ulysses over the L ranks of a node, then a ring over the P/L nodes
      // of k|v blocks with the node's rows and 1/L of the heads: 2·kv_block.
      auto l = static_cast<size_t>(c.cp_node_ranks), nodes = p / l;
      if (l > 1) {
        book("cp.ulysses", "alltoall", block, 4, "cp.node", l);
        book("cp.ulysses", "alltoall", kv_block, 4, "cp.node", l);
      }
      for (const char* pattern : {"cp.ring_kv", "cp.ring_kv_bwd", "cp.ring_dkv"})
        if (nodes > 1) book(pattern, "sendrecv", 2 * kv_block, nodes - 1, "cp.ring");
      break;
    }
    default:  // ring and zigzag: (cp − 1) k|v shifts forward, twice that backward
      book("cp.ring_kv", "sendrecv", 2 * kv_block, p - 1);
      book("cp.ring_kv_bwd", "sendrecv", 2 * kv_block, p - 1);
      book("cp.ring_dkv", "sendrecv", 2 * kv_block, p - 1);
      break;
  }
}

}  // namespace

Ledger Ledger::expected(const ModelConfig& c) {
  Ledger e;
  require(c.steps >= 0, "steps=" + std::to_string(c.steps) + " is negative");
  require(c.dp > 0 && c.hsdp > 0 && c.dp % c.hsdp == 0,
          "hsdp=" + std::to_string(c.hsdp) + " does not divide dp=" + std::to_string(c.dp));
  auto steps = static_cast<size_t>(c.steps);
  require(c.pp > 0 && c.virtual_stages > 0 && c.microbatches > 0 && c.batch % c.microbatches == 0 &&
              c.layers % (c.pp * c.virtual_stages) == 0,
          "pp=" + std::to_string(c.pp) + ", virtual_stages=" + std::to_string(c.virtual_stages) +
              ", microbatches=" + std::to_string(c.microbatches) +
              ": layers must divide by pp·virtual_stages, batch by microbatches");
  require(c.pp_rank >= 0 && c.pp_rank < c.pp,
          "pp_rank=" + std::to_string(c.pp_rank) + " is outside pp=" + std::to_string(c.pp));
  // SP and ZeRO are booked once per step: with one micro-batch that is per micro-batch too.
  require(c.microbatches == 1 || (!c.sp && c.zero == 0),
          "microbatches=" + std::to_string(c.microbatches) + " supports neither sp nor zero");
  require(!c.sp || c.pp == 1 || c.sp_numel != 0,
          "sp with pp=" + std::to_string(c.pp) + " needs sp_numel (this stage's)");
  std::vector<size_t> numels = c.param_numels, expert_numels = c.expert_param_numels;
  std::vector<int> layers = c.param_layers;
  if (numels.empty()) {
    for (const ParamSpec& spec : transformer_parameters(c))
      if (stage_holds(c, spec.layer)) {
        numels.push_back(spec.numel);
        layers.push_back(spec.layer);
      }
    if (c.experts > 0 && expert_numels.empty())
      for (const ParamSpec& spec : expert_parameters(c))
        if (stage_holds(c, spec.layer)) expert_numels.push_back(spec.numel);
  }
  require(layers.size() == numels.size(), "param_layers has " + std::to_string(layers.size()) +
                                              " entries for " + std::to_string(numels.size()) +
                                              " param_numels");
  size_t esize = dtype_bytes(c.dtype);
  // A pipeline rank runs its layers once per micro-batch; the embedding is
  // on the first stage, the LM head and the loss on the last.
  auto L = static_cast<size_t>(c.layers / c.pp);
  const size_t micro = static_cast<size_t>(c.microbatches) * steps;
  const size_t first = c.pp_rank == 0 ? 1 : 0, last = c.pp_rank == c.pp - 1 ? 1 : 0;

  if (c.tp > 1) {
    // Per micro-batch; each CP rank holds seq/cp positions of its batch.
    size_t tokens = static_cast<size_t>(c.batch / c.microbatches) * c.seq / std::max(c.cp, 1);
    size_t act = tokens * c.hidden * esize;  // b·s·h·dtype
    if (!c.sp) {
      // Per layer: row linears (attention out, fc2) AllReduce forward; column
      // linears (qkv, fc1) AllReduce dgrad backward; the LM head's too.
      expect(e, "tp.embedding", "allreduce", "tp", c.tp, act, first * micro);
      expect(e, "tp.reduce_from", "allreduce", "tp", c.tp, act, 2 * L * micro);
      expect(e, "tp.copy_to", "allreduce", "tp", c.tp, act, (2 * L + last) * micro);
    } else {
      require(tokens % c.tp == 0, "batch·seq=" + std::to_string(tokens) +
                                      " does not divide by tp=" + std::to_string(c.tp) + " (sp)");
      // Each AllReduce becomes a ReduceScatter + AllGather; the column
      // linears re-gather their saved input shard in backward.
      expect(e, "sp.embedding", "reducescatter", "tp", c.tp, act, first * micro);
      expect(e, "sp.embedding", "allgather", "tp", c.tp, act, first * micro);
      expect(e, "sp.gather_from", "allgather", "tp", c.tp, act, (2 * L + last) * micro);
      expect(e, "sp.gather_from", "reducescatter", "tp", c.tp, act, (2 * L + last) * micro);
      expect(e, "sp.regather", "allgather", "tp", c.tp, act, (2 * L + last) * micro);
      expect(e, "sp.reduce_scatter_to", "reducescatter", "tp", c.tp, act, 2 * L * micro);
      expect(e, "sp.reduce_scatter_to", "allgather", "tp", c.tp, act, 2 * L * micro);
      size_t sp_numel = c.sp_numel != 0 ? c.sp_numel : sequence_parallel_numel(c);
      expect(e, "tp.sp_grads", "allreduce", "tp", c.tp, sp_numel * sizeof(float), steps);
    }
    expect(e, "tp.cross_entropy", "allreduce", "tp", c.tp, tokens * sizeof(float),
           3 * last * micro);
  }
  if (c.pp > 1) {
    PipelineOptions pipeline;
    pipeline.microbatches = c.microbatches, pipeline.virtual_stages = c.virtual_stages;
    // expected_pipeline counts fp32 elements; scaled so that the bytes are c.dtype's.
    pipeline.activation_numel =
        static_cast<size_t>(c.batch / c.microbatches) * c.seq * c.hidden * esize / sizeof(float);
    expected_pipeline(pipeline, c.pp, c.pp_rank, "pp", c.steps, e);
  }

  // With CP the data-parallel reductions run over dp-cp (every rank of it
  // holds a sequence shard's partial gradients).
  std::string dp_dim = c.cp > 1 ? "dp-cp" : "dp";
  int dp_size = c.dp * std::max(c.cp, 1);
  int shard = dp_size / c.hsdp;
  std::string shard_dim = c.hsdp > 1 ? "dp_shard" : dp_dim;
  size_t quantum = std::lcm(static_cast<size_t>(shard), c.pad_multiple);
  auto replicas = [&](size_t shard_elements, size_t calls) {
    if (c.hsdp > 1)
      expect(e, "hsdp.grads", "allreduce", "dp_replicate", c.hsdp, shard_elements * sizeof(float),
             calls);
  };
  if (c.zero == 0) {
    if (dp_size > 1)
      for (const auto& bucket :
           assign_buckets(numels, esize, c.first_bucket_bytes, c.bucket_bytes)) {
        size_t numel = 0;
        for (size_t p : bucket) numel += numels[p];
        expect(e, "dp.bucket", "allreduce", dp_dim, dp_size, numel * esize, steps);
      }
  } else if (c.zero == 1 || c.zero == 2) {
    std::vector<size_t> padded;
    if (c.zero == 1)
      padded.push_back(round_up(std::accumulate(numels.begin(), numels.end(), size_t{0}), quantum));
    else
      for (const auto& bucket :
           assign_buckets(numels, sizeof(float), c.bucket_bytes, c.bucket_bytes)) {
        size_t numel = 0;
        for (size_t p : bucket) numel += numels[p];
        padded.push_back(round_up(numel, quantum));
      }
    std::string prefix = "zero" + std::to_string(c.zero);
    size_t total = std::accumulate(padded.begin(), padded.end(), size_t{0});
    if (shard > 1) {
      for (size_t bucket : padded)
        expect(e, prefix + ".grads", "reducescatter", shard_dim, shard, bucket * sizeof(float),
               steps);
      expect(e, prefix + ".params", "allgather", shard_dim, shard, total * sizeof(float), steps);
    }
    replicas(total / shard, steps);
  } else {
    require(c.zero == 3, "zero=" + std::to_string(c.zero) + " is not 0, 1, 2 or 3");
    for (size_t p = 0; p < numels.size();) {
      size_t numel = 0, q = p;
      for (; q < numels.size() && layers[q] == layers[p]; ++q) numel += numels[q];
      size_t bytes = round_up(numel, quantum) * sizeof(float);
      if (shard > 1) {
        expect(e, "zero3.gather_fwd", "allgather", shard_dim, shard, bytes, steps);
        expect(e, "zero3.gather_bwd", "allgather", shard_dim, shard, bytes, steps);
        expect(e, "zero3.grads", "reducescatter", shard_dim, shard, bytes, steps);
      }
      replicas(round_up(numel, quantum) / shard, steps);
      p = q;
    }
  }
  expect_cp(e, c, L, micro);
  expect_moe(e, c, micro, expert_numels);
  return e;
}

}  // namespace weft::parallel
