// Expert parallel (MoE) token dispatch and combine over the EP group of the
// mesh's expert view (Axis::expert(mesh, "ep", &ledger)).
//
// Global expert g lives on EP rank g / (experts / ep) as its local expert
// g % (experts / ep). A token row travels once per destination rank, with the
// routing weights and local expert indices of its slots on that rank; the
// receiver groups the rows by local expert (a row chosen by two local experts
// is copied locally). combine() sends back one row per (token, rank): the
// weighted sum over that rank's experts, which the source adds up in place of
// the token. Backward reuses the handle and exchanges no counts:
//   combine_backward   dout → the expert outputs' gradients (dispatch direction)
//   dispatch_backward  the expert inputs' gradients → dx and d_weight (combine direction)
// Data are fp32 rows [tokens, hidden], row-major. See docs/parallel.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "weft/parallel.hpp"

namespace weft::parallel {

struct MoeOptions {
  int experts = 0;    // global expert count; must divide by the EP size
  int topk = 1;       // slots per token, 1 ≤ topk ≤ experts
  size_t hidden = 0;  // row width (fp32 elements)
  // Capacity: with factor F > 0, each rank sends every expert at most
  // C = ceil(F · tokens · topk / experts) (token, slot) pairs, first come first
  // served in token order; the rest are dropped (they add nothing to the
  // output and get zero gradients). 0: no capacity.
  double capacity_factor = 0;
  // With a capacity: every local expert's group of rows is padded with zero
  // rows to C · ep, so the experts see fixed shapes (pad rows are not sent).
  // C is computed from max_tokens when given, else from this rank's tokens
  // (then every rank must dispatch as many tokens, or an expert may receive
  // more than C · ep rows: an error naming it).
  bool pad = false;
  // Count-sync-free mode: a bound on the tokens of any rank per call. Buffers
  // are sized for the worst case (min(max_tokens, C · local experts) rows per
  // peer) and no counts are exchanged before the transfer; the receiver reads
  // its counts from the records. 0: counts are exchanged (one AllGather).
  size_t max_tokens = 0;
  // Attention → FFN disaggregation (AF): the ranks of the axis that hold the
  // experts, in expert order (global expert g on expert_ranks[g / (experts /
  // expert_ranks.size())]); the others hold none and only send tokens (an
  // expert rank with no tokens of its own dispatches 0). Empty: every rank,
  // in axis order.
  std::vector<int> expert_ranks;
};

// Routing load of one dispatch.
struct MoeLoad {
  // (token, slot) pairs each global expert receives over the whole EP group,
  // after capacity; only the local experts' entries are known (others 0)
  // in count-sync-free mode, where `global` is false.
  std::vector<size_t> expert_tokens;
  // Rows each EP rank receives (every rank's with counts exchanged, else this
  // rank's entry only).
  std::vector<size_t> rank_rows;
  size_t dropped = 0;      // pairs this rank dropped by capacity
  double imbalance = 1.0;  // max / mean of expert_tokens over the known experts
  bool global = true;
};

// What one dispatch laid out; combine and the backward passes reuse it.
class MoeHandle {
 public:
  MoeHandle();
  ~MoeHandle();
  MoeHandle(MoeHandle&&) noexcept;
  MoeHandle& operator=(MoeHandle&&) noexcept;

  // The received rows grouped by local expert: expert e's rows are
  // [expert_offset(e), expert_offset(e) + expert_rows(e)) of expert_input().
  std::span<const float> expert_input() const;
  size_t rows() const;  // all local experts' rows (pad included)
  size_t expert_rows(int local_expert) const;
  size_t expert_offset(int local_expert) const;
  const MoeLoad& load() const;
  // Rows this rank sent to other ranks (each carries hidden fp32 values).
  size_t remote_rows_sent() const;

  struct State;

 private:
  friend class MoeDispatcher;
  friend class HierMoeDispatcher;
  std::unique_ptr<State> state_;
};

// Ledger patterns (dim: the axis's name): "ep.counts" allgather (count
// exchange), "ep.dispatch" and "ep.combine" alltoallv forward,
// "ep.combine_backward" and "ep.dispatch_backward" alltoallv backward. An
// AllToAllv's bytes per call is tokens · topk · hidden · 4 (the routed rows,
// whatever the routing), its bytes sent what left this rank (rows plus the
// dispatch's 8 · topk bytes of slot data per row). Every dispatch also notes
// its load in the ledger (Ledger::note): "ep.load.expert.<g>" and
// "ep.load.rank.<r>" accumulated, "ep.load.dropped" accumulated,
// "ep.load.imbalance" the largest seen.
class MoeDispatcher {
 public:
  // The axis (the EP group) must outlive the dispatcher.
  MoeDispatcher(const Axis& ep, MoeOptions options);
  ~MoeDispatcher();
  MoeDispatcher(MoeDispatcher&&) noexcept;
  MoeDispatcher& operator=(MoeDispatcher&&) noexcept;

  int local_experts() const;  // 0 on a rank outside MoeOptions::expert_ranks
  int first_expert() const;   // this rank's local expert 0 (-1 without experts)
  const Axis& axis() const;

  // x [tokens, hidden]; topk_index, topk_weight [tokens, topk]: global
  // expert ids (−1: the slot is unused) and their weights. Collective over
  // the EP group (every rank calls, tokens may differ per rank).
  MoeHandle dispatch(std::span<const float> x, size_t tokens, std::span<const int32_t> topk_index,
                     std::span<const float> topk_weight);
  // expert_output [handle.rows(), hidden], grouped like expert_input() →
  // out [tokens, hidden] = Σ_slots weight · output (overwritten). Keeps the
  // outputs in the handle for the backward.
  void combine(MoeHandle& handle, std::span<const float> expert_output, std::span<float> out);
  // dout [tokens, hidden] → d_expert_output [handle.rows(), hidden]
  // (overwritten; zero for pad rows). After combine().
  void combine_backward(MoeHandle& handle, std::span<const float> dout,
                        std::span<float> d_expert_output);
  // d_expert_input [handle.rows(), hidden] → dx [tokens, hidden] and
  // d_weight [tokens, topk] (both overwritten; zero for dropped and unused
  // slots). After combine_backward().
  void dispatch_backward(MoeHandle& handle, std::span<const float> d_expert_input,
                         std::span<float> dx, std::span<float> d_weight);

  struct State;

 private:
  friend class HierMoeDispatcher;
  std::unique_ptr<State> state_;
};

// Hierarchical dispatch: one message per destination node. A token crosses
// to another node once per node its kept slots reach (not once per rank),
// to its proxy there (the rank at the source's position in its node, modulo
// the node's size), which fans it out inside the node with a flat
// MoeDispatcher over the node's ranks; combine sums each node's slots at the
// proxy and sends one row per (token, node) back. Same results as the flat
// dispatcher up to the order of float additions; expert rows come grouped by
// local expert but ordered by (proxy, source, token). Capacity drops are
// decided at the source as in the flat dispatcher; pad and the
// count-sync-free mode are not offered here (an error). Ledger: the
// inter-node stage as "ep.inter.counts", "ep.inter.dispatch", ... on the EP
// axis (its bytes sent leave this rank's node: Σ over tokens of the remote
// nodes its kept slots reach, times the record), the intra-node stage as
// "ep.intra.*" on the axis "<ep name>.node"; the load ("ep.load.*") as the
// flat dispatcher notes it, rank_rows counting the rows each proxy receives.
class HierMoeHandle {
 public:
  std::span<const float> expert_input() const { return intra_.expert_input(); }
  size_t rows() const { return intra_.rows(); }
  size_t expert_rows(int local_expert) const { return intra_.expert_rows(local_expert); }
  size_t expert_offset(int local_expert) const { return intra_.expert_offset(local_expert); }
  const MoeLoad& load() const { return inter_.load(); }
  // Rows this rank sent to other nodes.
  size_t remote_rows_sent() const { return inter_.remote_rows_sent(); }

 private:
  friend class HierMoeDispatcher;
  MoeHandle inter_, intra_;
};

class HierMoeDispatcher {
 public:
  // nodes: the node of every rank of the EP axis (any labels; ep_nodes()
  // derives them from the mesh's hosts). Collective over the EP group (it
  // splits off the node communicator).
  HierMoeDispatcher(const Axis& ep, MoeOptions options, std::vector<int> nodes);
  ~HierMoeDispatcher();
  HierMoeDispatcher(HierMoeDispatcher&&) noexcept;
  HierMoeDispatcher& operator=(HierMoeDispatcher&&) noexcept;

  int local_experts() const;
  int first_expert() const;
  const Axis& axis() const;

  // As MoeDispatcher's.
  HierMoeHandle dispatch(std::span<const float> x, size_t tokens,
                         std::span<const int32_t> topk_index, std::span<const float> topk_weight);
  void combine(HierMoeHandle& handle, std::span<const float> expert_output, std::span<float> out);
  void combine_backward(HierMoeHandle& handle, std::span<const float> dout,
                        std::span<float> d_expert_output);
  void dispatch_backward(HierMoeHandle& handle, std::span<const float> d_expert_input,
                         std::span<float> dx, std::span<float> d_weight);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Expert tensor parallel inside EP (Megatron-Core's expert-TP): the expert
// view's etp group (Axis::expert(mesh, "etp"); MeshShape::expert_tp) shares
// every local expert of its EP position, W1 [ffn, h] split by rows
// (column-parallel, ffn/etp each) and W2 [h, ffn] by columns (row-parallel).
// Every member dispatches its own tokens over its EP group, then
//   gather          AllGatherv over etp of the members' received rows, regrouped
//                   by local expert (expert e: every member's rows, in member order);
//   each member runs its shard on all of them: partial y = W2_s · f(W1_s · x);
//   reduce_scatter  ReduceScatterv over etp of the partial outputs: each member
//                   gets the summed y of the rows it received, grouped as its handle
// and combines. Backward: combine_backward's gradient → gather (the adjoint of
// the ReduceScatter), the shard's backward → partial input gradients →
// reduce_scatter (the adjoint of the AllGather) → dispatch_backward. A shard's
// weight gradients sum the whole etp × EP group's tokens and reduce over
// expert-DP only. Ledger: "ep.etp.counts" allgather, "ep.etp.gather" and
// "ep.etp.reduce_scatter" (allgather / reducescatter, or alltoallv when the
// members' rows differ) on the etp axis.
class ExpertTp {
 public:
  // expert_rows: this member's rows per local expert (handle.expert_rows(e),
  // grouped contiguously in that order). Collective over etp (one AllGather
  // of the counts). The axis must outlive this.
  ExpertTp(const Axis& etp, std::span<const size_t> expert_rows);

  size_t rows() const;  // the group's rows of every local expert
  size_t expert_rows(int local_expert) const;
  size_t expert_offset(int local_expert) const;

  // own [this member's rows, hidden] → all [rows(), hidden] (overwritten).
  void gather(std::span<const float> own, std::span<float> all, size_t hidden) const;
  // all [rows(), hidden] (partial sums) → own [this member's rows, hidden],
  // summed over the members (overwritten).
  void reduce_scatter(std::span<const float> all, std::span<float> own, size_t hidden) const;

 private:
  const Axis& axis_;
  // counts_[m][e]: member m's rows of local expert e.
  std::vector<std::vector<size_t>> counts_;
  std::vector<size_t> member_rows_, expert_rows_, expert_offset_;
  // Member-major row r (as gathered) → its expert-major row.
  std::vector<size_t> order_;
};

// The node of every rank of this rank's EP group (mesh.expert_group_ranks("ep")),
// numbered by first appearance of its host in mesh.hosts().
std::vector<int> ep_nodes(const Mesh& mesh);

}  // namespace weft::parallel
