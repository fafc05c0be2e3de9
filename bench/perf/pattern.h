// Input values for the check: small integers chosen per (dtype, op, nranks) so that every
// partial result of the reduction is exact in the dtype, whatever order the ranks combine
// in. Then the expected output is known exactly, and any difference is a real error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "weft/weft.h"

namespace weft::perf {

class InputPattern {
 public:
  // op: the reduction, or nullopt for collectives that only move data.
  InputPattern(weftDataType_t dtype, std::optional<weftRedOp_t> op, int nranks);

  // The value rank puts at index of its input buffer.
  double input(int rank, size_t index) const;
  // op applied over every rank's input(rank, index): the exact reduced value.
  double reduced(size_t index) const;
  // Largest accepted |result - expected|: 0 except for float averages, which an
  // implementation may compute as a sum of pre-scaled terms (2 ulp, as nccl-tests allows).
  double tolerance(double expected) const;

 private:
  weftDataType_t dtype_;
  std::optional<weftRedOp_t> op_;
  int nranks_;
  int64_t limit_;      // every integer in [0, limit_] is exact in dtype_
  int64_t label_mod_;  // data movement, max, min: values in [0, label_mod_)
  int64_t sum_mod_;    // sum: values in [0, sum_mod_), or 0 for the sparse 0/1 scheme
  int64_t avg_mod_;    // avg: per-index mean in [0, avg_mod_)
  int prod_powers_;    // prod: at most this many ranks contribute a factor 2
};

}  // namespace weft::perf
