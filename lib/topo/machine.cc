#include "topo/machine.h"

#include <set>

namespace weft::topo {

const char* cache_kind_name(CacheKind kind) {
  switch (kind) {
    case CacheKind::Unified:
      return "unified";
    case CacheKind::Data:
      return "data";
    case CacheKind::Instruction:
      return "instruction";
  }
  return "?";
}

int Machine::pu_count() const {
  int count = 0;
  for (const Core& core : cores) count += static_cast<int>(core.pus.size());
  return count;
}

Locality locate(const Machine& machine, std::span<const int> pus) {
  if (pus.empty()) return {};
  std::set<int> wanted(pus.begin(), pus.end());
  std::set<int> packages, numas;
  size_t found = 0;
  for (const Core& core : machine.cores) {
    for (int pu : core.pus) {
      if (wanted.count(pu) == 0) continue;
      ++found;
      packages.insert(core.package);
      numas.insert(core.numa);
    }
  }
  // A PU the machine does not list makes the binding's place unknown.
  if (found != wanted.size()) return {};
  Locality locality;
  if (packages.size() == 1) locality.package = *packages.begin();
  if (numas.size() == 1) locality.numa = *numas.begin();
  return locality;
}

namespace {

bool in_range(int index, size_t size, bool allow_none) {
  return (allow_none && index == -1) || (index >= 0 && static_cast<size_t>(index) < size);
}

}  // namespace

Status validate(const Machine& m, const std::string& what) {
  const char* w = what.c_str();
  if (m.packages < 0) return Error(weftInvalidArgument, "%s: negative package count", w);
  const size_t packages = static_cast<size_t>(m.packages);
  std::set<int> numa_ids;
  for (size_t i = 0; i < m.numa.size(); ++i) {
    if (!in_range(m.numa[i].package, packages, true))
      return Error(weftInvalidArgument, "%s: numa[%zu] names package %d of %d", w, i,
                   m.numa[i].package, m.packages);
    if (m.numa[i].os_index < 0 || !numa_ids.insert(m.numa[i].os_index).second)
      return Error(weftInvalidArgument, "%s: numa[%zu] has a negative or repeated os_index %d", w,
                   i, m.numa[i].os_index);
  }
  std::set<int> pus;
  for (size_t i = 0; i < m.cores.size(); ++i) {
    const Core& core = m.cores[i];
    if (!in_range(core.package, packages, true))
      return Error(weftInvalidArgument, "%s: cores[%zu] names package %d of %d", w, i, core.package,
                   m.packages);
    if (!in_range(core.numa, m.numa.size(), true))
      return Error(weftInvalidArgument, "%s: cores[%zu] names numa node %d of %zu", w, i, core.numa,
                   m.numa.size());
    if (core.pus.empty()) return Error(weftInvalidArgument, "%s: cores[%zu] has no PUs", w, i);
    for (int pu : core.pus)
      if (pu < 0 || !pus.insert(pu).second)
        return Error(weftInvalidArgument, "%s: PU %d is negative or on two cores", w, pu);
  }
  if (!m.numa_distances.empty()) {
    if (m.numa_distances.size() != m.numa.size())
      return Error(weftInvalidArgument, "%s: numa_distances has %zu rows for %zu numa nodes", w,
                   m.numa_distances.size(), m.numa.size());
    for (const auto& row : m.numa_distances)
      if (row.size() != m.numa.size())
        return Error(weftInvalidArgument, "%s: numa_distances is not square", w);
  }
  for (const Cache& cache : m.caches)
    if (cache.level < 1 || cache.count < 1)
      return Error(weftInvalidArgument, "%s: a cache has level %d and count %d", w, cache.level,
                   cache.count);
  for (size_t i = 0; i < m.gpus.size(); ++i)
    if (!in_range(m.gpus[i].numa, m.numa.size(), true) || m.gpus[i].nvlink < -1)
      return Error(weftInvalidArgument, "%s: gpus[%zu] names numa node %d of %zu", w, i,
                   m.gpus[i].numa, m.numa.size());
  for (size_t i = 0; i < m.nics.size(); ++i)
    if (!in_range(m.nics[i].numa, m.numa.size(), true) || m.nics[i].rail < -1 ||
        !(m.nics[i].bandwidth_gb_s >= 0))
      return Error(weftInvalidArgument, "%s: nics[%zu] has a bad numa, rail or bandwidth", w, i);
  return Status::Ok();
}

}  // namespace weft::topo
