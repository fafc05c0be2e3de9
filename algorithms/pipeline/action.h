// Pipeline-parallel schedules as pure generators, like the collective
// schedules of schedule.h: from (family, stages, micro-batches, virtual
// stages) to every pipeline rank's list of actions. Nothing here does I/O; the
// executor (lib/parallel/pp.cc) runs the lists, the checker (checker.h)
// verifies and times them.
//
// Model chunks: with v virtual stages per rank the model is cut into p·v
// stages and rank r holds stages r, r + p, ..., r + (v−1)·p (its chunks
// 0..v−1), as Megatron's interleaved schedule places them; v = 1 otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::algo::pipeline {

enum class Family : uint8_t {
  GPipe,        // every forward, then every backward
  OneFOneB,     // warm-up forwards, then one forward / one backward
  Interleaved,  // 1F1B over v model chunks per rank
  ZeroBubble,   // 1F1B with the backward split into B (input grad) and W (weight grad)
};
const char* family_name(Family family);  // "gpipe", "1f1b", "interleaved", "zb"
bool parse_family(std::string_view name, Family* out);

enum class Op : uint8_t {
  Forward,
  Backward,        // input and weight gradient together
  BackwardInput,   // zero-bubble B: the input gradient only (what the previous stage waits for)
  BackwardWeight,  // zero-bubble W: the weight gradient (needs B's saved output gradient)
  SendForward,     // this chunk's output activation to the next stage
  RecvForward,     // this chunk's input activation from the previous stage
  SendBackward,    // this chunk's input gradient to the previous stage
  RecvBackward,    // this chunk's output gradient from the next stage
};
const char* op_name(Op op);
inline bool is_comm(Op op) {
  return op >= Op::SendForward;
}

struct Action {
  Op op = Op::Forward;
  int32_t microbatch = 0;
  int32_t chunk = 0;  // the rank's model chunk (0 unless interleaved)
  int32_t peer = -1;  // communication only: the pipeline rank on the other side
  // Communication only: actions of one rank with the same group are posted
  // together (one weftGroupStart/End), so a send and the receive that
  // follows it cannot wait on each other. Groups count up from 1 per rank.
  uint32_t group = 0;
  // Compute only: shares the transfers of the window the previous compute
  // action opened (its receives posted in the same group, its sends after
  // the window), as the interleaved steady state batches a forward's and a
  // backward's four transfers in one group.
  bool with_previous = false;
};

// Costs of one chunk's compute, in time units, for the zero-bubble generator
// and the checker's timing. A fused Backward costs backward_input + backward_weight.
struct Costs {
  int forward = 1;
  int backward_input = 1;
  int backward_weight = 1;
};

struct Params {
  Family family = Family::OneFOneB;
  int stages = 1;          // p: pipeline ranks
  int microbatches = 1;    // m
  int virtual_stages = 1;  // v: model chunks per rank (interleaved only)
  Costs costs;
};

struct Schedule {
  int stages = 1, microbatches = 1, virtual_stages = 1;
  std::vector<std::vector<Action>> ranks;  // [pipeline rank] -> actions in order
};

// The model stage of (chunk, rank) and back.
inline int stage_of(int chunk, int rank, int stages) {
  return chunk * stages + rank;
}

// "" when params can be scheduled, otherwise why, naming the argument
// (stages, microbatches, virtual_stages, costs).
std::string validate(const Params& params);

// Builds every rank's list: the family's compute order, then lower().
// Returns false with *error (validate's message) for bad params.
bool build(const Params& params, Schedule* schedule, std::string* error);

// The compute order of each family (Forward / Backward / BackwardInput /
// BackwardWeight actions only), for valid params.
std::vector<std::vector<Action>> gpipe_order(const Params& params);
std::vector<std::vector<Action>> one_f_one_b_order(const Params& params);
std::vector<std::vector<Action>> interleaved_order(const Params& params);
std::vector<std::vector<Action>> zero_bubble_order(const Params& params);

// Adds the transfers to compute orders: before each window (a compute action
// and those that join it) one group with the sends of the previous window
// and the receives this one needs (Megatron's send-forward + receive-backward
// pairs, and the reverse).
Schedule lower(const Params& params, const std::vector<std::vector<Action>>& compute);

}  // namespace weft::algo::pipeline
