// The traffic ledger, the reference transformer's parameter list, and the
// closed forms of a step's communication (Ledger::expected).
#include <algorithm>
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
}

const std::vector<LedgerEntry>& Ledger::entries() const {
  return state_->entries;
}

double Ledger::compute_s(std::string_view pattern) const {
  for (const auto& [name, total] : state_->compute)
    if (name == pattern) return total;
  return 0;
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
  auto h = static_cast<size_t>(c.hidden), f = static_cast<size_t>(c.ffn),
       v = static_cast<size_t>(c.vocab), s = static_cast<size_t>(c.seq),
       t = static_cast<size_t>(c.tp);
  std::vector<ParamSpec> specs = {{"embed.token", v / t * h, 0}, {"embed.position", s * h, 0}};
  for (int l = 0; l < c.layers; ++l) {
    std::string p = "layer" + std::to_string(l) + ".";
    int unit = l + 1;
    for (const auto& [name, numel] :
         std::initializer_list<std::pair<const char*, size_t>>{{"ln1.w", h},
                                                               {"ln1.b", h},
                                                               {"qkv.w", 3 * h / t * h},
                                                               {"qkv.b", 3 * h / t},
                                                               {"attn_out.w", h * (h / t)},
                                                               {"attn_out.b", h},
                                                               {"ln2.w", h},
                                                               {"ln2.b", h},
                                                               {"fc1.w", f / t * h},
                                                               {"fc1.b", f / t},
                                                               {"fc2.w", h * (f / t)},
                                                               {"fc2.b", h}})
      specs.push_back({p + name, numel, unit});
  }
  int last = c.layers + 1;
  specs.push_back({"ln_f.w", h, last});
  specs.push_back({"ln_f.b", h, last});
  specs.push_back({"head.w", v / t * h, last});
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

}  // namespace

Ledger Ledger::expected(const ModelConfig& c) {
  Ledger e;
  require(c.steps >= 0, "steps=" + std::to_string(c.steps) + " is negative");
  require(c.dp > 0 && c.hsdp > 0 && c.dp % c.hsdp == 0,
          "hsdp=" + std::to_string(c.hsdp) + " does not divide dp=" + std::to_string(c.dp));
  auto steps = static_cast<size_t>(c.steps);
  std::vector<size_t> numels = c.param_numels;
  std::vector<int> layers = c.param_layers;
  if (numels.empty())
    for (const ParamSpec& spec : transformer_parameters(c)) {
      numels.push_back(spec.numel);
      layers.push_back(spec.layer);
    }
  require(layers.size() == numels.size(), "param_layers has " + std::to_string(layers.size()) +
                                              " entries for " + std::to_string(numels.size()) +
                                              " param_numels");
  size_t esize = dtype_bytes(c.dtype);
  auto L = static_cast<size_t>(c.layers);

  if (c.tp > 1) {
    size_t tokens = static_cast<size_t>(c.batch) * c.seq;
    size_t act = tokens * c.hidden * esize;  // b·s·h·dtype
    if (!c.sp) {
      // Per layer: row linears (attention out, fc2) AllReduce forward; column
      // linears (qkv, fc1) AllReduce dgrad backward; the LM head's too.
      expect(e, "tp.embedding", "allreduce", "tp", c.tp, act, steps);
      expect(e, "tp.reduce_from", "allreduce", "tp", c.tp, act, 2 * L * steps);
      expect(e, "tp.copy_to", "allreduce", "tp", c.tp, act, (2 * L + 1) * steps);
    } else {
      require(tokens % c.tp == 0, "batch·seq=" + std::to_string(tokens) +
                                      " does not divide by tp=" + std::to_string(c.tp) + " (sp)");
      // Each AllReduce becomes a ReduceScatter + AllGather; the column
      // linears re-gather their saved input shard in backward.
      expect(e, "sp.embedding", "reducescatter", "tp", c.tp, act, steps);
      expect(e, "sp.embedding", "allgather", "tp", c.tp, act, steps);
      expect(e, "sp.gather_from", "allgather", "tp", c.tp, act, (2 * L + 1) * steps);
      expect(e, "sp.gather_from", "reducescatter", "tp", c.tp, act, (2 * L + 1) * steps);
      expect(e, "sp.regather", "allgather", "tp", c.tp, act, (2 * L + 1) * steps);
      expect(e, "sp.reduce_scatter_to", "reducescatter", "tp", c.tp, act, 2 * L * steps);
      expect(e, "sp.reduce_scatter_to", "allgather", "tp", c.tp, act, 2 * L * steps);
      size_t sp_numel = c.sp_numel != 0 ? c.sp_numel : sequence_parallel_numel(c);
      expect(e, "tp.sp_grads", "allreduce", "tp", c.tp, sp_numel * sizeof(float), steps);
    }
    expect(e, "tp.cross_entropy", "allreduce", "tp", c.tp, tokens * sizeof(float), 3 * steps);
  }

  int shard = c.dp / c.hsdp;
  std::string shard_dim = c.hsdp > 1 ? "dp_shard" : "dp";
  size_t quantum = std::lcm(static_cast<size_t>(shard), c.pad_multiple);
  auto replicas = [&](size_t shard_elements, size_t calls) {
    if (c.hsdp > 1)
      expect(e, "hsdp.grads", "allreduce", "dp_replicate", c.hsdp, shard_elements * sizeof(float),
             calls);
  };
  if (c.zero == 0) {
    if (c.dp > 1)
      for (const auto& bucket :
           assign_buckets(numels, esize, c.first_bucket_bytes, c.bucket_bytes)) {
        size_t numel = 0;
        for (size_t p : bucket) numel += numels[p];
        expect(e, "dp.bucket", "allreduce", "dp", c.dp, numel * esize, steps);
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
  return e;
}

}  // namespace weft::parallel
