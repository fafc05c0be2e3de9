// Pipeline parallel: runs a pipeline schedule (GPipe, 1F1B, interleaved 1F1B,
// zero-bubble) over the PP group of a mesh with Send/Recv in groups. The
// schedules are the pure generators of algorithms/pipeline; the caller
// supplies each stage's compute. Included by weft/parallel.hpp.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace weft::parallel {

class Axis;
class Ledger;

enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble };
// "gpipe", "1f1b", "interleaved", "zb".
const char* pipeline_schedule_name(PipelineSchedule schedule);
bool parse_pipeline_schedule(std::string_view name, PipelineSchedule* out);

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int microbatches = 1;
  // Model chunks per rank (interleaved): stage of chunk c on rank r = c·p + r.
  int virtual_stages = 1;
  // fp32 elements of one boundary activation (b·s·h of a micro-batch, as the
  // stage's output and the next one's input): every transfer has this size.
  size_t activation_numel = 0;
};

// A rank's compute, per micro-batch and model chunk (0 .. virtual_stages−1).
struct StageFunctions {
  // input: the previous stage's output (empty on stage 0); output: to fill
  // with this stage's (activation_numel; empty on the last stage).
  std::function<void(int microbatch, int chunk, std::span<const float> input,
                     std::span<float> output)>
      forward;
  // output_grad: the next stage's input gradient (empty on the last stage,
  // which starts from its own loss); input_grad: to fill (empty on stage 0).
  // Under zero_bubble it computes the input gradient only and
  // backward_weight(microbatch, chunk) the weight gradient, later; otherwise
  // it does both and backward_weight is not called.
  std::function<void(int microbatch, int chunk, std::span<const float> output_grad,
                     std::span<float> input_grad)>
      backward;
  std::function<void(int microbatch, int chunk)> backward_weight;
};

// What run() measured on this rank.
struct PipelineProfile {
  double wall_s = 0;     // the whole step
  double compute_s = 0;  // inside the stage functions
  double bubble() const { return wall_s > 0 ? 1.0 - compute_s / wall_s : 0.0; }
};

class Pipeline {
 public:
  // axis: the PP group (rank = pipeline stage); it must outlive the
  // Pipeline. Errors name the argument:
  // microbatches, virtual_stages (and the schedule), activation_numel.
  Pipeline(const Axis& axis, PipelineOptions options);
  ~Pipeline();
  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;

  int stages() const;  // p: the axis size
  int rank() const;
  int chunks() const;  // virtual_stages
  int stage(int chunk) const;
  bool first_stage(int chunk) const { return stage(chunk) == 0; }
  bool last_stage(int chunk) const { return stage(chunk) == stages() * chunks() - 1; }

  // One step: every action of this rank's list, in order. Transfers are
  // booked in the axis ledger as "pp.forward" / "pp.backward" sends and
  // receives of activation_numel·4 bytes (receives carry the wait).
  void run(const StageFunctions& functions);
  const PipelineProfile& profile() const;
  // The bubble the checker measures for this schedule with unit costs, and
  // the formula's ((p−1)/(m+p−1); interleaved (p−1)/(v·m+p−1)).
  double simulated_bubble() const;
  double formula_bubble() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The closed form of one step's transfers on pipeline rank `rank` of
// `stages`, added to `ledger` under dim: per micro-batch, a send forward on
// each of its chunks but the last stage's and a receive on each but stage
// 0's, and the reverse backward. Summed over the ranks: p·v − 1 transfers
// per micro-batch per direction of b·s·h·dtype ((p − 1) without interleaving).
void expected_pipeline(const PipelineOptions& options, int stages, int rank, std::string_view dim,
                       int steps, Ledger& ledger);

}  // namespace weft::parallel
