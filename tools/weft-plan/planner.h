// weft-plan's model: a step's communication, compute, pipeline bubble and
// memory per rank for a model on a mesh on a cluster, before anything runs.
// The collectives come from the same closed forms weft-train checks
// (weft::parallel::Ledger::expected); their times from the tuner's α-β cost
// model on the cluster file's links (weft::Tuner, the communicator's own).
// See docs/planning.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weft/parallel.hpp"

namespace weft::topo {
struct Cluster;
}

namespace weft::plan {

// A decoder-only transformer. arch "reference": weft-train's model (GELU MLP
// with biases, learned positions, LayerNorm; transformer_parameters);
// "llama": gated MLP, grouped-query attention, RMSNorm, no biases; "mla":
// llama with DeepSeek's multi-head latent attention.
struct ModelSpec {
  std::string name = "custom";
  std::string arch = "llama";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  // MoE: routed experts (0: dense), experts per token, each expert's ffn,
  // shared experts, and how many first layers stay dense.
  int experts = 0, topk = 0, moe_ffn = 0, shared_experts = 0, dense_layers = 0;
  // MLA: query and key-value latent ranks, per-head dims.
  int q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
};

// Llama-3-8B, Llama-3-70B, Mixtral-8x7B, DeepSeek-V3 (their published configs).
bool preset(std::string_view name, ModelSpec* out);
const char* preset_names();  // "llama3-8b, llama3-70b, ..."

// The whole model's parameters, and those one token uses (MoE: top-k experts).
struct ParameterCounts {
  double total = 0, active = 0;
};
ParameterCounts parameter_counts(const ModelSpec& model);

enum class Work { train, prefill, decode };

struct Options {
  ModelSpec model;
  Work work = Work::train;
  int global_batch = 0, micro_batch = 1, seq = 0;  // train
  int batch = 1, context = 0;  // prefill / decode; batch per data replica (dp·ep)
  weftDataType_t weights = weftBfloat16, grads = weftFloat32, comm = weftBfloat16;
  weftDataType_t moments = weftFloat32;  // Adam's two moments (DeepSeek-V3 keeps them in bf16)
  int dp = 0, tp = 1, pp = 1, cp = 1, ep = 1, hsdp = 1;  // dp 0: the cluster over the others
  bool sp = false;
  int zero = 0;
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved, zb
  int microbatches = 0;           // 0: global batch / (micro batch · data replicas)
  int virtual_stages = 1;
  // The library's CP attention algorithms (weft/parallel/cp.hpp): ring,
  // zigzag, passq, allgather, ulysses, hier (Ulysses inside a node, ring
  // across nodes), auto; or the recurrences in place of softmax attention:
  // affine (AffineStateCp) and compressed (CompressedAttentionCp, forward
  // only: --prefill).
  std::string cp_algo = "zigzag";
  int cp_node_ranks = 0;                // hier: CP ranks per node (0: from the cluster)
  int cp_block = 32, cp_stride = 16;    // compressed: positions per block, block step
  bool ep_sync_free = false;            // MoE dispatch without the count AllGather
  std::string ep_dispatch = "flat";     // or hier (HierMoeDispatcher: one message per node)
  int ep_node_ranks = 0;                // hier: EP ranks per node (0: from the cluster)
  std::string recompute = "selective";  // none, selective, full
  double hot_expert_share = 0;          // MoE routing skew: share of slots on one expert
  size_t bucket_bytes = 25u << 20, first_bucket_bytes = 1u << 20;
  // Memory per device kept free of the plan (CUDA context, allocator fragmentation, the
  // framework's workspaces): a rank fits in the device's memory_gb less this.
  double reserve_gb = 0;
};

// Bytes a rank may plan for on the cluster's devices (0: no limit given), and "" or the
// error naming --reserve-gb when the reserve leaves nothing (validate checks it too).
double usable_memory(const Options& options, const topo::Cluster& cluster);
std::string check_reserve(const Options& options, const topo::Cluster& cluster);

// One ledger entry, planned.
struct Entry {
  parallel::LedgerEntry ledger;  // the closed form's entry for this step
  int group = 1;                 // ranks in the collective's group
  bool per_microbatch = false;   // repeated per micro-batch (else once per step)
  double calls_per_layer = 0;    // per transformer layer and micro-batch (0: not per layer)
  std::string algorithm;         // the tuner's pick on this cluster
  double call_us = 0;            // its predicted time per call
  double total_s = 0;            // all calls of the step
  // What it can hide behind: "-" (nothing), "fwd", "wgrad", "bwd" (a share of that
  // compute), "attn", "attn-bwd" (a CP ring step's block of attention), "pp" (the next
  // micro-batch: only the pipeline's fill and drain wait for it).
  std::string window;
  double exposed_s = 0;
};

struct Memory {
  double weights = 0, grads = 0, optimizer = 0, activations = 0, kv_cache = 0;  // bytes per rank
  double total() const { return weights + grads + optimizer + activations + kv_cache; }
};

struct Result {
  int world = 1, dp = 1, microbatches = 1, layers_per_stage = 0;
  double params = 0, active_params = 0;  // whole model
  double stage_params = 0;               // this rank's (TP/EP-sharded, before ZeRO)
  std::vector<Entry> entries;
  std::vector<std::string> notes;         // patterns not planned yet, approximations
  Memory memory, memory_no_sp_recompute;  // the latter: no SP, no recomputation
  double compute_s = 0;                   // per step, this rank, at peak
  double bubble_fraction = 0, bubble_s = 0;
  double comm_s = 0, exposed_s = 0, step_s = 0, mfu = 0;
  double imbalance = 1;  // MoE: busiest EP rank's expert tokens over the mean
};

// The ranks of world rank 0's group along `dim` ("tp", "dp", "dp_shard", ...,
// and the ledger's "dp-cp", "expert:ep", "expert:edp") in the mesh order
// tp-cp-ep-dp-pp; options.dp must be resolved (not 0).
std::vector<int> group_ranks(const Options& options, std::string_view dim);

// How many ranks of world rank 0's group along `dim` ("cp", "ep") each node
// of the cluster holds (0: the nodes hold different numbers of them): the
// node level of hier CP and of hierarchical EP dispatch.
int ranks_per_node(const Options& options, const topo::Cluster& cluster, std::string_view dim);

// The collective `primitive` ("allreduce", "allgather", ...) of logical size
// `bytes_per_call` (AllReduce buffer, ReduceScatter input, AllGather output,
// AllToAll and AllToAllv send buffer, in equal pieces per peer) over `ranks`
// of the cluster, as a communicator on those ranks would plan it: the tuner's
// algorithm and its predicted microseconds (negative: unmodelled).
struct CallPrediction {
  std::string algorithm;
  double us = -1;
};
CallPrediction predict_call(const topo::Cluster& cluster, const std::vector<int>& ranks,
                            std::string_view primitive, size_t bytes_per_call,
                            size_t element_bytes);

// predict_call with its tuners and results kept, for many plans on one
// cluster (the search). The cluster must outlive it.
class Predictor {
 public:
  explicit Predictor(const topo::Cluster& cluster);
  ~Predictor();
  CallPrediction predict(const std::vector<int>& ranks, std::string_view primitive,
                         size_t bytes_per_call, size_t element_bytes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Checks the options against the model and cluster: "" or one line naming
// the argument and the constraint.
std::string validate(const Options& options, const topo::Cluster& cluster);

// Plans a validated configuration (predictor: a cache to reuse, or none).
// With memory_limit > 0 (bytes), a rank needing more stops after the memory.
Result plan(const Options& options, const topo::Cluster& cluster, Predictor* predictor = nullptr,
            double memory_limit = 0);

// The Ledger::expected input for the options (one micro-batch, one step, on
// world rank 0: pipeline stage 0).
parallel::ModelConfig ledger_config(const Options& options);

struct Candidate {
  Options options;
  Result result;
  std::string rejected;  // "" when it fits
};
// Meshes over the whole cluster (tp within a node, then cp, ep, dp, pp
// outward), each planned or rejected with its reason; fitting ones first,
// fastest first. cp goes up to base.cp (with base.cp_algo), ep over the
// powers of two up to the expert count; for each, ZeRO 0-3 (with and without
// SP), ZeRO-3 also as HSDP with a node's ranks per shard group, and with
// pp > 1 the schedules 1F1B, zero-bubble and interleaved (2 chunks); a mesh
// that does not fit with the base's recomputation is tried with full recomputation.
std::vector<Candidate> search(const Options& base, const topo::Cluster& cluster);

}  // namespace weft::plan
