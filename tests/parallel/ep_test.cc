// MoE dispatch and combine, forward and backward, against the dense
// single-process computation (every rank rebuilds the whole group's tokens
// and routes them itself): uniform, skewed (experts and ranks that receive
// nothing), everything to one expert, unused slots, uneven token counts,
// capacity drop and pad, the count-sync-free mode; the closed-form bytes
// under balanced routing; expert gradients reduced over expert-DP; errors.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::MoeDispatcher;
using parallel::MoeHandle;
using parallel::MoeOptions;

constexpr size_t kHidden = 6;
constexpr double kTolerance = 1e-5;

// dp = the world; the expert view's EP over `ep` of its ranks.
parallel::Mesh expert_mesh(const weft::Comm& world, int ep) {
  parallel::MeshShape shape;
  shape.expert_ep = ep;
  return parallel::Mesh(world, shape);
}

enum class Route { uniform, skewed, one_expert, unused_slots, balanced };

struct Case {
  const char* name;
  Route route;
  int experts_per_rank;
  int topk;
  double capacity = 0;
  bool pad = false;
  bool sync_free = false;
  bool uneven_tokens = false;
  // Attention → FFN disaggregation: the last ffn_ranks ranks hold every expert
  // and dispatch no tokens (0: every rank holds experts and has tokens).
  int ffn_ranks = 0;
};

int expert_holders(const Case& c, int ranks) {
  return c.ffn_ranks > 0 ? c.ffn_ranks : ranks;
}
// rank may carry an expert-DP group offset (100 · group).
bool ffn_only(const Case& c, int ranks, int rank) {
  return c.ffn_ranks > 0 && rank % 100 >= ranks - c.ffn_ranks;
}

struct RankData {
  size_t tokens = 0;
  std::vector<float> x, weight, dout;
  std::vector<int32_t> index;
};

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  return z ^ (z >> 27);
}

size_t tokens_of(const Case& c, int ranks, int rank) {
  if (ffn_only(c, ranks, rank)) return 0;
  if (c.route == Route::balanced) return size_t(2 * ranks);
  return c.uneven_tokens ? size_t((rank * 5) % 7) : 10;  // rank 0: none
}

// Rank r's tokens, routing and output gradient, from (case, r) alone.
RankData make_rank(const Case& c, int ranks, int rank) {
  RankData d;
  const int experts = c.experts_per_rank * expert_holders(c, ranks);
  const size_t k = size_t(c.topk);
  d.tokens = tokens_of(c, ranks, rank);
  d.x = random_floats(d.tokens * kHidden, 10 + rank);
  d.dout = random_floats(d.tokens * kHidden, 50 + rank);
  d.weight = random_floats(d.tokens * k, 90 + rank);
  d.index.assign(d.tokens * k, -1);
  for (size_t t = 0; t < d.tokens; ++t) {
    std::vector<int32_t> chosen;
    for (size_t j = 0; j < k; ++j) {
      uint64_t draw = mix(mix(uint64_t(rank), t), j);
      int32_t g = 0;
      switch (c.route) {
        case Route::uniform:
        case Route::unused_slots:
          g = int32_t(draw % uint64_t(experts));
          break;
        case Route::skewed:  // mostly expert 0; the upper half get (almost) nothing
          g = draw % 3 == 0 ? int32_t(draw / 3 % uint64_t(std::max(1, experts / 2))) : 0;
          break;
        case Route::one_expert:
          g = experts - 1;
          break;
        case Route::balanced:  // k distinct ranks per token, each rank T·k/P pairs
          g = int32_t(((t + j) % size_t(ranks)) * size_t(c.experts_per_rank) +
                      t % size_t(c.experts_per_rank));
          break;
      }
      // Distinct experts per token (as top-k gives), except where every slot
      // must hit one expert.
      while (c.route != Route::one_expert && c.route != Route::balanced &&
             std::find(chosen.begin(), chosen.end(), g) != chosen.end())
        g = (g + 1) % experts;
      chosen.push_back(g);
      if (c.route == Route::unused_slots && draw % 3 == 0) g = -1;
      d.index[t * k + j] = g;
    }
  }
  return d;
}

// The capacity rule, written apart: per source rank and expert, the first C
// (token, slot) pairs in order are kept.
std::vector<bool> kept_slots(const Case& c, const RankData& d, int experts) {
  std::vector<bool> kept(d.index.size(), false);
  size_t cap = c.capacity > 0
                   ? size_t(std::ceil(c.capacity * double(d.tokens) * c.topk / double(experts)))
                   : d.index.size();
  std::vector<size_t> used(experts, 0);
  for (size_t i = 0; i < d.index.size(); ++i)
    if (d.index[i] >= 0 && used[d.index[i]] < cap) {
      ++used[d.index[i]];
      kept[i] = true;
    }
  return kept;
}

// y = W·x for an h×h expert matrix, in double.
std::vector<double> apply(const std::vector<float>& w, const float* x, bool transposed) {
  std::vector<double> y(kHidden, 0.0);
  for (size_t i = 0; i < kHidden; ++i)
    for (size_t j = 0; j < kHidden; ++j)
      y[i] += double(transposed ? w[j * kHidden + i] : w[i * kHidden + j]) * x[j];
  return y;
}

std::vector<float> expert_matrix(int g) {
  return random_floats(kHidden * kHidden, 1000 + uint64_t(g));
}

MoeOptions options_of(const Case& c, int ranks) {
  size_t bound = 0;
  for (int r = 0; r < ranks; ++r) bound = std::max(bound, tokens_of(c, ranks, r));
  bound = std::max<size_t>(bound, 1);  // 0 would mean "exchange counts"
  MoeOptions options;
  options.experts = c.experts_per_rank * expert_holders(c, ranks);
  for (int r = ranks - c.ffn_ranks; c.ffn_ranks > 0 && r < ranks; ++r)
    options.expert_ranks.push_back(r);
  options.topk = c.topk;
  options.hidden = kHidden;
  options.capacity_factor = c.capacity;
  options.pad = c.pad;
  options.max_tokens = c.sync_free ? bound : 0;
  return options;
}

// Rows of h floats in lexicographic order (the hierarchical dispatcher
// groups them by expert in another order than the flat one).
std::vector<float> sorted_rows(const std::vector<float>& rows) {
  std::vector<std::vector<float>> split;
  for (size_t i = 0; i < rows.size(); i += kHidden)
    split.emplace_back(rows.begin() + i, rows.begin() + i + kHidden);
  std::sort(split.begin(), split.end());
  std::vector<float> joined;
  for (const auto& row : split) joined.insert(joined.end(), row.begin(), row.end());
  return joined;
}

// One dispatch → experts (y = W_g·x) → combine → backward, checked against the
// dense computation. Returns this rank's local experts' weight gradients.
template <typename Dispatcher>
std::vector<std::vector<float>> check_case(Dispatcher& dispatcher, const Case& c,
                                           bool any_row_order, int group_index = 0,
                                           int groups = 1) {
  const Axis& ep = dispatcher.axis();
  const int ranks = ep.size(), rank = ep.rank();
  const int experts = c.experts_per_rank * expert_holders(c, ranks);
  const size_t k = size_t(c.topk), h = kHidden;
  const bool holds = c.ffn_ranks == 0 || ffn_only(c, ranks, rank);
  const int local = holds ? c.experts_per_rank : 0;
  EXPECT_EQ(dispatcher.local_experts(), local);
  if (!holds) {
    EXPECT_EQ(dispatcher.first_expert(), -1);
  }
  // Each expert-DP replica (group) routes its own tokens.
  auto rank_data = [&](int r) { return make_rank(c, ranks, r + 100 * group_index); };
  const RankData mine = rank_data(rank);
  std::string what = std::string(c.name) + " at " + std::to_string(ranks) + " ranks";

  auto handle = dispatcher.dispatch(mine.x, mine.tokens, mine.index, mine.weight);
  const size_t rows = handle.rows();
  std::vector<float> input(handle.expert_input().begin(), handle.expert_input().end());
  EXPECT_EQ(input.size(), rows * h) << what;

  // The dense routing of the whole group: what each local expert must receive.
  std::vector<std::vector<float>> want_rows(local);
  std::vector<size_t> want_load(experts, 0);
  for (int r = 0; r < ranks; ++r) {
    RankData d = rank_data(r);
    std::vector<bool> kept = kept_slots(c, d, experts);
    for (size_t i = 0; i < d.index.size(); ++i) {
      if (!kept[i]) continue;
      ++want_load[d.index[i]];
      int e = d.index[i] - dispatcher.first_expert();
      if (local > 0 && e >= 0 && e < local)
        want_rows[e].insert(want_rows[e].end(), d.x.begin() + (i / k) * h,
                            d.x.begin() + (i / k + 1) * h);
    }
  }
  for (int e = 0; e < local; ++e) {
    size_t real = want_rows[e].size() / h;
    if (c.pad)
      EXPECT_GE(handle.expert_rows(e), real) << what;
    else
      EXPECT_EQ(handle.expert_rows(e), real) << what << " expert " << e;
    std::vector<float> got(input.begin() + handle.expert_offset(e) * h,
                           input.begin() + (handle.expert_offset(e) + real) * h);
    // Flat: rows arrive in (source rank, token) order, as the dense loop makes them.
    if (any_row_order)
      expect_close(sorted_rows(got), sorted_rows(want_rows[e]), 0,
                   (what + " expert input").c_str());
    else
      expect_close(got, want_rows[e], 0, (what + " expert input").c_str());
    for (size_t i = (handle.expert_offset(e) + real) * h;
         i < (handle.expert_offset(e) + handle.expert_rows(e)) * h; ++i)
      EXPECT_EQ(input[i], 0.0f) << what << " pad row";
  }
  const parallel::MoeLoad& load = handle.load();
  EXPECT_EQ(load.global, !c.sync_free) << what;
  for (int g = 0; g < experts; ++g) {
    bool known =
        load.global || (g >= dispatcher.first_expert() && g < dispatcher.first_expert() + local);
    EXPECT_EQ(load.expert_tokens[g], known ? want_load[g] : 0) << what << " load of " << g;
  }

  // Experts: y = W_g·x per row; pad rows get garbage the combine must ignore.
  std::vector<float> y(rows * h, 0.0f);
  for (int e = 0; e < local; ++e) {
    auto w = expert_matrix(dispatcher.first_expert() + e);
    size_t real = want_rows[e].size() / h;
    for (size_t row = 0; row < handle.expert_rows(e); ++row) {
      size_t at = handle.expert_offset(e) + row;
      auto v = apply(w, input.data() + at * h, false);
      for (size_t i = 0; i < h; ++i) y[at * h + i] = row < real ? float(v[i]) : 1e6f;
    }
  }
  std::vector<float> out(mine.tokens * h);
  dispatcher.combine(handle, y, out);

  std::vector<bool> kept = kept_slots(c, mine, experts);
  size_t dropped = 0;
  for (size_t i = 0; i < kept.size(); ++i) dropped += mine.index[i] >= 0 && !kept[i];
  EXPECT_EQ(load.dropped, dropped) << what;
  if (std::string(c.name) == "capacity drop" && ranks > 1 && mine.tokens > 0 && c.ffn_ranks == 0) {
    EXPECT_GT(dropped, 0u) << what << ": the case must drop";
  }
  std::vector<float> want_out(mine.tokens * h, 0.0f), want_dx(mine.tokens * h, 0.0f),
      want_dw(mine.tokens * k, 0.0f);
  for (size_t t = 0; t < mine.tokens; ++t) {
    std::vector<double> o(h, 0.0), dx(h, 0.0);
    for (size_t j = 0; j < k; ++j) {
      if (!kept[t * k + j]) continue;
      auto w = expert_matrix(mine.index[t * k + j]);
      auto v = apply(w, mine.x.data() + t * h, false);
      auto back = apply(w, mine.dout.data() + t * h, true);
      double dot = 0;
      for (size_t i = 0; i < h; ++i) {
        o[i] += mine.weight[t * k + j] * v[i];
        dx[i] += mine.weight[t * k + j] * back[i];
        dot += mine.dout[t * h + i] * v[i];
      }
      want_dw[t * k + j] = float(dot);
    }
    for (size_t i = 0; i < h; ++i)
      want_out[t * h + i] = float(o[i]), want_dx[t * h + i] = float(dx[i]);
  }
  expect_close(out, want_out, kTolerance, (what + " combine").c_str());

  std::vector<float> dy(rows * h), d_input(rows * h, 0.0f);
  dispatcher.combine_backward(handle, mine.dout, dy);
  std::vector<std::vector<float>> dweights(local, std::vector<float>(h * h, 0.0f));
  for (int e = 0; e < local; ++e) {
    auto w = expert_matrix(dispatcher.first_expert() + e);
    for (size_t row = 0; row < handle.expert_rows(e); ++row) {
      size_t at = handle.expert_offset(e) + row;
      auto back = apply(w, dy.data() + at * h, true);
      for (size_t i = 0; i < h; ++i) {
        d_input[at * h + i] = float(back[i]);
        for (size_t j = 0; j < h; ++j) dweights[e][i * h + j] += dy[at * h + i] * input[at * h + j];
      }
    }
  }
  std::vector<float> dx(mine.tokens * h), dw(mine.tokens * k);
  dispatcher.dispatch_backward(handle, d_input, dx, dw);
  expect_close(dx, want_dx, kTolerance, (what + " dx").c_str());
  expect_close(dw, want_dw, kTolerance, (what + " d_weight").c_str());

  // Dense expert weight gradients over every rank of every group:
  // dW_g = Σ weight · dout·xᵀ over the kept pairs routed to g.
  for (int e = 0; e < local; ++e) {
    int g = dispatcher.first_expert() + e;
    std::vector<double> want(h * h, 0.0);
    for (int gi = 0; gi < groups; ++gi)
      for (int r = 0; r < ranks; ++r) {
        RankData d = make_rank(c, ranks, r + 100 * gi);
        std::vector<bool> keep = kept_slots(c, d, experts);
        for (size_t i = 0; i < d.index.size(); ++i) {
          if (!keep[i] || d.index[i] != g) continue;
          size_t t = i / k;
          for (size_t a = 0; a < h; ++a)
            for (size_t b = 0; b < h; ++b)
              want[a * h + b] += double(d.weight[i]) * d.dout[t * h + a] * d.x[t * h + b];
        }
      }
    dweights[e].insert(dweights[e].end(), want.begin(), want.end());  // [got | want]
  }
  return dweights;
}

std::vector<std::vector<float>> run_case(const Axis& ep, const Case& c, int group_index = 0,
                                         int groups = 1) {
  MoeDispatcher dispatcher(ep, options_of(c, ep.size()));
  return check_case(dispatcher, c, false, group_index, groups);
}

const Case kCases[] = {
    {"uniform top-2", Route::uniform, 2, 2},
    {"uniform top-3, one expert per rank", Route::uniform, 1, 3},
    {"skewed", Route::skewed, 2, 2},
    {"all to one expert", Route::one_expert, 2, 1},
    {"unused slots, uneven tokens", Route::unused_slots, 2, 2, 0, false, false, true},
    {"capacity drop", Route::skewed, 2, 2, 1.0},
    {"capacity pad", Route::uniform, 2, 2, 1.5, true},
    {"count-sync-free", Route::uniform, 2, 2, 0, false, true, true},
    {"count-sync-free, capacity pad", Route::skewed, 2, 2, 1.0, true, true},
};

void expect_weight_grads(const std::vector<std::vector<float>>& grads, const std::string& what) {
  for (const auto& both : grads) {
    size_t n = both.size() / 2;
    expect_close(std::vector<float>(both.begin(), both.begin() + n),
                 std::vector<float>(both.begin() + n, both.end()), kTolerance, what.c_str());
  }
}

class Ep : public ::testing::TestWithParam<int> {};

TEST_P(Ep, DispatchAndCombineMatchTheDenseComputation) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, world.size());
    parallel::Ledger ledger;
    Axis ep = Axis::expert(mesh, "ep", &ledger);
    for (const Case& c : kCases) {
      if (c.topk > c.experts_per_rank * world.size()) continue;
      expect_weight_grads(run_case(ep, c), std::string(c.name) + " dW");
    }
    // Every case: 4 AllToAllv; counts exchanged except count-sync-free.
    size_t alltoallv = 0, counts = 0;
    for (const auto& e : ledger.entries())
      (e.primitive == "alltoallv" ? alltoallv : counts) += e.calls;
    size_t cases = 0, synced = 0;
    for (const Case& c : kCases)
      if (c.topk <= c.experts_per_rank * world.size()) ++cases, synced += c.sync_free ? 0 : 1;
    const size_t booked = world.size() > 1 ? 1 : 0;  // one rank: local copies
    EXPECT_EQ(alltoallv, 4 * cases * booked);
    EXPECT_EQ(counts, synced * booked);
    EXPECT_GE(ledger.noted("ep.load.imbalance"), 1.0);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Ep, ::testing::Values(1, 2, 3, 4, 8));

// Attention → FFN disaggregation: the attention ranks hand their tokens to
// experts held only by the FFN ranks (1, half, or all but one of the ranks),
// which dispatch nothing themselves, and get the combined outputs back, as
// the dense computation gives them; backward too.
class EpAttentionFfn : public ::testing::TestWithParam<int> {};

TEST_P(EpAttentionFfn, AttentionRanksHandTokensToExpertsOnFfnRanks) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, world.size());
    parallel::Ledger ledger;
    Axis ep = Axis::expert(mesh, "ep", &ledger);
    const int ranks = world.size();
    std::vector<int> splits = {1, ranks / 2, ranks - 1};
    std::sort(splits.begin(), splits.end());
    splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
    for (int ffn : splits) {
      ledger.clear();
      for (Case c : kCases) {
        c.ffn_ranks = ffn;
        if (c.topk > c.experts_per_rank * ffn || (c.pad && !c.sync_free)) continue;
        std::string what = std::string(c.name) + ", " + std::to_string(ffn) + " FFN ranks";
        expect_weight_grads(run_case(ep, c), what + " dW");
      }
      // Rows go attention → FFN and come back FFN → attention only.
      std::map<std::string, size_t> sent;
      for (const auto& e : ledger.entries()) sent[e.pattern] += e.bytes_sent;
      const bool attention = world.rank() < ranks - ffn;
      EXPECT_EQ(sent["ep.combine"] == 0, attention) << ffn << " FFN ranks";
      EXPECT_EQ(sent["ep.dispatch_backward"] == 0, attention) << ffn << " FFN ranks";
      if (attention) {
        EXPECT_GT(sent["ep.dispatch"], 0u) << ffn << " FFN ranks";
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpAttentionFfn, ::testing::Values(2, 3, 4, 8));

// Balanced routing (k distinct ranks per token, every rank the same share):
// each AllToAllv sends b·s·k·(1 − 1/EP)·h·4 bytes of rows, the closed form.
TEST(EpLedger, BalancedRoutingSendsTheClosedFormBytes) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, 4);
    parallel::Ledger ledger;
    Axis ep = Axis::expert(mesh, "ep", &ledger);
    Case c{"balanced", Route::balanced, 2, 2};
    expect_weight_grads(run_case(ep, c), "balanced dW");
    const size_t tokens = tokens_of(c, 4, 0), rows = tokens * 2 * 3 / 4;  // T·k·(1 − 1/4)
    const size_t row_bytes = kHidden * 4, logical = tokens * 2 * row_bytes;
    for (const auto& e : ledger.entries()) {
      if (e.primitive != "alltoallv") continue;
      EXPECT_EQ(e.calls, 1u) << e.pattern;
      EXPECT_EQ(e.dim, "expert:ep");
      EXPECT_EQ(e.bytes_per_call, logical) << e.pattern;
      // The dispatch carries 8·k bytes of slot data per row, its backward 4·k.
      size_t extra = e.pattern == "ep.dispatch" ? 16 : e.pattern == "ep.dispatch_backward" ? 8 : 0;
      EXPECT_EQ(e.bytes_sent, rows * (row_bytes + extra)) << e.pattern;
    }
    EXPECT_EQ(ledger.entries().size(), 5u);  // counts + 4 AllToAllv
    EXPECT_DOUBLE_EQ(ledger.noted("ep.load.imbalance"), 1.0);
    for (int r = 0; r < 4; ++r)
      EXPECT_DOUBLE_EQ(ledger.noted("ep.load.rank." + std::to_string(r)), 4.0 * tokens * 2 / 4);
  });
}

// dp 4 with EP 2: two expert-DP replicas route different tokens; the local
// experts' gradients AllReduced over edp equal the dense sum over all four ranks.
TEST(EpExpertDataParallel, ExpertGradientsReduceOverEdpOnly) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, 2);
    ASSERT_EQ(mesh.expert_size("edp"), 2);
    parallel::Ledger ledger;
    Axis ep = Axis::expert(mesh, "ep", &ledger), edp = Axis::expert(mesh, "edp", &ledger);
    Case c{"ep x dp", Route::uniform, 2, 2};
    auto grads = run_case(ep, c, edp.rank(), edp.size());
    for (auto& both : grads) {
      size_t n = both.size() / 2;
      parallel::all_reduce(edp, parallel::view(both.data(), {n}), "edp.expert_grads");
    }
    // The reduced half against the dense sum over both replicas' tokens.
    expect_weight_grads(grads, "edp-reduced dW");
    size_t edp_calls = 0;
    for (const auto& e : ledger.entries())
      if (e.dim == "expert:edp") {
        edp_calls += e.calls;
        EXPECT_EQ(e.primitive, "allreduce");
      }
    EXPECT_EQ(edp_calls, grads.size());
  });
}

TEST(EpErrors, BadInputIsNamed) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, 2);
    Axis ep = Axis::expert(mesh, "ep");
    auto make = [&](auto edit) {
      MoeOptions o;
      o.experts = 4, o.topk = 2, o.hidden = 3;
      edit(o);
      return [&ep, o] { MoeDispatcher bad(ep, o); };
    };
    expect_error(make([](MoeOptions& o) { o.topk = 5; }), "topk=5 is larger than experts=4");
    expect_error(make([](MoeOptions& o) { o.topk = 0; }), "topk=0");
    expect_error(make([](MoeOptions& o) { o.experts = 3, o.topk = 1; }),
                 "experts=3 does not divide by the 2 ranks");
    expect_error(make([](MoeOptions& o) { o.hidden = 0; }), "hidden=0");
    expect_error(make([](MoeOptions& o) { o.capacity_factor = -1; }), "capacity_factor=");
    expect_error(make([](MoeOptions& o) { o.pad = true; }), "pad needs a capacity_factor");
    expect_error(make([](MoeOptions& o) { o.expert_ranks = {2}; }),
                 "expert_ranks[0]=2 is out of range [0, 2)");
    expect_error(make([](MoeOptions& o) {
                   o.expert_ranks = {1, 1};
                 }),
                 "expert_ranks: rank 1 appears twice");
    expect_error(make([](MoeOptions& o) {
                   o.experts = 3, o.topk = 1, o.expert_ranks = {0, 1};
                 }),
                 "experts=3 does not divide by the 2 expert_ranks");
    expect_error(
        make([](MoeOptions& o) { o.expert_ranks = {1}, o.capacity_factor = 1, o.pad = true; }),
        "pad with expert_ranks needs max_tokens");

    MoeOptions o;
    o.experts = 4, o.topk = 2, o.hidden = 3, o.max_tokens = 2;
    MoeDispatcher d(ep, o);
    std::vector<float> x(2 * 3), w(4);
    std::vector<int32_t> idx{0, 1, 2, 4};
    expect_error([&] { d.dispatch(x, 2, idx, w); },
                 "topk_index[3]=4 is out of range [0, experts=4)");
    idx[3] = -2;
    expect_error([&] { d.dispatch(x, 2, idx, w); }, "topk_index[3]=-2");
    idx[3] = 3;
    expect_error([&] { d.dispatch(x, 1, idx, w); }, "x has 6 elements, expected tokens·hidden = 3");
    expect_error([&] { d.dispatch(x, 2, idx, std::vector<float>(3)); }, "topk_weight has 3");
    std::vector<float> x3(3 * 3), w3(6);
    std::vector<int32_t> i3(6, 0);
    expect_error([&] { d.dispatch(x3, 3, i3, w3); }, "tokens=3 exceeds max_tokens=2");
    // A good call on both ranks, then the handle's order is enforced.
    MoeHandle handle = d.dispatch(x, 2, idx, w);
    std::vector<float> y(handle.rows() * 3), out(6), dx(6), dw(4);
    expect_error([&] { d.combine_backward(handle, out, y); }, "combine_backward needs a handle");
    expect_error([&] { d.dispatch_backward(handle, y, dx, dw); }, "dispatch_backward needs");
    expect_error([&] { d.combine(handle, std::vector<float>(y.size() + 1), out); },
                 "expert_output has");
    expect_error([&] { handle.expert_rows(2); }, "local_expert=2 is out of range [0, 2)");
  });
}

// Ledger::expected for MoE layers: per layer and step the count AllGather and
// four AllToAllv over expert:ep of T·k·h·dtype, sending T·k·(1 − 1/ep)·h·dtype,
// and the expert buckets over expert:edp only.
TEST(EpLedger, ClosedFormOfMoeLayers) {
  parallel::ModelConfig c;
  c.layers = 3, c.hidden = 16, c.seq = 8, c.batch = 2, c.steps = 2;
  c.dp = 4, c.ep = 2, c.experts = 6, c.topk = 2;
  c.param_numels = {100, 200};
  c.param_layers = {0, 1};
  c.expert_param_numels = {300, 400};
  parallel::Ledger expected = parallel::Ledger::expected(c);
  const size_t tokens = 8 * 2, rows = tokens * 2, row = 16 * 4;
  size_t alltoallv = 0, counts = 0, expert_buckets = 0, dense_buckets = 0;
  for (const auto& e : expected.entries()) {
    if (e.primitive == "alltoallv") {
      EXPECT_EQ(e.dim, "expert:ep");
      EXPECT_EQ(e.bytes_per_call, rows * row) << e.pattern;
      EXPECT_EQ(e.bytes_sent, e.calls * rows / 2 * row) << e.pattern;  // (1 − 1/2)
      alltoallv += e.calls;
    } else if (e.pattern == "ep.counts") {
      EXPECT_EQ(e.bytes_per_call, 2u * (6 + 2) * 8);
      counts += e.calls;
    } else if (e.dim == "expert:edp") {
      EXPECT_EQ(e.bytes_per_call, (300u + 400u) * 4);  // one bucket
      expert_buckets += e.calls;
    } else if (e.dim == "dp") {
      EXPECT_EQ(e.bytes_per_call, (100u + 200u) * 4);
      dense_buckets += e.calls;
    }
  }
  EXPECT_EQ(alltoallv, 4u * 3 * 2);
  EXPECT_EQ(counts, 3u * 2);
  EXPECT_EQ(expert_buckets, 2u);
  EXPECT_EQ(dense_buckets, 2u);
  c.ep = 3;
  expect_error([&] { parallel::Ledger::expected(c); }, "ep=3 does not divide dp=4");
}

// Hierarchical dispatch over fake nodes (the mesh's host names): node of
// rank r for each rank count, unequal (3) and interleaved (4) included.
std::vector<std::string> fake_hosts(int ranks) {
  std::vector<std::string> hosts;
  for (int r = 0; r < ranks; ++r) {
    int node = ranks == 3 ? r / 2 : ranks == 4 ? r % 2 : ranks == 8 ? r / 2 : r;
    hosts.push_back("node" + std::to_string(node));
  }
  return hosts;
}

parallel::Mesh hier_mesh(const weft::Comm& world) {
  parallel::MeshShape shape;
  shape.expert_ep = world.size();
  shape.hosts = fake_hosts(world.size());
  return parallel::Mesh(world, shape);
}

// Remote nodes (and remote-node ranks) each token of `d` reaches with its
// kept slots, per node.
struct Reach {
  std::vector<size_t> node_rows;  // per node: tokens that reach it
  size_t nodes = 0, ranks = 0;    // off the source's node: (token, node), (token, rank)
};
Reach reach(const Case& c, const RankData& d, const std::vector<int>& nodes, int source) {
  const int experts = c.experts_per_rank * int(nodes.size());
  std::vector<bool> kept = kept_slots(c, d, experts);
  Reach r;
  r.node_rows.assign(*std::max_element(nodes.begin(), nodes.end()) + 1, 0);
  for (size_t t = 0; t < d.tokens; ++t) {
    std::vector<int> reached_nodes, reached_ranks;
    for (size_t j = 0; j < size_t(c.topk); ++j) {
      size_t i = t * size_t(c.topk) + j;
      if (!kept[i]) continue;
      int q = d.index[i] / c.experts_per_rank;
      reached_nodes.push_back(nodes[q]);
      if (nodes[q] != nodes[source]) reached_ranks.push_back(q);
    }
    for (auto* v : {&reached_nodes, &reached_ranks}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    for (int n : reached_nodes) {
      ++r.node_rows[n];
      r.nodes += n != nodes[source];
    }
    r.ranks += reached_ranks.size();
  }
  return r;
}

// The inter-node stage's closed form on this rank, summed over the cases:
// a source sends one record per (token, remote node) in dispatch and
// combine_backward; a proxy returns one per (token, its node) of every
// remote source whose proxy it is (position in node mod node size) in
// combine and dispatch_backward. Returns the flat dispatcher's remote-node
// rows over the same routing (the hierarchical dispatch's are at most those).
size_t expect_inter_ledger(const parallel::Ledger& ledger, const std::vector<const Case*>& cases,
                           const std::vector<int>& nodes, int rank, size_t* hier_rows) {
  const int ranks = int(nodes.size());
  std::vector<int> position(ranks), node_size(ranks, 0);
  for (int q = 0; q < ranks; ++q) position[q] = node_size[nodes[q]]++;
  std::map<std::string, size_t> want;
  size_t flat = 0;
  *hier_rows = 0;
  for (const Case* c : cases) {
    const size_t row = kHidden * 4, k = size_t(c->topk);
    Reach mine = reach(*c, make_rank(*c, ranks, rank), nodes, rank);
    want["ep.inter.dispatch"] += mine.nodes * (row + 8 * k);
    want["ep.inter.combine_backward"] += mine.nodes * row;
    flat += mine.ranks, *hier_rows += mine.nodes;
    for (int src = 0; src < ranks; ++src) {
      if (nodes[src] == nodes[rank] || position[src] % node_size[nodes[rank]] != position[rank])
        continue;
      size_t proxied = reach(*c, make_rank(*c, ranks, src), nodes, src).node_rows[nodes[rank]];
      want["ep.inter.combine"] += proxied * row;
      want["ep.inter.dispatch_backward"] += proxied * (row + 4 * k);
    }
  }
  std::map<std::string, size_t> got;
  for (const auto& e : ledger.entries())
    if (e.pattern.starts_with("ep.inter.") && e.primitive == "alltoallv") {
      got[e.pattern] += e.bytes_sent;
      EXPECT_EQ(e.dim, "expert:ep");
    }
  for (const auto& [pattern, bytes] : want) EXPECT_EQ(got[pattern], bytes) << pattern;
  return flat;
}

std::vector<const Case*> hier_cases(int ranks) {
  std::vector<const Case*> cases;
  for (const Case& c : kCases)
    if (!c.pad && !c.sync_free && c.topk <= c.experts_per_rank * ranks) cases.push_back(&c);
  return cases;
}

void run_hier(parallel::Mesh& mesh, parallel::Ledger& ledger,
              const std::vector<const Case*>& cases) {
  Axis ep = Axis::expert(mesh, "ep", &ledger);
  const std::vector<int> nodes = parallel::ep_nodes(mesh);
  ASSERT_EQ(int(nodes.size()), ep.size());
  for (const Case* c : cases) {
    parallel::HierMoeDispatcher dispatcher(ep, options_of(*c, ep.size()), nodes);
    expect_weight_grads(check_case(dispatcher, *c, true), std::string(c->name) + " hier dW");
  }
}

class EpHier : public ::testing::TestWithParam<int> {};

TEST_P(EpHier, MatchesTheDenseComputationWithOneMessagePerNode) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = hier_mesh(world);
    parallel::Ledger ledger;
    std::vector<const Case*> cases = hier_cases(world.size());
    run_hier(mesh, ledger, cases);
    std::vector<int> nodes = parallel::ep_nodes(mesh);
    size_t hier_rows = 0;
    size_t flat_rows = expect_inter_ledger(ledger, cases, nodes, world.rank(), &hier_rows);
    EXPECT_LE(hier_rows, flat_rows);
    size_t intra = 0;
    for (const auto& e : ledger.entries())
      if (e.pattern.starts_with("ep.intra.")) {
        EXPECT_EQ(e.dim, "expert:ep.node");
        intra += e.calls;
      }
    const int node_size = int(std::count(nodes.begin(), nodes.end(), nodes[world.rank()]));
    // A node of one rank fans out by local copies, booked nowhere.
    EXPECT_EQ(intra, node_size > 1 ? cases.size() * 5 : 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpHier, ::testing::Values(2, 3, 4, 8));

// Two contiguous nodes of two ranks, balanced top-2 routing (token t to ranks
// t and t + 1 mod 4): tokens whose two experts share a remote node cross
// once, so the inter-node rows fall strictly below the flat dispatcher's.
TEST(EpHierLedger, TokensWhoseExpertsShareANodeCrossOnce) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::MeshShape shape;
    shape.expert_ep = 4;
    shape.hosts = {"a", "a", "b", "b"};
    parallel::Mesh mesh(world, shape);
    parallel::Ledger ledger;
    static const Case balanced{"balanced", Route::balanced, 2, 2};
    run_hier(mesh, ledger, {&balanced});
    size_t hier_rows = 0;
    size_t flat_rows = expect_inter_ledger(ledger, {&balanced}, parallel::ep_nodes(mesh),
                                           world.rank(), &hier_rows);
    // Of every 4 tokens one stays on the node, two reach one remote rank and
    // one both ranks of the other node: 4 flat rows, 3 here (8 tokens).
    EXPECT_EQ(flat_rows, 8u);
    EXPECT_EQ(hier_rows, 6u);
  });
}

TEST(EpHierErrors, BadInputIsNamed) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = expert_mesh(world, 2);
    Axis ep = Axis::expert(mesh, "ep");
    MoeOptions o;
    o.experts = 4, o.topk = 2, o.hidden = 3;
    expect_error([&] { parallel::HierMoeDispatcher bad(ep, o, {0}); },
                 "nodes has 1 entries for the 2 ranks");
    expect_error([&] { parallel::HierMoeDispatcher bad(ep, o, {0, -1}); }, "nodes[1]=-1");
    MoeOptions sync_free = o;
    sync_free.max_tokens = 4;
    expect_error([&] { parallel::HierMoeDispatcher bad(ep, sync_free, {0, 1}); }, "max_tokens");
    MoeOptions bad_topk = o;
    bad_topk.topk = 5;
    expect_error(
        [&] {
          parallel::HierMoeDispatcher bad(ep, bad_topk, {0, 1});
        },
        "topk=5 is larger than experts=4");
    parallel::HierMoeDispatcher d(ep, o, {0, 1});
    std::vector<float> x(2 * 3), w(4);
    std::vector<int32_t> idx{0, 1, 2, 4};
    expect_error([&] { d.dispatch(x, 2, idx, w); }, "topk_index[3]=4 is out of range");
    idx[3] = 3;
    parallel::HierMoeHandle handle = d.dispatch(x, 2, idx, w);
    std::vector<float> y(handle.rows() * 3), out(6), dx(6), dw(4);
    expect_error([&] { d.combine_backward(handle, out, y); }, "combine_backward needs a handle");
    expect_error([&] { d.dispatch_backward(handle, y, dx, dw); }, "dispatch_backward needs");
    std::vector<float> short_out(5);
    expect_error([&] { d.combine(handle, y, short_out); }, "out has 5");
  });
}

// Expert-TP inside EP: experts y = W2·tanh(W1·x) (W1 [F, h], W2 [h, F])
// sharded over etp by F; every rank of the world routes its own tokens.
constexpr size_t kFfn = 6;  // divides by etp 2 and 3

struct ExpertMlp {
  std::vector<float> w1, w2;
};
ExpertMlp expert_mlp(int g) {
  return {random_floats(kFfn * kHidden, 2000 + uint64_t(g)),
          random_floats(kHidden * kFfn, 3000 + uint64_t(g))};
}

// Rows [begin, end) of the hidden units: y += W2[:, f]·tanh(W1[f]·x) summed
// over them, and the per-unit activations for the backward.
void mlp_forward(const ExpertMlp& w, const float* x, size_t begin, size_t end, double* y,
                 std::vector<double>& act) {
  act.assign(kFfn, 0.0);
  for (size_t f = begin; f < end; ++f) {
    double u = 0;
    for (size_t i = 0; i < kHidden; ++i) u += double(w.w1[f * kHidden + i]) * x[i];
    act[f] = std::tanh(u);
    for (size_t i = 0; i < kHidden; ++i) y[i] += double(w.w2[i * kFfn + f]) * act[f];
  }
}

// dy → dx += over the units [begin, end); dW1, dW2 (full-size) accumulated.
void mlp_backward(const ExpertMlp& w, const float* x, const double* dy, size_t begin, size_t end,
                  const std::vector<double>& act, double* dx, double* dw1, double* dw2) {
  for (size_t f = begin; f < end; ++f) {
    double dg = 0;
    for (size_t i = 0; i < kHidden; ++i) {
      dg += double(w.w2[i * kFfn + f]) * dy[i];
      dw2[i * kFfn + f] += dy[i] * act[f];
    }
    double du = dg * (1 - act[f] * act[f]);
    for (size_t i = 0; i < kHidden; ++i) {
      dx[i] += double(w.w1[f * kHidden + i]) * du;
      dw1[f * kHidden + i] += du * x[i];
    }
  }
}

struct EtpShape {
  int etp, ep;
};
EtpShape etp_shape(int ranks) {
  return ranks == 2 ? EtpShape{2, 1} : ranks == 3 ? EtpShape{3, 1} : EtpShape{2, ranks / 2};
}

class EpExpertTp : public ::testing::TestWithParam<int> {};

TEST_P(EpExpertTp, ShardedExpertsMatchTheDenseComputation) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    const EtpShape shape = etp_shape(world.size());
    parallel::MeshShape mesh_shape;
    mesh_shape.expert_tp = shape.etp;
    mesh_shape.expert_ep = shape.ep;
    parallel::Mesh mesh(world, mesh_shape);
    parallel::Ledger ledger;
    Axis ep = Axis::expert(mesh, "ep", &ledger), etp = Axis::expert(mesh, "etp", &ledger);
    ASSERT_EQ(etp.size(), shape.etp);
    const size_t h = kHidden, shard = kFfn / size_t(shape.etp);
    const size_t begin = size_t(etp.rank()) * shard, end = begin + shard;
    const Case cases[] = {
        {"etp uniform top-2", Route::uniform, 2, 2},
        {"etp skewed", Route::skewed, 2, 2},
        {"etp all to one expert", Route::one_expert, 2, 1},
        {"etp capacity drop, uneven tokens", Route::unused_slots, 2, 2, 1.0, false, false, true}};
    for (const Case& c : cases) {
      const std::string what = std::string(c.name) + " at " + std::to_string(world.size());
      const int experts = c.experts_per_rank * shape.ep;
      const size_t k = size_t(c.topk);
      // The world rank's tokens, routed over its EP group's experts.
      auto data_of = [&](int world_rank) { return make_rank(c, shape.ep, world_rank); };
      const RankData mine = data_of(world.rank());
      MoeDispatcher dispatcher(ep, options_of(c, shape.ep));
      MoeHandle handle = dispatcher.dispatch(mine.x, mine.tokens, mine.index, mine.weight);
      std::vector<size_t> counts;
      for (int e = 0; e < c.experts_per_rank; ++e) counts.push_back(handle.expert_rows(e));
      parallel::ExpertTp tp(etp, counts);

      // Forward: the gathered rows through this member's shard, reduce-scattered.
      std::vector<float> x_all(tp.rows() * h), partial(tp.rows() * h);
      tp.gather(handle.expert_input(), x_all, h);
      std::vector<std::vector<double>> acts(tp.rows());
      for (int e = 0; e < c.experts_per_rank; ++e) {
        ExpertMlp w = expert_mlp(dispatcher.first_expert() + e);
        for (size_t r = tp.expert_offset(e); r < tp.expert_offset(e) + tp.expert_rows(e); ++r) {
          std::vector<double> y(h, 0.0);
          mlp_forward(w, x_all.data() + r * h, begin, end, y.data(), acts[r]);
          for (size_t i = 0; i < h; ++i) partial[r * h + i] = float(y[i]);
        }
      }
      std::vector<float> y_own(handle.rows() * h), out(mine.tokens * h);
      tp.reduce_scatter(partial, y_own, h);
      dispatcher.combine(handle, y_own, out);

      // Backward.
      std::vector<float> dy_own(handle.rows() * h), dy_all(tp.rows() * h), dx_all(tp.rows() * h);
      dispatcher.combine_backward(handle, mine.dout, dy_own);
      tp.gather(dy_own, dy_all, h);
      std::vector<std::vector<double>> dw1(c.experts_per_rank, std::vector<double>(kFfn * h)),
          dw2(c.experts_per_rank, std::vector<double>(h * kFfn));
      for (int e = 0; e < c.experts_per_rank; ++e) {
        ExpertMlp w = expert_mlp(dispatcher.first_expert() + e);
        for (size_t r = tp.expert_offset(e); r < tp.expert_offset(e) + tp.expert_rows(e); ++r) {
          std::vector<double> dy(dy_all.begin() + r * h, dy_all.begin() + (r + 1) * h), dx(h, 0.0);
          mlp_backward(w, x_all.data() + r * h, dy.data(), begin, end, acts[r], dx.data(),
                       dw1[e].data(), dw2[e].data());
          for (size_t i = 0; i < h; ++i) dx_all[r * h + i] = float(dx[i]);
        }
      }
      std::vector<float> d_in(handle.rows() * h), dx(mine.tokens * h), dw(mine.tokens * k);
      tp.reduce_scatter(dx_all, d_in, h);
      dispatcher.dispatch_backward(handle, d_in, dx, dw);

      // The dense computation of this rank's tokens, full experts.
      std::vector<bool> kept = kept_slots(c, mine, experts);
      std::vector<float> want_out(mine.tokens * h, 0.0f), want_dx(mine.tokens * h, 0.0f),
          want_dw(mine.tokens * k, 0.0f);
      std::vector<double> scratch1(kFfn * h), scratch2(h * kFfn);
      for (size_t t = 0; t < mine.tokens; ++t) {
        std::vector<double> o(h, 0.0), d(h, 0.0);
        for (size_t j = 0; j < k; ++j) {
          if (!kept[t * k + j]) continue;
          ExpertMlp w = expert_mlp(mine.index[t * k + j]);
          std::vector<double> y(h, 0.0), act, dy(h), dxe(h, 0.0);
          mlp_forward(w, mine.x.data() + t * h, 0, kFfn, y.data(), act);
          double dot = 0;
          for (size_t i = 0; i < h; ++i) {
            o[i] += mine.weight[t * k + j] * y[i];
            dy[i] = double(mine.weight[t * k + j]) * mine.dout[t * h + i];
            dot += mine.dout[t * h + i] * y[i];
          }
          mlp_backward(w, mine.x.data() + t * h, dy.data(), 0, kFfn, act, dxe.data(),
                       scratch1.data(), scratch2.data());
          for (size_t i = 0; i < h; ++i) d[i] += dxe[i];
          want_dw[t * k + j] = float(dot);
        }
        for (size_t i = 0; i < h; ++i)
          want_out[t * h + i] = float(o[i]), want_dx[t * h + i] = float(d[i]);
      }
      expect_close(out, want_out, kTolerance, (what + " combine").c_str());
      expect_close(dx, want_dx, kTolerance, (what + " dx").c_str());
      expect_close(dw, want_dw, kTolerance, (what + " d_weight").c_str());

      // This member's shard gradients: every world rank's kept pairs routed
      // to the expert (etp × ep is the world; no expert-DP here).
      for (int e = 0; e < c.experts_per_rank; ++e) {
        const int g = dispatcher.first_expert() + e;
        ExpertMlp w = expert_mlp(g);
        std::vector<double> want1(kFfn * h, 0.0), want2(h * kFfn, 0.0);
        for (int r = 0; r < world.size(); ++r) {
          RankData d = data_of(r);
          std::vector<bool> keep = kept_slots(c, d, experts);
          for (size_t i = 0; i < d.index.size(); ++i) {
            if (!keep[i] || d.index[i] != g) continue;
            size_t t = i / k;
            std::vector<double> y(h, 0.0), act, dy(h), dxe(h, 0.0);
            mlp_forward(w, d.x.data() + t * h, 0, kFfn, y.data(), act);
            for (size_t a = 0; a < h; ++a) dy[a] = double(d.weight[i]) * d.dout[t * h + a];
            mlp_backward(w, d.x.data() + t * h, dy.data(), begin, end, act, dxe.data(),
                         want1.data(), want2.data());
          }
        }
        auto as_float = [](const std::vector<double>& v) {
          return std::vector<float>(v.begin(), v.end());
        };
        expect_close(as_float(dw1[e]), as_float(want1), kTolerance, (what + " dW1 shard").c_str());
        expect_close(as_float(dw2[e]), as_float(want2), kTolerance, (what + " dW2 shard").c_str());
      }
    }
    // Per case: the count AllGather, two gathers and two reduce-scatters over etp.
    size_t etp_calls = 0;
    for (const auto& e : ledger.entries())
      if (e.dim == "expert:etp") {
        EXPECT_TRUE(e.pattern.starts_with("ep.etp.")) << e.pattern;
        etp_calls += e.calls;
      }
    EXPECT_EQ(etp_calls, 4u * 5);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpExpertTp, ::testing::Values(2, 3, 4, 8));

}  // namespace
}  // namespace weft::testing
