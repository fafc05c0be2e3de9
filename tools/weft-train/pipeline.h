// The model of model.h pipelined: layers split over pp·v stages (stage s = chunk·pp + pp rank
// holds layers [s·L/(pp·v), (s+1)·L/(pp·v))), the embeddings on stage 0, the final norm, LM
// head and loss on the last; every stage tensor parallel over tp and replicated over dp (DP
// bucketing of the stage's parameters after the pipeline step). The micro-batches of each dp
// rank's share of the batch run through weft::parallel::Pipeline with the chosen schedule;
// their gradients accumulate, so one step equals the reference's full-batch step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed.h"

namespace weft::train {

// "" when the pipeline options fit the model and mesh, else a message naming the option.
std::string check_pipeline(const Config& config, const Parallelism& par, int dp);

// Per stage (pipeline rank) of one dp/tp position: the bubble of the last step measured
// around the stage functions, and the checker's and the formula's for the schedule.
struct StageProfile {
  double wall_s = 0, compute_s = 0, simulated = 0, formula = 0;
};

class PipelineModel : public Trainer {
 public:
  PipelineModel(const Config& config, const Parallelism& par, int dp, weftComm_t world);
  ~PipelineModel() override;

  double step(const Batch& global) override;
  parallel::Ledger& ledger() override;
  int dp_coord() const override;
  const std::vector<float>& local_grads() const override;
  std::vector<float> reduced_grads() const override;
  std::vector<float> params() override;
  bool coverage_ok() const override { return true; }
  // Each stage's own layers (the embeddings on the first, the head on the last).
  ShardState shard_state() const override;
  void restore(const GlobalState& state) override;
  int pp_coord() const;
  StageProfile profile() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The closed forms for this rank: its stage's parameters and TP calls per micro-batch, the
// DP buckets of its parameters and the pipeline transfers.
parallel::ModelConfig pipeline_ledger_model(const Config& config, const Parallelism& par, int dp,
                                            int pp_rank);

}  // namespace weft::train
