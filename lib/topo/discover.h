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
inline constexpr uint64_t kMaxSyntheticPus = uint64_t{1} << 16;

}  // namespace weft::topo
