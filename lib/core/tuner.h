// Chooses the algorithm and message chunking per collective call. Users can
// force an algorithm per collective with WEFT_ALGO or the config's
// `algorithms` field ("allreduce:ring,allgather:bruck"). Until the cost model
// lands the default is a size threshold per collective.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "algorithms/schedule.h"
#include "common/status.h"

namespace weft {

struct AlgorithmOverrides {
  // Forced algorithm per collective, or -1.
  std::array<int, algo::kNumCollectives> forced;
  AlgorithmOverrides() { forced.fill(-1); }
};

// Parses "collective:algorithm[,collective:algorithm...]". Unknown names and
// algorithms that do not implement the collective are errors listing the
// valid choices.
Status parse_algorithm_overrides(const std::string& spec, const char* source,
                                 AlgorithmOverrides* out);

struct Plan {
  algo::Algorithm algorithm;
  uint64_t chunk_elements;  // 0: no chunking
};

Plan plan_collective(algo::Collective collective, uint64_t bytes, size_t element_size, int nranks,
                     const AlgorithmOverrides& overrides);

}  // namespace weft
