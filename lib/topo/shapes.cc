#include "topo/shapes.h"

#include <algorithm>
#include <array>
#include <deque>

namespace weft::topo {

std::vector<int> ring_order(const ClusterView& view) {
  std::vector<int> order = view.order();
  auto zero = std::find(order.begin(), order.end(), 0);
  if (zero != order.end()) std::rotate(order.begin(), zero, order.end());
  return order;
}

namespace {

constexpr int kLevels = 3;  // node, package, NUMA node; below them the ranks

class TreeBuilder {
 public:
  TreeBuilder(const ClusterView& view, TreeShape* tree) : view_(view), tree_(tree) {}

  // The tree over `ranks` (contiguous in topology order) below `level`; returns its root.
  int build(std::vector<int> ranks, int level) {
    auto has_root = std::find(ranks.begin(), ranks.end(), tree_->root);
    if (level == kLevels) {
      // A binary heap over the ranks of one NUMA node, the tree's root first.
      if (has_root != ranks.end()) std::rotate(ranks.begin(), has_root, has_root + 1);
      for (size_t i = 1; i < ranks.size(); ++i) link(ranks[(i - 1) / 2], ranks[i]);
      return ranks.front();
    }
    std::vector<std::vector<int>> groups;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (i == 0 || key(ranks[i], level) != key(ranks[i - 1], level))
        groups.emplace_back(1, ranks[i]);
      else
        groups.back().push_back(ranks[i]);
    if (has_root != ranks.end()) {
      auto holder = std::find_if(groups.begin(), groups.end(), [&](const std::vector<int>& g) {
        return key(g.front(), level) == key(tree_->root, level);
      });
      std::rotate(groups.begin(), holder, holder + 1);
    }
    std::vector<int> roots;
    for (std::vector<int>& group : groups) roots.push_back(build(std::move(group), level + 1));
    // A binary heap over the groups: group j hangs from group (j - 1) / 2.
    for (size_t j = 1; j < roots.size(); ++j) link(free_slot(roots[(j - 1) / 2], level), roots[j]);
    return roots.front();
  }

 private:
  // The group a rank belongs to at `level` (nodes, then packages, then NUMA nodes).
  std::array<int, kLevels> key(int rank, int level) const {
    const RankPlace& place = view_.place(rank);
    std::array<int, kLevels> k = {view_.node_of(rank), place.package, place.numa};
    for (int i = level + 1; i < kLevels; ++i) k[i] = 0;
    return k;
  }

  // The shallowest rank of `group_root`'s group with fewer than two children.
  // A binary tree over m ranks has m + 1 free slots, so a group can always
  // take the two child groups a heap gives it.
  int free_slot(int group_root, int level) const {
    std::deque<int> queue = {group_root};
    while (!queue.empty()) {
      int rank = queue.front();
      queue.pop_front();
      if (tree_->children[rank].size() < 2) return rank;
      for (int child : tree_->children[rank])
        if (key(child, level) == key(group_root, level)) queue.push_back(child);
    }
    return group_root;  // unreachable: see above
  }

  void link(int parent, int child) {
    tree_->parent[child] = parent;
    tree_->children[parent].push_back(child);
  }

  const ClusterView& view_;
  TreeShape* tree_;
};

int subtree_sizes(const TreeShape& tree, int rank, std::vector<int>* sizes) {
  int size = 1;
  for (int child : tree.children[rank]) size += subtree_sizes(tree, child, sizes);
  return (*sizes)[rank] = size;
}

}  // namespace

TreeShape tree_shape(const ClusterView& view, int root) {
  TreeShape tree;
  const int n = view.nranks();
  if (n == 0) return tree;
  tree.root = root;
  tree.parent.assign(n, -1);
  tree.children.assign(n, {});
  TreeBuilder(view, &tree).build(view.order(), 0);

  std::vector<int> sizes(n, 0);
  subtree_sizes(tree, root, &sizes);
  std::vector<int> depth(n, 0);
  std::deque<int> queue = {root};
  while (!queue.empty()) {
    int rank = queue.front();
    queue.pop_front();
    std::vector<int>& kids = tree.children[rank];
    std::stable_sort(kids.begin(), kids.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
    for (int child : kids) {
      depth[child] = depth[rank] + 1;
      tree.depth = std::max(tree.depth, depth[child]);
      queue.push_back(child);
    }
  }
  return tree;
}

namespace {

void count_edge(const ClusterView& view, int a, int b, Crossings* out) {
  out->nodes += view.node_of(a) != view.node_of(b);
  out->domains += view.domain_of(a) != view.domain_of(b);
}

}  // namespace

Crossings ring_crossings(const ClusterView& view, const std::vector<int>& order) {
  Crossings crossings;
  if (order.size() < 2) return crossings;
  for (size_t i = 0; i < order.size(); ++i)
    count_edge(view, order[i], order[(i + 1) % order.size()], &crossings);
  return crossings;
}

Crossings tree_crossings(const ClusterView& view, const TreeShape& tree) {
  Crossings crossings;
  for (size_t rank = 0; rank < tree.parent.size(); ++rank)
    if (tree.parent[rank] >= 0)
      count_edge(view, tree.parent[rank], static_cast<int>(rank), &crossings);
  return crossings;
}

}  // namespace weft::topo
