// weft-train's verdict, on rank 0: every rank's losses, gradients and parameters against
// the single-process reference, and against each other inside replica groups.
#pragma once

#include <string>
#include <vector>

#include "model.h"

namespace weft::train {

// What one rank reports (arrays in the global layout of param_specs, NaN where not held).
struct RankReport {
  int dp = 0;  // coordinate along dp
  std::vector<double> losses;
  std::vector<float> grads;    // local, complete over tp, partial over dp
  std::vector<float> reduced;  // after the DP reduction (all NaN when not exposed)
  std::vector<float> params;   // after the last step
};

struct Worst {
  // max |distributed − reference| / max |reference| over one tensor (parameters: over the
  // whole model)
  double value = 0;
  std::string where;
};

struct Verdict {
  std::vector<double> losses;  // distributed, per step (mean over dp)
  Worst loss, grads, reduced, params;
  bool has_reduced = false;
  std::vector<std::string> failures;  // replica mismatches and missing elements
};

// ranks indexed by world rank; dp the data-parallel size.
Verdict verify(const std::vector<ParamSpec>& specs, const std::vector<RankReport>& ranks, int dp,
               const std::vector<double>& ref_losses, const std::vector<float>& ref_grads,
               const std::vector<float>& ref_params);

}  // namespace weft::train
