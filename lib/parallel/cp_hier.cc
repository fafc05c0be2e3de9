// Hierarchical CP: Ulysses inside a node, ring pass-KV across nodes. The
// L ranks of a node trade sequence for heads by AllToAll, so each holds the
// node's whole segment for 1/L of the heads; the ranks with the same local
// index on every node then run the ring over the node segments on those
// heads, and an AllToAll returns the output. Only the ring crosses nodes,
// with blocks as large as a flat ring's but N − 1 = P/L − 1 shifts of them.
// With zigzag the nodes hold zigzag chunks (node k: k and 2N−1−k), which
// balances the causal ring across nodes as it does the flat ring.
#include <algorithm>
#include <map>

#include "parallel/cp_internal.h"

namespace weft::parallel::detail {

using State = ContextParallelAttention::State;

struct Hier {
  weftComm_t node_comm = nullptr, ring_comm = nullptr;
  std::unique_ptr<Axis> node_axis, ring_axis;
  // node: this rank's node as a Ulysses group (its rows per local rank);
  // ring: the pass-KV state over the node segments on this rank's heads.
  std::unique_ptr<State> node, ring;
  Heads q_heads, kv_heads;

  ~Hier() {
    node.reset();
    ring.reset();
    node_axis.reset();
    ring_axis.reset();
    if (node_comm != nullptr) weftCommDestroy(node_comm);
    if (ring_comm != nullptr) weftCommDestroy(ring_comm);
  }
};

namespace {

size_t rows_of(const std::vector<SeqRun>& runs) {
  size_t n = 0;
  for (const SeqRun& run : runs) n += run.count;
  return n;
}

// The i-th rank's piece of its node's rows (the node's runs in order, split
// by split_sizes): what the node's AllToAll puts back together in rank order.
std::vector<SeqRun> piece(const std::vector<SeqRun>& node_runs, int per_node, int local) {
  std::vector<size_t> sizes = split_sizes(rows_of(node_runs), per_node);
  size_t skip = 0, take = sizes[local];
  for (int i = 0; i < local; ++i) skip += sizes[i];
  std::vector<SeqRun> runs;
  for (const SeqRun& run : node_runs) {
    size_t from = std::min(skip, run.count), count = std::min(take, run.count - from);
    skip -= from;
    if (count > 0) runs.push_back({run.begin + from, count});
    take -= count;
  }
  return runs;
}

}  // namespace

void hier_setup(State& s) {
  std::vector<std::string> hosts = s.config.hosts.empty()
                                       ? exchange_hosts(s.axis.comm(), s.size, s.axis.stream())
                                       : s.config.hosts;
  require(static_cast<int>(hosts.size()) == s.size, "hosts has " + std::to_string(hosts.size()) +
                                                        " names for a cp size of " +
                                                        std::to_string(s.size));
  // Nodes in the order of their first rank; a rank's local index is its
  // order among its node's ranks.
  std::map<std::string, int> node_index;
  std::vector<int> node_of(s.size), local_of(s.size), per_node;
  for (int r = 0; r < s.size; ++r) {
    auto [it, added] = node_index.emplace(hosts[r], static_cast<int>(per_node.size()));
    if (added) per_node.push_back(0);
    node_of[r] = it->second;
    local_of[r] = per_node[it->second]++;
  }
  int nodes = static_cast<int>(per_node.size()), l = per_node[0];
  for (int k = 0; k < nodes; ++k)
    require(per_node[k] == l, "hier needs the same number of cp ranks on every node: " + hosts[0] +
                                  " has " + std::to_string(l) + ", node " + std::to_string(k) +
                                  " has " + std::to_string(per_node[k]));
  auto per = static_cast<size_t>(l);
  require(s.shape.heads % per == 0 && s.shape.kv_heads % per == 0,
          "heads (" + std::to_string(s.shape.heads) + ") and kv_heads (" +
              std::to_string(s.shape.kv_heads) + ") must divide by the " + std::to_string(l) +
              " cp ranks of a node for hier");
  // Node k holds segment k of the nodes' split (zigzag: chunks k and 2N−1−k
  // of 2N), its ranks pieces of that.
  size_t offset = s.config.kv_seq - s.config.q_seq;
  bool zigzag = s.config.zigzag;
  auto chunks = static_cast<size_t>(2 * nodes);
  require(!zigzag || (s.config.q_seq % chunks == 0 && s.config.kv_seq % chunks == 0),
          "hier with zigzag needs q_seq (" + std::to_string(s.config.q_seq) + ") and kv_seq (" +
              std::to_string(s.config.kv_seq) +
              ") divisible by 2·nodes = " + std::to_string(chunks));
  auto q_of_node = [&](int k) { return cp_shard(s.config.q_seq, offset, nodes, k, zigzag); };
  auto kv_of_node = [&](int k) { return cp_shard(s.config.kv_seq, 0, nodes, k, zigzag); };
  for (int r = 0; r < s.size; ++r) {
    s.q_runs[r] = piece(q_of_node(node_of[r]), l, local_of[r]);
    s.kv_runs[r] = piece(kv_of_node(node_of[r]), l, local_of[r]);
    s.q_rows[r] = rows_of(s.q_runs[r]);
    s.kv_rows[r] = rows_of(s.kv_runs[r]);
  }
  s.max_q = *std::max_element(s.q_rows.begin(), s.q_rows.end());
  s.max_kv = *std::max_element(s.kv_rows.begin(), s.kv_rows.end());

  auto h = std::make_shared<Hier>();
  int node = node_of[s.rank], local = local_of[s.rank];
  check(weftCommSplit(s.axis.comm(), node, local, &h->node_comm, nullptr));
  check(weftCommSplit(s.axis.comm(), local, node, &h->ring_comm, nullptr));
  h->node_axis = std::make_unique<Axis>(h->node_comm, s.axis.name() + ".node", s.axis.ledger());
  h->ring_axis = std::make_unique<Axis>(h->ring_comm, s.axis.name() + ".ring", s.axis.ledger());
  h->q_heads = split_heads(s.shape.heads, l);
  h->kv_heads = split_heads(s.shape.kv_heads, l);

  // The node level: rank = local index, rows of every rank of this node.
  h->node = std::make_unique<State>(*h->node_axis, s.shape, s.config);
  State& n = *h->node;
  n.rank = local, n.size = l;
  for (int r = 0; r < s.size; ++r)
    if (node_of[r] == node) {
      n.q_rows.push_back(s.q_rows[r]);
      n.kv_rows.push_back(s.kv_rows[r]);
    }

  // The ring level: rank = node, each holding its node segment on 1/L of
  // the heads.
  AttentionShape own = s.shape;
  own.heads /= per;
  own.kv_heads /= per;
  h->ring = std::make_unique<State>(*h->ring_axis, own, s.config);
  State& g = *h->ring;
  g.algorithm = CpAlgorithm::ring;
  g.rank = node, g.size = nodes;
  for (int k = 0; k < nodes; ++k) {
    g.q_runs.push_back(q_of_node(k));
    g.kv_runs.push_back(kv_of_node(k));
    g.q_rows.push_back(rows_of(g.q_runs.back()));
    g.kv_rows.push_back(rows_of(g.kv_runs.back()));
  }
  g.max_q = *std::max_element(g.q_rows.begin(), g.q_rows.end());
  g.max_kv = *std::max_element(g.kv_rows.begin(), g.kv_rows.end());
  g.q_stride = own.batch * own.heads * own.head_dim;
  g.kv_stride = own.batch * own.kv_heads * own.head_dim;
  g.lse_stride = own.batch * own.heads;
  s.hier = std::move(h);
}

void hier_forward(State& s) {
  Hier& h = *s.hier;
  State &n = *h.node, &g = *h.ring;
  size_t nkv = s.kv_rows[s.rank] * s.kv_stride;
  g.q = to_heads(n, s.q.data(), n.q_rows, h.q_heads);
  g.kv = to_heads(n, s.kv.data(), n.kv_rows, h.kv_heads);
  std::vector<float> v = to_heads(n, s.kv.data() + nkv, n.kv_rows, h.kv_heads);
  g.kv.insert(g.kv.end(), v.begin(), v.end());
  g.out.assign(g.q.size(), 0.0f);
  g.lse.assign(g.q_rows[g.rank] * g.lse_stride, kNegInf);
  ring_forward(g);
  from_heads(n, g.out.data(), n.q_rows, h.q_heads, s.out.data());
}

void hier_backward(State& s, const float* dout, float* dq, float* dkv) {
  Hier& h = *s.hier;
  State &n = *h.node, &g = *h.ring;
  std::vector<float> head_dout = to_heads(n, dout, n.q_rows, h.q_heads);
  std::vector<float> head_dq(g.q.size(), 0.0f), head_dkv(g.kv.size(), 0.0f);
  ring_backward(g, head_dout.data(), head_dq.data(), head_dkv.data());
  size_t half = head_dkv.size() / 2;
  from_heads(n, head_dq.data(), n.q_rows, h.q_heads, dq);
  from_heads(n, head_dkv.data(), n.kv_rows, h.kv_heads, dkv);
  from_heads(n, head_dkv.data() + half, n.kv_rows, h.kv_heads,
             dkv + s.kv_rows[s.rank] * s.kv_stride);
}

}  // namespace weft::parallel::detail
