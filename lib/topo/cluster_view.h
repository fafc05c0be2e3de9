// The cluster as the ranks of one communicator see it: which ranks share a
// node, and inside a node which share a package and NUMA node ("domain").
// Built from one small entry per rank (the bootstrap's host hash plus the
// rank's binding and device), so every rank computes the same view from the
// same allgathered entries; ring_order and tree_shape (shapes.h) read it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "topo/cluster.h"
#include "topo/machine.h"

namespace weft::topo {

struct RankPlace {
  uint64_t node_key = 0;  // equal for ranks on one node (PeerInfo::host_hash)
  int package = -1;       // -1: unknown or spanning several
  int numa = -1;
  int gpu = -1;
  bool operator==(const RankPlace&) const = default;
};

// This process's entry: its binding located on its machine.
RankPlace local_place(const Machine& machine, std::span<const int> binding, uint64_t node_key,
                      int gpu);
// The entries of a cluster file's ranks (node_key = node index).
std::vector<RankPlace> places_of(const Cluster& cluster);

class ClusterView {
 public:
  explicit ClusterView(std::vector<RankPlace> places);

  int nranks() const { return static_cast<int>(places_.size()); }
  // Nodes are numbered by their lowest rank, so rank 0 is on node 0.
  int nnodes() const { return static_cast<int>(node_ranks_.size()); }
  int ndomains() const { return static_cast<int>(domain_ranks_.size()); }
  const RankPlace& place(int rank) const { return places_[rank]; }
  int node_of(int rank) const { return node_[rank]; }
  int domain_of(int rank) const { return domain_[rank]; }
  int domain_node(int domain) const { return domain_node_[domain]; }
  // Ranks of a node (domain) in topology order: by package, NUMA node, GPU, rank.
  const std::vector<int>& node_ranks(int node) const { return node_ranks_[node]; }
  const std::vector<int>& domain_ranks(int domain) const { return domain_ranks_[domain]; }
  // Every rank in topology order: node by node.
  const std::vector<int>& order() const { return order_; }

 private:
  std::vector<RankPlace> places_;
  std::vector<int> node_, domain_, domain_node_, order_;
  std::vector<std::vector<int>> node_ranks_, domain_ranks_;
};

}  // namespace weft::topo
