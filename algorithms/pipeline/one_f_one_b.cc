// 1F1B: rank r runs p − r − 1 warm-up forwards, then alternates one forward
// and one backward, then drains the remaining backwards. A micro-batch's
// activations are freed by its backward, so rank r holds at most p − r.
#include <algorithm>

#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

std::vector<std::vector<Action>> one_f_one_b_order(const Params& params) {
  const int p = params.stages, m = params.microbatches;
  std::vector<std::vector<Action>> order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m);
    std::vector<Action>& list = order[r];
    for (int mb = 0; mb < warmup; ++mb) list.push_back({Op::Forward, mb, 0});
    for (int i = 0; i + warmup < m; ++i) {
      list.push_back({Op::Forward, warmup + i, 0});
      list.push_back({Op::Backward, i, 0});
    }
    for (int mb = std::max(m - warmup, 0); mb < m; ++mb) list.push_back({Op::Backward, mb, 0});
  }
  return order;
}

}  // namespace weft::algo::pipeline
