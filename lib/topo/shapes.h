// Ring order and tree shape chosen from the cluster view. Pure functions of
// the view, so every rank derives the same ring and tree from the same
// allgathered places.
#pragma once

#include <vector>

#include "topo/cluster_view.h"

namespace weft::topo {

// Every rank once, starting at rank 0, with the ranks of each node adjacent
// and, inside a node, the ranks of each package and NUMA node adjacent: the
// ring enters and leaves every node exactly once (every domain likewise),
// the fewest boundary crossings a ring can have. Successor of order[i] is
// order[(i + 1) % n].
std::vector<int> ring_order(const ClusterView& view);

// A spanning tree rooted at `root` in which every rank has at most two
// children. Built level by level (node, package, NUMA node): a binary tree
// over each NUMA node's ranks, those joined by a binary tree over the NUMA
// nodes of a package, and so on up to a binary tree over the nodes, each
// group hanging from the shallowest free slot of its parent group. So exactly
// nnodes - 1 edges cross nodes and ndomains - 1 cross domains, the fewest a
// spanning tree can have. Children are listed largest subtree first.
struct TreeShape {
  int root = 0;
  std::vector<int> parent;                 // -1 at the root
  std::vector<std::vector<int>> children;  // at most two each
  int depth = 0;                           // edges on the longest root-to-leaf path
};
TreeShape tree_shape(const ClusterView& view, int root);

// Edges of a ring or tree whose ends sit on different nodes / domains.
struct Crossings {
  int nodes = 0;
  int domains = 0;
};
Crossings ring_crossings(const ClusterView& view, const std::vector<int>& order);
Crossings tree_crossings(const ClusterView& view, const TreeShape& tree);

}  // namespace weft::topo
