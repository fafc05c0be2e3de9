// weft-sim's --topo mode: the tuner's cost model on a modelled cluster. For
// each size from lo to hi (times --factor) it prints every algorithm's
// predicted time and bus bandwidth at its best chunk, and marks the tuner's
// choice:
//   weft-sim --topo cluster.json --coll allreduce --bytes 1K:4G [--factor 4]
//            [--shm] [--memory-gbps B] [--max-steps 8M]
#pragma once

#include <cstdint>

#include "algorithms/schedule.h"

namespace weft::sim {

// "256", "4K", "2M", "1G" (powers of 1024).
bool parse_size(const char* text, uint64_t* out);

// --bytes is the whole buffer for collectives whose count is per rank.
bool per_rank_count(algo::Collective c);

// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
double busbw_factor(algo::Collective c, int nranks);

// The --topo mode's main: returns the exit status.
int run_predict(int argc, char** argv);

}  // namespace weft::sim
