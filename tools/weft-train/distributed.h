// The model of model.h on a mesh, built from the adapters of weft/parallel.hpp: tensor
// parallel linears, vocabulary-parallel embedding and cross-entropy, sequence parallelism,
// DP gradient bucketing or ZeRO-1/2/3 (with HSDP). Only the kernels are weft-train's own.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model.h"
#include "weft/parallel.hpp"

namespace weft::train {

struct Parallelism {
  int dp = 0;  // 0: the world size over the others
  int tp = 1;
  int cp = 1;                    // context parallel: the sequence sharded over cp ranks
  std::string cp_algo = "ring";  // ring|zigzag|passq|allgather|ulysses|hier|compressed|auto
  // Emulated nodes: the world's ranks in `nodes` consecutive equal blocks, each posing as a
  // host of its own (the mesh's hosts; what hier splits on); 0: the real host names.
  int nodes = 0;
  bool sp = false;
  int zero = 0;       // 0: DP bucketing; 1, 2, 3
  int hsdp = 1;       // ZeRO-3 replicas
  int bucket_kb = 0;  // DP and ZeRO-2 gradient buckets (KiB, first included); 0: the defaults
  // Expert parallel (with Config::experts > 0): the EP size, a view over dp; the experts'
  // gradients are reduced over the dp / ep expert-DP ranks.
  int ep = 1;
  bool ep_sync_free = false;  // the dispatcher's count-sync-free mode (bound: the rank's tokens)
  // Debug: add a small error to one element of the final layernorm's gradient (replicated
  // over tp) on the last rank, which a verdict must see (FAIL).
  bool perturb_grad = false;
  // Debug: one AllReduce per step over tp that no closed form has (the ledger must FAIL).
  bool extra_call = false;
  // Pipeline parallel (pipeline.h): stages, micro-batches per step, schedule, chunks per rank.
  int pp = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
};

// The mesh sizes resolved against the world, or a message naming the offending option.
struct MeshPlan {
  int dp = 1, tp = 1, cp = 1;
  std::string error;
};
MeshPlan plan_mesh(const Config& config, const Parallelism& par, int world_size);

// The closed-form model description the ledger's expected column is computed from.
parallel::ModelConfig ledger_model(const Config& config, const Parallelism& par, int dp);

// How a rank's coordinates shard parameters: TP splits rows or columns, EP the stacked
// experts' rows.
struct Shard {
  int tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  int rows(const ParamSpec& s) const {
    return s.split == Split::kRows      ? s.rows / tp
           : s.split == Split::kExperts ? s.rows / ep
                                        : s.rows;
  }
  int cols(const ParamSpec& s) const { return s.split == Split::kCols ? s.cols / tp : s.cols; }
  int row0(const ParamSpec& s) const {
    return s.split == Split::kRows      ? tp_rank * rows(s)
           : s.split == Split::kExperts ? ep_rank * rows(s)
                                        : 0;
  }
  int col0(const ParamSpec& s) const { return s.split == Split::kCols ? tp_rank * cols(s) : 0; }
};

// This rank's slice of a full parameter value.
std::vector<float> slice(const ParamSpec& s, const std::vector<float>& full, const Shard& shard);
// The inverse: a rank's share into the global layout at `offset`.
void place_slice(const ParamSpec& s, size_t offset, const Shard& shard,
                 std::span<const float> local, std::vector<float>& global);

// One transformer layer's TP linears (each saves its input for its backward) and the
// activations the layer's backward reads (rows: this rank's; qkv_out, att, u, g: all tokens).
class CpAttention;
struct ShardState;   // checkpoint.h
struct GlobalState;  // checkpoint.h

struct TransformerLayer {
  TransformerLayer(const parallel::Axis& tp, const Config& c,
                   const parallel::LinearOptions& options);
  ~TransformerLayer();  // where CpAttention is complete
  parallel::ColumnParallelLinear qkv, fc1;
  parallel::RowParallelLinear out, fc2;
  std::unique_ptr<CpAttention> cp;  // with --cp > 1 or compressed attention
  std::vector<float> x, a1, mean1, rstd1, qkv_out, probs, att, x1, c, mean2, rstd2, u, g;
  // MoE: the routing of this rank's rows, the dispatch handle, the grouped expert
  // activations (u, g above then hold the grouped rows' values).
  std::vector<float> logits, weight, y;
  std::vector<int32_t> index;
  parallel::MoeHandle handle;
};

// What weft-train's verdict needs from a distributed model (Distributed, PipelineModel).
class Trainer {
 public:
  virtual ~Trainer() = default;
  // One training step on this rank's share of the global batch; returns its mean loss (NaN
  // on a rank that computes no loss: pipeline stages before the last).
  virtual double step(const Batch& global) = 0;
  virtual parallel::Ledger& ledger() = 0;
  virtual int dp_coord() const = 0;
  // The data-parallel replica whose ranks must agree (dp-cp with context parallel).
  virtual int replica_coord() const { return dp_coord(); }
  virtual const std::vector<float>& local_grads() const = 0;
  virtual std::vector<float> reduced_grads() const = 0;
  virtual std::vector<float> params() = 0;
  virtual bool coverage_ok() const = 0;
  // The ranks of this rank's CP group on its node (hier's node size).
  virtual int cp_node_ranks() const { return 1; }
  // This rank's coordinate along cp (compressed attention's halo depends on it).
  virtual int cp_coord() const { return 0; }
  // Checkpoints: this rank's parameters and Adam moments in its tp slice of each parameter
  // (NaN where it holds none: another ZeRO shard's, another pipeline stage's), and their
  // restoration from a whole-model state (each rank takes what it holds).
  virtual ShardState shard_state() const = 0;
  virtual void restore(const GlobalState& state) = 0;
};

class Distributed : public Trainer {
 public:
  Distributed(const Config& config, const Parallelism& par, int dp, weftComm_t world);
  ~Distributed() override;

  double step(const Batch& global) override;

  parallel::Ledger& ledger() override { return ledger_; }
  int dp_coord() const override;
  // The data-parallel replica: the coordinate over dp-cp (dp without CP).
  int replica_coord() const override;
  int tp_coord() const;
  int ep_coord() const;
  // Per rank, in the global (unsharded) parameter layout of param_specs, NaN where this rank
  // holds nothing: the local gradients of the last step as handed to the data-parallel
  // reduction (complete over tp, partial over dp); the reduced gradients (DP bucketing only:
  // ZeRO does not expose them); the parameters after the last step. params() gathers ZeRO-3
  // units, so it issues collectives: call it on every rank, after reading the ledger.
  const std::vector<float>& local_grads() const override { return local_grads_; }
  std::vector<float> reduced_grads() const override;
  std::vector<float> params() override;
  // ZeRO: every element owned by exactly one rank of its shard group (collective).
  bool coverage_ok() const override;
  int cp_node_ranks() const override;
  // ZeRO re-shards a restored state over this mesh's dp.
  ShardState shard_state() const override;
  void restore(const GlobalState& state) override;
  int cp_coord() const override;

 private:
  using Layer = TransformerLayer;
  Shard shard() const;  // this rank's tp and ep coordinates
  std::span<float> param(size_t id);
  std::span<float> grad(size_t id);
  void ready(size_t id);      // the gradient of id is complete on this rank for this step
  void hand_over(size_t id);  // to the DP/ZeRO reduction (recorded for the check first)
  void unit_forward_begin(int unit), unit_forward_end(int unit);
  void unit_backward_begin(int unit), unit_backward_end(int unit);
  void reduce_sp_grads();
  bool is_expert(size_t id) const { return specs_[id].split == Split::kExperts; }
  parallel::DataParallel& ddp_of(size_t id) const { return is_expert(id) ? *expert_ddp_ : *ddp_; }
  // The MoE MLP of layer l (moe.h) on this rank's rows, through the EP dispatcher.
  void moe_forward(Layer& a, int l, std::vector<float>& o);
  void moe_backward(Layer& a, int l, const std::vector<float>& dx, std::vector<float>& dz);
  void place(size_t id, std::span<const float> local, std::vector<float>& global) const;
  // Runs kernel work, booked as compute of the current phase ("forward", "backward").
  void timed_compute(const std::function<void()>& work);

  Config config_;
  Parallelism par_;
  std::vector<ParamSpec> specs_;
  std::vector<size_t> offsets_;  // of each parameter in the global layout
  parallel::Ledger ledger_;
  parallel::AdamOptions adam_;
  std::unique_ptr<parallel::Mesh> mesh_;
  std::unique_ptr<parallel::Axis> tp_, cp_;
  std::vector<int> positions_;  // the sequence positions of this rank's rows (CP shard)
  std::unique_ptr<parallel::DataParallel> ddp_;  // zero 0
  std::unique_ptr<parallel::Zero> zero_;         // zero 1-3
  std::unique_ptr<parallel::Axis> ep_;           // MoE: the EP group of the expert view
  std::unique_ptr<parallel::MoeDispatcher> moe_;
  std::unique_ptr<parallel::DataParallel> expert_ddp_;  // MoE: expert gradients over edp
  std::vector<std::vector<float>> values_, m_, v_;      // zero 0: local parameters and Adam state
  std::vector<size_t> ids_;                             // adapter id of each parameter
  std::unique_ptr<parallel::VocabParallelEmbedding> embedding_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<parallel::ColumnParallelLinear> lm_head_;
  std::unique_ptr<parallel::VocabParallelCrossEntropy> loss_;
  std::vector<float> local_grads_;
  int step_ = 0;
  const char* phase_ = "forward";
};

}  // namespace weft::train
