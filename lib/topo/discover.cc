#include "topo/discover.h"

#include <hwloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <tuple>

namespace weft::topo {

namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using Topology = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* bitmap) const { hwloc_bitmap_free(bitmap); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

// Initialises a topology, lets `configure` pick its source, and loads it.
Status load_topology(bool with_io, const std::function<int(hwloc_topology_t)>& configure,
                     const char* what, Topology* out) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    return Error(weftSystemError, "hwloc_topology_init failed: %s", strerror(errno));
  Topology topology(raw);
  hwloc_topology_set_icache_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (with_io) {
    hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    // hwloc's Linux backend reads the PCI devices from sysfs; the libpciaccess
    // "pci" component adds only what Weft does not use (device names) and
    // leaks memory on every load.
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  }
  errno = 0;
  if (configure && configure(raw) != 0)
    return Error(weftInvalidArgument, "hwloc rejected %s: %s", what,
                 errno != 0 ? strerror(errno) : "invalid");
  if (hwloc_topology_load(raw) != 0)
    return Error(weftSystemError, "hwloc could not load %s: %s", what, strerror(errno));
  *out = std::move(topology);
  return Status::Ok();
}

int package_index(hwloc_topology_t topology, hwloc_obj_t object, int packages) {
  hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topology, HWLOC_OBJ_PACKAGE, object);
  if (package != nullptr) return static_cast<int>(package->logical_index);
  return packages == 1 ? 0 : -1;  // no package objects: the machine is the one package
}

// The NUMA node (logical index) of a nodeset holding exactly one node, else -1.
int single_numa(hwloc_topology_t topology, hwloc_const_nodeset_t nodeset) {
  if (nodeset == nullptr || hwloc_bitmap_weight(nodeset) != 1) return -1;
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(
      topology, static_cast<unsigned>(hwloc_bitmap_first(nodeset)));
  return node != nullptr ? static_cast<int>(node->logical_index) : -1;
}

void read_cpus(hwloc_topology_t topology, int packages, Machine* m) {
  int ncores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
  // Without Core objects (some synthetic machines) every PU counts as a core.
  hwloc_obj_type_t core_type = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int count = hwloc_get_nbobjs_by_type(topology, core_type);
  for (int i = 0; i < count; ++i) {
    hwloc_obj_t object = hwloc_get_obj_by_type(topology, core_type, static_cast<unsigned>(i));
    Core core;
    core.package = package_index(topology, object, packages);
    for (size_t n = 0; n < m->numa.size(); ++n) {
      hwloc_obj_t node =
          hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(n));
      if (!hwloc_bitmap_iszero(node->cpuset) &&
          hwloc_bitmap_isincluded(object->cpuset, node->cpuset)) {
        core.numa = static_cast<int>(n);
        break;
      }
    }
    unsigned pu = 0;
    hwloc_bitmap_foreach_begin(pu, object->cpuset) {
      core.pus.push_back(static_cast<int>(pu));
    }
    hwloc_bitmap_foreach_end();
    m->cores.push_back(std::move(core));
  }
}

void read_caches(hwloc_topology_t topology, Machine* m) {
  std::map<std::tuple<int, CacheKind, uint64_t>, int> counts;
  for (hwloc_obj_type_t type :
       {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L4CACHE,
        HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2ICACHE, HWLOC_OBJ_L3ICACHE}) {
    int count = hwloc_get_nbobjs_by_type(topology, type);
    for (int i = 0; i < count; ++i) {
      hwloc_obj_t cache = hwloc_get_obj_by_type(topology, type, static_cast<unsigned>(i));
      CacheKind kind = cache->attr->cache.type == HWLOC_OBJ_CACHE_DATA ? CacheKind::Data
                       : cache->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION
                           ? CacheKind::Instruction
                           : CacheKind::Unified;
      ++counts[{static_cast<int>(cache->attr->cache.depth), kind, cache->attr->cache.size}];
    }
  }
  for (const auto& [key, count] : counts)
    m->caches.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), count});
}

void read_numa_distances(hwloc_topology_t topology, Machine* m) {
  unsigned nr = 8;
  hwloc_distances_s* matrices[8];
  if (m->numa.size() < 2 ||
      hwloc_distances_get_by_type(topology, HWLOC_OBJ_NUMANODE, &nr, matrices, 0, 0) != 0)
    return;
  for (unsigned k = 0; k < nr; ++k) {
    hwloc_distances_s* d = matrices[k];
    if (m->numa_distances.empty() && d->nbobjs == m->numa.size()) {
      m->numa_distances.assign(d->nbobjs, std::vector<uint64_t>(d->nbobjs));
      for (unsigned i = 0; i < d->nbobjs; ++i)
        for (unsigned j = 0; j < d->nbobjs; ++j)
          m->numa_distances[d->objs[i]->logical_index][d->objs[j]->logical_index] =
              d->values[i * d->nbobjs + j];
    }
    hwloc_distances_release(topology, d);
  }
}

// The first OS device below `pci` of the preferred type, else of the other.
std::string os_device_name(hwloc_obj_t pci, hwloc_obj_osdev_type_t preferred,
                           hwloc_obj_osdev_type_t fallback) {
  std::string other;
  for (hwloc_obj_t child = pci->io_first_child; child != nullptr; child = child->next_sibling) {
    if (child->type != HWLOC_OBJ_OS_DEVICE || child->name == nullptr) continue;
    if (child->attr->osdev.type == preferred) return child->name;
    if (child->attr->osdev.type == fallback && other.empty()) other = child->name;
  }
  return other;
}

// GPUs reachable from each other over NVLink (directly or through NVSwitches)
// share a domain; hwloc reports the links as the "NVLinkBandwidth" matrix
// when its NVML plugin is present.
void read_nvlink_domains(hwloc_topology_t topology, const std::vector<hwloc_obj_t>& gpu_objects,
                         Machine* m) {
  unsigned nr = 1;
  hwloc_distances_s* d = nullptr;
  if (hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0) return;
  std::vector<unsigned> parent(d->nbobjs);
  std::iota(parent.begin(), parent.end(), 0u);
  std::function<unsigned(unsigned)> find = [&](unsigned x) {
    return parent[x] == x ? x : parent[x] = find(parent[x]);
  };
  std::vector<bool> linked(d->nbobjs, false);
  for (unsigned i = 0; i < d->nbobjs; ++i)
    for (unsigned j = 0; j < d->nbobjs; ++j)
      if (i != j && d->values[i * d->nbobjs + j] > 0) {
        parent[find(i)] = find(j);
        linked[i] = linked[j] = true;
      }
  std::map<unsigned, int> domain_ids;
  for (size_t g = 0; g < gpu_objects.size(); ++g) {
    for (unsigned i = 0; i < d->nbobjs; ++i) {
      hwloc_obj_t object = d->objs[i];
      bool same = object == gpu_objects[g] || object->parent == gpu_objects[g];
      if (!same || !linked[i]) continue;
      auto [it, fresh] = domain_ids.emplace(find(i), static_cast<int>(domain_ids.size()));
      m->gpus[g].nvlink = it->second;
      break;
    }
  }
  hwloc_distances_release(topology, d);
}

void read_pci(hwloc_topology_t topology, Machine* m) {
  std::vector<hwloc_obj_t> gpu_objects;
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topology, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(topology, pci)) {
    const auto& attr = pci->attr->pcidev;
    char bus_id[32];
    snprintf(bus_id, sizeof(bus_id), "%04x:%02x:%02x.%x", attr.domain, attr.bus, attr.dev,
             attr.func);
    hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, pci);
    int numa = single_numa(topology, ancestor != nullptr ? ancestor->nodeset : nullptr);
    bool vendor_gpu = attr.vendor_id == 0x10de || attr.vendor_id == 0x1002;
    if ((attr.class_id >> 8) == 0x03 && (vendor_gpu || attr.class_id == 0x0302)) {
      m->gpus.push_back(
          {bus_id, os_device_name(pci, HWLOC_OBJ_OSDEV_COPROC, HWLOC_OBJ_OSDEV_GPU), numa, -1});
      gpu_objects.push_back(pci);
    } else if ((attr.class_id >> 8) == 0x02) {
      Nic nic;
      nic.bus_id = bus_id;
      nic.name = os_device_name(pci, HWLOC_OBJ_OSDEV_OPENFABRICS, HWLOC_OBJ_OSDEV_NETWORK);
      nic.numa = numa;
      m->nics.push_back(std::move(nic));
    }
  }
  read_nvlink_domains(topology, gpu_objects, m);
}

Status convert(hwloc_topology_t topology, Machine* out) {
  Machine m;
  hwloc_obj_t root = hwloc_get_root_obj(topology);
  if (const char* host = hwloc_obj_get_info_by_name(root, "HostName")) m.name = host;
  int packages = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PACKAGE);
  if (packages == 0 && hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PU) > 0) packages = 1;
  m.packages = packages;
  int nnuma = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nnuma; ++i) {
    hwloc_obj_t node =
        hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    m.numa.push_back({static_cast<int>(node->os_index), package_index(topology, node, packages),
                      node->attr->numanode.local_memory});
  }
  read_cpus(topology, packages, &m);
  read_caches(topology, &m);
  read_numa_distances(topology, &m);
  read_pci(topology, &m);
  WEFT_RETURN_IF_ERROR(validate(m, "hwloc topology"));
  *out = std::move(m);
  return Status::Ok();
}

// Loads a topology from the source `configure` picks and converts it.
Status load_machine(bool with_io, const std::function<int(hwloc_topology_t)>& configure,
                    const std::string& what, Machine* out) {
  Topology topology;
  WEFT_RETURN_IF_ERROR(load_topology(with_io, configure, what.c_str(), &topology));
  return convert(topology.get(), out);
}

}  // namespace

Status synthetic_pu_count(std::string_view description, uint64_t* out) {
  // Levels are separated by spaces; "[...]" and "(...)" hold memory children
  // and attributes, which add no PUs.
  uint64_t product = 1;
  int nesting = 0;
  size_t i = 0;
  while (i < description.size()) {
    char c = description[i];
    if (c == '(' || c == '[') ++nesting;
    if (c == ')' || c == ']') --nesting;
    if (nesting > 0 || c == ' ' || c == ')' || c == ']') {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < description.size() && description[end] != ' ' && description[end] != '(' &&
           description[end] != '[')
      ++end;
    std::string_view level = description.substr(i, end - i);
    // A count runs from the first ':' to the level's end: hwloc would read "a:466660pu:1" as
    // a level of 466660 and another of 1.
    size_t colon = level.find(':');
    std::string_view digits = colon == std::string_view::npos ? level : level.substr(colon + 1);
    uint64_t count = 0;
    for (char d : digits) {
      if (d < '0' || d > '9') {
        count = 0;
        break;
      }
      count = count * 10 + static_cast<uint64_t>(d - '0');
      if (count > kMaxSyntheticPus) break;
    }
    if (count == 0)
      return Error(weftInvalidArgument, "synthetic topology \"%.*s\": level \"%.*s\" has no count",
                   static_cast<int>(description.size()), description.data(),
                   static_cast<int>(level.size()), level.data());
    product *= count;
    if (product > kMaxSyntheticPus)
      return Error(weftInvalidArgument, "synthetic topology \"%.*s\" has more than %llu PUs",
                   static_cast<int>(description.size()), description.data(),
                   static_cast<unsigned long long>(kMaxSyntheticPus));
    i = end;
  }
  if (nesting != 0)
    return Error(weftInvalidArgument, "synthetic topology \"%.*s\": unbalanced brackets",
                 static_cast<int>(description.size()), description.data());
  *out = product;
  return Status::Ok();
}

Status discover_local(Machine* out) {
  WEFT_RETURN_IF_ERROR(load_machine(true, nullptr, "this host", out));
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) out->name = host;
  return Status::Ok();
}

Status load_synthetic(std::string_view description, Machine* out) {
  uint64_t pus = 0;
  WEFT_RETURN_IF_ERROR(synthetic_pu_count(description, &pus));
  std::string text(description);
  return load_machine(
      false, [&](hwloc_topology_t t) { return hwloc_topology_set_synthetic(t, text.c_str()); },
      "synthetic topology \"" + text + "\"", out);
}

Status load_xml_file(const std::string& path, Machine* out) {
  if (access(path.c_str(), R_OK) != 0)
    return Error(weftInvalidArgument, "cannot read hwloc XML file %s: %s", path.c_str(),
                 strerror(errno));
  return load_machine(
      true, [&](hwloc_topology_t t) { return hwloc_topology_set_xml(t, path.c_str()); },
      "hwloc XML file " + path, out);
}

Status process_binding(std::vector<int>* pus) {
  // Loading a topology costs milliseconds of CPU, every communicator asks, and
  // the machine does not change while the process runs (its binding may, so
  // that is read each time): one topology, loaded at the first query and kept
  // to the end (not destroyed at exit, under threads that may still ask).
  static std::once_flag once;
  static hwloc_topology_t topology = nullptr;
  static Status* loaded = nullptr;
  std::call_once(once, [] {
    Topology owned;
    loaded = new Status(load_topology(false, nullptr, "this host", &owned));
    topology = owned.release();
  });
  WEFT_RETURN_IF_ERROR(*loaded);
  Bitmap set(hwloc_bitmap_alloc());
  if (!set) return Error(weftSystemError, "hwloc_bitmap_alloc failed");
  if (hwloc_get_cpubind(topology, set.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return Error(weftSystemError, "hwloc_get_cpubind failed: %s", strerror(errno));
  // An unbound process may report an infinite set; only real PUs count.
  hwloc_bitmap_and(set.get(), set.get(), hwloc_topology_get_complete_cpuset(topology));
  pus->clear();
  unsigned pu = 0;
  hwloc_bitmap_foreach_begin(pu, set.get()) {
    pus->push_back(static_cast<int>(pu));
  }
  hwloc_bitmap_foreach_end();
  return Status::Ok();
}

}  // namespace weft::topo
