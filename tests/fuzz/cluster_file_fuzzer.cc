// Fuzz target: any bytes as a cluster file (WEFT_TOPO_FILE). A file either
// fails with an error that names its place, or gives a cluster whose dump
// parses back to the same cluster (the round trip cluster_file.h promises).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "topo/cluster_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // No base folder: relative "xml" paths name files nobody can rely on here.
  weft::topo::Cluster cluster;
  weft::Status status = weft::topo::parse_cluster(
      std::string_view(reinterpret_cast<const char*>(data), size), "/nonexistent", &cluster);
  if (!status.ok()) {
    if (status.message().empty()) abort();
    return 0;
  }
  const std::string text = weft::topo::dump_cluster(cluster);
  weft::topo::Cluster again;
  if (!weft::topo::parse_cluster(text, "", &again).ok() || !(again == cluster)) abort();
  return 0;
}
