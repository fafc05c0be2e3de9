#include "topo/cluster_view.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

namespace weft::topo {

RankPlace local_place(const Machine& machine, std::span<const int> binding, uint64_t node_key,
                      int gpu) {
  Locality locality = locate(machine, binding);
  RankPlace place{node_key, locality.package, locality.numa, gpu};
  // A GPU rank that is not pinned belongs near its GPU.
  if (place.numa < 0 && gpu >= 0 && static_cast<size_t>(gpu) < machine.gpus.size()) {
    place.numa = machine.gpus[gpu].numa;
    if (place.numa >= 0) place.package = machine.numa[place.numa].package;
  }
  return place;
}

std::vector<RankPlace> places_of(const Cluster& cluster) {
  std::vector<RankPlace> places;
  for (const RankSpec& spec : cluster.ranks) {
    const Machine& machine = cluster.nodes[spec.node];
    uint64_t key = static_cast<uint64_t>(spec.node);
    if (spec.numa >= 0)
      places.push_back({key, machine.numa[spec.numa].package, spec.numa, spec.gpu});
    else
      places.push_back(local_place(machine, spec.cpus, key, spec.gpu));
  }
  return places;
}

ClusterView::ClusterView(std::vector<RankPlace> places) : places_(std::move(places)) {
  const int n = nranks();
  node_.assign(n, -1);
  domain_.assign(n, -1);
  std::unordered_map<uint64_t, int> nodes;
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = nodes.emplace(places_[r].node_key, nnodes());
    if (fresh) node_ranks_.emplace_back();
    node_[r] = it->second;
    node_ranks_[it->second].push_back(r);
  }
  for (int node = 0; node < nnodes(); ++node) {
    std::vector<int>& ranks = node_ranks_[node];
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      const RankPlace& x = places_[a];
      const RankPlace& y = places_[b];
      return std::tie(x.package, x.numa, x.gpu) < std::tie(y.package, y.numa, y.gpu);
    });
    for (size_t i = 0; i < ranks.size(); ++i) {
      const RankPlace& here = places_[ranks[i]];
      if (i == 0 || here.package != places_[ranks[i - 1]].package ||
          here.numa != places_[ranks[i - 1]].numa) {
        domain_ranks_.emplace_back();
        domain_node_.push_back(node);
      }
      domain_[ranks[i]] = ndomains() - 1;
      domain_ranks_.back().push_back(ranks[i]);
      order_.push_back(ranks[i]);
    }
  }
}

}  // namespace weft::topo
