// The cluster view and the ring and tree built on it, for every cluster of
// 1..8 nodes with 1..8 ranks each (uneven), ranks numbered in scrambled
// order, NUMA domains of several sizes: the ring crosses each node and
// domain boundary the fewest times possible, the tree is a binary spanning
// tree with the fewest cross-node and cross-domain edges. Crossings are
// counted here, independently of the library's own counters.
#include "topo/shapes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "topo/cluster_file.h"

namespace weft::topo {
namespace {

struct Scenario {
  std::vector<RankPlace> places;
  int nodes = 0;
  int domains = 0;  // distinct (node, package, numa)
};

// Node i holds 1 + (i * 5 + ranks_per_node) % 8 ranks (capped to
// ranks_per_node when uneven is false), split over up to 2 packages x 2 NUMA
// nodes; ranks are numbered in a random order.
Scenario make_scenario(int nodes, int ranks_per_node, bool uneven, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<RankPlace> unnumbered;
  std::set<std::tuple<uint64_t, int, int>> domains;
  for (int node = 0; node < nodes; ++node) {
    int count = uneven ? 1 + (node * 5 + ranks_per_node) % 8 : ranks_per_node;
    int packages = 1 + static_cast<int>(random() % 2), numas = 1 + static_cast<int>(random() % 2);
    uint64_t key = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(node + 1);  // like a host hash
    for (int i = 0; i < count; ++i) {
      int package = static_cast<int>(random() % packages);
      int numa = package * 2 + static_cast<int>(random() % numas);
      unnumbered.push_back({key, package, numa, -1});
      domains.insert({key, package, numa});
    }
  }
  std::shuffle(unnumbered.begin(), unnumbered.end(), random);
  return {unnumbered, nodes, static_cast<int>(domains.size())};
}

struct Edge {
  int from, to;
};

// How many edges leave a group of ranks, per group, for a grouping function.
template <typename Group>
std::map<uint64_t, int> out_edges(const std::vector<Edge>& edges, Group group) {
  std::map<uint64_t, int> out;
  for (const Edge& e : edges)
    if (group(e.from) != group(e.to)) ++out[group(e.from)];
  return out;
}

void check_view(const Scenario& s, const ClusterView& view) {
  ASSERT_EQ(view.nranks(), static_cast<int>(s.places.size()));
  EXPECT_EQ(view.nnodes(), s.nodes);
  EXPECT_EQ(view.ndomains(), s.domains);
  EXPECT_EQ(view.node_of(0), 0);
  std::vector<int> lowest(view.nnodes(), -1);
  for (int r = 0; r < view.nranks(); ++r) {
    for (int q = 0; q < view.nranks(); ++q) {
      EXPECT_EQ(view.node_of(r) == view.node_of(q), s.places[r].node_key == s.places[q].node_key);
      bool same_domain = s.places[r].node_key == s.places[q].node_key &&
                         s.places[r].package == s.places[q].package &&
                         s.places[r].numa == s.places[q].numa;
      EXPECT_EQ(view.domain_of(r) == view.domain_of(q), same_domain);
    }
    if (lowest[view.node_of(r)] < 0) lowest[view.node_of(r)] = r;
  }
  // Nodes are numbered by their lowest rank.
  EXPECT_TRUE(std::is_sorted(lowest.begin(), lowest.end()));
}

void check_ring(const Scenario& s, const ClusterView& view) {
  std::vector<int> ring = ring_order(view);
  const int n = view.nranks();
  ASSERT_EQ(static_cast<int>(ring.size()), n);
  EXPECT_EQ(ring[0], 0);
  std::vector<int> sorted = ring;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  ASSERT_EQ(sorted, all) << "not a permutation";
  std::vector<Edge> edges;
  for (int i = 0; i < n && n > 1; ++i) edges.push_back({ring[i], ring[(i + 1) % n]});
  auto node = [&](int r) { return s.places[r].node_key; };
  auto domain = [&](int r) {
    return s.places[r].node_key * 31 +
           static_cast<uint64_t>(s.places[r].package * 8 + s.places[r].numa);
  };
  std::map<uint64_t, int> node_out = out_edges(edges, node);
  std::map<uint64_t, int> domain_out = out_edges(edges, domain);
  // A ring leaves each node exactly once when there are several nodes (and
  // so enters each once); likewise for domains.
  int node_crossings = 0, domain_crossings = 0;
  for (const auto& [key, count] : node_out) {
    EXPECT_EQ(count, 1) << "the ring leaves a node " << count << " times";
    node_crossings += count;
  }
  for (const auto& [key, count] : domain_out) {
    EXPECT_EQ(count, 1) << "the ring leaves a domain " << count << " times";
    domain_crossings += count;
  }
  EXPECT_EQ(node_crossings, s.nodes > 1 ? s.nodes : 0);
  EXPECT_EQ(domain_crossings, s.domains > 1 ? s.domains : 0);
  Crossings reported = ring_crossings(view, ring);
  EXPECT_EQ(reported.nodes, node_crossings);
  EXPECT_EQ(reported.domains, domain_crossings);
}

void check_tree(const Scenario& s, const ClusterView& view, int root) {
  TreeShape tree = tree_shape(view, root);
  const int n = view.nranks();
  ASSERT_EQ(static_cast<int>(tree.parent.size()), n);
  EXPECT_EQ(tree.root, root);
  EXPECT_EQ(tree.parent[root], -1);
  std::vector<Edge> edges;
  for (int r = 0; r < n; ++r) {
    EXPECT_LE(tree.children[r].size(), 2u) << "rank " << r;
    for (int child : tree.children[r]) EXPECT_EQ(tree.parent[child], r);
    if (r == root) continue;
    ASSERT_GE(tree.parent[r], 0) << "rank " << r << " has no parent";
    const auto& siblings = tree.children[tree.parent[r]];
    EXPECT_EQ(std::count(siblings.begin(), siblings.end(), r), 1);
    edges.push_back({tree.parent[r], r});
  }
  // Spanning and acyclic: every rank reaches the root within n steps.
  int deepest = 0;
  for (int r = 0; r < n; ++r) {
    int steps = 0;
    for (int at = r; at != root; at = tree.parent[at]) ASSERT_LE(++steps, n) << "cycle at " << r;
    deepest = std::max(deepest, steps);
  }
  EXPECT_EQ(tree.depth, deepest);
  // Children are listed largest subtree first.
  std::vector<int> size(n, 1);
  for (int r = 0; r < n; ++r)
    for (int at = r; at != root; at = tree.parent[at]) ++size[tree.parent[at]];
  for (int r = 0; r < n; ++r)
    for (size_t i = 1; i < tree.children[r].size(); ++i)
      EXPECT_GE(size[tree.children[r][i - 1]], size[tree.children[r][i]]);
  // The fewest crossings a spanning tree can have.
  int node_edges = 0, domain_edges = 0;
  for (const Edge& e : edges) {
    node_edges += s.places[e.from].node_key != s.places[e.to].node_key;
    domain_edges += view.domain_of(e.from) != view.domain_of(e.to);
  }
  EXPECT_EQ(node_edges, s.nodes - 1);
  EXPECT_EQ(domain_edges, s.domains - 1);
  Crossings reported = tree_crossings(view, tree);
  EXPECT_EQ(reported.nodes, node_edges);
  EXPECT_EQ(reported.domains, domain_edges);
  // Logarithmic, not a chain. A group of m ranks has a free slot at depth
  // <= log2(m), and a heap over k groups chains at most log2(k) of them, so
  // each level adds at most log2(k) * (log2(n) + 1); the scenarios have up to
  // 2 packages and 2 NUMA nodes per package.
  auto log2_ceil = [](int x) {
    int log = 0;
    while ((1 << log) < x) ++log;
    return log;
  };
  int bound = (log2_ceil(s.nodes) + 2) * (log2_ceil(n) + 1) + log2_ceil(n);
  EXPECT_LE(tree.depth, bound);
}

TEST(Shapes, EveryClusterUpToEightNodesOfEightRanks) {
  for (int nodes = 1; nodes <= 8; ++nodes) {
    for (int per_node = 1; per_node <= 8; ++per_node) {
      for (bool uneven : {false, true}) {
        uint32_t seed = static_cast<uint32_t>(nodes * 100 + per_node * 2 + uneven);
        Scenario s = make_scenario(nodes, per_node, uneven, seed);
        SCOPED_TRACE("nodes " + std::to_string(nodes) + " per node " + std::to_string(per_node) +
                     (uneven ? " uneven" : "") + " seed " + std::to_string(seed));
        ClusterView view(s.places);
        check_view(s, view);
        check_ring(s, view);
        for (int root : {0, view.nranks() - 1, view.nranks() / 2}) check_tree(s, view, root);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(Shapes, LargeClusterStaysShallow) {
  Scenario s = make_scenario(64, 8, false, 5);
  ClusterView view(s.places);
  check_ring(s, view);
  check_tree(s, view, 17);
  // 512 ranks: a few hops per doubling (log2 64 nodes + log2 8 ranks), far
  // from the 64+ of a chain over the nodes.
  EXPECT_LE(tree_shape(view, 0).depth, 3 * (6 + 3));
}

TEST(Shapes, NoPlacementKnownIsOneDomain) {
  std::vector<RankPlace> places(5);  // one node, nothing known: plain rank order
  ClusterView view(places);
  EXPECT_EQ(view.nnodes(), 1);
  EXPECT_EQ(view.ndomains(), 1);
  EXPECT_EQ(ring_order(view), (std::vector<int>{0, 1, 2, 3, 4}));
  TreeShape tree = tree_shape(view, 3);
  EXPECT_EQ(tree.parent[3], -1);
  EXPECT_EQ(tree.depth, 2);
}

TEST(Shapes, SingleRankAndEmpty) {
  ClusterView one(std::vector<RankPlace>(1));
  EXPECT_EQ(ring_order(one), std::vector<int>{0});
  EXPECT_EQ(tree_shape(one, 0).depth, 0);
  EXPECT_EQ(ring_crossings(one, ring_order(one)).nodes, 0);
  ClusterView none(std::vector<RankPlace>{});
  EXPECT_TRUE(ring_order(none).empty());
  EXPECT_TRUE(tree_shape(none, 0).parent.empty());
}

// The cluster file path end to end: ranks interleaved over nodes, as a
// round-robin launcher numbers them; the ring regroups them by node.
TEST(Shapes, FromAClusterFile) {
  Cluster cluster;
  Status status = parse_cluster(R"({"weft_topology": 1,
    "nodes": [{"name": "n", "count": 3, "synthetic": "package:2 numa:1 core:2 pu:1"}],
    "ranks": [{"node": "n-0", "cpus": [0]}, {"node": "n-1", "cpus": [0]}, {"node": "n-2", "cpus": [2]},
              {"node": "n-0", "cpus": [2]}, {"node": "n-1", "cpus": [1]}, {"node": "n-2", "cpus": [0]}]})",
                                "", &cluster);
  ASSERT_TRUE(status.ok()) << status.message();
  ClusterView view(places_of(cluster));
  EXPECT_EQ(view.nnodes(), 3);
  EXPECT_EQ(view.ndomains(), 5);  // n-0: two packages; n-1: one; n-2: two
  std::vector<int> ring = ring_order(view);
  Crossings crossings = ring_crossings(view, ring);
  EXPECT_EQ(crossings.nodes, 3);
  EXPECT_EQ(crossings.domains, 5);
  for (size_t i = 0; i + 1 < ring.size(); i += 2)
    EXPECT_EQ(cluster.ranks[ring[i]].node, cluster.ranks[ring[i + 1]].node)
        << "ring position " << i;
  TreeShape tree = tree_shape(view, 0);
  EXPECT_EQ(tree_crossings(view, tree).nodes, 2);
}

TEST(LocalPlace, UsesBindingThenGpu) {
  Machine m;
  m.packages = 2;
  m.numa = {{0, 0, 0}, {1, 1, 0}};
  m.cores = {{0, 0, {0}}, {1, 1, {1}}};
  m.gpus = {{"", "g0", 1, -1}};
  EXPECT_EQ(local_place(m, std::vector<int>{0}, 7, -1), (RankPlace{7, 0, 0, -1}));
  EXPECT_EQ(local_place(m, std::vector<int>{0, 1}, 7, 0), (RankPlace{7, 1, 1, 0}));  // GPU's node
  EXPECT_EQ(local_place(m, std::vector<int>{0, 1}, 7, -1), (RankPlace{7, -1, -1, -1}));
}

}  // namespace
}  // namespace weft::topo
