// Column- and row-parallel linear layers (fp32) and the reference GEMM. The
// backward input-gradient collective runs on the axis stream while the
// weight-gradient GEMM runs on the caller's thread; an event joins them.
#include <algorithm>

#include "parallel/internal.h"

namespace weft::parallel {

namespace detail {

// A collective on dim 0 of contiguous fp32 rows, launched on the axis stream.
void launch_all_gather(detail::Inflight& op, const Axis& axis, std::string_view pattern,
                       const float* shard, float* full, size_t shard_count) {
  op.launch(axis, pattern, "allgather", shard_count * axis.size() * sizeof(float),
            [=](weftComm_t c, weftStream_t s) {
              return weftAllGather(shard, full, shard_count, weftFloat32, c, s);
            });
}

void launch_reduce_scatter(detail::Inflight& op, const Axis& axis, std::string_view pattern,
                           const float* full, float* shard, size_t shard_count) {
  op.launch(axis, pattern, "reducescatter", shard_count * axis.size() * sizeof(float),
            [=](weftComm_t c, weftStream_t s) {
              return weftReduceScatter(full, shard, shard_count, weftFloat32, weftSum, c, s);
            });
}

void launch_all_reduce(detail::Inflight& op, const Axis& axis, std::string_view pattern,
                       float* data, size_t count) {
  op.launch(axis, pattern, "allreduce", count * sizeof(float), [=](weftComm_t c, weftStream_t s) {
    return weftAllReduce(data, data, count, weftFloat32, weftSum, c, s);
  });
}

void fp32_collective(const Axis& axis, std::string_view pattern, std::string_view primitive,
                     const float* in, float* out, size_t in_count, size_t out_count) {
  if (axis.size() == 1) {
    std::copy(in, in + in_count, out);
    return;
  }
  detail::Inflight op;
  if (primitive == "allgather")
    launch_all_gather(op, axis, pattern, in, out, in_count);
  else if (primitive == "reducescatter")
    launch_reduce_scatter(op, axis, pattern, in, out, out_count);
  else {
    std::copy(in, in + in_count, out);
    launch_all_reduce(op, axis, pattern, out, out_count);
  }
  op.join();
}

void require_size(std::string_view what, size_t got, size_t want) {
  require(got == want, std::string(what) + " has " + std::to_string(got) + " elements, expected " +
                           std::to_string(want));
}

size_t divided(size_t features, const Axis& axis, std::string_view what) {
  auto n = static_cast<size_t>(axis.size());
  require(features % n == 0, std::string(what) + "=" + std::to_string(features) +
                                 " does not divide by the " + std::to_string(n) +
                                 " ranks of axis " + axis.name());
  return features / n;
}

// Rows of this rank's sequence shard (SP requires an even split).
size_t shard_rows(const Axis& axis, size_t tokens) {
  auto n = static_cast<size_t>(axis.size());
  require(tokens % n == 0, "tokens=" + std::to_string(tokens) + " does not divide by the " +
                               std::to_string(n) + " ranks of axis " + axis.name() +
                               " (sequence parallel)");
  return tokens / n;
}

}  // namespace detail

namespace {

using detail::divided;
using detail::require;
using detail::require_size;
using detail::shard_rows;

// What both linear layers keep: the shape, options, GEMM and saved input.
struct Linear {
  const Axis* axis;
  size_t in, out, local;  // local: this rank's out (column) or in (row) features
  LinearOptions options;
  Gemm gemm;
  size_t tokens = 0;
  std::vector<float> saved;  // the input (column with SP: this rank's shard)
  bool forwarded = false;

  Linear(const Axis& a, size_t in_features, size_t out_features, bool split_out, LinearOptions o)
      : axis(&a),
        in(in_features),
        out(out_features),
        local(split_out ? divided(out_features, a, "out_features")
                        : divided(in_features, a, "in_features")),
        options(std::move(o)),
        gemm(options.gemm ? options.gemm : Gemm(naive_gemm)) {}
};

}  // namespace

void naive_gemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k, const float* a,
                const float* b, float* c, bool accumulate) {
  for (size_t i = 0; i < m; ++i) {
    float* row = c + i * n;
    if (!accumulate) std::fill(row, row + n, 0.0f);
    for (size_t p = 0; p < k; ++p) {
      float scale = transpose_a ? a[p * m + i] : a[i * k + p];
      if (transpose_b)
        for (size_t j = 0; j < n; ++j) row[j] += scale * b[j * k + p];
      else
        for (size_t j = 0; j < n; ++j) row[j] += scale * b[p * n + j];
    }
  }
}

struct ColumnParallelLinear::State : Linear {
  using Linear::Linear;
};

ColumnParallelLinear::ColumnParallelLinear(const Axis& axis, size_t in_features,
                                           size_t out_features, LinearOptions options)
    : state_(std::make_unique<State>(axis, in_features, out_features, true, std::move(options))) {}

ColumnParallelLinear::~ColumnParallelLinear() = default;
size_t ColumnParallelLinear::local_out() const {
  return state_->local;
}

void ColumnParallelLinear::forward(std::span<const float> x, size_t tokens,
                                   std::span<const float> weight, std::span<const float> bias,
                                   std::span<float> y) {
  State& s = *state_;
  const Axis& axis = *s.axis;
  size_t rows = s.options.sequence_parallel ? shard_rows(axis, tokens) : tokens;
  require_size("x", x.size(), rows * s.in);
  require_size("weight", weight.size(), s.local * s.in);
  require_size("bias", bias.size(), s.options.bias ? s.local : 0);
  require_size("y", y.size(), tokens * (s.options.gather_output ? s.out : s.local));
  s.tokens = tokens;
  s.saved.assign(x.begin(), x.end());  // copy_to_tp forward: identity
  std::vector<float> gathered;
  const float* input = s.saved.data();
  if (s.options.sequence_parallel) {
    gathered.resize(tokens * s.in);
    detail::fp32_collective(axis, "sp.gather_from", "allgather", x.data(), gathered.data(),
                            x.size(), gathered.size());
    input = gathered.data();
  }
  std::vector<float> local(s.options.gather_output ? tokens * s.local : 0);
  float* out = s.options.gather_output ? local.data() : y.data();
  s.gemm(false, true, tokens, s.local, s.in, input, weight.data(), out, false);
  if (s.options.bias) detail::add_bias({out, tokens * s.local}, bias, tokens);
  if (s.options.gather_output)
    gather_from_tp(axis, Pass::forward, view(local.data(), {tokens, s.local}),
                   view(y.data(), {tokens, s.out}), -1);
  s.forwarded = true;
}

void ColumnParallelLinear::backward(std::span<const float> dy, std::span<const float> weight,
                                    std::span<float> dx, std::span<float> weight_grad,
                                    std::span<float> bias_grad) {
  State& s = *state_;
  const Axis& axis = *s.axis;
  require(s.forwarded, "ColumnParallelLinear::backward without a forward");
  size_t tokens = s.tokens;
  require_size("dy", dy.size(), tokens * (s.options.gather_output ? s.out : s.local));
  require_size("weight", weight.size(), s.local * s.in);
  require_size("dx", dx.size(), s.saved.size());
  require_size("weight_grad", weight_grad.size(), s.local * s.in);
  require_size("bias_grad", bias_grad.size(), s.options.bias ? s.local : 0);
  std::vector<float> own;
  const float* grad = dy.data();
  if (s.options.gather_output) {  // gather_from_tp backward: this rank's columns
    own.resize(tokens * s.local);
    gather_from_tp(axis, Pass::backward, view(dy.data(), {tokens, s.out}),
                   view(own.data(), {tokens, s.local}), -1);
    grad = own.data();
  }
  bool parallel = axis.size() > 1;
  // Buffers the stream reads stay alive until `op` (declared after them) is joined.
  std::vector<float> input, partial;
  const float* full_input = s.saved.data();
  detail::Inflight op;
  if (!s.options.sequence_parallel) {
    // dgrad, then its AllReduce overlapped with the wgrad GEMM.
    s.gemm(false, false, tokens, s.in, s.local, grad, weight.data(), dx.data(), false);
    if (parallel) launch_all_reduce(op, axis, "tp.copy_to", dx.data(), dx.size());
  } else {
    // Re-gather the saved shard while the dgrad GEMM runs, then
    // reduce-scatter dgrad while the wgrad GEMM runs.
    input.resize(tokens * s.in);
    partial.resize(tokens * s.in);
    if (parallel)
      launch_all_gather(op, axis, "sp.regather", s.saved.data(), input.data(), s.saved.size());
    else
      input = s.saved;
    s.gemm(false, false, tokens, s.in, s.local, grad, weight.data(), partial.data(), false);
    op.join();
    if (parallel)
      launch_reduce_scatter(op, axis, "sp.gather_from", partial.data(), dx.data(), dx.size());
    else
      std::copy(partial.begin(), partial.end(), dx.begin());
    full_input = input.data();
  }
  s.gemm(true, false, s.local, s.in, tokens, grad, full_input, weight_grad.data(), true);
  if (s.options.bias) detail::accumulate_column_sums({grad, tokens * s.local}, tokens, bias_grad);
  op.join();
}

struct RowParallelLinear::State : Linear {
  using Linear::Linear;
};

RowParallelLinear::RowParallelLinear(const Axis& axis, size_t in_features, size_t out_features,
                                     LinearOptions options) {
  require(!options.gather_output, "gather_output applies to the column-parallel linear only");
  state_ = std::make_unique<State>(axis, in_features, out_features, false, std::move(options));
}

RowParallelLinear::~RowParallelLinear() = default;
size_t RowParallelLinear::local_in() const {
  return state_->local;
}

void RowParallelLinear::forward(std::span<const float> x, size_t tokens,
                                std::span<const float> weight, std::span<const float> bias,
                                std::span<float> y) {
  State& s = *state_;
  const Axis& axis = *s.axis;
  size_t rows = s.options.sequence_parallel ? shard_rows(axis, tokens) : tokens;
  require_size("x", x.size(), tokens * s.local);
  require_size("weight", weight.size(), s.out * s.local);
  require_size("bias", bias.size(), s.options.bias ? s.out : 0);
  require_size("y", y.size(), rows * s.out);
  s.tokens = tokens;
  s.saved.assign(x.begin(), x.end());
  std::vector<float> partial(tokens * s.out);
  s.gemm(false, true, tokens, s.out, s.local, x.data(), weight.data(), partial.data(), false);
  if (s.options.sequence_parallel)
    detail::fp32_collective(axis, "sp.reduce_scatter_to", "reducescatter", partial.data(), y.data(),
                            partial.size(), y.size());
  else
    detail::fp32_collective(axis, "tp.reduce_from", "allreduce", partial.data(), y.data(),
                            partial.size(), y.size());
  if (s.options.bias) detail::add_bias(y, bias, rows);
  s.forwarded = true;
}

void RowParallelLinear::backward(std::span<const float> dy, std::span<const float> weight,
                                 std::span<float> dx, std::span<float> weight_grad,
                                 std::span<float> bias_grad) {
  State& s = *state_;
  const Axis& axis = *s.axis;
  require(s.forwarded, "RowParallelLinear::backward without a forward");
  size_t tokens = s.tokens;
  size_t rows = s.options.sequence_parallel ? tokens / axis.size() : tokens;
  require_size("dy", dy.size(), rows * s.out);
  require_size("weight", weight.size(), s.out * s.local);
  require_size("dx", dx.size(), tokens * s.local);
  require_size("weight_grad", weight_grad.size(), s.out * s.local);
  require_size("bias_grad", bias_grad.size(), s.options.bias ? s.out : 0);
  // The bias gradient is over this rank's rows (SP: a partial sum, see the header).
  if (s.options.bias) detail::accumulate_column_sums(dy, rows, bias_grad);
  std::vector<float> gathered;
  const float* grad = dy.data();
  if (s.options.sequence_parallel) {
    gathered.resize(tokens * s.out);
    detail::fp32_collective(axis, "sp.reduce_scatter_to", "allgather", dy.data(), gathered.data(),
                            dy.size(), gathered.size());
    grad = gathered.data();
  }
  s.gemm(false, false, tokens, s.local, s.out, grad, weight.data(), dx.data(), false);
  s.gemm(true, false, s.out, s.local, tokens, grad, s.saved.data(), weight_grad.data(), true);
}

}  // namespace weft::parallel
