// The pipeline schedule checker: runs every rank's action list together,
// symbolically, with the semantics the executor has. A group of transfers
// blocks its rank until every transfer in it has met its counterpart, and
// the k-th send from rank a to rank b meets the k-th receive on b from a
// (Send/Recv order, no tags), so sends are not assumed to be buffered. It
// checks that nothing deadlocks, that matched transfers agree (direction,
// micro-batch, adjacent stages), that every compute action has its inputs
// (activation received or local, output gradient received, B before W) and
// that each stage runs F and its backward exactly once per micro-batch.
// With transfers free and compute costed by Params::costs it measures the
// bubble and the micro-batches each rank holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

struct CheckResult {
  std::vector<std::string> errors;  // empty = the schedule is sound
  int64_t makespan = 0;             // time units until the last rank finishes
  std::vector<int64_t> busy;        // compute time per rank
  std::vector<double> rank_bubble;  // idle fraction per rank: 1 − busy / makespan
  double bubble = 0;                // the whole pipeline: 1 − Σ busy / (p · makespan)
  // Peak micro-batches per rank whose activations are alive: forward done,
  // backward not (held: until W for a split backward).
  std::vector<int> peak_in_flight, peak_held;
  uint64_t forward_transfers = 0, backward_transfers = 0;  // over all ranks
  bool ok() const { return errors.empty(); }
  std::string message() const;
};

CheckResult check(const Params& params, const Schedule& schedule);

// The bubble fraction of the family's formula: (p − 1)/(m + p − 1), and
// (p − 1)/(v·m + p − 1) for interleaved. Zero-bubble has none (it is below
// 1F1B's, by how much depends on the costs): returns 1F1B's.
double bubble_formula(const Params& params);

}  // namespace weft::algo::pipeline
