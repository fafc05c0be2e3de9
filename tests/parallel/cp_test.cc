// Context-parallel attention (ring pass-KV, zigzag, pass-Q, all-gather K/V,
// Ulysses, auto) forward and backward against dense single-process
// attention, the ledger's call counts and bytes, the KV-cache rule, and bad
// input.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::AttentionShape;
using parallel::CpAlgorithm;
using parallel::CpConfig;
using parallel::SeqRun;

struct Dense {
  std::vector<float> out, dq, dk, dv;
};

// Attention of every query over every key written as whole matrices (the
// softmax of the masked scores, its Jacobian applied to dP), apart from the
// library's blockwise kernels. Queries are the last q_seq of kv_seq positions.
Dense dense_attention(const AttentionShape& sh, size_t q_seq, size_t kv_seq,
                      const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<float>& dout) {
  size_t b = sh.batch, h = sh.heads, hk = sh.kv_heads, d = sh.head_dim, offset = kv_seq - q_seq;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Dense r{std::vector<float>(q.size()), std::vector<float>(q.size()), std::vector<float>(k.size()),
          std::vector<float>(v.size())};
  auto qi = [&](size_t t, size_t bb, size_t hh) { return ((t * b + bb) * h + hh) * d; };
  auto ki = [&](size_t t, size_t bb, size_t hh) { return ((t * b + bb) * hk + hh / (h / hk)) * d; };
  for (size_t bb = 0; bb < b; ++bb)
    for (size_t hh = 0; hh < h; ++hh) {
      std::vector<double> p(q_seq * kv_seq, 0.0), dp(q_seq * kv_seq, 0.0);
      for (size_t i = 0; i < q_seq; ++i) {
        double top = -INFINITY, sum = 0;
        for (size_t j = 0; j < kv_seq; ++j) {
          if (sh.causal && j > i + offset) continue;
          double s = 0;
          for (size_t x = 0; x < d; ++x) s += double(q[qi(i, bb, hh) + x]) * k[ki(j, bb, hh) + x];
          p[i * kv_seq + j] = s * scale;
          top = std::max(top, s * scale);
        }
        for (size_t j = 0; j < kv_seq; ++j) {
          if (sh.causal && j > i + offset) continue;
          p[i * kv_seq + j] = std::exp(p[i * kv_seq + j] - top);
          sum += p[i * kv_seq + j];
        }
        for (size_t j = 0; j < kv_seq; ++j) p[i * kv_seq + j] /= sum;
      }
      for (size_t i = 0; i < q_seq; ++i)
        for (size_t x = 0; x < d; ++x) {
          double o = 0;
          for (size_t j = 0; j < kv_seq; ++j) o += p[i * kv_seq + j] * v[ki(j, bb, hh) + x];
          r.out[qi(i, bb, hh) + x] = float(o);
        }
      for (size_t i = 0; i < q_seq; ++i) {
        double row = 0;
        for (size_t j = 0; j < kv_seq; ++j) {
          double s = 0;
          for (size_t x = 0; x < d; ++x)
            s += double(dout[qi(i, bb, hh) + x]) * v[ki(j, bb, hh) + x];
          dp[i * kv_seq + j] = s;
          row += s * p[i * kv_seq + j];
        }
        for (size_t j = 0; j < kv_seq; ++j) {
          double pij = p[i * kv_seq + j], ds = pij * (dp[i * kv_seq + j] - row) * scale;
          for (size_t x = 0; x < d; ++x) {
            r.dv[ki(j, bb, hh) + x] += float(pij * dout[qi(i, bb, hh) + x]);
            r.dq[qi(i, bb, hh) + x] += float(ds * k[ki(j, bb, hh) + x]);
            r.dk[ki(j, bb, hh) + x] += float(ds * q[qi(i, bb, hh) + x]);
          }
        }
      }
    }
  return r;
}

// The rows of a [seq, stride] tensor at runs (positions minus offset).
std::vector<float> rows_at(const std::vector<float>& x, size_t stride,
                           const std::vector<SeqRun>& runs, size_t offset) {
  std::vector<float> out;
  for (const SeqRun& run : runs)
    out.insert(out.end(), x.begin() + (run.begin - offset) * stride,
               x.begin() + (run.begin - offset + run.count) * stride);
  return out;
}

struct Case {
  CpAlgorithm algorithm;
  size_t q_seq, kv_seq, heads, kv_heads;
  bool causal;
  bool uneven_heads = false;
  std::vector<std::string> hosts = {};  // hier: the node of every rank
  bool zigzag = false;                  // zigzag shards (hier: over the nodes)
};

std::string describe(const Case& c, int n) {
  return std::string(parallel::cp_algorithm_name(c.algorithm)) + " P=" + std::to_string(n) +
         " q=" + std::to_string(c.q_seq) + " kv=" + std::to_string(c.kv_seq) +
         " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         (c.causal ? " causal" : " full") + (c.zigzag ? " zigzag" : "");
}

void run_case(const parallel::Axis& axis, const Case& c) {
  AttentionShape sh;
  sh.batch = 2;
  sh.heads = c.heads;
  sh.kv_heads = c.kv_heads;
  sh.head_dim = 4;
  sh.causal = c.causal;
  CpConfig config;
  config.algorithm = c.algorithm;
  config.q_seq = c.q_seq;
  config.kv_seq = c.kv_seq;
  config.uneven_heads = c.uneven_heads;
  config.hosts = c.hosts;
  config.zigzag = c.zigzag;
  size_t qs = sh.batch * sh.heads * sh.head_dim, ks = sh.batch * sh.kv_heads * sh.head_dim;
  auto q = random_floats(c.q_seq * qs, 11), k = random_floats(c.kv_seq * ks, 12),
       v = random_floats(c.kv_seq * ks, 13), dout = random_floats(c.q_seq * qs, 14);
  Dense want = dense_attention(sh, c.q_seq, c.kv_seq, q, k, v, dout);

  parallel::ContextParallelAttention attention(axis, sh, config);
  int r = axis.rank();
  size_t offset = c.kv_seq - c.q_seq;
  const auto &qr = attention.q_runs(r), &kr = attention.kv_runs(r);
  auto q_r = rows_at(q, qs, qr, offset), k_r = rows_at(k, ks, kr, 0), v_r = rows_at(v, ks, kr, 0);
  ASSERT_EQ(q_r.size(), attention.q_rows() * qs);
  if (c.zigzag && !c.hosts.empty()) {  // this rank's rows lie in its node's chunks k, 2N−1−k
    std::vector<std::string> nodes;
    for (const std::string& host : c.hosts)
      if (std::find(nodes.begin(), nodes.end(), host) == nodes.end()) nodes.push_back(host);
    size_t k = std::find(nodes.begin(), nodes.end(), c.hosts[r]) - nodes.begin();
    size_t chunks = 2 * nodes.size(), chunk = c.q_seq / chunks;
    for (const SeqRun& run : qr) {
      size_t first = (run.begin - offset) / chunk,
             last = (run.begin - offset + run.count - 1) / chunk;
      EXPECT_EQ(first, last) << "a run crosses chunks";
      EXPECT_TRUE(first == k || first == chunks - 1 - k) << "chunk " << first << " on node " << k;
    }
  }
  std::vector<float> out(q_r.size()), dq(q_r.size()), dk(k_r.size()), dv(v_r.size());
  attention.forward(q_r, k_r, v_r, out);
  std::string what = describe(c, axis.size());
  expect_close(out, rows_at(want.out, qs, qr, offset), 1e-5, (what + " out").c_str());
  attention.backward(rows_at(dout, qs, qr, offset), dq, dk, dv);
  expect_close(dq, rows_at(want.dq, qs, qr, offset), 1e-5, (what + " dq").c_str());
  expect_close(dk, rows_at(want.dk, ks, kr, 0), 1e-5, (what + " dk").c_str());
  expect_close(dv, rows_at(want.dv, ks, kr, 0), 1e-5, (what + " dv").c_str());
}

// A mesh with every rank on cp.
parallel::Mesh cp_mesh(const weft::Comm& world) {
  parallel::MeshShape shape;
  shape.cp = world.size();
  return parallel::Mesh(world, shape);
}

// body(cp axis, its ledger) on every rank of a world of `ranks`, all on cp.
void on_cp_axis(int ranks,
                const std::function<void(const parallel::Axis&, parallel::Ledger&)>& body) {
  run_ranks(ranks, [&](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world);
    parallel::Ledger ledger;
    parallel::Axis cp(mesh, "cp", &ledger);
    body(cp, ledger);
  });
}

class ContextParallel : public ::testing::TestWithParam<int> {};

TEST_P(ContextParallel, EveryAlgorithmMatchesDenseAttention) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world);
    parallel::Axis cp(mesh, "cp");
    size_t n = world.size(), odd = 2 * n + 3, even = 4 * n;
    std::vector<Case> cases = {
        {CpAlgorithm::ring, odd, odd, 4, 2, true},
        {CpAlgorithm::ring, odd, odd, 2, 2, false},
        {CpAlgorithm::zigzag, even, even, 2, 1, true},
        {CpAlgorithm::zigzag, even, even, 2, 2, false},
        {CpAlgorithm::passq, odd, odd, 2, 2, true},
        {CpAlgorithm::passq, n + 1, 3 * n + 2, 4, 2, true},  // prefill against a KV cache
        {CpAlgorithm::passq, odd, odd, 2, 1, false},
        {CpAlgorithm::allgather, odd, odd, 2, 2, true},
        {CpAlgorithm::allgather, even, even, 4, 1, false},
        {CpAlgorithm::ulysses, odd, odd, 2 * n, n, true},
        {CpAlgorithm::ulysses, even, even, n, n, false},
        {CpAlgorithm::ulysses, odd, odd, n + 1, n + 1, true, true},  // AllToAllv of heads
        {CpAlgorithm::automatic, 2, 6 * n, 2, 2, true},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(describe(c, n));
      run_case(cp, c);
    }
  });
}

// Ring pass-KV books P−1 k|v shifts forward and, backward, P−1 of k|v and
// P−1 of the dk|dv accumulators (twice the forward bytes); Ulysses four
// AllToAlls each way of (P−1)/P of a tensor's rows × heads/P.
TEST_P(ContextParallel, LedgerMatchesTheClosedForms) {
  on_cp_axis(GetParam(), [](const parallel::Axis& cp, parallel::Ledger& ledger) {
    size_t n = cp.size(), seq = 4 * n;
    AttentionShape sh;
    sh.heads = n;
    sh.head_dim = 2;
    size_t stride = sh.heads * sh.head_dim, rows = seq / n;
    for (CpAlgorithm algorithm : {CpAlgorithm::ring, CpAlgorithm::ulysses}) {
      ledger.clear();
      CpConfig config;
      config.algorithm = algorithm;
      config.q_seq = seq;
      parallel::ContextParallelAttention attention(cp, sh, config);
      auto x = random_floats(rows * stride, 5);
      std::vector<float> out(x.size()), dq(x.size()), dk(x.size()), dv(x.size());
      attention.forward(x, x, x, out);
      attention.backward(x, dq, dk, dv);
      std::map<std::string, std::pair<size_t, size_t>> got;  // pattern -> calls, bytes sent
      for (const auto& e : ledger.entries()) {
        got[e.pattern].first += e.calls;
        got[e.pattern].second += e.bytes_sent;
      }
      size_t block = rows * stride * sizeof(float);
      if (algorithm == CpAlgorithm::ring) {
        EXPECT_EQ(got["cp.ring_kv"], std::make_pair(n - 1, (n - 1) * 2 * block));
        EXPECT_EQ(got["cp.ring_kv_bwd"].second + got["cp.ring_dkv"].second,
                  2 * got["cp.ring_kv"].second);
        EXPECT_EQ(got["cp.ring_dkv"].first, n - 1);
      } else {
        EXPECT_EQ(got["cp.ulysses"], std::make_pair(size_t{8}, 8 * (n - 1) * block / n));
      }
    }
  });
}

// Nodes a, b, … of `per_node` consecutive ranks each, or round robin.
std::vector<std::string> nodes_of(size_t n, size_t per_node, bool interleaved = false) {
  std::vector<std::string> hosts;
  size_t nodes = n / per_node;
  for (size_t r = 0; r < n; ++r)
    hosts.push_back(std::string(1, char('a' + (interleaved ? r % nodes : r / per_node))));
  return hosts;
}

// hier on every way to cut the ranks into equal nodes of consecutive ranks
// (one node: Ulysses alone; one rank per node: the ring alone) with the
// ledger of the calls inside nodes and across them; interleaved nodes,
// uneven shards with grouped-query heads against a KV cache, and the
// host-name default once each.
TEST_P(ContextParallel, HierMatchesDenseAttention) {
  on_cp_axis(GetParam(), [](const parallel::Axis& cp, parallel::Ledger& ledger) {
    size_t n = cp.size(), middle = 1;
    for (size_t l = 1; l <= n; ++l) {
      if (n % l != 0) continue;
      if (l < n) middle = l;
      SCOPED_TRACE("nodes of " + std::to_string(l));
      ledger.clear();
      run_case(cp, {CpAlgorithm::hier, 4 * n, 4 * n, 2 * l, 2 * l, true, false, nodes_of(n, l)});
      parallel::ModelConfig model;
      model.layers = 1, model.seq = int(4 * n), model.heads = int(2 * l);
      model.hidden = int(2 * l * 4), model.cp = int(n);  // batch 2, head_dim 4 as run_case's
      model.cp_algorithm = CpAlgorithm::hier, model.cp_node_ranks = int(l);
      parallel::Ledger step = parallel::Ledger::expected(model), expected;  // its CP entries
      for (const auto& e : step.entries())
        for (size_t i = 0; e.pattern.starts_with("cp.") && i < e.calls; ++i)
          expected.record(e.pattern, e.primitive, e.dim, e.bytes_per_call, e.bytes_sent / e.calls,
                          "", 0, 0);
      auto differences = ledger.compare(expected);
      EXPECT_TRUE(differences.empty()) << differences.front();
      for (const auto& e : ledger.entries())
        EXPECT_EQ(e.dim, e.primitive == "alltoall" ? "cp.node" : "cp.ring") << e.pattern;
    }
    if (n >= 4) {
      SCOPED_TRACE("interleaved nodes of 2");
      run_case(cp,
               {CpAlgorithm::hier, 2 * n + 3, 2 * n + 3, 4, 2, true, false, nodes_of(n, 2, true)});
    }
    SCOPED_TRACE("KV cache, nodes of " + std::to_string(middle));
    run_case(cp, {CpAlgorithm::hier, n + 1, 3 * n + 2, 2 * middle, middle, true, false,
                  nodes_of(n, middle)});
    // Zigzag over the nodes: node k holds chunks k and 2N−1−k, split over its
    // ranks (a rank's piece may span both chunks); causal and not, a KV cache.
    for (size_t l = 1; l <= n; ++l) {
      if (n % l != 0) continue;
      size_t nodes = n / l;
      SCOPED_TRACE("zigzag, nodes of " + std::to_string(l));
      run_case(cp, {CpAlgorithm::hier, 2 * nodes * 3, 2 * nodes * 3, 2 * l, l, true, false,
                    nodes_of(n, l), true});
      run_case(cp, {CpAlgorithm::hier, 2 * nodes * 2, 2 * nodes * 2, l, l, false, false,
                    nodes_of(n, l), true});
      run_case(cp, {CpAlgorithm::hier, 2 * nodes, 2 * nodes * 4, 2 * l, 2 * l, true, false,
                    nodes_of(n, l), true});
    }
    // Without hosts every rank reports its own host name: one node here.
    run_case(cp, {CpAlgorithm::hier, 2 * n + 3, 2 * n + 3, n, n, false});
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ContextParallel, ::testing::Values(2, 3, 4, 8));

TEST(ContextParallelRule, AutoPicksPassQOnlyWithALargeKvCache) {
  AttentionShape sh;
  sh.heads = 16;
  sh.kv_heads = 1;
  sh.head_dim = 64;
  // pass-Q sends q_seq·heads·(2·dim + 1) against kv_seq·kv_heads·2·dim:
  // break-even at q/kv = (1/16)·128/129, about 6.2% of the positions new.
  auto bytes = parallel::cp_forward_bytes(sh, 100, 1000, 4);
  EXPECT_LT(bytes.pass_kv, bytes.pass_q);
  EXPECT_EQ(parallel::choose_cp_algorithm(sh, 100, 1000, 4), CpAlgorithm::ring);
  bytes = parallel::cp_forward_bytes(sh, 60, 1000, 4);
  EXPECT_LT(bytes.pass_q, bytes.pass_kv);
  EXPECT_EQ(parallel::choose_cp_algorithm(sh, 60, 1000, 4), CpAlgorithm::passq);
  // Without a cache (q = kv) pass-KV always wins, even with full heads.
  sh.kv_heads = 16;
  EXPECT_EQ(parallel::choose_cp_algorithm(sh, 1000, 1000, 4), CpAlgorithm::ring);
  EXPECT_EQ(parallel::choose_cp_algorithm(sh, 400, 1000, 4), CpAlgorithm::passq);
}

TEST(ContextParallelErrors, BadInputIsNamed) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = cp_mesh(world);
    parallel::Axis cp(mesh, "cp");
    AttentionShape sh;
    sh.heads = 6;
    sh.head_dim = 2;
    CpConfig config;
    config.q_seq = 12;
    config.algorithm = CpAlgorithm::zigzag;
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "sequence length 12 is not divisible by 2·cp = 8");
    config.algorithm = CpAlgorithm::ulysses;
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "heads (6) and kv_heads (6) must divide by the cp size 4");
    sh.heads = 3;
    config.uneven_heads = true;
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "heads (3) is fewer than the cp size 4");
    sh.heads = 6;
    sh.kv_heads = 4;
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "heads (6) is not a multiple of kv_heads (4)");
    sh.kv_heads = 0;
    config.algorithm = CpAlgorithm::ring;
    config.kv_seq = 8;
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "kv_seq (8) is shorter than q_seq (12)");
    config.kv_seq = 0;
    parallel::ContextParallelAttention attention(cp, sh, config);
    std::vector<float> small(3), out(3 * 6 * 2);
    expect_error([&] { attention.forward(small, small, small, out); }, "q has 3 elements");
    expect_error([&] { attention.backward(out, out, out, out); }, "backward before forward");
    expect_error([] { parallel::parse_cp_algorithm("spiral"); }, "cp algorithm 'spiral'");
    config.algorithm = CpAlgorithm::hier;
    config.hosts = {"a", "a", "a", "b"};
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "hier needs the same number of cp ranks on every node: a has 3, node 1 has 1");
    config.hosts = {"a", "b"};
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "hosts has 2 names for a cp size of 4");
    config.hosts = {"a", "a", "a", "a"};
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "heads (6) and kv_heads (6) must divide by the 4 cp ranks of a node for hier");
    config.hosts = {"a", "a", "b", "b"};
    config.zigzag = true;
    config.q_seq = 6;  // 2 nodes: 4 chunks
    expect_error([&] { (void)parallel::ContextParallelAttention(cp, sh, config); },
                 "hier with zigzag needs q_seq (6) and kv_seq (6) divisible by 2·nodes = 4");
  });
}

}  // namespace
}  // namespace weft::testing
