// Zero-bubble (ZB-H1 style): the backward is split into B, the input
// gradient the previous stage waits for, and W, the weight gradient nobody
// waits for. The order comes from list-scheduling every rank over the costs:
// a ready B first (it is on the critical path), else the next forward while
// the rank holds fewer than 1F1B's p − r micro-batches (held until W), else a
// pending W, which so fills the time 1F1B spends waiting.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>

#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

std::vector<std::vector<Action>> zero_bubble_order(const Params& params) {
  const int p = params.stages, m = params.microbatches;
  const Costs& cost = params.costs;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // Finish times of F and B per [rank][micro-batch]; kNever until scheduled.
  std::vector<std::vector<int64_t>> f_done(p, std::vector<int64_t>(m, kNever));
  std::vector<std::vector<int64_t>> b_done = f_done;
  struct Rank {
    int64_t free_at = 0;
    int next_f = 0, next_b = 0, held = 0;
    std::deque<int> pending_w;
  };
  std::vector<Rank> ranks(p);
  std::vector<std::vector<Action>> order(p);
  size_t left = size_t(p) * m * 3;
  for (int64_t t = 0; left > 0;) {
    int64_t next = kNever;
    for (int r = 0; r < p; ++r) {
      Rank& k = ranks[r];
      if (k.free_at > t) {
        next = std::min(next, k.free_at);
        continue;
      }
      auto start = [&](Op op, int mb, int duration) {
        order[r].push_back({op, mb, 0});
        k.free_at = t + duration;
        next = std::min(next, k.free_at);
        --left;
      };
      const bool b_ready = k.next_b < m && k.next_b < k.next_f &&
                           (r == p - 1 ? f_done[r][k.next_b] <= t : b_done[r + 1][k.next_b] <= t);
      const bool f_ready =
          k.next_f < m && k.held < p - r && (r == 0 || f_done[r - 1][k.next_f] <= t);
      if (b_ready) {
        b_done[r][k.next_b] = t + cost.backward_input;
        k.pending_w.push_back(k.next_b++);
        start(Op::BackwardInput, k.next_b - 1, cost.backward_input);
      } else if (f_ready) {
        f_done[r][k.next_f] = t + cost.forward;
        ++k.held;
        start(Op::Forward, k.next_f++, cost.forward);
      } else if (!k.pending_w.empty()) {
        const int mb = k.pending_w.front();
        k.pending_w.pop_front();
        --k.held;
        start(Op::BackwardWeight, mb, cost.backward_weight);
      }
    }
    // Idle ranks can only start once something finishes; the last rank is
    // never stuck, so something is always running while work is left.
    if (next == kNever) break;
    t = next;
  }
  return order;
}

}  // namespace weft::algo::pipeline
