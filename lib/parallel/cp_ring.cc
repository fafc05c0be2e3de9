// Ring attention pass-KV (contiguous or zigzag shards): every rank keeps its
// queries while the k|v blocks travel to rank + 1; the next shift is posted
// on the axis stream before the current block is computed on, and partial
// outputs merge by log-sum-exp. Backward runs the k|v ring again and a second
// ring of fp32 dk|dv accumulators one step behind it.
#include <algorithm>

#include "parallel/cp_internal.h"

namespace weft::parallel::detail {

namespace {

using State = ContextParallelAttention::State;

// The runs of local rows [begin, end) of `runs`.
std::vector<SeqRun> rows_of(const std::vector<SeqRun>& runs, size_t begin, size_t end) {
  std::vector<SeqRun> out;
  size_t at = 0;
  for (const SeqRun& run : runs) {
    size_t lo = std::max(begin, at), hi = std::min(end, at + run.count);
    if (lo < hi) out.push_back({run.begin + (lo - at), hi - lo});
    at += run.count;
  }
  return out;
}

void book_compute(const State& s, std::string_view pattern, double start) {
  if (s.axis.ledger() != nullptr) s.axis.ledger()->add_compute(pattern, now_s() - start);
}

}  // namespace

void ring_forward(State& s) {
  int n = s.size, r = s.rank;
  size_t capacity = 2 * s.max_kv * s.kv_stride;
  std::vector<float> cur(s.kv), next(capacity);
  cur.resize(capacity);
  Inflight shift;
  for (int j = 0; j < n; ++j) {
    int src = (r - j + n) % n, prev = (src - 1 + n) % n;
    if (j + 1 < n)
      launch_ring_shift(shift, s.axis, "cp.ring_kv", cur.data(), s.kv_block(src), next.data(),
                        s.kv_block(prev));
    double start = now_s();
    attention_block_forward(s.shape, s.q.data(), s.q_runs[r], cur.data(),
                            cur.data() + s.kv_rows[src] * s.kv_stride, s.kv_runs[src], s.out.data(),
                            s.lse.data());
    book_compute(s, "cp.ring_kv", start);
    shift.join();
    std::swap(cur, next);
  }
}

void ring_backward(State& s, const float* dout, float* dq, float* dkv) {
  int n = s.size, r = s.rank;
  std::vector<float> delta(s.q_rows[r] * s.lse_stride);
  attention_delta(s.shape, s.q_rows[r], dout, s.out.data(), delta.data());
  size_t capacity = 2 * s.max_kv * s.kv_stride;
  std::vector<float> cur(s.kv), next(capacity), block(capacity), sending(capacity),
      received(capacity);
  cur.resize(capacity);
  // The own block's gradient in two halves of the query rows: the first
  // hides the first k|v shift, the second the last accumulator's shift.
  size_t half = s.q_rows[r] / 2;
  auto own = [&](size_t begin, size_t end) {
    double start = now_s();
    std::vector<SeqRun> runs = rows_of(s.q_runs[r], begin, end);
    attention_block_backward(s.shape, s.q.data() + begin * s.q_stride, runs, s.kv.data(),
                             s.kv.data() + s.kv_rows[r] * s.kv_stride, s.kv_runs[r],
                             dout + begin * s.q_stride, s.lse.data() + begin * s.lse_stride,
                             delta.data() + begin * s.lse_stride, dq + begin * s.q_stride, dkv,
                             dkv + s.kv_rows[r] * s.kv_stride);
    book_compute(s, "cp.ring_kv_bwd", start);
  };
  Inflight shift, dshift;
  for (int j = 0; j < n; ++j) {
    int src = (r - j + n) % n, prev = (src - 1 + n) % n;
    if (j + 1 < n)
      launch_ring_shift(shift, s.axis, "cp.ring_kv_bwd", cur.data(), s.kv_block(src), next.data(),
                        s.kv_block(prev));
    if (j == 0) {
      own(0, half);
      shift.join();
      std::swap(cur, next);
      continue;
    }
    // Block src's accumulator starts at rank src + 1 and reaches its owner
    // after n − 1 shifts; each rank computes its part first and only then
    // waits for the accumulator (as ring-flash-attention does), so the shift
    // is hidden behind the block compute.
    std::fill_n(block.begin(), s.kv_block(src), 0.0f);
    double start = now_s();
    attention_block_backward(s.shape, s.q.data(), s.q_runs[r], cur.data(),
                             cur.data() + s.kv_rows[src] * s.kv_stride, s.kv_runs[src], dout,
                             s.lse.data(), delta.data(), dq, block.data(),
                             block.data() + s.kv_rows[src] * s.kv_stride);
    book_compute(s, "cp.ring_kv_bwd", start);
    if (j >= 2) {
      dshift.join();
      for (size_t i = 0; i < s.kv_block(src); ++i) block[i] += received[i];
    }
    std::swap(block, sending);
    launch_ring_shift(dshift, s.axis, "cp.ring_dkv", sending.data(), s.kv_block(src),
                      received.data(), s.kv_block(prev));
    shift.join();
    std::swap(cur, next);
  }
  own(half, s.q_rows[r]);
  if (n == 1) return;
  dshift.join();
  for (size_t i = 0; i < s.kv_block(r); ++i) dkv[i] += received[i];
}

}  // namespace weft::parallel::detail
