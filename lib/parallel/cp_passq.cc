// Pass-Q: the k|v shards stay, the query blocks travel the ring. Each rank
// computes a partial output and lse of every query block against its own
// keys; one AllToAll returns the partials to their owners, which merge them
// by log-sum-exp. Backward sends q, dout, lse and delta around the ring, each
// rank accumulates its own dk|dv, and an AllToAll returns the dq partials.
#include <algorithm>

#include "parallel/cp_internal.h"

namespace weft::parallel::detail {

namespace {

using State = ContextParallelAttention::State;

// AllToAll of n slots of `slot` floats (blocking); a copy on one rank.
void exchange_slots(const State& s, std::string_view pattern, const float* send, float* recv,
                    size_t slot) {
  auto n = static_cast<size_t>(s.size);
  if (n == 1) {
    std::copy(send, send + slot, recv);
    return;
  }
  blocking(
      s.axis, pattern, "alltoall", n * slot * sizeof(float),
      [=](weftComm_t c, weftStream_t st) {
        return weftAllToAll(send, recv, slot, weftFloat32, c, st);
      },
      (n - 1) * slot * sizeof(float));
}

}  // namespace

void passq_forward(State& s) {
  int n = s.size, r = s.rank;
  size_t q_part = s.max_q * s.q_stride, slot = q_part + s.max_q * s.lse_stride;
  std::vector<float> cur(s.q), next(q_part), parts(n * slot, 0.0f), back(n * slot);
  cur.resize(q_part);
  for (int p = 0; p < n; ++p)
    std::fill_n(parts.begin() + p * slot + q_part, slot - q_part, kNegInf);
  const float* v = s.kv.data() + s.kv_rows[r] * s.kv_stride;
  Inflight shift;
  for (int j = 0; j < n; ++j) {
    int src = (r - j + n) % n, prev = (src - 1 + n) % n;
    if (j + 1 < n)
      launch_ring_shift(shift, s.axis, "cp.passq_q", cur.data(), s.q_rows[src] * s.q_stride,
                        next.data(), s.q_rows[prev] * s.q_stride);
    float* part = parts.data() + src * slot;
    attention_block_forward(s.shape, cur.data(), s.q_runs[src], s.kv.data(), v, s.kv_runs[r], part,
                            part + q_part);
    shift.join();
    std::swap(cur, next);
  }
  exchange_slots(s, "cp.passq_out", parts.data(), back.data(), slot);
  for (int p = 0; p < n; ++p)
    merge_partial(s.shape, s.q_rows[r], s.out.data(), s.lse.data(), back.data() + p * slot,
                  back.data() + p * slot + q_part);
}

void passq_backward(State& s, const float* dout, float* dq, float* dkv) {
  int n = s.size, r = s.rank;
  size_t q_part = s.max_q * s.q_stride, l_part = s.max_q * s.lse_stride;
  // A travelling packet: q | dout | lse | delta of one query block.
  size_t packet = 2 * q_part + 2 * l_part, nq = s.q_rows[r] * s.q_stride;
  std::vector<float> cur(packet, 0.0f), next(packet), dq_parts(n * q_part, 0.0f), back(n * q_part);
  std::copy(s.q.begin(), s.q.end(), cur.begin());
  std::copy(dout, dout + nq, cur.begin() + q_part);
  std::copy(s.lse.begin(), s.lse.end(), cur.begin() + 2 * q_part);
  attention_delta(s.shape, s.q_rows[r], dout, s.out.data(), cur.data() + 2 * q_part + l_part);
  const float* v = s.kv.data() + s.kv_rows[r] * s.kv_stride;
  float* dv = dkv + s.kv_rows[r] * s.kv_stride;
  Inflight shift;
  for (int j = 0; j < n; ++j) {
    int src = (r - j + n) % n;
    if (j + 1 < n)
      launch_ring_shift(shift, s.axis, "cp.passq_bwd", cur.data(), packet, next.data(), packet);
    const float* p = cur.data();
    attention_block_backward(s.shape, p, s.q_runs[src], s.kv.data(), v, s.kv_runs[r], p + q_part,
                             p + 2 * q_part, p + 2 * q_part + l_part,
                             dq_parts.data() + src * q_part, dkv, dv);
    shift.join();
    std::swap(cur, next);
  }
  exchange_slots(s, "cp.passq_dq", dq_parts.data(), back.data(), q_part);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < nq; ++i) dq[i] += back[p * q_part + i];
}

}  // namespace weft::parallel::detail
