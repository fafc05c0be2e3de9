// Schedules on multi-node layouts: every layout-aware pair (rings, chains and
// trees that follow the layout's ring; the hierarchical and node-leader
// compositions) through the simulator over many layouts (1-4 nodes of 1-4
// ranks, equal and unequal, nodes contiguous or interleaved, rings in rank
// order or node by node), and the cross-node traffic each one promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "algorithms/patterns.h"
#include "algorithms/simulator.h"
#include "test_pairs.h"

namespace weft::algo {
namespace {

struct NamedLayout {
  std::string name;
  Layout layout;
  int nodes = 1;
  bool equal = true;
};

// Renumbers node ids so that nodes are numbered 0.. by their lowest rank.
void renumber(std::vector<int>* node_of) {
  std::vector<int> id(node_of->size(), -1);
  int next = 0;
  for (int& node : *node_of) {
    if (id[node] < 0) id[node] = next++;
    node = id[node];
  }
}

// The ranks node by node (nodes by id, ranks ascending, or descending inside
// each node when `reverse`), rotated to start at rank 0.
std::vector<int> node_ring(const std::vector<int>& node_of, int nodes, bool reverse) {
  std::vector<int> ring;
  for (int k = 0; k < nodes; ++k) {
    std::vector<int> group;
    for (int r = 0; r < static_cast<int>(node_of.size()); ++r) {
      if (node_of[r] == k) group.push_back(r);
    }
    if (reverse) std::reverse(group.begin(), group.end());
    ring.insert(ring.end(), group.begin(), group.end());
  }
  std::rotate(ring.begin(), std::find(ring.begin(), ring.end(), 0), ring.end());
  return ring;
}

// Node sizes -> layouts: ranks of a node contiguous, or dealt out round
// robin (node_of interleaved); each with the identity ring (empty), the
// node-by-node ring, and the node-by-node ring reversed inside nodes.
void add_layouts(const std::vector<int>& sizes, std::vector<NamedLayout>* out) {
  const int nodes = static_cast<int>(sizes.size());
  std::string shape;
  for (int s : sizes) shape += std::to_string(s);
  std::vector<int> blocked, dealt;
  for (int k = 0; k < nodes; ++k) blocked.insert(blocked.end(), sizes[k], k);
  std::vector<int> left = sizes;
  for (bool more = true; more;) {
    more = false;
    for (int k = 0; k < nodes; ++k) {
      if (left[k] > 0) {
        dealt.push_back(k);
        --left[k];
        more = true;
      }
    }
  }
  renumber(&dealt);
  const bool equal = std::count(sizes.begin(), sizes.end(), sizes[0]) == nodes;
  for (const auto& [kind, node_of] : {std::pair{"blocked", blocked}, std::pair{"dealt", dealt}}) {
    if (kind == std::string("dealt") && (nodes == 1 || sizes.size() == node_of.size())) continue;
    for (int ring = 0; ring < 3; ++ring) {
      NamedLayout l;
      l.name = std::string(kind) + shape + "/ring" + std::to_string(ring);
      l.layout.node_of = node_of;
      if (ring > 0) l.layout.ring = node_ring(node_of, nodes, ring == 2);
      l.nodes = nodes;
      l.equal = equal;
      out->push_back(std::move(l));
    }
  }
}

std::vector<NamedLayout> all_layouts() {
  std::vector<NamedLayout> out;
  for (int nodes = 1; nodes <= 4; ++nodes) {
    for (int per = 1; per <= 4; ++per) add_layouts(std::vector<int>(nodes, per), &out);
  }
  for (const std::vector<int>& sizes :
       {std::vector<int>{2, 1}, {1, 3}, {3, 1, 2}, {4, 2, 2, 1}, {1, 1, 4}}) {
    add_layouts(sizes, &out);
  }
  return out;
}

bool layout_aware(Pair pair) {
  const auto [a, c] = pair;
  if (a == Algorithm::Hierarchical || a == Algorithm::NodeLeader) return true;
  if (a == Algorithm::Ring) {
    return c == Collective::AllReduce || c == Collective::ReduceScatter ||
           c == Collective::AllGather;
  }
  if (a == Algorithm::Chain) return true;
  return a == Algorithm::Tree && c == Collective::AllReduce;
}

std::vector<Pair> layout_pairs() {
  std::vector<Pair> out;
  for (const Pair& pair : supported_pairs()) {
    // AllToAllv needs a count matrix: LayoutAllToAllv below.
    if (layout_aware(pair) && pair.second != Collective::AllToAllv) out.push_back(pair);
  }
  return out;
}

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce;
}

Params params_for(Pair pair, const Layout& layout, uint64_t count) {
  Params p;
  p.algorithm = pair.first;
  p.collective = pair.second;
  p.nranks = static_cast<int>(layout.node_of.size());
  p.count = count;
  p.layout = &layout;
  return p;
}

class LayoutPair : public ::testing::TestWithParam<Pair> {};

TEST_P(LayoutPair, ExactOnEveryLayout) {
  const Pair pair = GetParam();
  for (const NamedLayout& l : all_layouts()) {
    Params p = params_for(pair, l.layout, 0);
    const int n = p.nranks;
    std::string why;
    if (!applicable(p, &why)) {
      // Only the sliced hierarchical schedules refuse, and only unequal nodes.
      EXPECT_FALSE(l.equal) << l.name;
      EXPECT_EQ(pair.first, Algorithm::Hierarchical) << l.name;
      EXPECT_NE(why.find("same number of ranks"), std::string::npos) << why;
      Program program;
      std::string error;
      EXPECT_FALSE(build(p, &program, &error));
      EXPECT_EQ(error, why);
      continue;
    }
    std::vector<int> roots = {0};
    if (rooted(pair.second) && n > 1) roots = {n - 1, n / 2};
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}}) {
      for (uint64_t chunk : {uint64_t{0}, uint64_t{count < 100 ? 3u : 128u}}) {
        for (bool in_place : {false, true}) {
          for (int root : roots) {
            p.count = count;
            p.chunk = chunk;
            p.in_place = in_place;
            p.root = root;
            const SimResult res = simulate(p);
            ASSERT_TRUE(res.ok()) << l.name << " count=" << count << " chunk=" << chunk
                                  << " in_place=" << in_place << " root=" << root << "\n"
                                  << res.message();
            EXPECT_TRUE(res.values_checked) << l.name;
          }
        }
      }
    }
  }
}

// The phases rely on their dependencies: with all of them removed, the
// simulator must object on a multi-node layout.
TEST_P(LayoutPair, StrippedDependenciesAreCaught) {
  Layout layout;
  layout.node_of = {0, 1, 0, 1, 0, 1};
  layout.ring = {0, 2, 4, 1, 3, 5};
  Params p = params_for(GetParam(), layout, 13);
  p.root = 3;
  p.chunk = 4;
  ASSERT_TRUE(simulate(p).ok());
  auto stripped = [](const Params& q, Program* prog, std::string* e) {
    if (!build(q, prog, e)) return false;
    for (Step& s : prog->steps) s.num_deps = 0;
    return true;
  };
  EXPECT_FALSE(simulate(p, {}, stripped).ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutPair, ::testing::ValuesIn(layout_pairs()), pair_name);

// Messages and elements one rank sends to ranks on other nodes.
struct Crossing {
  uint64_t messages = 0;
  uint64_t elements = 0;
};

Crossing crossing(const Params& p, const Layout& layout) {
  Program program;
  std::string error;
  EXPECT_TRUE(build(p, &program, &error)) << error;
  Crossing out;
  for (const Step& s : program.steps) {
    if (s.kind == StepKind::Send && layout.node_of[s.peer] != layout.node_of[p.rank]) {
      ++out.messages;
      out.elements += s.a.count;
    }
  }
  return out;
}

Crossing traffic(Params p) {
  Program program;
  std::string error;
  EXPECT_TRUE(build(p, &program, &error)) << error;
  const RankStats stats = count_program(program, 1);
  return Crossing{stats.messages, stats.bytes_sent};
}

// The layout seen as two levels, as the hierarchical schedules promise to
// see it: nodes in the order the ring enters them, ranks in ring order.
struct Levels {
  std::vector<std::vector<int>> nodes;
  int node_of_rank(int r) const {
    for (size_t k = 0; k < nodes.size(); ++k) {
      if (std::count(nodes[k].begin(), nodes[k].end(), r)) return static_cast<int>(k);
    }
    return -1;
  }
  int local_of(int r) const {
    const std::vector<int>& g = nodes[node_of_rank(r)];
    return static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin());
  }
};

Levels levels_of(const Layout& layout) {
  const int n = static_cast<int>(layout.node_of.size());
  std::vector<int> ring = layout.ring;
  if (ring.empty()) {
    for (int r = 0; r < n; ++r) ring.push_back(r);
  }
  Levels out;
  std::vector<int> index(n, -1);
  for (int r : ring) {
    const int id = layout.node_of[r];
    if (index[id] < 0) {
      index[id] = static_cast<int>(out.nodes.size());
      out.nodes.emplace_back();
    }
    out.nodes[index[id]].push_back(r);
  }
  return out;
}

// Cross-node traffic of hierarchical AllReduce, AllGather, ReduceScatter and
// AllToAll is exactly the inter-node phase: the same collective among the N
// ranks with this rank's local index, on its slice (AllReduce), its block,
// or (AllToAll, pairwise) its L blocks for each node. On unequal nodes
// (AllReduce only) there are S = the smallest node's size slices, and ranks
// with a local index of S or more do not cross at all.
TEST(LayoutTraffic, HierarchicalCrossesOnlyInTheInterNodePhase) {
  for (const NamedLayout& l : all_layouts()) {
    if (l.nodes < 2) continue;
    const Levels levels = levels_of(l.layout);
    size_t slices = levels.nodes[0].size();
    for (const std::vector<int>& group : levels.nodes) slices = std::min(slices, group.size());
    const int per = static_cast<int>(slices);
    for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                         Collective::AllToAll}) {
      if (!l.equal && c != Collective::AllReduce) continue;
      for (uint64_t count : {uint64_t{7}, uint64_t{1000}}) {
        for (uint64_t chunk : {uint64_t{0}, uint64_t{64}}) {
          Params p = params_for({Algorithm::Hierarchical, c}, l.layout, count);
          p.chunk = chunk;
          for (int r = 0; r < p.nranks; ++r) {
            p.rank = r;
            const int local = levels.local_of(r);
            Params inter = p;
            inter.algorithm = Algorithm::Ring;
            inter.layout = nullptr;
            inter.nranks = l.nodes;
            inter.rank = levels.node_of_rank(r);
            inter.in_place = c == Collective::AllReduce;
            if (c == Collective::AllReduce) {
              inter.count = local < per ? block_span(count, per, local).count : 0;
            }
            if (c == Collective::AllToAll) {
              inter.algorithm = Algorithm::Pairwise;
              inter.count = per * count;
            }
            const Crossing got = crossing(p, l.layout);
            const Crossing want = traffic(inter);
            EXPECT_EQ(got.messages, want.messages) << l.name << " " << collective_name(c) << r;
            EXPECT_EQ(got.elements, want.elements) << l.name << " " << collective_name(c) << r;
          }
        }
      }
    }
  }
}

// A ring that follows the layout crosses between nodes only where the ring
// does: ring AllReduce sends 2(n-1) messages per rank, so the ranks whose
// successor is on another node send all of theirs across and the others none.
TEST(LayoutTraffic, RingsFollowTheLayoutRing) {
  for (const NamedLayout& l : all_layouts()) {
    const int n = static_cast<int>(l.layout.node_of.size());
    if (n < 2) continue;
    std::vector<int> ring = l.layout.ring;
    if (ring.empty()) {
      for (int r = 0; r < n; ++r) ring.push_back(r);
    }
    uint64_t total = 0;
    int ring_crossings = 0;
    for (int q = 0; q < n; ++q) {
      const int r = ring[q];
      const int next = ring[(q + 1) % n];
      const bool crosses = l.layout.node_of[r] != l.layout.node_of[next];
      ring_crossings += crosses;
      Params p = params_for({Algorithm::Ring, Collective::AllReduce}, l.layout, 4 * n);
      p.rank = r;
      const Crossing got = crossing(p, l.layout);
      EXPECT_EQ(got.messages, crosses ? 2u * (n - 1) : 0u) << l.name << " rank " << r;
      total += got.messages;
      // AllGather sends n-1 blocks to the successor too.
      p.collective = Collective::AllGather;
      EXPECT_EQ(crossing(p, l.layout).messages, crosses ? n - 1u : 0u) << l.name;
    }
    EXPECT_EQ(total, 2u * (n - 1) * ring_crossings) << l.name;
    if (!l.layout.ring.empty()) {
      // A node-by-node ring enters and leaves every node once.
      EXPECT_EQ(ring_crossings, l.nodes == 1 ? 0 : l.nodes) << l.name;
    }
  }
}

// Leaders carry all cross-node traffic: the node-leader AllReduce sends
// across nodes only from the leaders (recursive doubling among them), and
// the two-level Broadcast and Reduce cross between nodes N-1 times in all.
TEST(LayoutTraffic, LeadersCarryTheCrossNodeTraffic) {
  for (const NamedLayout& l : all_layouts()) {
    const Levels levels = levels_of(l.layout);
    const int n = static_cast<int>(l.layout.node_of.size());
    for (uint64_t count : {uint64_t{1}, uint64_t{100}}) {
      Params p = params_for({Algorithm::NodeLeader, Collective::AllReduce}, l.layout, count);
      for (int r = 0; r < n; ++r) {
        p.rank = r;
        const bool leader = levels.local_of(r) == 0;
        Crossing want;
        if (leader && l.nodes > 1) {
          Params inter = p;
          inter.algorithm = Algorithm::Rd;
          inter.layout = nullptr;
          inter.nranks = l.nodes;
          inter.rank = levels.node_of_rank(r);
          inter.in_place = true;
          want = traffic(inter);
        }
        const Crossing got = crossing(p, l.layout);
        EXPECT_EQ(got.messages, want.messages) << l.name << " rank " << r;
        EXPECT_EQ(got.elements, want.elements) << l.name << " rank " << r;
      }
      for (Algorithm a : {Algorithm::NodeLeader, Algorithm::Hierarchical}) {
        for (Collective c : {Collective::Broadcast, Collective::Reduce}) {
          for (int root : {0, n - 1}) {
            Params q = params_for({a, c}, l.layout, count);
            q.root = root;
            uint64_t messages = 0;
            for (int r = 0; r < n; ++r) {
              q.rank = r;
              messages += crossing(q, l.layout).messages;
            }
            EXPECT_EQ(messages, static_cast<uint64_t>(l.nodes - 1))
                << l.name << " " << algorithm_name(a) << " " << collective_name(c);
          }
        }
      }
    }
  }
}

// Random uneven AllToAllv counts up to `most`, about a third of them zero,
// and the simulator options that lay them out with `gap` unused elements
// after every piece.
SimOptions uneven_counts(int n, uint64_t most, uint64_t gap, uint64_t seed) {
  SimOptions options;
  std::mt19937_64 random(seed);
  for (int cell = 0; cell < n * n; ++cell) {
    const uint64_t draw = random() % (most + 1);
    options.alltoallv_counts.push_back(random() % 3 == 0 ? 0 : draw);
  }
  options.alltoallv_gap = gap;
  return options;
}

Params hier_alltoallv(const Layout& layout, const SimOptions& options, uint64_t chunk) {
  Params p = params_for({Algorithm::Hierarchical, Collective::AllToAllv}, layout, 0);
  p.chunk = chunk;
  p.all_send_counts = options.alltoallv_counts.data();
  return p;
}

// Hierarchical AllToAllv on every layout (equal and unequal nodes): exact,
// every piece at its receiver's displacement, gaps untouched, whatever the
// counts (zeros, a rank sending nothing at all), chunked or not.
TEST(LayoutAllToAllv, ExactOnEveryLayout) {
  uint64_t seed = 1;
  for (const NamedLayout& l : all_layouts()) {
    const int n = static_cast<int>(l.layout.node_of.size());
    for (uint64_t most : {uint64_t{0}, uint64_t{1}, uint64_t{9}, uint64_t{300}}) {
      ++seed;
      SimOptions options = uneven_counts(n, most, seed % 3, seed);
      if (most == 1) std::fill_n(options.alltoallv_counts.begin(), n, 0);  // rank 0 sends nothing
      for (uint64_t chunk : {uint64_t{0}, uint64_t{most < 100 ? 2u : 64u}}) {
        const Params p = hier_alltoallv(l.layout, options, chunk);
        const SimResult res = simulate(p, options);
        ASSERT_TRUE(res.ok()) << l.name << " most=" << most << " chunk=" << chunk << "\n"
                              << res.message();
        EXPECT_TRUE(res.values_checked) << l.name;
        EXPECT_TRUE(res.hazards_checked) << l.name;
        if (chunk > 0) {
          for (const RankStats& r : res.ranks) EXPECT_LE(r.largest, chunk) << l.name;
        }
      }
    }
  }
}

TEST(LayoutAllToAllv, StrippedDependenciesAreCaught) {
  Layout layout;
  layout.node_of = {0, 1, 0, 1, 0, 1};
  layout.ring = {0, 2, 4, 1, 3, 5};
  const SimOptions options = uneven_counts(6, 20, 1, 7);
  Params p = hier_alltoallv(layout, options, 4);
  ASSERT_TRUE(simulate(p, options).ok());
  auto stripped = [](const Params& q, Program* prog, std::string* e) {
    if (!build(q, prog, e)) return false;
    for (Step& s : prog->steps) s.num_deps = 0;
    return true;
  };
  EXPECT_FALSE(simulate(p, options, stripped).ok());
}

// Points `p` at rank r's counts from `options`, every piece `spacing`
// elements from the last in both buffers (the arrays live here).
struct RankView {
  std::vector<uint64_t> recv_counts, displs;
  RankView(Params* p, const SimOptions& options, int r, uint64_t spacing) {
    const size_t n = static_cast<size_t>(p->nranks);
    for (size_t q = 0; q < n; ++q) {
      recv_counts.push_back(options.alltoallv_counts[q * n + r]);
      displs.push_back(q * spacing);
    }
    p->rank = r;
    p->send_counts = &options.alltoallv_counts[r * n];
    p->recv_counts = recv_counts.data();
    p->send_displs = p->recv_displs = displs.data();
  }
};

// What rank r has for other nodes' ranks: non-empty pieces, nodes with
// data, elements.
struct ForOtherNodes {
  uint64_t pieces = 0, nodes = 0, elements = 0;
};
ForOtherNodes for_other_nodes(const Layout& layout, const SimOptions& options, int r) {
  const size_t n = layout.node_of.size();
  ForOtherNodes out;
  std::vector<uint64_t> per_node(n, 0);
  for (size_t q = 0; q < n; ++q) {
    const uint64_t c = options.alltoallv_counts[r * n + q];
    if (layout.node_of[q] == layout.node_of[r]) continue;
    out.elements += c;
    out.pieces += c > 0;
    per_node[layout.node_of[q]] += c;
  }
  out.nodes = std::count_if(per_node.begin(), per_node.end(), [](uint64_t c) { return c > 0; });
  return out;
}

// Each rank sends one aggregated message to each other node it has data
// for (N - 1 when every count is non-zero), where pairwise sends one per
// non-empty piece there, and across nodes it moves exactly what it has for
// other nodes' ranks.
TEST(LayoutAllToAllv, OneMessagePerOtherNode) {
  for (const NamedLayout& l : all_layouts()) {
    if (l.nodes < 2) continue;
    const int n = static_cast<int>(l.layout.node_of.size());
    for (bool zeros : {false, true}) {
      SimOptions options = uneven_counts(n, 50, 0, n * 31 + l.nodes + zeros);
      if (!zeros) {
        for (uint64_t& c : options.alltoallv_counts) c = std::max<uint64_t>(c, 1);
      }
      Params p = hier_alltoallv(l.layout, options, zeros ? 1000 : 0);
      for (int r = 0; r < n; ++r) {
        const RankView view(&p, options, r, 50);
        const ForOtherNodes want = for_other_nodes(l.layout, options, r);
        if (!zeros) {
          EXPECT_EQ(want.nodes, static_cast<uint64_t>(l.nodes - 1)) << l.name;
        }
        const Crossing got = crossing(p, l.layout);
        EXPECT_EQ(got.messages, want.nodes) << l.name << " rank " << r;
        EXPECT_EQ(got.elements, want.elements) << l.name << " rank " << r;
        p.algorithm = Algorithm::Pairwise;
        EXPECT_EQ(crossing(p, l.layout).messages, want.pieces) << l.name;
        p.algorithm = Algorithm::Hierarchical;
      }
    }
  }
}

// The measurement behind the schedule: 4 nodes of 8 ranks (interleaved),
// random counts up to 4096 with zeros. Both schedules are exact in the
// simulator; per rank, pairwise crosses nodes once per non-empty piece for
// another node's ranks, hier once per other node (it has data for all
// three here). Prints the figures.
TEST(LayoutAllToAllv, FourNodesOfEightAgainstPairwise) {
  Layout layout;
  for (int r = 0; r < 32; ++r) layout.node_of.push_back(r % 4);
  const int n = 32;
  const SimOptions options = uneven_counts(n, 4096, 1, 2026);
  for (Algorithm a : {Algorithm::Pairwise, Algorithm::Hierarchical}) {
    Params p = hier_alltoallv(layout, options, 0);
    p.algorithm = a;
    const SimResult res = simulate(p, options);
    ASSERT_TRUE(res.ok()) << res.message();
    uint64_t most = 0, least = UINT64_MAX, total = 0, elements = 0, messages = 0;
    for (int r = 0; r < n; ++r) {
      const RankView view(&p, options, r, 4096);
      const ForOtherNodes want = for_other_nodes(layout, options, r);
      EXPECT_EQ(want.nodes, 3u);
      const Crossing got = crossing(p, layout);
      EXPECT_EQ(got.messages, a == Algorithm::Pairwise ? want.pieces : want.nodes) << r;
      most = std::max(most, got.messages);
      least = std::min(least, got.messages);
      total += got.messages;
      elements += got.elements;
      messages += res.ranks[r].messages;
    }
    std::printf(
        "4 nodes x 8 ranks, %s alltoallv: cross-node messages per rank %llu-%llu (%.2f mean), "
        "%llu cross-node elements in all, %llu messages in all, %u rounds\n",
        algorithm_name(a), static_cast<unsigned long long>(least),
        static_cast<unsigned long long>(most), static_cast<double>(total) / n,
        static_cast<unsigned long long>(elements), static_cast<unsigned long long>(messages),
        res.rounds);
  }
}

// Phase boundaries go through join steps, so dependency lists stay
// proportional to the steps even where many steps end one phase and many
// start the next (64 nodes of 4 ranks).
TEST(LayoutTraffic, PhaseBoundariesStayLinear) {
  Layout layout;
  for (int r = 0; r < 256; ++r) layout.node_of.push_back(r / 4);
  for (Collective c : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                       Collective::AllToAll, Collective::Broadcast, Collective::Reduce}) {
    Params p = params_for({Algorithm::Hierarchical, c}, layout, 1000);
    p.chunk = 100;
    p.rank = 129;
    Program program;
    std::string error;
    ASSERT_TRUE(build(p, &program, &error)) << error;
    EXPECT_LE(program.deps.size(), 3 * program.steps.size()) << collective_name(c);
  }
}

// Without a layout, or with one node, the hierarchical schedules are the
// plain intra-node ring ones.
TEST(LayoutTraffic, OneNodeDegradesToTheRing) {
  Layout one;
  one.node_of.assign(6, 0);
  one.ring = {0, 2, 4, 1, 3, 5};
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter}) {
    for (const Layout* layout :
         {static_cast<const Layout*>(nullptr), static_cast<const Layout*>(&one)}) {
      Params hier;
      hier.algorithm = Algorithm::Hierarchical;
      hier.collective = c;
      hier.nranks = 6;
      hier.rank = 4;
      hier.count = 50;
      hier.layout = layout;
      Params ring = hier;
      ring.algorithm = Algorithm::Ring;
      Program a, b;
      std::string error;
      ASSERT_TRUE(build(hier, &a, &error)) << error;
      ASSERT_TRUE(build(ring, &b, &error)) << error;
      ASSERT_EQ(a.steps.size(), b.steps.size()) << collective_name(c);
      for (size_t i = 0; i < a.steps.size(); ++i) {
        EXPECT_EQ(a.steps[i].peer, b.steps[i].peer);
        EXPECT_EQ(a.steps[i].dst.offset, b.steps[i].dst.offset);
      }
    }
  }
}

}  // namespace
}  // namespace weft::algo
