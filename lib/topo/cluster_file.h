// The cluster file (WEFT_TOPO_FILE): a JSON description of nodes, link costs
// and rank placement; the format is specified in docs/topology.md. Parsing is
// strict (unknown keys, wrong types and out-of-range values are errors naming
// the line, column and path) and bounded, so any input yields a Cluster or a
// clear error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "topo/cluster.h"

namespace weft::topo {

inline constexpr int kClusterFormatVersion = 1;
inline constexpr int kMaxNodes = 1 << 16;
inline constexpr int kMaxRanks = 1 << 20;
inline constexpr int64_t kMaxTotalPus = int64_t{1} << 22;  // bounds the memory a file can ask for

// `base_dir` resolves relative "xml" paths ("" for the working directory).
Status parse_cluster(std::string_view text, const std::string& base_dir, Cluster* out);
Status load_cluster_file(const std::string& path, Cluster* out);
// The cluster WEFT_TOPO_FILE names; *found is false (and out untouched) when unset.
Status load_cluster_from_env(Cluster* out, bool* found);

// The cluster in the file format, every field explicit:
// parse_cluster(dump_cluster(c)) == c.
std::string dump_cluster(const Cluster& cluster);

}  // namespace weft::topo
