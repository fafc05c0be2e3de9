// GPipe: every micro-batch forward through the rank's stage, then every
// backward in the same order. Peak activations: all m micro-batches.
#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

std::vector<std::vector<Action>> gpipe_order(const Params& params) {
  std::vector<std::vector<Action>> order(params.stages);
  for (std::vector<Action>& list : order) {
    for (int mb = 0; mb < params.microbatches; ++mb) list.push_back({Op::Forward, mb, 0});
    for (int mb = 0; mb < params.microbatches; ++mb) list.push_back({Op::Backward, mb, 0});
  }
  return order;
}

}  // namespace weft::algo::pipeline
