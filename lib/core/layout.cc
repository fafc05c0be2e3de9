#include "core/layout.h"

#include <mutex>

#include "common/log.h"
#include "topo/cluster_file.h"
#include "topo/discover.h"
#include "topo/shapes.h"

namespace weft {

topo::RankPlace this_process_place(uint64_t node_key) {
  static std::once_flag once;
  static topo::Machine machine;
  static bool discovered = false;
  std::call_once(once, [] {
    Status status = topo::discover_local(&machine);
    discovered = status.ok();
    if (!discovered)
      WEFT_LOG(WARN, INIT, "topology discovery failed (%s): rings follow rank order",
               status.message().c_str());
  });
  std::vector<int> binding;
  if (!discovered || !topo::process_binding(&binding).ok()) return topo::RankPlace{node_key};
  return topo::local_place(machine, binding, node_key, -1);
}

Status comm_topology(std::vector<topo::RankPlace> places, CommTopology* out) {
  topo::Cluster cluster;
  bool found = false;
  WEFT_RETURN_IF_ERROR(topo::load_cluster_from_env(&cluster, &found));
  if (found) {
    if (cluster.ranks.size() != places.size())
      return Error(weftInvalidUsage, "WEFT_TOPO_FILE describes %zu ranks, the communicator has %zu",
                   cluster.ranks.size(), places.size());
    places = topo::places_of(cluster);
    out->links = cluster.links;
    out->injected = true;
  }
  topo::ClusterView view(places);
  const int n = view.nranks();
  out->layout.node_of.resize(n);
  for (int rank = 0; rank < n; ++rank) out->layout.node_of[rank] = view.node_of(rank);
  out->layout.ring = topo::ring_order(view);
  out->places = std::move(places);
  WEFT_LOG(INFO, INIT, "%d rank%s on %d node%s (%s)", n, n == 1 ? "" : "s", view.nnodes(),
           view.nnodes() == 1 ? "" : "s", found ? "WEFT_TOPO_FILE" : "reported by the ranks");
  return Status::Ok();
}

}  // namespace weft
