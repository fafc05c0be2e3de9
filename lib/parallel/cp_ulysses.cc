// Ulysses: AllToAll from sequence-sharded q, k, v ([rows, batch, heads,
// dim] of this rank's positions) to head-sharded ones (every position, this
// rank's heads), attention over the whole sequence, and an AllToAll of the
// output back: four AllToAlls each way. Uneven head groups use AllToAllv.
#include <algorithm>
#include <numeric>

#include "parallel/cp_internal.h"

namespace weft::parallel::detail {

namespace {

using State = ContextParallelAttention::State;

// An AllToAllv of fp32 counts (AllToAll when every count is the same).
void all_to_all(const State& s, const float* send, const std::vector<size_t>& send_counts,
                float* recv, const std::vector<size_t>& recv_counts) {
  size_t n = send_counts.size();
  std::vector<size_t> sdispls(n, 0), rdispls(n, 0);
  std::exclusive_scan(send_counts.begin(), send_counts.end(), sdispls.begin(), size_t{0});
  std::exclusive_scan(recv_counts.begin(), recv_counts.end(), rdispls.begin(), size_t{0});
  size_t total = sdispls.back() + send_counts.back();
  if (n == 1) {
    std::copy(send, send + total, recv);
    return;
  }
  size_t sent = (total - send_counts[s.rank]) * sizeof(float);
  auto same = [&](const std::vector<size_t>& c) {
    return std::all_of(c.begin(), c.end(), [&](size_t x) { return x == send_counts[0]; });
  };
  if (same(send_counts) && same(recv_counts)) {
    size_t count = send_counts[0];
    blocking(
        s.axis, "cp.ulysses", "alltoall", total * sizeof(float),
        [=](weftComm_t c, weftStream_t st) {
          return weftAllToAll(send, recv, count, weftFloat32, c, st);
        },
        sent);
    return;
  }
  blocking(
      s.axis, "cp.ulysses", "alltoallv", total * sizeof(float),
      [&](weftComm_t c, weftStream_t st) {
        return weftAllToAllv(send, send_counts.data(), sdispls.data(), recv, recv_counts.data(),
                             rdispls.data(), weftFloat32, c, st);
      },
      sent);
}

}  // namespace

Heads split_heads(size_t heads, int n) {
  Heads h{split_sizes(heads, n), std::vector<size_t>(n, 0), heads};
  std::exclusive_scan(h.count.begin(), h.count.end(), h.offset.begin(), size_t{0});
  return h;
}

// [rows[me], batch, heads, dim] -> [Σ rows, batch, heads.count[me], dim].
std::vector<float> to_heads(const State& s, const float* x, const std::vector<size_t>& rows,
                            const Heads& heads) {
  size_t n = rows.size(), me = s.rank, b = s.shape.batch, dim = s.shape.head_dim;
  std::vector<size_t> send_counts(n), recv_counts(n);
  std::vector<float> send, recv;
  for (size_t p = 0; p < n; ++p) {
    for (size_t i = 0; i < rows[me] * b; ++i) {
      const float* from = x + (i * heads.total + heads.offset[p]) * dim;
      send.insert(send.end(), from, from + heads.count[p] * dim);
    }
    send_counts[p] = rows[me] * b * heads.count[p] * dim;
    recv_counts[p] = rows[p] * b * heads.count[me] * dim;
  }
  recv.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}));
  all_to_all(s, send.data(), send_counts, recv.data(), recv_counts);
  return recv;
}

// The inverse of to_heads, into y [rows[me], batch, heads, dim].
void from_heads(const State& s, const float* x, const std::vector<size_t>& rows, const Heads& heads,
                float* y) {
  size_t n = rows.size(), me = s.rank, b = s.shape.batch, dim = s.shape.head_dim;
  std::vector<size_t> send_counts(n), recv_counts(n);
  for (size_t p = 0; p < n; ++p) {
    send_counts[p] = rows[p] * b * heads.count[me] * dim;
    recv_counts[p] = rows[me] * b * heads.count[p] * dim;
  }
  std::vector<float> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}));
  all_to_all(s, x, send_counts, recv.data(), recv_counts);
  const float* from = recv.data();
  for (size_t p = 0; p < n; ++p)
    for (size_t i = 0; i < rows[me] * b; ++i, from += heads.count[p] * dim)
      std::copy(from, from + heads.count[p] * dim, y + (i * heads.total + heads.offset[p]) * dim);
}

namespace {

struct Local {
  Heads q, kv;
  AttentionShape shape;  // this rank's heads
  std::vector<SeqRun> q_runs, kv_runs;
  size_t q_rows, kv_rows;
};

Local local_view(const State& s) {
  Local l{split_heads(s.shape.heads, s.size),
          split_heads(s.shape.kv_heads, s.size),
          s.shape,
          {},
          {},
          0,
          0};
  l.shape.heads = l.q.count[s.rank];
  l.shape.kv_heads = l.kv.count[s.rank];
  for (int p = 0; p < s.size; ++p) {
    l.q_runs.insert(l.q_runs.end(), s.q_runs[p].begin(), s.q_runs[p].end());
    l.kv_runs.insert(l.kv_runs.end(), s.kv_runs[p].begin(), s.kv_runs[p].end());
  }
  l.q_rows = std::accumulate(s.q_rows.begin(), s.q_rows.end(), size_t{0});
  l.kv_rows = std::accumulate(s.kv_rows.begin(), s.kv_rows.end(), size_t{0});
  return l;
}

}  // namespace

void ulysses_forward(State& s) {
  Local l = local_view(s);
  size_t nkv = s.kv_rows[s.rank] * s.kv_stride;
  s.head_q = to_heads(s, s.q.data(), s.q_rows, l.q);
  s.head_kv = to_heads(s, s.kv.data(), s.kv_rows, l.kv);
  std::vector<float> head_v = to_heads(s, s.kv.data() + nkv, s.kv_rows, l.kv);
  size_t half = s.head_kv.size();
  s.head_kv.insert(s.head_kv.end(), head_v.begin(), head_v.end());
  s.head_out.assign(s.head_q.size(), 0.0f);
  s.head_lse.assign(l.q_rows * s.shape.batch * l.shape.heads, kNegInf);
  attention_block_forward(l.shape, s.head_q.data(), l.q_runs, s.head_kv.data(),
                          s.head_kv.data() + half, l.kv_runs, s.head_out.data(), s.head_lse.data());
  from_heads(s, s.head_out.data(), s.q_rows, l.q, s.out.data());
}

void ulysses_backward(State& s, const float* dout, float* dq, float* dkv) {
  Local l = local_view(s);
  std::vector<float> head_dout = to_heads(s, dout, s.q_rows, l.q);
  std::vector<float> delta(s.head_lse.size()), head_dq(s.head_q.size(), 0.0f),
      head_dkv(s.head_kv.size(), 0.0f);
  attention_delta(l.shape, l.q_rows, head_dout.data(), s.head_out.data(), delta.data());
  size_t half = s.head_kv.size() / 2;
  attention_block_backward(l.shape, s.head_q.data(), l.q_runs, s.head_kv.data(),
                           s.head_kv.data() + half, l.kv_runs, head_dout.data(), s.head_lse.data(),
                           delta.data(), head_dq.data(), head_dkv.data(), head_dkv.data() + half);
  from_heads(s, head_dq.data(), s.q_rows, l.q, dq);
  from_heads(s, head_dkv.data(), s.kv_rows, l.kv, dkv);
  from_heads(s, head_dkv.data() + half, s.kv_rows, l.kv, dkv + s.kv_rows[s.rank] * s.kv_stride);
}

}  // namespace weft::parallel::detail
