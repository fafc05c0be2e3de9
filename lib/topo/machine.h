// What Weft knows about one machine: packages, NUMA nodes, cores, caches,
// GPUs, NICs and NUMA distances. Plain data, independent of hwloc, so the
// tuner, the ring/tree builders and the tests can use it (and build it by
// hand) without including hwloc. Indexes are logical: positions in these
// vectors; OS numbering appears only where the OS needs it (PU and NUMA ids).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft::topo {

enum class CacheKind : uint8_t { Unified, Data, Instruction };
const char* cache_kind_name(CacheKind kind);  // "unified", "data", "instruction"

// All caches of one level, kind and size on the machine.
struct Cache {
  int level = 0;
  CacheKind kind = CacheKind::Unified;
  uint64_t size_bytes = 0;
  int count = 0;  // instances
  bool operator==(const Cache&) const = default;
};

struct NumaNode {
  int os_index = 0;
  int package = -1;  // -1: spans packages (or the machine has none)
  uint64_t memory_bytes = 0;
  bool operator==(const NumaNode&) const = default;
};

struct Core {
  int package = -1;
  int numa = -1;         // index into Machine::numa; -1: none
  std::vector<int> pus;  // OS indexes of its hardware threads
  bool operator==(const Core&) const = default;
};

struct Gpu {
  std::string bus_id;  // PCI "dddd:bb:dd.f"; "" when unknown
  std::string name;    // "cuda0", "rsmi0", ...
  int numa = -1;       // nearest NUMA node; -1: unknown
  int nvlink = -1;     // GPUs with the same value >= 0 share an NVLink/NVSwitch domain
  bool operator==(const Gpu&) const = default;
};

struct Nic {
  std::string bus_id;
  std::string name;  // "mlx5_0", "eth0", ...
  int numa = -1;
  int rail = -1;              // network plane it attaches to; -1: unknown
  double bandwidth_gb_s = 0;  // GB/s (1e9 bytes/s); 0: unknown
  bool operator==(const Nic&) const = default;
};

struct Machine {
  std::string name;
  int packages = 0;
  std::vector<NumaNode> numa;
  std::vector<Core> cores;
  std::vector<Cache> caches;
  // numa_distances[i][j]: relative access cost from node i to node j (10 =
  // local, as the ACPI SLIT reports it); empty when unknown.
  std::vector<std::vector<uint64_t>> numa_distances;
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  bool operator==(const Machine&) const = default;

  int pu_count() const;
};

// Where a set of PUs (a process's binding) sits: the one package and NUMA
// node that hold all of them, or -1 where they span several or are unknown.
struct Locality {
  int package = -1;
  int numa = -1;
  bool operator==(const Locality&) const = default;
};
Locality locate(const Machine& machine, std::span<const int> pus);

// Every index in range, every PU on one core only, distances square.
// `what` names the machine in the error ("nodes[2]").
Status validate(const Machine& machine, const std::string& what);

}  // namespace weft::topo
