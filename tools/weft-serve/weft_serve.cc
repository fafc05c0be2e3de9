// weft-serve: disaggregated greedy decoding of weft-train's model. The first
// --prefill-tp ranks prefill each prompt (tensor parallel), hand its paged KV
// cache to the last --decode-tp ranks layer by layer (weft::parallel::KvTransfer,
// heads resharded between the two TP sizes) and the first generated token;
// the decode ranks then generate the rest. Decode rank 0 checks the tokens
// against the same model run in one process (prefill and decode together, no
// transfer), the received caches against that run's, and the transfer's
// ledger against its closed form, and prints "# weft-serve: PASS" (or FAIL).
//
//   weftrun -n 3 weft-serve --prefill-tp 2 --decode-tp 1
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "model.h"
#include "weft/parallel.hpp"

namespace {

namespace par = weft::parallel;
using weft::train::Config;

struct Options {
  Config model;
  int prefill_tp = 1, decode_tp = 1;
  int prompt = 13, generate = 8, sequences = 2, page_tokens = 4;
  bool perturb_kv = false;  // corrupt one received value: the check must FAIL
};

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr,
               "weft-serve: %s\n"
               "usage: weftrun -n P+D weft-serve --prefill-tp P --decode-tp D [--prompt N]\n"
               "  [--generate G] [--sequences S] [--page-tokens T] [--layers L] [--hidden H]\n"
               "  [--heads A] [--ffn F] [--vocab V] [--seed N] [--perturb-kv]\n",
               message.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  o.model.heads = 4;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--perturb-kv") {
      o.perturb_kv = true;
      continue;
    }
    if (i + 1 >= argc) usage(a + " needs a value");
    char* end = nullptr;
    long v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || v < 0 || v > 1 << 20) usage(a + "=" + argv[i] + " is not a count");
    int n = int(v);
    if (a == "--prefill-tp")
      o.prefill_tp = n;
    else if (a == "--decode-tp")
      o.decode_tp = n;
    else if (a == "--prompt")
      o.prompt = n;
    else if (a == "--generate")
      o.generate = n;
    else if (a == "--sequences")
      o.sequences = n;
    else if (a == "--page-tokens")
      o.page_tokens = n;
    else if (a == "--layers")
      o.model.layers = n;
    else if (a == "--hidden")
      o.model.hidden = n;
    else if (a == "--heads")
      o.model.heads = n;
    else if (a == "--ffn")
      o.model.ffn = n;
    else if (a == "--vocab")
      o.model.vocab = n;
    else if (a == "--seed")
      o.model.seed = uint64_t(n);
    else
      usage("unknown option " + a);
  }
  for (auto [name, v] : {std::pair{"--prefill-tp", o.prefill_tp},
                         {"--decode-tp", o.decode_tp},
                         {"--prompt", o.prompt},
                         {"--generate", o.generate},
                         {"--sequences", o.sequences},
                         {"--page-tokens", o.page_tokens},
                         {"--layers", o.model.layers},
                         {"--heads", o.model.heads}})
    if (v < 1) usage(std::string(name) + "=" + std::to_string(v) + " must be at least 1");
  if (o.model.hidden % o.model.heads != 0)
    usage("--hidden=" + std::to_string(o.model.hidden) + " does not divide by --heads");
  for (int tp : {o.prefill_tp, o.decode_tp})
    if (o.model.heads % tp != 0 || o.model.ffn % tp != 0)
      usage("--heads=" + std::to_string(o.model.heads) + " and --ffn=" +
            std::to_string(o.model.ffn) + " must divide by the TP size " + std::to_string(tp));
  o.model.seq = o.prompt + o.generate;  // the position table's length
  o.model.batch = 1;
  return o;
}

int32_t prompt_token(const Options& o, int sequence, int t) {
  uint64_t z = (o.model.seed * 1000003 + uint64_t(sequence)) * 0x9e3779b97f4a7c15ull + uint64_t(t);
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return int32_t((z ^ (z >> 29)) % uint64_t(o.model.vocab));
}

// One TP rank's share of the model and its forward over new positions, with
// the keys and values of every position kept in a paged cache.
class Shard {
 public:
  Shard(const Options& o, const par::Axis& tp) : o_(o), c_(o.model), tp_(tp) {
    const int tps = tp.size(), r = tp.rank();
    auto specs = weft::train::param_specs(c_);
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> full = weft::train::init_param(c_, specs[i], i);
      const auto& s = specs[i];
      std::vector<float> mine;
      const bool in_layer = s.unit >= 1 && s.unit <= c_.layers;
      if (in_layer && s.split == weft::train::Split::kRows) {
        size_t rows = size_t(s.rows) / tps;
        mine.assign(full.begin() + r * rows * s.cols, full.begin() + (r + 1) * rows * s.cols);
      } else if (in_layer && s.split == weft::train::Split::kCols) {
        size_t cols = size_t(s.cols) / tps;
        for (int row = 0; row < s.rows; ++row)
          mine.insert(mine.end(), full.begin() + row * s.cols + r * cols,
                      full.begin() + row * s.cols + (r + 1) * cols);
      } else {
        mine = std::move(full);  // replicated (the embeddings and LM head too)
      }
      params_.push_back(std::move(mine));
    }
    for (int l = 0; l < c_.layers; ++l) {
      qkv_.emplace_back(tp, c_.hidden, 3 * c_.hidden);
      out_.emplace_back(tp, c_.hidden, c_.hidden);
      fc1_.emplace_back(tp, c_.hidden, c_.ffn);
      fc2_.emplace_back(tp, c_.ffn, c_.hidden);
    }
  }

  par::KvCacheShape cache_shape() const {
    return {c_.layers, c_.heads, c_.head_dim(), o_.page_tokens};
  }
  size_t pages_of(int positions) const {
    return size_t((positions + o_.page_tokens - 1) / o_.page_tokens);
  }

  // Positions [t0, t0 + tokens.size()) of the sequence whose pages are
  // `table` in `cache`; returns the logits of the last one. layer_ready(l)
  // runs before layer l reads the cache; layer_done(l) after it wrote it.
  template <typename Ready, typename Done>
  std::vector<float> forward(const std::vector<int32_t>& tokens, int t0, par::PagedKvCache& cache,
                             const std::vector<size_t>& table, Ready layer_ready, Done layer_done) {
    const int n = int(tokens.size()), h = c_.hidden, dh = c_.head_dim();
    const int heads = c_.heads / tp_.size();
    std::vector<float> x(size_t(n) * h);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < h; ++j)
        x[size_t(i) * h + j] = p(weft::train::kWte)[size_t(tokens[i]) * h + j] +
                               p(weft::train::kWpe)[size_t(t0 + i) * h + j];
    std::vector<float> a(x.size()), mean(n), rstd(n), qkv(size_t(n) * 3 * dh * heads),
        att(size_t(n) * dh * heads), y(x.size()), u(size_t(n) * c_.ffn / tp_.size()), g(u.size());
    using namespace weft::train;
    for (int l = 0; l < c_.layers; ++l) {
      auto w = [&](size_t which) { return std::span<const float>(params_[layer_param(l, which)]); };
      layernorm(n, h, x.data(), w(kLn1W).data(), w(kLn1B).data(), a.data(), mean.data(),
                rstd.data());
      qkv_[l].forward(a, size_t(n), w(kQkvW), w(kQkvB), qkv);
      layer_ready(l);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < heads; ++j) {
          const int t = t0 + i;
          const float* row = qkv.data() + size_t(i) * 3 * dh * heads + size_t(j) * 3 * dh;
          size_t page = table[size_t(t / o_.page_tokens)];
          std::copy(row + dh, row + 2 * dh, cache.key(l, page, j, t % o_.page_tokens).begin());
          std::copy(row + 2 * dh, row + 3 * dh,
                    cache.value(l, page, j, t % o_.page_tokens).begin());
        }
      layer_done(l);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < heads; ++j)
          attend(cache, l, table, j, t0 + i,
                 qkv.data() + size_t(i) * 3 * dh * heads + size_t(j) * 3 * dh,
                 att.data() + size_t(i) * dh * heads + size_t(j) * dh);
      out_[l].forward(att, size_t(n), w(kOutW), w(kOutB), y);
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
      layernorm(n, h, x.data(), w(kLn2W).data(), w(kLn2B).data(), a.data(), mean.data(),
                rstd.data());
      fc1_[l].forward(a, size_t(n), w(kFc1W), w(kFc1B), u);
      gelu(u.size(), u.data(), g.data());
      fc2_[l].forward(g, size_t(n), w(kFc2W), w(kFc2B), y);
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
    const float* last = x.data() + size_t(n - 1) * h;
    std::vector<float> lnf(h), logits(c_.vocab);
    float m = 0, s = 0;
    layernorm(1, h, last, p(head_param(c_, kLnfW)).data(), p(head_param(c_, kLnfB)).data(),
              lnf.data(), &m, &s);
    linear(1, h, c_.vocab, lnf.data(), p(head_param(c_, kLmW)).data(), nullptr, logits.data());
    return logits;
  }

 private:
  const std::vector<float>& p(size_t index) const { return params_[index]; }

  // Softmax attention of one query (local head j at position t) over the
  // cached positions 0..t, in position order.
  void attend(const par::PagedKvCache& cache, int l, const std::vector<size_t>& table, int j, int t,
              const float* q, float* out) const {
    const int dh = c_.head_dim(), pt = o_.page_tokens;
    const float scale = 1.0f / std::sqrt(float(dh));
    std::vector<float> score(size_t(t) + 1);
    float top = -INFINITY;
    for (int s = 0; s <= t; ++s) {
      auto k = cache.key(l, table[size_t(s / pt)], j, s % pt);
      float dot = 0;
      for (int d = 0; d < dh; ++d) dot += q[d] * k[d];
      score[s] = dot * scale;
      top = std::max(top, score[s]);
    }
    float sum = 0;
    for (float& v : score) sum += v = std::exp(v - top);
    std::fill(out, out + dh, 0.0f);
    for (int s = 0; s <= t; ++s) {
      auto v = cache.value(l, table[size_t(s / pt)], j, s % pt);
      for (int d = 0; d < dh; ++d) out[d] += score[s] / sum * v[d];
    }
  }

  const Options& o_;
  Config c_;
  const par::Axis& tp_;
  std::vector<std::vector<float>> params_;
  // The layers keep no parameters, only their shapes and the saved input.
  std::deque<par::ColumnParallelLinear> qkv_, fc1_;
  std::deque<par::RowParallelLinear> out_, fc2_;
};

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// A block table: the sequence's pages, taken from the end of the cache so
// that sender and receiver pages differ.
std::vector<size_t> block_table(size_t pages, size_t cache_pages, int side) {
  std::vector<size_t> table;
  for (size_t i = 0; i < pages; ++i) table.push_back(side == 0 ? i : cache_pages - 1 - i);
  return table;
}

auto nothing = [](int) {};

struct Reference {
  std::vector<int32_t> tokens;
  par::PagedKvCache cache;
  std::vector<size_t> table;
};

// The same model in one process: prefill and decode on one cache.
Reference reference(const Options& o, const par::Axis& solo, int sequence) {
  Shard model(o, solo);
  const size_t pages = model.pages_of(o.prompt + o.generate);
  Reference r{
      {}, par::PagedKvCache(model.cache_shape(), 1, 0, pages), block_table(pages, pages, 0)};
  std::vector<int32_t> prompt;
  for (int t = 0; t < o.prompt; ++t) prompt.push_back(prompt_token(o, sequence, t));
  int32_t next = argmax(model.forward(prompt, 0, r.cache, r.table, nothing, nothing));
  for (int g = 0; g < o.generate; ++g) {
    r.tokens.push_back(next);
    if (g + 1 < o.generate)
      next = argmax(model.forward({next}, o.prompt + g, r.cache, r.table, nothing, nothing));
  }
  return r;
}

int run(const Options& o) {
  weft::Comm world = weft::Comm::from_env();
  const int P = o.prefill_tp, D = o.decode_tp, rank = world.rank();
  if (world.size() != P + D)
    usage("the run has " + std::to_string(world.size()) +
          " ranks; --prefill-tp + --decode-tp = " + std::to_string(P + D));
  const bool prefill = rank < P;
  weft::Comm side = world.split(prefill ? 0 : 1, rank);
  weft::Comm pair = world.split(0, rank);   // the KV transfer's own communicator
  weft::Comm alone = world.split(rank, 0);  // the reference's one-rank "TP group"
  par::Ledger ledger;
  par::Axis tp(side.get(), prefill ? "tp.prefill" : "tp.decode");
  par::Axis pd(pair.get(), "pd", &ledger);
  par::Axis solo(alone.get(), "solo");
  par::KvTransferGroups groups;
  for (int r = 0; r < P + D; ++r) (r < P ? groups.prefill : groups.decode).push_back(r);

  Shard model(o, tp);
  par::KvTransfer transfer(pd, model.cache_shape(), groups);
  const size_t pages = model.pages_of(o.prompt + o.generate), cache_pages = pages + 3;
  par::PagedKvCache cache(model.cache_shape(), prefill ? P : D, prefill ? rank : rank - P,
                          cache_pages);
  const std::vector<size_t> table = block_table(pages, cache_pages, prefill ? 0 : 1);
  bool ok = true;
  double worst_kv = 0, worst_wait = 0;
  for (int sequence = 0; sequence < o.sequences; ++sequence) {
    int32_t first = 0;
    if (prefill) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < o.prompt; ++t) prompt.push_back(prompt_token(o, sequence, t));
      // Each layer leaves as soon as its keys and values are in the cache.
      auto logits = model.forward(prompt, 0, cache, table, nothing,
                                  [&](int l) { transfer.send_layer(cache, l, table); });
      first = argmax(logits);
      if (rank == 0)
        for (int d : groups.decode)
          weft::check(weftSend(&first, 1, weftInt32, d, world.get(), nullptr));
      transfer.finish();
      continue;
    }
    transfer.receive(cache, table);
    weft::check(weftRecv(&first, 1, weftInt32, 0, world.get(), nullptr));
    std::vector<int32_t> tokens{first};
    bool first_step = true;
    for (int g = 1; g < o.generate; ++g) {
      // The first step starts each layer once that layer has arrived.
      auto logits = model.forward(
          {tokens.back()}, o.prompt + g - 1, cache, table,
          [&](int l) {
            if (first_step) worst_wait = std::max(worst_wait, transfer.wait_layer(l));
            if (first_step && l == o.model.layers - 1 && o.perturb_kv)
              cache.key(l, table[0], 0, 0)[0] += 1.0f;
          },
          nothing);
      first_step = false;
      tokens.push_back(argmax(logits));
    }
    transfer.finish();
    if (rank != P) continue;
    // Decode rank 0: tokens and this rank's heads of the cache against one process.
    Reference want = reference(o, solo, sequence);
    if (tokens != want.tokens) {
      ok = false;
      std::printf("sequence %d: tokens differ from the single-process run\n", sequence);
    }
    for (int l = 0; l < o.model.layers; ++l)
      for (int t = 0; t < o.prompt + o.generate - 1; ++t)
        for (int j = 0; j < cache.heads(); ++j)
          for (int kv = 0; kv < 2; ++kv) {
            auto got = kv ? cache.value(l, table[t / o.page_tokens], j, t % o.page_tokens)
                          : cache.key(l, table[t / o.page_tokens], j, t % o.page_tokens);
            int head = cache.head_begin() + j;
            auto ref =
                kv ? want.cache.value(l, want.table[t / o.page_tokens], head, t % o.page_tokens)
                   : want.cache.key(l, want.table[t / o.page_tokens], head, t % o.page_tokens);
            for (size_t d = 0; d < got.size(); ++d)
              worst_kv = std::max(worst_kv, double(std::fabs(got[d] - ref[d])) /
                                                std::max(1.0, double(std::fabs(ref[d]))));
          }
    std::printf("sequence %d: prompt %d tokens, generated", sequence, o.prompt);
    for (int32_t t : tokens) std::printf(" %d", t);
    std::printf("\n");
  }
  if (rank != P) return 0;
  par::Ledger want;
  for (int s = 0; s < o.sequences; ++s)
    par::expected_kv_transfer(model.cache_shape(), groups, pages, rank, "pd", want);
  auto diff = ledger.compare(want);
  for (const auto& line : diff) std::printf("ledger: %s\n", line.c_str());
  std::printf("%s", ledger.table(&want).c_str());
  std::printf("kv cache: worst relative difference %.3g from the single-process run (bound 1e-5)\n",
              worst_kv);
  std::printf("first decode step: the longest wait for a layer's cache was %.3f ms\n",
              worst_wait * 1e3);
  ok = ok && diff.empty() && worst_kv <= 1e-5;
  std::printf("# weft-serve: %s (prefill tp %d -> decode tp %d, %d sequences, %d layers)\n",
              ok ? "PASS" : "FAIL", P, D, o.sequences, o.model.layers);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    return run(o);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-serve: %s\n", e.what());
    return 1;
  }
}
