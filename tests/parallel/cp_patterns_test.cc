// Affine-state CP and compressed-attention CP against single-process
// references written in the test, at 2, 3, 4 and 8 ranks: the affine state
// against the sequential recurrence with explicit matrices, compressed
// attention bit for bit against one rank (and close to the direct formula),
// its backward close to one rank's and to central differences;
// their ledgers against the closed forms; bad input.
#include <array>
#include <cmath>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::AffineShape;
using parallel::AttentionShape;
using parallel::CompressedConfig;
using parallel::SeqRun;

parallel::Mesh cp_mesh(const weft::Comm& world, int cp) {
  parallel::MeshShape shape;
  shape.cp = cp;
  return parallel::Mesh(world, shape);
}

std::vector<float> rows_of(const std::vector<float>& x, size_t stride, SeqRun run) {
  return {x.begin() + run.begin * stride, x.begin() + (run.begin + run.count) * stride};
}

// values in [lo, hi) from random_floats' [-1, 1).
std::vector<float> in_range(size_t count, uint64_t seed, float lo, float hi) {
  std::vector<float> x = random_floats(count, seed);
  for (float& value : x) value = lo + (value + 1.0f) / 2.0f * (hi - lo);
  return x;
}

// q, k, alpha, v, beta of the whole sequence.
using AffineInputs = std::array<std::vector<double>, 5>;
enum { kQ, kK, kAlpha, kV, kBeta };

AffineInputs affine_inputs(const AffineShape& sh, size_t seq) {
  size_t heads = sh.batch * sh.heads, keys = seq * heads * sh.key_dim;
  std::array<std::vector<float>, 5> x = {
      random_floats(keys, 21), in_range(keys, 22, -0.5f, 0.5f), in_range(keys, 24, 0.6f, 1.0f),
      random_floats(seq * heads * sh.value_dim, 23), in_range(seq * heads, 25, 0.1f, 0.9f)};
  AffineInputs in;
  for (int i = 0; i < 5; ++i) in[i].assign(x[i].begin(), x[i].end());
  return in;
}

std::vector<float> floats(const std::vector<double>& x) {
  return {x.begin(), x.end()};
}

// The recurrence position by position with M_t formed as a matrix:
// S ← (I − β·k·kᵀ)·diag(α)·S + β·k·vᵀ, o = Sᵀ·q.
std::vector<double> sequential_recurrence(const AffineShape& sh, size_t seq,
                                          const AffineInputs& in) {
  size_t heads = sh.batch * sh.heads, dk = sh.key_dim, dv = sh.value_dim;
  std::vector<double> out(seq * heads * dv);
  for (size_t h = 0; h < heads; ++h) {
    std::vector<double> s(dk * dv, 0.0), m(dk * dk), next(dk * dv);
    for (size_t t = 0; t < seq; ++t) {
      size_t at = t * heads + h;
      const double *q = &in[kQ][at * dk], *k = &in[kK][at * dk], *a = &in[kAlpha][at * dk],
                   *v = &in[kV][at * dv];
      double beta = in[kBeta][at];
      for (size_t i = 0; i < dk; ++i)
        for (size_t j = 0; j < dk; ++j) m[i * dk + j] = ((i == j) - beta * k[i] * k[j]) * a[j];
      for (size_t i = 0; i < dk; ++i)
        for (size_t j = 0; j < dv; ++j) {
          double x = beta * k[i] * v[j];
          for (size_t l = 0; l < dk; ++l) x += m[i * dk + l] * s[l * dv + j];
          next[i * dv + j] = x;
        }
      s = next;
      for (size_t j = 0; j < dv; ++j) {
        double o = 0;
        for (size_t i = 0; i < dk; ++i) o += s[i * dv + j] * q[i];
        out[at * dv + j] = o;
      }
    }
  }
  return out;
}

class CpPatterns : public ::testing::TestWithParam<int> {};

// Forward against the recurrence; backward against central differences of
// Σ dout·o through it (for the inputs of this rank's positions).
TEST_P(CpPatterns, AffineStateMatchesTheSequentialRecurrence) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world, world.size());
    parallel::Ledger ledger;
    parallel::Axis cp(mesh, "cp", &ledger);
    size_t n = world.size();
    AffineShape sh{2, 3, 4, 3};
    size_t heads = sh.batch * sh.heads;
    const size_t stride[5] = {heads * sh.key_dim, heads * sh.key_dim, heads * sh.key_dim,
                              heads * sh.value_dim, heads};
    const char* names[5] = {"dq", "dk", "dalpha", "dv", "dbeta"};
    // Uneven segments, and a sequence shorter than the ranks (empty segments).
    for (size_t seq : {3 * n + 2, n - 1}) {
      SCOPED_TRACE("seq " + std::to_string(seq));
      AffineInputs in = affine_inputs(sh, seq);
      std::vector<float> dout = random_floats(seq * heads * sh.value_dim, 26);
      std::vector<double> want = sequential_recurrence(sh, seq, in);
      ledger.clear();
      parallel::AffineStateCp affine(cp, sh, seq);
      SeqRun run = affine.run(cp.rank());
      std::array<std::vector<float>, 5> mine, grads;
      for (int i = 0; i < 5; ++i) {
        mine[i] = rows_of(floats(in[i]), stride[i], run);
        grads[i].resize(mine[i].size());
      }
      std::vector<float> out(run.count * stride[kV]);
      affine.forward(mine[kQ], mine[kK], mine[kV], mine[kAlpha], mine[kBeta], out);
      expect_close(out, rows_of(floats(want), stride[kV], run), 1e-5, "affine out");
      affine.backward(rows_of(dout, stride[kV], run), grads[kQ], grads[kK], grads[kV],
                      grads[kAlpha], grads[kBeta]);
      auto loss = [&](const AffineInputs& x) {
        std::vector<double> o = sequential_recurrence(sh, seq, x);
        double sum = 0;
        for (size_t i = 0; i < o.size(); ++i) sum += o[i] * dout[i];
        return sum;
      };
      for (int i = 0; i < 5; ++i) {
        std::vector<float> numeric;
        AffineInputs x = in;
        constexpr double kStep = 1e-6;
        for (size_t e = run.begin * stride[i]; e < (run.begin + run.count) * stride[i]; ++e) {
          x[i][e] = in[i][e] + kStep;
          double up = loss(x);
          x[i][e] = in[i][e] - kStep;
          double down = loss(x);
          x[i][e] = in[i][e];
          numeric.push_back(static_cast<float>((up - down) / (2 * kStep)));
        }
        expect_close(grads[i], numeric, 1e-5, names[i]);
      }
      parallel::Ledger expected;
      parallel::add_affine_cp_expected(expected, sh, cp.size(), true);
      auto differences = ledger.compare(expected);
      EXPECT_TRUE(differences.empty()) << differences.front();
      EXPECT_EQ(ledger.entries().size(), 2u);
    }
  });
}

// Compressed attention written directly, in double: every block compressed
// from the whole sequence with weights w, each query over the blocks that end
// at or before it.
std::vector<double> direct_compressed(const AttentionShape& sh, const CompressedConfig& c,
                                      const std::vector<double>& q, const std::vector<double>& k,
                                      const std::vector<double>& v, const std::vector<double>& w) {
  size_t b = sh.batch, h = sh.heads, hk = sh.kv_heads, d = sh.head_dim;
  size_t blocks = c.seq >= c.block ? (c.seq - c.block) / c.stride + 1 : 0;
  std::vector<double> out(q.size(), 0.0);
  for (size_t t = 0; t < c.seq; ++t)
    for (size_t bb = 0; bb < b; ++bb)
      for (size_t hh = 0; hh < h; ++hh) {
        size_t kv_head = hh / (h / hk);
        std::vector<double> scores, vals;
        for (size_t j = 0; j < blocks; ++j) {
          if (sh.causal && j * c.stride + c.block - 1 > t) break;
          std::vector<double> kc(d, 0.0), vc(d, 0.0);
          for (size_t i = 0; i < c.block; ++i)
            for (size_t x = 0; x < d; ++x) {
              size_t at = (((j * c.stride + i) * b + bb) * hk + kv_head) * d + x;
              kc[x] += w[i] * k[at];
              vc[x] += w[i] * v[at];
            }
          double s = 0;
          for (size_t x = 0; x < d; ++x) s += q[((t * b + bb) * h + hh) * d + x] * kc[x];
          scores.push_back(s / std::sqrt(double(d)));
          vals.insert(vals.end(), vc.begin(), vc.end());
        }
        if (scores.empty()) continue;
        double top = *std::max_element(scores.begin(), scores.end()), sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - top));
        for (size_t x = 0; x < d; ++x) {
          double o = 0;
          for (size_t j = 0; j < scores.size(); ++j) o += scores[j] * vals[j * d + x];
          out[((t * b + bb) * h + hh) * d + x] = o / sum;
        }
      }
  return out;
}

std::vector<double> doubles(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

struct CompressedCase {
  size_t seq, block, stride, heads, kv_heads;
  bool causal;
  bool weighted;
};

// Forward bit for bit against one rank (and close to the direct formula);
// backward (dq, dk, dv row by row, dweights summed over the ranks) close to
// one rank's; the ledger of both passes.
TEST_P(CpPatterns, CompressedAttentionDoesNotDependOnTheCpDegree) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world, world.size());
    parallel::Mesh single = cp_mesh(world, 1);  // every rank alone on its cp group
    parallel::Ledger ledger;
    parallel::Axis cp(mesh, "cp", &ledger), one(single, "cp");
    size_t n = world.size();
    std::vector<CompressedCase> cases = {
        {8 * n + 5, 4, 2, 4, 2, true, false},  // overlapping blocks, grouped-query heads
        {6 * n + 1, 3, 3, 2, 2, true, true},   // disjoint blocks, learned weights
        {5 * n, 5, 1, 2, 1, false, true},      // every position starts a block, non-causal
        {2 * n + 1, 1, 1, 2, 2, true, false},  // no halo
    };
    for (const CompressedCase& c : cases) {
      SCOPED_TRACE("seq " + std::to_string(c.seq) + " block " + std::to_string(c.block) +
                   " stride " + std::to_string(c.stride));
      AttentionShape sh{
          .batch = 2, .heads = c.heads, .kv_heads = c.kv_heads, .head_dim = 4, .causal = c.causal};
      CompressedConfig config{c.seq, c.block, c.stride, {}};
      config.weights = c.weighted ? in_range(c.block, 31, 0.1f, 1.0f)
                                  : std::vector<float>(c.block, 1.0f / c.block);
      size_t qs = sh.batch * sh.heads * sh.head_dim, ks = sh.batch * sh.kv_heads * sh.head_dim;
      auto q = random_floats(c.seq * qs, 32), k = random_floats(c.seq * ks, 33),
           v = random_floats(c.seq * ks, 34), dout = random_floats(c.seq * qs, 35);
      parallel::CompressedAttentionCp whole(one, sh, config);
      std::vector<float> alone(q.size()), dq1(q.size()), dk1(k.size()), dv1(v.size()), dw1(c.block);
      whole.forward(q, k, v, alone);
      whole.backward(dout, dq1, dk1, dv1, dw1);
      expect_close(alone,
                   floats(direct_compressed(sh, config, doubles(q), doubles(k), doubles(v),
                                            doubles(config.weights))),
                   1e-5, "one rank vs direct");

      ledger.clear();
      parallel::CompressedAttentionCp attention(cp, sh, config);
      SeqRun run = attention.run(cp.rank());
      std::vector<float> out(run.count * qs);
      attention.forward(rows_of(q, qs, run), rows_of(k, ks, run), rows_of(v, ks, run), out);
      EXPECT_EQ(out, rows_of(alone, qs, run)) << "P = " << n << " differs from one rank";
      std::vector<float> dq(out.size()), dk(run.count * ks), dv(dk.size()), dw(c.block);
      attention.backward(rows_of(dout, qs, run), dq, dk, dv, dw);
      expect_close(dq, rows_of(dq1, qs, run), 1e-5, "dq");
      expect_close(dk, rows_of(dk1, ks, run), 1e-5, "dk");
      expect_close(dv, rows_of(dv1, ks, run), 1e-5, "dv");
      world.all_reduce(dw);
      expect_close(dw, dw1, 1e-5, "dweights summed over the ranks");
      parallel::Ledger expected;
      parallel::add_compressed_cp_expected(expected, sh, config, cp.size(), cp.rank(), true);
      auto differences = ledger.compare(expected);
      EXPECT_TRUE(differences.empty()) << differences.front();
      EXPECT_EQ(ledger.entries().size(), c.block > 1 ? 4u : 2u);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpPatterns, ::testing::Values(2, 3, 4, 8));

// One rank's backward against central differences of Σ dout·o through the
// direct formula in double, for q, k, v and the block weights.
TEST(CpPatternsGradient, CompressedAttentionBackwardMatchesCentralDifferences) {
  run_ranks(1, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world, 1);
    parallel::Axis one(mesh, "cp");
    for (bool causal : {true, false}) {
      SCOPED_TRACE(causal ? "causal" : "non-causal");
      AttentionShape sh{.batch = 1, .heads = 2, .kv_heads = 1, .head_dim = 3, .causal = causal};
      CompressedConfig config{11, 3, 2, in_range(3, 51, 0.1f, 1.0f)};
      size_t qs = sh.heads * sh.head_dim, ks = sh.kv_heads * sh.head_dim;
      std::array<std::vector<float>, 4> x = {random_floats(config.seq * qs, 52),
                                             random_floats(config.seq * ks, 53),
                                             random_floats(config.seq * ks, 54), config.weights};
      std::vector<float> dout = random_floats(config.seq * qs, 55);
      parallel::CompressedAttentionCp attention(one, sh, config);
      std::vector<float> out(x[0].size());
      std::array<std::vector<float>, 4> grads = {
          std::vector<float>(x[0].size()), std::vector<float>(x[1].size()),
          std::vector<float>(x[2].size()), std::vector<float>(config.block)};
      attention.forward(x[0], x[1], x[2], out);
      attention.backward(dout, grads[0], grads[1], grads[2], grads[3]);
      std::array<std::vector<double>, 4> at;
      for (int i = 0; i < 4; ++i) at[i] = doubles(x[i]);
      auto loss = [&] {
        std::vector<double> o = direct_compressed(sh, config, at[0], at[1], at[2], at[3]);
        double sum = 0;
        for (size_t i = 0; i < o.size(); ++i) sum += o[i] * dout[i];
        return sum;
      };
      const char* names[4] = {"dq", "dk", "dv", "dweights"};
      for (int i = 0; i < 4; ++i) {
        std::vector<float> numeric;
        constexpr double kStep = 1e-6;
        for (size_t e = 0; e < at[i].size(); ++e) {
          at[i][e] = x[i][e] + kStep;
          double up = loss();
          at[i][e] = x[i][e] - kStep;
          double down = loss();
          at[i][e] = x[i][e];
          numeric.push_back(static_cast<float>((up - down) / (2 * kStep)));
        }
        expect_close(grads[i], numeric, 1e-5, names[i]);
      }
    }
  });
}

TEST(CpPatternsLayout, CompressedBlocksAreOwnedByTheRankOfTheirLastPosition) {
  CompressedConfig config{20, 4, 2, {}};  // 9 blocks ending at 3, 5, …, 19
  for (int cp : {1, 2, 3, 4, 8}) {
    size_t total = 0;
    for (int r = 0; r < cp; ++r) {
      parallel::BlockRange range = parallel::compressed_blocks(config, cp, r);
      SeqRun run = parallel::cp_shard(config.seq, 0, cp, r, false)[0];
      EXPECT_EQ(range.first, total) << "cp " << cp << " rank " << r;
      for (size_t j = range.first; j < range.first + range.count; ++j) {
        size_t last = j * config.stride + config.block - 1;
        EXPECT_TRUE(last >= run.begin && last < run.begin + run.count) << "block " << j;
      }
      total += range.count;
    }
    EXPECT_EQ(total, 9u) << "cp " << cp;
  }
}

TEST(CpPatternsErrors, BadInputIsNamed) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world, 4);
    parallel::Axis cp(mesh, "cp");
    AttentionShape sh;
    sh.heads = 2;
    sh.head_dim = 2;
    CompressedConfig config{9, 4, 2, {}};
    expect_error([&] { (void)parallel::CompressedAttentionCp(cp, sh, config); },
                 "gives rank 1 2 positions, fewer than the halo block − 1 = 3");
    config = {40, 2, 3, {}};
    expect_error([&] { (void)parallel::CompressedAttentionCp(cp, sh, config); },
                 "stride (3) must be in [1, block = 2]");
    config = {40, 2, 1, {0.5f}};
    expect_error([&] { (void)parallel::CompressedAttentionCp(cp, sh, config); },
                 "weights has 1 entries, expected block = 2");
    config.weights.clear();
    parallel::CompressedAttentionCp attention(cp, sh, config);
    std::vector<float> small(3), out(10 * 4);
    expect_error([&] { attention.backward(out, out, out, out, small); }, "backward before forward");
    expect_error([&] { attention.forward(small, out, out, out); }, "q has 3 elements");
    std::vector<float> in(10 * 4);
    attention.forward(in, in, in, out);
    expect_error([&] { attention.backward(out, out, in, in, small); },
                 "dweights has 3 elements, expected 2");

    AffineShape affine_shape{1, 1, 2, 0};
    expect_error([&] { (void)parallel::AffineStateCp(cp, affine_shape, 8); },
                 "key_dim and value_dim of the affine state must be positive");
    affine_shape.value_dim = 2;
    parallel::AffineStateCp affine(cp, affine_shape, 8);
    std::vector<float> rows(2 * 2);
    expect_error([&] { affine.backward(rows, rows, rows, rows, rows, small); },
                 "backward before forward");
    expect_error([&] { affine.forward(rows, rows, rows, rows, small, rows); },
                 "beta has 3 elements, expected 2");
  });
}

}  // namespace
}  // namespace weft::testing
