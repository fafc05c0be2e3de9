#include "topo/cluster.h"

#include <set>

namespace weft::topo {

namespace {

constexpr const char* kLinkNames[kNumLinkClasses] = {
    "same_numa", "same_socket", "cross_socket", "nvlink", "pcie", "network", "cross_rail"};

}  // namespace

const char* link_class_name(LinkClass link) {
  return kLinkNames[static_cast<int>(link)];
}

bool parse_link_class(std::string_view name, LinkClass* out) {
  for (int i = 0; i < kNumLinkClasses; ++i) {
    if (name == kLinkNames[i]) {
      *out = static_cast<LinkClass>(i);
      return true;
    }
  }
  return false;
}

LinkCost default_link_cost(LinkClass link) {
  switch (link) {
    case LinkClass::SameNuma:
      return {40, 0.2};
    case LinkClass::SameSocket:
      return {30, 0.3};
    case LinkClass::CrossSocket:
      return {20, 0.6};
    case LinkClass::NvLink:
      return {150, 2};
    case LinkClass::Pcie:
      return {25, 5};
    case LinkClass::Network:
      return {25, 3};
    case LinkClass::CrossRail:
      return {20, 5};
  }
  return {};
}

std::array<LinkCost, kNumLinkClasses> Cluster::default_links() {
  std::array<LinkCost, kNumLinkClasses> links;
  for (int i = 0; i < kNumLinkClasses; ++i) links[i] = default_link_cost(static_cast<LinkClass>(i));
  return links;
}

int rank_package(const Cluster& cluster, int rank) {
  const RankSpec& spec = cluster.ranks[rank];
  const Machine& machine = cluster.nodes[spec.node];
  if (spec.numa >= 0) return machine.numa[spec.numa].package;
  return locate(machine, spec.cpus).package;
}

LinkClass link_between(const Cluster& cluster, int a, int b) {
  const RankSpec& x = cluster.ranks[a];
  const RankSpec& y = cluster.ranks[b];
  if (x.node != y.node) {
    const Machine& mx = cluster.nodes[x.node];
    const Machine& my = cluster.nodes[y.node];
    int rail_x = x.nic >= 0 ? mx.nics[x.nic].rail : -1;
    int rail_y = y.nic >= 0 ? my.nics[y.nic].rail : -1;
    return rail_x >= 0 && rail_y >= 0 && rail_x != rail_y ? LinkClass::CrossRail
                                                          : LinkClass::Network;
  }
  const Machine& m = cluster.nodes[x.node];
  if (x.gpu >= 0 && y.gpu >= 0 && x.gpu != y.gpu) {
    int domain = m.gpus[x.gpu].nvlink;
    return domain >= 0 && domain == m.gpus[y.gpu].nvlink ? LinkClass::NvLink : LinkClass::Pcie;
  }
  int numa_x = x.numa >= 0 ? x.numa : locate(m, x.cpus).numa;
  int numa_y = y.numa >= 0 ? y.numa : locate(m, y.cpus).numa;
  if (numa_x >= 0 && numa_x == numa_y) return LinkClass::SameNuma;
  int package_x = rank_package(cluster, a), package_y = rank_package(cluster, b);
  if (package_x >= 0 && package_x == package_y) return LinkClass::SameSocket;
  return LinkClass::CrossSocket;
}

void place_ranks(const Machine& m, int node, int count, std::vector<RankSpec>* out) {
  std::vector<int> numas;
  for (size_t n = 0; n < m.numa.size(); ++n)
    for (const Core& core : m.cores)
      if (core.numa == static_cast<int>(n)) {
        numas.push_back(static_cast<int>(n));
        break;
      }
  for (int i = 0; i < count; ++i) {
    RankSpec spec;
    spec.node = node;
    if (!m.gpus.empty()) {
      spec.gpu = i % static_cast<int>(m.gpus.size());
      spec.numa = m.gpus[spec.gpu].numa;
    }
    if (spec.numa < 0 && !numas.empty())
      spec.numa = numas[static_cast<size_t>(i) * numas.size() / static_cast<size_t>(count)];
    std::vector<int> near, all;
    for (size_t k = 0; k < m.nics.size(); ++k) {
      all.push_back(static_cast<int>(k));
      if (m.nics[k].numa >= 0 && m.nics[k].numa == spec.numa) near.push_back(static_cast<int>(k));
    }
    const std::vector<int>& nics = near.empty() ? all : near;
    if (!nics.empty()) spec.nic = nics[static_cast<size_t>(i) % nics.size()];
    out->push_back(std::move(spec));
  }
}

Status validate_rank(const Cluster& cluster, int rank) {
  const RankSpec& spec = cluster.ranks[rank];
  if (spec.node < 0 || static_cast<size_t>(spec.node) >= cluster.nodes.size())
    return Error(weftInvalidArgument, "ranks[%d] names node %d of %zu", rank, spec.node,
                 cluster.nodes.size());
  const Machine& m = cluster.nodes[spec.node];
  auto bad = [](int index, size_t size) {
    return index < -1 || (index >= 0 && static_cast<size_t>(index) >= size);
  };
  if (bad(spec.numa, m.numa.size()) || bad(spec.gpu, m.gpus.size()) || bad(spec.nic, m.nics.size()))
    return Error(weftInvalidArgument,
                 "ranks[%d]: numa %d, gpu %d or nic %d is not on node %s (%zu numa, %zu gpus, "
                 "%zu nics)",
                 rank, spec.numa, spec.gpu, spec.nic, m.name.c_str(), m.numa.size(), m.gpus.size(),
                 m.nics.size());
  if (spec.cpus.empty()) return Status::Ok();
  std::set<int> pus;
  for (const Core& core : m.cores) pus.insert(core.pus.begin(), core.pus.end());
  for (int pu : spec.cpus)
    if (pus.count(pu) == 0)
      return Error(weftInvalidArgument, "ranks[%d]: cpu %d is not on node %s", rank, pu,
                   m.name.c_str());
  int bound_numa = locate(m, spec.cpus).numa;
  if (spec.numa >= 0 && bound_numa >= 0 && bound_numa != spec.numa)
    return Error(weftInvalidArgument, "ranks[%d]: numa %d, but its cpus are on numa %d", rank,
                 spec.numa, bound_numa);
  return Status::Ok();
}

Status validate(const Cluster& cluster) {
  for (size_t n = 0; n < cluster.nodes.size(); ++n)
    WEFT_RETURN_IF_ERROR(validate(cluster.nodes[n], "nodes[" + std::to_string(n) + "]"));
  for (int i = 0; i < kNumLinkClasses; ++i) {
    const LinkCost& cost = cluster.links[i];
    if (!(cost.bandwidth_gb_s > 0) || !(cost.latency_us >= 0))
      return Error(weftInvalidArgument, "links.%s needs a positive bandwidth and a latency >= 0",
                   kLinkNames[i]);
  }
  for (int r = 0; r < static_cast<int>(cluster.ranks.size()); ++r)
    WEFT_RETURN_IF_ERROR(validate_rank(cluster, r));
  return Status::Ok();
}

}  // namespace weft::topo
