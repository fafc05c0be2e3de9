// Machines from hwloc: this host, an hwloc synthetic description, or an
// hwloc XML file (lstopo --of xml). The only part of Weft that includes hwloc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "topo/machine.h"

namespace weft::topo {

// This host, PCI GPUs and NICs included; name is the host name.
Status discover_local(Machine* out);

// "package:2 numa:2 core:16 pu:1" (hwloc's synthetic syntax). Synthetic
// machines have no I/O devices.
Status load_synthetic(std::string_view description, Machine* out);

// An XML file as lstopo --of xml writes it.
Status load_xml_file(const std::string& path, Machine* out);

// The PUs (OS indexes) this process may run on (hwloc_get_cpubind).
Status process_binding(std::vector<int>* pus);

// The PU count a synthetic description asks for (the product of its level
// counts); refuses absurd sizes before hwloc allocates them.
Status synthetic_pu_count(std::string_view description, uint64_t* out);
// hwloc builds a synthetic level in time that grows faster than its width squared
// (hwloc-calc --input "package:N pu:1": 0.2 s at N = 2048, 1.3 s at 4096, 12 s at 8192,
// 146 s at 16384; "package:16 core:1024 pu:4" 43 s), so a cluster file could stall a job's
// start for minutes (the cluster-file fuzzer found "X:46666 pu:1"). 4096 PUs per machine
// cover the largest shared-memory nodes in use; every level is at most that wide.
inline constexpr uint64_t kMaxSyntheticPus = uint64_t{1} << 12;

}  // namespace weft::topo
