// Context-parallel attention: the state the algorithm files share and their
// entry points (one file per family: ring pass-KV, pass-Q, all-gather,
// Ulysses, hierarchical).
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "parallel/internal.h"

namespace weft::parallel {

namespace detail {
struct Hier;
}

struct ContextParallelAttention::State {
  State(const Axis& a, const AttentionShape& s, const CpConfig& c) : axis(a), shape(s), config(c) {}
  const Axis& axis;
  AttentionShape shape;
  CpConfig config;
  CpAlgorithm algorithm = CpAlgorithm::ring;
  int rank = 0, size = 1;
  std::vector<std::vector<SeqRun>> q_runs, kv_runs;  // per rank
  std::vector<size_t> q_rows, kv_rows;               // per rank
  size_t max_q = 0, max_kv = 0;
  size_t q_stride = 0, kv_stride = 0, lse_stride = 0;  // floats per row
  // Saved by forward: this rank's q, k|v packed (k rows then v rows), out, lse.
  std::vector<float> q, kv, out, lse;
  bool forwarded = false;
  // Ulysses keeps its head-sharded tensors (whole sequence, own heads).
  std::vector<float> head_q, head_kv, head_out, head_lse;
  // hier: the node's communicator, the ring's, and their states.
  std::shared_ptr<detail::Hier> hier;

  size_t kv_block(int r) const { return 2 * kv_rows[r] * kv_stride; }  // k|v floats
};

namespace detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// delta[row, b, h] = Σ_d dout·out (the softmax backward's row term).
void attention_delta(const AttentionShape& shape, size_t rows, const float* dout, const float* out,
                     float* delta);
// (out, lse) ← the log-sum-exp merge of itself and (part, part_lse).
void merge_partial(const AttentionShape& shape, size_t rows, float* out, float* lse,
                   const float* part, const float* part_lse);

// One step of a ring: send `count` floats to rank + 1 and receive
// `recv_count` from rank − 1, as a group on the axis stream, booked as
// "sendrecv" with the bytes sent.
void launch_ring_shift(Inflight& op, const Axis& axis, std::string_view pattern, const float* send,
                       size_t count, float* recv, size_t recv_count);

void ring_forward(ContextParallelAttention::State& s);
void ring_backward(ContextParallelAttention::State& s, const float* dout, float* dq, float* dkv);
void passq_forward(ContextParallelAttention::State& s);
void passq_backward(ContextParallelAttention::State& s, const float* dout, float* dq, float* dkv);
void allgather_forward(ContextParallelAttention::State& s);
void allgather_backward(ContextParallelAttention::State& s, const float* dout, float* dq,
                        float* dkv);
// Ulysses' head split over the ranks of s.axis and its AllToAlls: x [rows[me],
// batch, heads, dim] -> [Σ rows, batch, heads.count[me], dim] and back.
struct Heads {
  std::vector<size_t> count, offset;  // per rank
  size_t total;
};
Heads split_heads(size_t heads, int n);
std::vector<float> to_heads(const ContextParallelAttention::State& s, const float* x,
                            const std::vector<size_t>& rows, const Heads& heads);
void from_heads(const ContextParallelAttention::State& s, const float* x,
                const std::vector<size_t>& rows, const Heads& heads, float* y);

void ulysses_forward(ContextParallelAttention::State& s);
void ulysses_backward(ContextParallelAttention::State& s, const float* dout, float* dq, float* dkv);
// hier: splits the axis into nodes (s.config.hosts) and replaces the shards.
void hier_setup(ContextParallelAttention::State& s);
void hier_forward(ContextParallelAttention::State& s);
void hier_backward(ContextParallelAttention::State& s, const float* dout, float* dq, float* dkv);

}  // namespace detail
}  // namespace weft::parallel
