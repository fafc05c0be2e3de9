// Where a communicator's ranks sit, as the schedules and the tuner see it:
// reported by the ranks at init (host identity, package and NUMA node of
// each rank's binding), or injected with WEFT_TOPO_FILE for tests and
// planning. The shared-memory path never trusts an injected file: it asks
// the peers' real host identity.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "algorithms/schedule.h"
#include "common/status.h"
#include "topo/cluster.h"
#include "topo/cluster_view.h"

namespace weft {

struct CommTopology {
  std::vector<topo::RankPlace> places;  // per rank
  algo::Layout layout;                  // node per rank, topology-aware ring order
  std::array<topo::LinkCost, topo::kNumLinkClasses> links = topo::Cluster::default_links();
  bool injected = false;  // from WEFT_TOPO_FILE
};

// This process's place on its node (hwloc discovery, done once per process).
topo::RankPlace this_process_place(uint64_t node_key);

// The topology of ranks at `places`; WEFT_TOPO_FILE replaces it when it
// describes exactly that many ranks (a file of another size is an error).
Status comm_topology(std::vector<topo::RankPlace> places, CommTopology* out);

}  // namespace weft
