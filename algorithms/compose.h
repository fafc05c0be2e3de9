// Compositions: a schedule built for a sub-group of ranks and appended to the
// outer program as one of its phases. Hierarchical algorithms are sequences
// of such phases (inside a node, across nodes, inside a node again), so the
// simulator checks them like any other program. Internal to weft_algorithms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "algorithms/steps.h"

namespace weft::algo::detail {

// Where a sub-program's buffers live in the outer program: its Input and
// Output start at the offsets of these ranges (their counts bound what it
// may touch); its Scratch is fresh outer scratch.
struct SubBuffers {
  Range input;
  Range output;
};

// Appends `sub` (built for sub-ranks 0..members.size()-1) to the outer
// program: sub-rank q becomes real rank members[q], Input and Output ranges
// move onto `buffers`, and its steps without dependencies wait for every
// step in `after`. Returns the steps no other sub-step waits for (later
// phases wait for those); `after` itself when `sub` has no steps.
std::vector<uint32_t> compose(Emitter& e, const Program& sub, const std::vector<int>& members,
                              const SubBuffers& buffers, const std::vector<uint32_t>& after);

// `after` itself when short, else one join step waiting for all of it, so
// that the many steps starting a phase do not each list every step that
// ended the last one.
std::vector<uint32_t> funnel(Emitter& e, const std::vector<uint32_t>& after);

using Builder = void (*)(const Params&, Emitter&);

// Builds the sub-group's program for `sub` (layout-free: members are already
// in ring order) with build(), or with `builder` for a phase that is not a
// collective of its own, then compose()s it. build() failing is a bug in the
// calling algorithm.
std::vector<uint32_t> compose_built(Emitter& e, const Params& sub, const std::vector<int>& members,
                                    const SubBuffers& buffers, const std::vector<uint32_t>& after,
                                    Builder builder = nullptr);

}  // namespace weft::algo::detail
