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
  bool sp = false;
  int zero = 0;       // 0: DP bucketing; 1, 2, 3
  int hsdp = 1;       // ZeRO-3 replicas
  int bucket_kb = 0;  // DP and ZeRO-2 gradient buckets (KiB, first included); 0: the defaults
  // Debug: add a small error to one element of the final layernorm's gradient (replicated
  // over tp) on the last rank, which a verdict must see (FAIL).
  bool perturb_grad = false;
  // Debug: one AllReduce per step over tp that no closed form has (the ledger must FAIL).
  bool extra_call = false;
};

// The mesh sizes resolved against the world, or a message naming the offending option.
struct MeshPlan {
  int dp = 1, tp = 1;
  std::string error;
};
MeshPlan plan_mesh(const Config& config, const Parallelism& par, int world_size);

// The closed-form model description the ledger's expected column is computed from.
parallel::ModelConfig ledger_model(const Config& config, const Parallelism& par, int dp);

class Distributed {
 public:
  Distributed(const Config& config, const Parallelism& par, int dp, weftComm_t world);
  ~Distributed();

  // One training step on this rank's share of the global batch; returns its mean loss.
  double step(const Batch& global);

  parallel::Ledger& ledger() { return ledger_; }
  int dp_coord() const;
  int tp_coord() const;
  // Per rank, in the global (unsharded) parameter layout of param_specs, NaN where this rank
  // holds nothing: the local gradients of the last step as handed to the data-parallel
  // reduction (complete over tp, partial over dp); the reduced gradients (DP bucketing only:
  // ZeRO does not expose them); the parameters after the last step. params() gathers ZeRO-3
  // units, so it issues collectives: call it on every rank, after reading the ledger.
  const std::vector<float>& local_grads() const { return local_grads_; }
  std::vector<float> reduced_grads() const;
  std::vector<float> params();
  // ZeRO: every element owned by exactly one rank of its shard group (collective).
  bool coverage_ok() const;

 private:
  struct Layer;
  std::span<float> param(size_t id);
  std::span<float> grad(size_t id);
  void ready(size_t id);      // the gradient of id is complete on this rank for this step
  void hand_over(size_t id);  // to the DP/ZeRO reduction (recorded for the check first)
  void unit_forward_begin(int unit), unit_forward_end(int unit);
  void unit_backward_begin(int unit), unit_backward_end(int unit);
  void reduce_sp_grads();
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
  std::unique_ptr<parallel::Axis> tp_;
  std::unique_ptr<parallel::DataParallel> ddp_;     // zero 0
  std::unique_ptr<parallel::Zero> zero_;            // zero 1-3
  std::vector<std::vector<float>> values_, m_, v_;  // zero 0: local parameters and Adam state
  std::vector<size_t> ids_;                         // adapter id of each parameter
  std::unique_ptr<parallel::VocabParallelEmbedding> embedding_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<parallel::ColumnParallelLinear> lm_head_;
  std::unique_ptr<parallel::VocabParallelCrossEntropy> loss_;
  std::vector<float> local_grads_;
  int step_ = 0;
  const char* phase_ = "forward";
};

}  // namespace weft::train
