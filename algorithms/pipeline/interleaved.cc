// Interleaved 1F1B: each rank holds v model chunks and walks the
// micro-batches in rounds of p, every chunk in turn (forwards chunk 0 → v−1,
// backwards v−1 → 0). The warm-up is 2·(p − r − 1) + (v − 1)·p chunk
// forwards, after which forwards and backwards alternate. Each chunk costs
// 1/v of a full stage, so the bubble shrinks to (p − 1)/(v·m + p − 1).
#include <algorithm>

#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

namespace {

// The k-th chunk-forward (or backward) of a rank: round k / (p·v), chunk
// (k mod p·v) / p, micro-batch round·p + k mod p.
Action nth(int k, int p, int v, Op op) {
  const int round = k / (p * v), within = k % (p * v);
  const int chunk = within / p;
  return {op, round * p + within % p, op == Op::Forward ? chunk : v - 1 - chunk};
}

}  // namespace

std::vector<std::vector<Action>> interleaved_order(const Params& params) {
  const int p = params.stages, m = params.microbatches, v = params.virtual_stages;
  if (v == 1) return one_f_one_b_order(params);
  const int total = m * v;
  std::vector<std::vector<Action>> order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    std::vector<Action>& list = order[r];
    for (int k = 0; k < warmup; ++k) list.push_back(nth(k, p, v, Op::Forward));
    for (int i = 0; i + warmup < total; ++i) {
      list.push_back(nth(warmup + i, p, v, Op::Forward));
      list.push_back(nth(i, p, v, Op::Backward));
      list.back().with_previous = true;
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(nth(k, p, v, Op::Backward));
  }
  return order;
}

}  // namespace weft::algo::pipeline
