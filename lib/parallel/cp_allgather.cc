// All-gather K/V (Llama 3 style): one AllGather of every rank's k|v block,
// then local attention of this rank's queries over all of them. Backward
// gathers k|v again (nothing but the own shard is kept between the passes)
// and reduce-scatters the dk|dv partials to their owners.
#include <algorithm>

#include "parallel/cp_internal.h"

namespace weft::parallel::detail {

namespace {

using State = ContextParallelAttention::State;

// Every rank's k|v block, each padded to the largest.
std::vector<float> gather_kv(const State& s, std::string_view pattern) {
  size_t block = 2 * s.max_kv * s.kv_stride;
  std::vector<float> mine(s.kv), all(s.size * block);
  mine.resize(block);
  fp32_collective(s.axis, pattern, "allgather", mine.data(), all.data(), block, all.size());
  return all;
}

}  // namespace

void allgather_forward(State& s) {
  size_t block = 2 * s.max_kv * s.kv_stride;
  std::vector<float> all = gather_kv(s, "cp.allgather_kv");
  for (int src = 0; src < s.size; ++src) {
    const float* k = all.data() + src * block;
    attention_block_forward(s.shape, s.q.data(), s.q_runs[s.rank], k,
                            k + s.kv_rows[src] * s.kv_stride, s.kv_runs[src], s.out.data(),
                            s.lse.data());
  }
}

void allgather_backward(State& s, const float* dout, float* dq, float* dkv) {
  size_t block = 2 * s.max_kv * s.kv_stride;
  std::vector<float> all = gather_kv(s, "cp.allgather_kv_bwd");
  std::vector<float> delta(s.q_rows[s.rank] * s.lse_stride), partial(all.size(), 0.0f), mine(block);
  attention_delta(s.shape, s.q_rows[s.rank], dout, s.out.data(), delta.data());
  for (int src = 0; src < s.size; ++src) {
    const float* k = all.data() + src * block;
    float* dk = partial.data() + src * block;
    size_t half = s.kv_rows[src] * s.kv_stride;
    attention_block_backward(s.shape, s.q.data(), s.q_runs[s.rank], k, k + half, s.kv_runs[src],
                             dout, s.lse.data(), delta.data(), dq, dk, dk + half);
  }
  fp32_collective(s.axis, "cp.allgather_dkv", "reducescatter", partial.data(), mine.data(),
                  partial.size(), block);
  std::copy(mine.begin(), mine.begin() + s.kv_block(s.rank), dkv);
}

}  // namespace weft::parallel::detail
