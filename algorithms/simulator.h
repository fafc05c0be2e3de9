// The schedule simulator: builds every rank's program and runs them together
// in one process, symbolically. It checks what an executor relies on
// (dependencies are sound, sends and receives pair up with equal sizes,
// ranges stay inside their buffers, nothing deadlocks, no two unordered
// steps race on the same elements) and that the result is exact: each input
// element is a random 64-bit value, Reduce is wrapping addition, and every
// output element must equal its closed-form value. It also counts, per rank,
// steps, messages, bytes sent and communication rounds on the critical path.
// For AllReduce it also tracks each element's expression shape with an
// order-sensitive hash, so every rank must combine contributions in the same
// order and grouping (bitwise-equal results for floats).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/schedule.h"

namespace weft::algo {

// Builds one rank's program: build() itself, or a hand-made one in tests.
using ProgramBuilder = std::function<bool(const Params&, Program*, std::string*)>;

// What went wrong, as bits of SimResult::issues.
enum SimIssue : uint32_t {
  kSimBuildFailed = 1u << 0,
  kSimInvalidStep = 1u << 1,  // bad dependency, peer, or ranges that disagree within a step
  kSimOutOfBounds = 1u << 2,
  kSimUnmatched = 1u << 3,     // a send or receive without its counterpart
  kSimSizeMismatch = 1u << 4,  // a matched send and receive of different lengths
  kSimDeadlock = 1u << 5,
  kSimHazard = 1u << 6,  // unordered steps touching overlapping elements, one writing
  kSimWrongResult = 1u << 7,
  kSimNoSync = 1u << 8,  // a Barrier rank could finish before hearing from every rank
  // AllReduce ranks combine the contributions in different orders or
  // groupings: exact for integers, but floats would differ bitwise.
  kSimOrderDiffers = 1u << 9,
};

struct SimOptions {
  bool check_values = true;  // false: structure and counts only (for huge vectors)
  // Hazards are checked on ranks whose program has at most this many steps
  // (the check is quadratic); 0 disables it.
  uint64_t hazard_step_limit = 4096;
  uint64_t element_size = 4;  // bytes per element, for bytes_sent
  uint64_t seed = 0x5eed;
  // 0: run ready steps last-in first-out; otherwise pick them at random
  // with this seed (races the hazard check did not cover then show up as
  // wrong values on some seeds).
  uint64_t order_seed = 0;
  size_t max_errors = 8;  // messages kept in SimResult::errors
  // AllToAllv: counts[s * nranks + d] elements go from rank s to rank d.
  // Each rank packs its pieces in peer order with `gap` unused elements after
  // each; the result check also requires the gaps to stay untouched.
  std::vector<uint64_t> alltoallv_counts;
  uint64_t alltoallv_gap = 0;
};

struct RankStats {
  uint64_t steps = 0;
  uint64_t messages = 0;    // sends
  uint64_t bytes_sent = 0;  // elements sent * element_size
  uint64_t largest = 0;     // elements in the largest message sent
  uint64_t scratch = 0;     // Program::scratch_count
  uint32_t rounds = 0;      // communication rounds before this rank's last step completes
};

// Steps, messages and bytes of one program, without running it.
RankStats count_program(const Program& program, uint64_t element_size);

struct SimResult {
  uint32_t issues = 0;
  std::vector<std::string> errors;
  std::vector<RankStats> ranks;
  uint32_t rounds = 0;           // critical path: the most rounds over all ranks
  bool values_checked = false;   // the exact result was verified
  bool hazards_checked = false;  // every rank's program was checked for hazards

  bool ok() const { return issues == 0; }
  bool has(SimIssue issue) const { return (issues & issue) != 0; }
  std::string message() const;  // the errors, one per line
};

// Simulates the collective described by `params` (rank is ignored: every
// rank 0..nranks-1 is built with its own) and checks it.
SimResult simulate(const Params& params, const SimOptions& options = {},
                   const ProgramBuilder& builder = build);

}  // namespace weft::algo
