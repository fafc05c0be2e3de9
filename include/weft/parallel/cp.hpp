// Context parallelism: attention over a sequence sharded across the ranks of
// a CP axis. Ring pass-KV (contiguous or zigzag-balanced shards), pass-Q,
// all-gather K/V, Ulysses (AllToAll to head sharding) and hierarchical
// (Ulysses inside a node, ring across nodes), forward and backward, each
// exact against single-process attention; `automatic` picks pass-KV or
// pass-Q from the bytes each would move (the KV-cache rule of
// docs/parallel.md). Then two recurrences over a sharded sequence: affine-
// state CP (linear attention) and compressed-attention CP. Included by
// weft/parallel.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::parallel {

class Axis;

// CpAlgorithm (declared in weft/parallel.hpp) by name: "ring", "zigzag",
// "passq", "allgather", "ulysses", "hier", "auto"; anything else is a
// weft::Error naming the value.
CpAlgorithm parse_cp_algorithm(std::string_view name);
std::string_view cp_algorithm_name(CpAlgorithm algorithm);

// Tensors are fp32 rows, one per sequence position, each row [batch, heads,
// head_dim] (q, out) or [batch, kv_heads, head_dim] (k, v). Query head h
// reads key/value head h / (heads / kv_heads) (grouped-query attention).
struct AttentionShape {
  size_t batch = 1;
  size_t heads = 1;
  size_t kv_heads = 0;  // 0: heads
  size_t head_dim = 1;
  bool causal = true;
  float scale = 0;  // 0: 1/sqrt(head_dim)
};

// Sequence positions [begin, begin + count).
struct SeqRun {
  size_t begin = 0, count = 0;
};

struct CpConfig {
  CpAlgorithm algorithm = CpAlgorithm::ring;
  size_t q_seq = 0;   // query positions, over all ranks
  size_t kv_seq = 0;  // key/value positions (0: q_seq). With kv_seq > q_seq the
                      // queries are the last q_seq positions (prefill against
                      // a KV cache of kv_seq − q_seq positions).
  // Zigzag shards (rank r holds chunks r and 2P−1−r of 2P) for any algorithm;
  // implied by CpAlgorithm::zigzag. q_seq and kv_seq must divide by 2P.
  bool zigzag = false;
  // Ulysses with heads not divisible by P: AllToAllv of uneven head groups
  // (kv_heads must then equal heads); otherwise an error naming heads.
  bool uneven_heads = false;
  // hier: the node (host name) of every rank of the axis; empty: each rank's
  // gethostname, exchanged by an AllGather on the axis at construction. Every
  // node must hold the same number L of ranks, and heads and kv_heads must
  // divide by L. Node k (nodes in the order of their first rank) holds
  // segment k of split_sizes(seq, nodes), its i-th rank piece i of
  // split_sizes(segment, L); with zigzag node k holds chunks k and 2N−1−k of
  // 2N (q_seq and kv_seq must divide by 2N) and its ranks pieces of those
  // rows in order.
  std::vector<std::string> hosts;
};

// The KV-cache rule: the bytes one rank sends in the forward pass under
// ring pass-KV and under pass-Q, and the choice `automatic` makes (pass-Q
// when it sends fewer bytes, else pass-KV). See docs/parallel.md.
struct CpForwardBytes {
  size_t pass_kv = 0, pass_q = 0;
};
CpForwardBytes cp_forward_bytes(const AttentionShape& shape, size_t q_seq, size_t kv_seq, int cp);
CpAlgorithm choose_cp_algorithm(const AttentionShape& shape, size_t q_seq, size_t kv_seq, int cp);

// The positions each rank holds: contiguous (split_sizes) or zigzag.
std::vector<SeqRun> cp_shard(size_t seq, size_t offset, int cp, int rank, bool zigzag);

// Attention of the rows at q_runs over the rows at kv_runs (causal by
// position), merged into (out, lse) by log-sum-exp: start from out = 0,
// lse = −inf for plain attention. lse is [rows, batch, heads].
void attention_block_forward(const AttentionShape& shape, const float* q,
                             std::span<const SeqRun> q_runs, const float* k, const float* v,
                             std::span<const SeqRun> kv_runs, float* out, float* lse);
// The block's gradient given the final out's lse and delta = rowsum(dout·out)
// ([rows, batch, heads]); accumulates into dq, dk, dv.
void attention_block_backward(const AttentionShape& shape, const float* q,
                              std::span<const SeqRun> q_runs, const float* k, const float* v,
                              std::span<const SeqRun> kv_runs, const float* dout, const float* lse,
                              const float* delta, float* dq, float* dk, float* dv);

// Context-parallel attention over the CP axis (collective: every rank of the
// axis calls forward and backward in the same order). Communication is
// booked in the axis's ledger: "cp.ring_kv" / "cp.ring_dkv" (sendrecv),
// "cp.passq_q" (sendrecv) + "cp.passq_out" / "cp.passq_dq" (alltoall),
// "cp.allgather_kv" (allgather) + "cp.allgather_dkv" (reducescatter),
// "cp.ulysses" (alltoall or alltoallv); hier books its Ulysses calls on dim
// axis.name() + ".node" and its ring on axis.name() + ".ring" (its
// constructor is collective: it splits the axis). The axis must outlive it.
class ContextParallelAttention {
 public:
  ContextParallelAttention(const Axis& axis, const AttentionShape& shape, const CpConfig& config);
  ~ContextParallelAttention();
  ContextParallelAttention(const ContextParallelAttention&) = delete;
  ContextParallelAttention& operator=(const ContextParallelAttention&) = delete;

  CpAlgorithm algorithm() const;  // never automatic: what it resolved to
  const std::vector<SeqRun>& q_runs(int rank) const;
  const std::vector<SeqRun>& kv_runs(int rank) const;
  size_t q_rows() const;   // this rank's query rows
  size_t kv_rows() const;  // this rank's key/value rows

  // q [q_rows, batch, heads, head_dim], k and v [kv_rows, batch, kv_heads,
  // head_dim] -> out like q. Keeps what backward needs.
  void forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
               std::span<float> out);
  // dout like out -> dq, dk, dv like q, k, v (overwritten), for the last forward.
  void backward(std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                std::span<float> dv);

  // Opaque; public only so that each algorithm family can live in a file of
  // its own.
  struct State;

 private:
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// Affine-state CP (linear attention, gated delta rule as in KDA). Per batch
// element and head a state S [key_dim, value_dim] runs along the sequence:
//   S_t = M_t·S_{t−1} + β_t·k_t·v_tᵀ,  M_t = (I − β_t·k_t·k_tᵀ)·diag(α_t),
//   o_t = S_tᵀ·q_t.
// Each rank summarises its contiguous segment (split_sizes) as (M, S̃): the
// product of its M_t and its final state from S = 0; one AllGather of the
// fixed-size summaries; then the prefix (M_b, S̃_b)∘(M_a, S̃_a) = (M_b·M_a,
// M_b·S̃_a + S̃_b) over the ranks before it gives the state entering its
// segment, from which it recomputes its outputs. Backward runs the same in
// reverse: each rank's segment hands the state gradient G̃ (from a zero
// gradient at its end) to the state before it, one AllGather of the G̃, and
// the suffix c ← M_bᵀ·c + G̃_b over the later ranks gives the gradient at its
// end. Booked as "cp.affine_state" and "cp.affine_grad" (allgather).
struct AffineShape {
  size_t batch = 1;
  size_t heads = 1;
  size_t key_dim = 1;
  size_t value_dim = 1;
};

// One forward's ledger entries on dim "cp" (none for cp = 1): one AllGather
// of cp · batch·heads·(key_dim² + key_dim·value_dim) fp32; with backward
// one more of cp · batch·heads·key_dim·value_dim fp32.
void add_affine_cp_expected(Ledger& ledger, const AffineShape& shape, int cp,
                            bool backward = false);

class AffineStateCp {
 public:
  // seq: positions over all ranks of the axis (collective constructor: none).
  AffineStateCp(const Axis& axis, const AffineShape& shape, size_t seq);
  SeqRun run(int rank) const;  // the positions rank holds
  size_t rows() const;         // this rank's

  // Rows of this rank's positions: q, k, alpha [rows, batch, heads, key_dim]
  // (alpha: the per-key decay), v and out [rows, batch, heads, value_dim],
  // beta [rows, batch, heads].
  // Keeps the inputs, the state entering the segment and every summary.
  void forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
               std::span<const float> alpha, std::span<const float> beta, std::span<float> out);
  // dout like out -> the gradients of the last forward's inputs (overwritten).
  void backward(std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                std::span<float> dv, std::span<float> dalpha, std::span<float> dbeta);

 private:
  const Axis& axis_;
  AffineShape shape_;
  std::vector<SeqRun> runs_;
  std::vector<float> saved_, summaries_;
  std::vector<double> state_in_;
};

// ---------------------------------------------------------------------------
// Compressed-attention CP (block compression, NSA's compressed branch).
// Block j covers positions [j·stride, j·stride + block); its compressed key
// and value are Σ_i weights_i·k[j·stride + i] (and v). A query at t attends
// (softmax, per head, grouped-query as above) over the closed blocks only,
// those with j·stride + block − 1 ≤ t, in block order; a query that sees no
// closed block gets 0. Over CP (contiguous segments, split_sizes): the block
// ending on a rank is compressed there, with the tail halo of m = block − 1
// k|v rows sent by the previous rank; every rank compresses its blocks into a
// fixed number of entries (the most any rank owns, zero-padded); one
// AllGather; each query selects its closed blocks. The result does not depend
// on the CP degree, bit for bit. Booked as "cp.compressed_halo" (sendrecv)
// and "cp.compressed_blocks" (allgather). Backward, the adjoint: one
// ReduceScatter of the entries' gradients to their owners
// ("cp.compressed_blocks_grad"), which spread them over the block's rows and
// weights and send the halo rows' part back ("cp.compressed_halo_grad",
// sendrecv); equal to one rank's backward up to the order of the sum over
// ranks.
struct CompressedConfig {
  size_t seq = 0;
  size_t block = 1;
  size_t stride = 1;
  std::vector<float> weights;  // block weights (empty: the mean, 1/block each)
};

// Blocks rank `rank` of `cp` compresses: [first, first + count).
struct BlockRange {
  size_t first = 0, count = 0;
};
BlockRange compressed_blocks(const CompressedConfig& config, int cp, int rank);
// One forward's ledger entries of rank `rank` on dim "cp" (none for cp = 1):
// a halo sendrecv of (block − 1) k|v rows (0 bytes on the last rank; none
// for block 1) and one AllGather of cp · entries · 2·batch·kv_heads·head_dim
// fp32, entries = the most blocks any rank compresses; with backward, a
// ReduceScatter of the same size and the halo's sendrecv back (0 bytes on
// rank 0).
void add_compressed_cp_expected(Ledger& ledger, const AttentionShape& shape,
                                const CompressedConfig& config, int cp, int rank,
                                bool backward = false);

class CompressedAttentionCp {
 public:
  // Checks on every rank before any communication: block, stride > 0,
  // stride ≤ block, weights.size() = block, every segment at least the halo.
  CompressedAttentionCp(const Axis& axis, const AttentionShape& shape,
                        const CompressedConfig& config);
  SeqRun run(int rank) const;
  size_t rows() const;
  size_t halo() const;     // m = block − 1
  size_t entries() const;  // compressed entries per rank (padded)

  // q and out [rows, batch, heads, head_dim], k and v [rows, batch,
  // kv_heads, head_dim] of this rank's positions.
  // Keeps q, the k|v rows with the halo and the gathered entries.
  void forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
               std::span<float> out);
  // dout like out -> dq, dk, dv like q, k, v (overwritten) for the last
  // forward, and dweights [block]: this rank's part of the weights'
  // gradient (its blocks'), whose sum over the axis is the gradient (as a
  // data-parallel reduction over the CP ranks sums it).
  void backward(std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                std::span<float> dv, std::span<float> dweights);

 private:
  // Pointers to every compressed entry of gathered_, in block order.
  std::vector<const float*> gathered_blocks() const;
  // visit(offset of the query head's row, offset of its k/v head, blocks it
  // attends over) for every query row, batch element and head of this rank.
  void for_each_query(size_t blocks,
                      const std::function<void(size_t, size_t, size_t)>& visit) const;

  const Axis& axis_;
  AttentionShape shape_;
  CompressedConfig config_;
  std::vector<SeqRun> runs_;
  size_t entries_ = 0;
  std::vector<float> q_, kv_, gathered_;
};

}  // namespace weft::parallel
