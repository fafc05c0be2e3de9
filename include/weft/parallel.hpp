// Weft's parallelism adapter layer: a device mesh over a world communicator,
// tensor and sequence parallel region operations and linear layers, data
// parallel gradient bucketing, ZeRO-1/2/3 (FSDP) with hybrid sharding, and a
// traffic ledger that checks what was sent against the closed forms.
//
// It uses only Weft's public API (weft.h, weft.hpp), as an outside user would.
// Every failure is a weft::Error whose message names the argument at fault.
// See docs/parallel.md for the call patterns and the closed forms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/weft.hpp"

namespace weft::parallel {

class Ledger;

// ---------------------------------------------------------------------------
// Tensors: a non-owning, contiguous, row-major view.

// Bytes of one element of dtype (weftInvalidArgument for an unknown dtype).
size_t dtype_bytes(weftDataType_t dtype);

struct Tensor {
  void* data = nullptr;
  std::vector<size_t> shape;  // empty = a scalar
  weftDataType_t dtype = weftFloat32;

  size_t numel() const;
  size_t bytes() const { return numel() * dtype_bytes(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  // dim in [-rank, rank): negative counts from the end (-1 = last).
  size_t extent(int dim) const;
};

template <typename T>
Tensor view(T* data, std::vector<size_t> shape) {
  return Tensor{const_cast<std::remove_const_t<T>*>(data), std::move(shape),
                weft::datatype_of<std::remove_const_t<T>>()};
}

// How a dimension of `total` is split over `parts` ranks: the first
// total % parts ranks get one more (the uneven rule of the v-forms).
std::vector<size_t> split_sizes(size_t total, int parts);

// Copies, for every part p, the slab [offset_p, offset_p + sizes[p]) of `dim`
// of `in` into one contiguous block, blocks in part order: the layout a
// collective on dim 0 needs. sizes must sum to in.extent(dim).
void pack(const Tensor& in, int dim, std::span<const size_t> sizes, void* out);
// The inverse: contiguous blocks (shape of `out` with dim = sizes[p]) into
// their slabs of `out`.
void unpack(const void* in, int dim, std::span<const size_t> sizes, const Tensor& out);

// ---------------------------------------------------------------------------
// Mesh.
//
// The dense view has the dimensions named in `order` (at least tp, cp, ep, dp
// and pp; every dimension not named is size 1), first = innermost (fastest
// varying in the world rank): with "tp-cp-ep-dp-pp",
//   rank = tp + TP·(cp + CP·(ep + EP·(dp + DP·pp))).
// The expert view re-factors the same ranks of each pipeline stage as
// expert-tp (fastest), ep, expert-dp, over the same pp groups (CP folds into
// EP and expert-DP), as Megatron-Core does: its dims are named "etp", "ep",
// "edp" and "pp".
//
// Groups: group("dp"), group("dp-cp"), group("tp-cp"), ... is the communicator
// over the product of the named dimensions (the ranks that differ only along
// them; rank inside it = the linear index over those dims in mesh order).
// Creating one is a weftCommSplit of the world, which is collective: the
// constructor therefore creates the group of every single dimension of both
// views that has more than one rank (and those named in MeshShape::groups)
// eagerly, in a fixed order, on every rank. A product group not created at
// construction is created on first request, which is then collective over
// the whole world: every rank must request such groups in the same order.
// Dims that group the ranks identically (tp and etp when expert_tp = tp, "dp"
// and "dp_shard" without HSDP, ...) share one communicator, and all one-rank
// groups share one made locally (no collective). The Mesh owns them.
struct MeshShape {
  int tp = 1;
  int cp = 1;
  int ep = 1;
  int pp = 1;
  // 0: the world size over the product of the others (must divide it).
  int dp = 0;
  // Expert view: expert-TP size (0: same as tp) and EP size (0: same as ep).
  int expert_tp = 0;
  int expert_ep = 0;
  std::string order = "tp-cp-ep-dp-pp";
  // HSDP: dp is further factored as dp_shard (inner, dp/hsdp ranks: a node
  // when it fits) × dp_replicate (outer, hsdp replicas); both are dims of the
  // dense view ("dp" stays their product).
  int hsdp = 1;
  // Product groups to create eagerly, e.g. {"dp-cp", "tp-cp"}.
  std::vector<std::string> groups;
  // Host of every world rank, for tests of the placement check; empty = each
  // rank's gethostname, exchanged by an AllGather at construction.
  std::vector<std::string> hosts;
};

class Mesh {
 public:
  // world stays owned by the caller and must outlive the Mesh.
  Mesh(weftComm_t world, const MeshShape& shape);
  Mesh(const weft::Comm& world, const MeshShape& shape) : Mesh(world.get(), shape) {}
  ~Mesh();
  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;

  weftComm_t world() const;
  int world_rank() const;
  int world_size() const;
  const std::string& order() const;

  // Dense view. dims is one name or names joined by '-' ("dp-cp").
  int size(std::string_view dims) const;   // product of the sizes
  int coord(std::string_view dims) const;  // this rank's index in group(dims)
  weftComm_t group(std::string_view dims) const;
  // The stream every adapter collective on group(dims) is enqueued on (one
  // per group, so calls on a communicator keep their order). Enqueue your own
  // collectives on a group here too while adapters may have work in flight.
  weftStream_t stream(std::string_view dims) const;
  // World ranks of the group containing world rank `rank`, in group order.
  std::vector<int> group_ranks(std::string_view dims, int rank) const;

  // Expert view: "etp", "ep", "edp", "pp" and their products.
  int expert_size(std::string_view dims) const;
  int expert_coord(std::string_view dims) const;
  weftComm_t expert_group(std::string_view dims) const;
  weftStream_t expert_stream(std::string_view dims) const;
  std::vector<int> expert_group_ranks(std::string_view dims, int rank) const;

  // Placement (TP on the fastest links: a TP group should not cross nodes
  // while a node could hold it whole). True when some TP group spans more
  // than one host although tp ≤ the ranks of its hosts' nodes; logged once at
  // INFO (WEFT_DEBUG=INFO) at construction, with the group.
  bool tp_crosses_nodes() const;
  const std::string& placement_report() const;  // "" when placement is fine
  const std::vector<std::string>& hosts() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A group of the mesh, the stream its collectives run on (the mesh's for
// that group) and the ledger its traffic is booked in (may be null); booked
// under the dims as given ("tp", "dp-cp"). Adapters take an Axis so the same
// code serves "tp", "dp-cp" or an expert group. The mesh must outlive it.
class Axis {
 public:
  Axis(const Mesh& mesh, std::string_view dims, Ledger* ledger = nullptr);
  // A group of the expert view, booked as "expert:" + dims.
  static Axis expert(const Mesh& mesh, std::string_view dims, Ledger* ledger = nullptr);
  // Any communicator (with a stream of its own), booked under `name`.
  Axis(weftComm_t comm, std::string name, Ledger* ledger = nullptr);
  ~Axis();
  Axis(Axis&&) noexcept;
  Axis& operator=(Axis&&) noexcept;

  weftComm_t comm() const;
  int size() const;
  int rank() const;
  const std::string& name() const;
  Ledger* ledger() const;
  weftStream_t stream() const;

 private:
  struct State;
  explicit Axis(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// Tensor and sequence parallel region operations (adjoint pairs).
//
// Each takes a Pass and reads `in`, writes `out` (caller-allocated, same
// dtype; identity passes copy unless in.data == out.data; AllReduce passes
// may run in place). Splits and gathers along `dim` pack → collective on dim 0
// → unpack. `sizes` (optional) gives every rank's extent along dim for uneven
// splits (v-forms); empty = split_sizes(full extent, axis.size()).
//   copy_to_tp       forward identity        backward AllReduce(sum)
//   reduce_from_tp   forward AllReduce(sum)  backward identity
//   scatter_to_tp    forward own slice       backward AllGather   (default dim -1)
//   gather_from_tp   forward AllGather       backward own slice   (default dim -1)
//   scatter_to_sp    forward own slice       backward AllGather   (default dim 0)
//   gather_from_sp   forward AllGather       backward ReduceScatter(sum)
//   reduce_scatter_to_sp forward ReduceScatter(sum)  backward AllGather
// Uneven AllGather is built from AllToAllv (every rank sends its block to
// all), uneven ReduceScatter from a ReduceScatter of blocks padded to the
// largest (zeros): both exact. Calls are blocking on the caller's thread.
enum class Pass { forward, backward };

void copy_to_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out);
void reduce_from_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out);
void scatter_to_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim = -1,
                   std::span<const size_t> sizes = {});
void gather_from_tp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim = -1,
                    std::span<const size_t> sizes = {});
void scatter_to_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim = 0,
                   std::span<const size_t> sizes = {});
void gather_from_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out, int dim = 0,
                    std::span<const size_t> sizes = {});
void reduce_scatter_to_sp(const Axis& axis, Pass pass, const Tensor& in, const Tensor& out,
                          int dim = 0, std::span<const size_t> sizes = {});

// In-place AllReduce of a whole tensor (e.g. the sequence-parallel
// parameters' gradients over tp, "tp.sp_grads").
void all_reduce(const Axis& axis, const Tensor& tensor, std::string_view pattern,
                weftRedOp_t op = weftSum);
// The primitives under them, along any dim, booked under `pattern`.
void all_gather_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
                    std::span<const size_t> sizes, std::string_view pattern);
void reduce_scatter_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
                        std::span<const size_t> sizes, std::string_view pattern);
void slice_dim(const Axis& axis, const Tensor& in, const Tensor& out, int dim,
               std::span<const size_t> sizes);

// ---------------------------------------------------------------------------
// Linear layers (fp32). Weights are [out, in] row-major, y = x·Wᵀ + b, over
// token rows x [tokens, in] (tokens = sequence × batch, sequence-major, so a
// sequence shard is a contiguous block of rows). The GEMM is the caller's (a Gemm callable) or the
// built-in reference GEMM (naive_gemm) when none is given.

// C[m, n] (+)= op(A) · op(B) with op(X) = Xᵀ when the flag is set; A is
// [m, k] (or [k, m] transposed), B is [k, n] (or [n, k] transposed).
using Gemm = std::function<void(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k,
                                const float* a, const float* b, float* c, bool accumulate)>;
void naive_gemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k, const float* a,
                const float* b, float* c, bool accumulate);

struct LinearOptions {
  bool bias = true;
  // Sequence parallel: the column linear's input (and the row linear's
  // output) are sequence shards of the tokens (dim 0), split by split_sizes
  // unless `tokens` says otherwise.
  bool sequence_parallel = false;
  // Column linear only: AllGather the output along its last dim.
  bool gather_output = false;
  Gemm gemm;  // empty: naive_gemm
};

// The layers hold no parameters: weights, biases and their gradients are the
// caller's spans (so they can live in DP buckets or ZeRO-3 gathered units).
// Gradients are accumulated (+=). Each layer saves its input for backward.
// in_features / out_features (and vocab) must divide by the axis size.
//
// Column-parallel: rank r holds rows [r·out/tp, (r+1)·out/tp) of W and of b.
// forward: copy_to_tp (SP: AllGather of the sequence shard, "sp.gather_from"),
// y_r = x·W_rᵀ + b_r (gather_output: AllGather along the last dim).
// backward: dx = dy_r·W_r, its AllReduce ("tp.copy_to"; SP: ReduceScatter,
// "sp.gather_from") launched on the axis stream, then dW_r = dy_rᵀ·x and db_r
// computed meanwhile, joined by an event before backward returns. With SP the
// saved input shard is re-gathered ("sp.regather") on the stream while the
// dgrad GEMM runs.
class ColumnParallelLinear {
 public:
  ColumnParallelLinear(const Axis& axis, size_t in_features, size_t out_features,
                       LinearOptions options = {});
  ~ColumnParallelLinear();
  size_t local_out() const;  // out_features / tp
  // x [tokens (SP: this rank's shard of them), in], weight [local_out, in],
  // bias [local_out] (empty without bias) -> y [tokens (all), local_out]
  // (or [tokens, out] with gather_output). `tokens` is the full count.
  void forward(std::span<const float> x, size_t tokens, std::span<const float> weight,
               std::span<const float> bias, std::span<float> y);
  // dy like y -> dx like x (overwritten); accumulates weight_grad, bias_grad.
  void backward(std::span<const float> dy, std::span<const float> weight, std::span<float> dx,
                std::span<float> weight_grad, std::span<float> bias_grad);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Row-parallel: rank r holds columns [r·in/tp, (r+1)·in/tp) of W as a
// [out, in/tp] matrix; b is whole (added after the reduction).
// forward: y = reduce_from_tp(x_r·W_rᵀ) + b ("tp.reduce_from"; SP:
// ReduceScatter to the sequence shard, "sp.reduce_scatter_to").
// backward: identity of dy (SP: AllGather of dy, "sp.reduce_scatter_to"),
// then dx_r = dy·W_r and dW_r = dyᵀ·x_r. With SP the bias gradient is this
// rank's partial sum over its sequence shard: AllReduce it over tp with the
// other sequence-parallel parameters (layernorms, "tp.sp_grads"), as Megatron
// does.
class RowParallelLinear {
 public:
  RowParallelLinear(const Axis& axis, size_t in_features, size_t out_features,
                    LinearOptions options = {});
  ~RowParallelLinear();
  size_t local_in() const;  // in_features / tp
  // x [tokens (all), local_in], weight [out, local_in], bias [out] ->
  // y [tokens (SP: this rank's shard), out].
  void forward(std::span<const float> x, size_t tokens, std::span<const float> weight,
               std::span<const float> bias, std::span<float> y);
  void backward(std::span<const float> dy, std::span<const float> weight, std::span<float> dx,
                std::span<float> weight_grad, std::span<float> bias_grad);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Vocabulary-parallel embedding: rank r owns rows [vocab_begin, vocab_end) =
// [r·vocab/tp, (r+1)·vocab/tp) of the [vocab, hidden] table. forward: rows
// of ids in range, zeros otherwise, then AllReduce over the axis
// ("tp.embedding"; SP: ReduceScatter to the sequence shard, "sp.embedding").
// backward: scatter-add of dout (SP: AllGather first, "sp.embedding") into
// the owned rows; no communication otherwise.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(const Axis& axis, size_t vocab, size_t hidden,
                         bool sequence_parallel = false);
  ~VocabParallelEmbedding();
  size_t vocab_begin() const;
  size_t vocab_end() const;
  // ids [tokens] -> out [tokens (SP: this rank's shard), hidden]; weight is
  // the owned rows [vocab_end - vocab_begin, hidden]. An id ≥ vocab is an error.
  void forward(std::span<const int32_t> ids, std::span<const float> weight, std::span<float> out);
  // Accumulates into weight_grad (the owned rows).
  void backward(std::span<const float> dout, std::span<float> weight_grad);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Vocabulary-parallel cross-entropy over logits sharded on the vocab dim
// (columns [vocab_begin, vocab_end) of [tokens, vocab], as the embedding):
// three AllReduces over the axis of one fp32 per token (max, sum of exp,
// target logit; "tp.cross_entropy").
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(const Axis& axis, size_t vocab);
  ~VocabParallelCrossEntropy();
  size_t vocab_begin() const;
  size_t vocab_end() const;
  // logits [tokens, local vocab], targets [tokens] -> per-token loss [tokens]
  // (the same on every rank). Saves the softmax for backward.
  void forward(std::span<const float> logits, std::span<const int32_t> targets,
               std::span<float> loss);
  // dloss [tokens] -> dlogits [tokens, local vocab] (no communication).
  void backward(std::span<const float> dloss, std::span<float> dlogits);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// Data parallel gradient bucketing (DDP).

enum class Reduction {
  sum,
  avg,
  // Sum of every rank's gradient multiplied by gradient_scale (weft's
  // pre-multiplied sum), e.g. 1/(dp · accumulation steps).
  scaled_sum,
};

struct BucketOptions {
  size_t bucket_bytes = 25u << 20;
  size_t first_bucket_bytes = 1u << 20;
  Reduction reduction = Reduction::avg;
  double gradient_scale = 1.0;  // for scaled_sum
  weftDataType_t dtype = weftFloat32;
};

// Bucket assignment as DataParallel does it, shared with Ledger::expected:
// parameters (element counts, registration order) are taken in reverse, a
// bucket closes once it holds at least its limit (the first bucket's limit is
// first_bucket_bytes, the others' bucket_bytes). Returns each bucket's
// parameter indices, in the order the buckets are launched.
std::vector<std::vector<size_t>> assign_buckets(std::span<const size_t> numels,
                                                size_t element_bytes, size_t first_bucket_bytes,
                                                size_t bucket_bytes);

struct BucketInfo {
  std::vector<size_t> params;  // indices in registration order
  size_t numel = 0;
  size_t offset = 0;  // in elements, in the flat gradient storage
};

class DataParallel {
 public:
  DataParallel(Axis axis, BucketOptions options = {});
  ~DataParallel();
  // Registration, in forward order, before finalize(). Names must be unique.
  size_t add(std::string name, size_t numel);
  // Lays out the buckets; gradients then live in the bucket storage.
  void finalize();
  // The parameter's gradient: a view into its bucket (no extra copy).
  Tensor grad(size_t param) const;
  template <typename T>
  std::span<T> grad_as(size_t param) const {
    Tensor t = grad(param);
    return {static_cast<T*>(t.data), t.numel()};
  }
  // The parameter's gradient is complete for this step: when its bucket's
  // last gradient arrives, the bucket's AllReduce is launched on the stream.
  void mark_ready(size_t param);
  // Launches what is left, waits for every bucket; ready for the next step.
  void finish();
  void zero_grad();
  const std::vector<BucketInfo>& buckets() const;
  // Buckets in the order their AllReduce was launched in the last step.
  const std::vector<size_t>& launch_order() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// ZeRO / FSDP (fp32 parameters, gradients and Adam state).

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW) when non-zero
};

// The reference step the shards take: exactly this, element by element, so a
// single-process run with the same inputs gives identical parameters.
// m, v are updated; step is 1-based.
void adam_step(std::span<float> params, std::span<const float> grads, std::span<float> m,
               std::span<float> v, int step, const AdamOptions& options);

struct ZeroOptions {
  int stage = 1;  // 1, 2 or 3
  // Stage 2: gradient bucket size (as BucketOptions); stage 1 uses one bucket,
  // stage 3 one unit per layer.
  size_t bucket_bytes = 25u << 20;
  // Buckets are padded to a multiple of lcm(shard group size, pad_multiple).
  size_t pad_multiple = 1;
  // Gradients averaged (true) or summed over shard × replicate ranks.
  bool average = true;
  AdamOptions adam;
};

struct ShardRange {
  size_t param;
  size_t begin, end;  // elements of the parameter this rank owns
};

// A rank's optimizer state, for checkpoints: its parameters and Adam moments over
// `ranges` (their elements concatenated in order) and the Adam steps taken.
struct ZeroShard {
  int steps = 0;
  std::vector<ShardRange> ranges;
  std::vector<float> params, m, v;
};

// shard: the axis the buckets are sharded over (dp, or dp-cp); replicate: the
// HSDP replicate axis (gradient shards AllReduced over it), or none.
class Zero {
 public:
  Zero(Axis shard, ZeroOptions options = {});
  Zero(Axis shard, Axis replicate, ZeroOptions options);
  ~Zero();

  // Registration, in forward order, before finalize(); `layer` is the stage 3
  // unit (0-based, registered in non-decreasing order).
  size_t add(std::string name, size_t numel, int layer = 0);
  void finalize();

  // The full parameter: stages 1/2 always; stage 3 while its layer is gathered.
  std::span<float> param(size_t id);
  // Its full gradient buffer (stage 3: while its layer is in backward).
  std::span<float> grad(size_t id);
  // Sets the initial full value (same on every rank); each rank keeps its shard.
  void set_param(size_t id, std::span<const float> value);

  // Backward: the gradient of `id` is complete. Stage 2 reduce-scatters a
  // bucket as soon as all its gradients are ready (on the stream).
  void mark_ready(size_t id);

  // Stage 3 unit lifecycle. forward_begin(l): waits l's AllGather (issuing it
  // if not prefetched) and prefetches l+1's; forward_end(l): frees l's full
  // parameters. backward_begin(l): gathers l again, prefetching l-1;
  // backward_end(l): launches the ReduceScatter of l's gradients, frees l.
  void forward_begin(int layer);
  void forward_end(int layer);
  void backward_begin(int layer);
  void backward_end(int layer);

  // Finishes gradient reductions, Adam on this rank's shard, and (stages 1/2)
  // AllGathers the updated parameters. Zeroes the gradients.
  void step();

  // Checkpoints. export_shard(): this rank's state over owned(). import_shard(): takes
  // from `state` the elements this rank owns (every one must be in its ranges, which may
  // be another mesh's shards or whole parameters, so a checkpoint can be re-sharded) and
  // its steps; stages 1/2 then AllGather the parameters (not booked in the ledger: not a
  // step's traffic), so it is collective there.
  ZeroShard export_shard() const;
  void import_shard(const ZeroShard& state);

  // What this rank owns; coverage_ok() is collective over the shard axis and
  // true when every element of every parameter is owned by exactly one rank.
  std::vector<ShardRange> owned() const;
  bool coverage_ok() const;
  size_t shard_numel() const;   // elements of flat storage this rank owns
  size_t padded_numel() const;  // all buckets, padded

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// Traffic ledger.

struct LedgerEntry {
  std::string pattern;    // e.g. "tp.reduce_from", "dp.bucket", "zero3.gather"
  std::string primitive;  // "allreduce", "reducescatter", "allgather", "alltoallv"
  std::string dim;        // the axis name, e.g. "tp", "dp-cp"
  size_t calls = 0;
  size_t bytes_per_call = 0;  // logical size: AllReduce buffer, RS input, AG output
  // Bytes this rank sent, total over the calls, derived from the closed form
  // of the algorithm that ran (weftCommLastAlgorithm); for expected entries,
  // the ring's.
  size_t bytes_sent = 0;
  std::string algorithm;  // last algorithm seen ("" for expected entries)
  double comm_s = 0;      // communication time (async: launch to join)
  double exposed_s = 0;   // of it, time the caller waited
};

// Context-parallel attention algorithms (weft/parallel/cp.hpp); declared
// here for ModelConfig.
enum class CpAlgorithm { ring, zigzag, passq, allgather, ulysses, hier, automatic };

// What mixes the sequence across cp: softmax attention (ContextParallelAttention,
// by cp_algorithm), affine-state linear attention (AffineStateCp) or
// compressed attention (CompressedAttentionCp, forward only).
enum class CpMixer { attention, affine, compressed };

// The model a step trains, for the closed forms (and later the planner).
struct ModelConfig {
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int ffn = 256;
  int vocab = 128;
  int seq = 32;
  int batch = 2;
  weftDataType_t dtype = weftFloat32;  // activations and gradients
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  // The attention's algorithm over cp (its K/V or Q traffic, per layer and
  // micro-batch; automatic resolves as ContextParallelAttention does).
  CpAlgorithm cp_algorithm = CpAlgorithm::ring;
  int cp_node_ranks = 1;  // hier: the CP ranks of a node (dims "cp.node" and "cp.ring")
  // Grouped-query attention: key/value heads (0: heads). CP's K/V traffic
  // carries kv_heads/tp of them per rank (one when tp > kv_heads: each TP
  // rank then holds a replica of one).
  int kv_heads = 0;
  // affine: key and value dims are hidden/heads. compressed
  // (CompressedAttentionCp): blocks of compressed_block positions every
  // compressed_stride; its halo entries depend on cp_rank, this rank's
  // coordinate along cp.
  CpMixer cp_mixer = CpMixer::attention;
  int compressed_block = 32, compressed_stride = 16;
  int cp_rank = 0;
  bool sp = false;
  int zero = 0;  // 0 = plain DP bucketing; 1, 2, 3
  int hsdp = 1;  // ZeRO-3 replicas (each shards over dp/hsdp ranks)
  size_t bucket_bytes = 25u << 20;
  size_t first_bucket_bytes = 1u << 20;
  size_t pad_multiple = 1;
  int steps = 1;
  // The parameters each rank registers, in forward order (element counts and
  // stage 3 unit); empty = transformer_parameters(*this), this pp rank's.
  // Sequence-parallel parameters' elements (their gradients are AllReduced over
  // tp once per step); 0 with sp = sequence_parallel_numel(*this).
  size_t sp_numel = 0;
  // Pipeline (pp.hpp): this rank's coordinate along pp, the micro-batches of
  // one step (each batch/microbatches sequences) and the chunks per rank.
  // TP entries are per micro-batch, for this rank's layers/pp layers, the
  // embedding's on pp rank 0 and the head's on the last; with pp > 1
  // param_numels must be this rank's (no SP, plain DP only).
  int pp_rank = 0;
  int microbatches = 1;
  int virtual_stages = 1;
  std::vector<size_t> param_numels;
  std::vector<int> param_layers;
  // MoE MLPs (experts > 0; see weft/parallel/ep.hpp): experts, top-k, and the
  // expert parameters this rank holds (its local experts'), in forward order,
  // bucketed over expert-DP (dp / ep ranks) apart from param_numels; empty
  // with param_numels empty = expert_parameters(*this).
  int experts = 0;
  int topk = 1;
  bool ep_sync_free = false;  // count-sync-free dispatch: no ep.counts AllGather
  int dense_layers = 0;       // the first layers keep a dense MLP (no EP traffic)
  // HierMoeDispatcher over nodes of ep_node_ranks EP ranks each: "ep.inter.*"
  // on expert:ep, "ep.intra.*" on expert:ep.node; its proxies' rows are
  // uniform routing's expectation, rounded (exact when every token's slots
  // reach every node).
  bool ep_hier = false;
  int ep_node_ranks = 1;
  std::vector<size_t> expert_param_numels;
};

struct ParamSpec {
  std::string name;
  size_t numel;  // this rank's (TP-sharded) count
  int layer;     // stage 3 unit
};

// The reference decoder-only transformer's parameters as one TP rank holds
// them, in forward order: unit 0 = token embedding [vocab/tp, h] and position
// embedding [seq, h]; unit 1+l = layer l: ln1 (w, b: h each), qkv (w [3h/tp, h],
// b [3h/tp]), attention out (w [h, h/tp], b [h]), ln2 (w, b), fc1 (w [ffn/tp, h],
// b [ffn/tp]), fc2 (w [h, ffn/tp], b [h]); unit L+1 = final ln (w, b) and the
// LM head [vocab/tp, h] (untied, no bias). Errors when hidden, heads, ffn or
// vocab do not divide by tp.
std::vector<ParamSpec> transformer_parameters(const ModelConfig& config);
// With experts > 0 (tp 1), each layer's MLP from dense_layers on is MoE: between ln2.b and fc2.b
// the dense list holds the router [experts, h] in place of fc1 and fc2, and
// expert_parameters lists this EP rank's experts per layer: fc1 [E/ep·ffn, h],
// fc2 [E/ep·h, ffn] (weft-train's layout).
std::vector<ParamSpec> expert_parameters(const ModelConfig& config);
// With SP, the parameters applied to sequence shards: position embedding,
// ln1, ln2, attention-out and fc2 biases per layer, final ln:
// s·h + L·6h + 2h.
size_t sequence_parallel_numel(const ModelConfig& config);

class Ledger {
 public:
  Ledger();
  ~Ledger();
  Ledger(const Ledger&);
  Ledger& operator=(const Ledger&);

  // One collective call (adapters call this; exposed for extensions).
  void record(std::string_view pattern, std::string_view primitive, std::string_view dim,
              size_t bytes_per_call, size_t bytes_sent, std::string_view algorithm, double comm_s,
              double exposed_s);
  // Compute time the caller spent under a pattern (for the hidden fraction).
  void add_compute(std::string_view pattern, double seconds);
  void clear();

  // Entries keyed by (pattern, primitive, dim, bytes_per_call), in first-seen order.
  const std::vector<LedgerEntry>& entries() const;
  double compute_s(std::string_view pattern) const;
  // Named figures that are not traffic (the MoE load, "ep.load.*"): set,
  // read (0 when never noted), and all of them in first-noted order.
  void note(std::string_view name, double value);
  double noted(std::string_view name) const;
  const std::vector<std::pair<std::string, double>>& notes() const;

  // The closed forms for `config` over config.steps steps (see docs/parallel.md):
  // TP 2 AllReduce per layer forward + 2 backward of b·s·h·dtype (SP: each as
  // ReduceScatter + AllGather), embedding/LM-head/cross-entropy TP calls, DP
  // bucket AllReduces (2Φ), ZeRO-1 (RS + AG: 2 calls, 2Φ), ZeRO-2 (per bucket
  // RS + one AG: buckets+1 calls, 2Φ), ZeRO-3 (per unit AG, AG, RS: 3 calls
  // per unit, 3Φ), the HSDP AllReduce, the pipeline's stage-to-stage
  // transfers (expected_pipeline), the CP attention's K/V (or Q) exchange of
  // config.cp_algorithm (or compressed attention's halo and entries), and the
  // MoE layers' count AllGather, dispatch and combine AllToAllv and expert-DP
  // reductions.
  static Ledger expected(const ModelConfig& config);

  // Every entry whose calls or bytes_per_call differ, or that only one side
  // has, one line each naming it; empty when they agree.
  std::vector<std::string> compare(const Ledger& expected) const;

  // A table: pattern, primitive, dim, calls, bytes/call, sent, algorithm,
  // comm, exposed (and the expected calls and bytes/call when given).
  std::string table(const Ledger* expected = nullptr) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft::parallel

#include "weft/parallel/cp.hpp"  // context parallelism
#include "weft/parallel/ep.hpp"  // expert parallel (MoE dispatch and combine)
#include "weft/parallel/pd.hpp"  // disaggregated serving (KV-cache transfer)
#include "weft/parallel/pp.hpp"  // pipeline schedules
