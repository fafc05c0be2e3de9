// A cluster: its machines ("nodes"), the cost of each class of link between
// two ranks, and where each rank sits. Written by hand or by weft-topo as a
// WEFT_TOPO_FILE (docs/topology.md), or built from what the ranks report.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "topo/machine.h"

namespace weft::topo {

// The classes of path between two ranks, from nearest to farthest.
enum class LinkClass : uint8_t {
  SameNuma,     // one NUMA node
  SameSocket,   // one package, different NUMA nodes
  CrossSocket,  // one node, different packages
  NvLink,       // GPUs in one NVLink domain
  Pcie,         // GPUs of one node without NVLink between them
  Network,      // different nodes, NICs on one rail (or rails unknown)
  CrossRail,    // different nodes, NICs on different rails
};
inline constexpr int kNumLinkClasses = 7;
const char* link_class_name(LinkClass link);  // "same_numa", "cross_socket", ...
bool parse_link_class(std::string_view name, LinkClass* out);

// alpha-beta cost of a link: time = latency + bytes / bandwidth.
struct LinkCost {
  double bandwidth_gb_s = 0;  // GB/s (1e9 bytes/s)
  double latency_us = 0;
  bool operator==(const LinkCost&) const = default;
};
// Plausible figures for a current server, used where a file gives none.
LinkCost default_link_cost(LinkClass link);

struct RankSpec {
  int node = 0;           // index into Cluster::nodes
  int numa = -1;          // NUMA node index on that node; -1: unknown
  int gpu = -1;           // GPU index on that node; -1: none
  int nic = -1;           // NIC index on that node; -1: unknown
  std::vector<int> cpus;  // binding (PU OS indexes); empty: unknown
  bool operator==(const RankSpec&) const = default;
};

// What one device (a rank's GPU or CPU) computes and holds, for planning
// (weft-plan); 0 = not given.
struct DeviceSpec {
  double tflops = 0;       // peak dense TFLOP/s (1e12) at the compute dtype
  double memory_gb = 0;    // memory per device, 1e9 bytes
  double memory_gb_s = 0;  // its memory bandwidth, 1e9 bytes/s
  bool operator==(const DeviceSpec&) const = default;
};

struct Cluster {
  std::vector<Machine> nodes;
  std::array<LinkCost, kNumLinkClasses> links = default_links();
  std::vector<RankSpec> ranks;  // rank r is ranks[r]
  DeviceSpec device;
  bool operator==(const Cluster&) const = default;

  static std::array<LinkCost, kNumLinkClasses> default_links();
};

// A rank's package: its NUMA node's, else its binding's, else -1.
int rank_package(const Cluster& cluster, int rank);

// The class of the path between ranks a and b.
LinkClass link_between(const Cluster& cluster, int a, int b);

// Appends `count` ranks on machine `node`: one per GPU (round robin) where
// it has GPUs, else in blocks over the NUMA nodes that have cores; each on a
// NIC of its NUMA node when there is one.
void place_ranks(const Machine& machine, int node, int count, std::vector<RankSpec>* out);

// Node indexes and per-node indexes in range, bindings on the named node:
// for one rank, and for the whole cluster (machines and links included).
Status validate_rank(const Cluster& cluster, int rank);
Status validate(const Cluster& cluster);

}  // namespace weft::topo
