// Vocabulary-parallel embedding and cross-entropy (fp32).
#include <algorithm>
#include <cmath>

#include "parallel/internal.h"

namespace weft::parallel {

namespace {

using detail::require;
using detail::require_size;

}  // namespace

struct VocabParallelEmbedding::State {
  const Axis* axis;
  size_t vocab, hidden, begin, end;
  bool sequence_parallel;
  std::vector<int32_t> ids;
};

VocabParallelEmbedding::VocabParallelEmbedding(const Axis& axis, size_t vocab, size_t hidden,
                                               bool sequence_parallel)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  size_t local = detail::divided(vocab, axis, "vocab");
  s.axis = &axis;
  s.vocab = vocab;
  s.hidden = hidden;
  s.begin = local * axis.rank();
  s.end = s.begin + local;
  s.sequence_parallel = sequence_parallel;
}

VocabParallelEmbedding::~VocabParallelEmbedding() = default;
size_t VocabParallelEmbedding::vocab_begin() const {
  return state_->begin;
}
size_t VocabParallelEmbedding::vocab_end() const {
  return state_->end;
}

void VocabParallelEmbedding::forward(std::span<const int32_t> ids, std::span<const float> weight,
                                     std::span<float> out) {
  State& s = *state_;
  size_t tokens = ids.size();
  size_t rows = s.sequence_parallel ? detail::shard_rows(*s.axis, tokens) : tokens;
  require_size("weight", weight.size(), (s.end - s.begin) * s.hidden);
  require_size("out", out.size(), rows * s.hidden);
  for (size_t t = 0; t < tokens; ++t)
    require(ids[t] >= 0 && static_cast<size_t>(ids[t]) < s.vocab,
            "ids[" + std::to_string(t) + "]=" + std::to_string(ids[t]) +
                " is outside the vocab of " + std::to_string(s.vocab));
  s.ids.assign(ids.begin(), ids.end());
  // Rows this rank owns; zeros for the others' ids, so the sum is exact.
  std::vector<float> local(tokens * s.hidden, 0.0f);
  for (size_t t = 0; t < tokens; ++t) {
    auto id = static_cast<size_t>(ids[t]);
    if (id >= s.begin && id < s.end)
      std::copy_n(weight.begin() + (id - s.begin) * s.hidden, s.hidden,
                  local.begin() + t * s.hidden);
  }
  if (s.sequence_parallel)
    detail::fp32_collective(*s.axis, "sp.embedding", "reducescatter", local.data(), out.data(),
                            local.size(), out.size());
  else
    detail::fp32_collective(*s.axis, "tp.embedding", "allreduce", local.data(), out.data(),
                            local.size(), out.size());
}

void VocabParallelEmbedding::backward(std::span<const float> dout, std::span<float> weight_grad) {
  State& s = *state_;
  size_t tokens = s.ids.size();
  size_t rows = s.sequence_parallel ? tokens / s.axis->size() : tokens;
  require_size("dout", dout.size(), rows * s.hidden);
  require_size("weight_grad", weight_grad.size(), (s.end - s.begin) * s.hidden);
  std::vector<float> gathered;
  const float* grad = dout.data();
  if (s.sequence_parallel) {
    gathered.resize(tokens * s.hidden);
    detail::fp32_collective(*s.axis, "sp.embedding", "allgather", dout.data(), gathered.data(),
                            dout.size(), gathered.size());
    grad = gathered.data();
  }
  for (size_t t = 0; t < tokens; ++t) {
    auto id = static_cast<size_t>(s.ids[t]);
    if (id < s.begin || id >= s.end) continue;
    float* row = weight_grad.data() + (id - s.begin) * s.hidden;
    for (size_t j = 0; j < s.hidden; ++j) row[j] += grad[t * s.hidden + j];
  }
}

struct VocabParallelCrossEntropy::State {
  const Axis* axis;
  size_t vocab, begin, end;
  std::vector<float> softmax;  // [tokens, local vocab]
  std::vector<int32_t> targets;
};

VocabParallelCrossEntropy::VocabParallelCrossEntropy(const Axis& axis, size_t vocab)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  size_t local = detail::divided(vocab, axis, "vocab");
  s.axis = &axis;
  s.vocab = vocab;
  s.begin = local * axis.rank();
  s.end = s.begin + local;
}

VocabParallelCrossEntropy::~VocabParallelCrossEntropy() = default;
size_t VocabParallelCrossEntropy::vocab_begin() const {
  return state_->begin;
}
size_t VocabParallelCrossEntropy::vocab_end() const {
  return state_->end;
}

void VocabParallelCrossEntropy::forward(std::span<const float> logits,
                                        std::span<const int32_t> targets, std::span<float> loss) {
  State& s = *state_;
  const Axis& axis = *s.axis;
  size_t tokens = targets.size(), local = s.end - s.begin;
  require_size("logits", logits.size(), tokens * local);
  require_size("loss", loss.size(), tokens);
  for (size_t t = 0; t < tokens; ++t)
    require(targets[t] >= 0 && static_cast<size_t>(targets[t]) < s.vocab,
            "targets[" + std::to_string(t) + "]=" + std::to_string(targets[t]) +
                " is outside the vocab of " + std::to_string(s.vocab));
  std::vector<float> max(tokens), sum(tokens, 0.0f), target(tokens, 0.0f);
  for (size_t t = 0; t < tokens; ++t)
    max[t] = *std::max_element(logits.begin() + t * local, logits.begin() + (t + 1) * local);
  auto reduce = [&](std::vector<float>& values, weftRedOp_t op) {
    all_reduce(axis, view(values.data(), {tokens}), "tp.cross_entropy", op);
  };
  reduce(max, weftMax);
  s.softmax.resize(tokens * local);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < local; ++j) {
      float e = std::exp(logits[t * local + j] - max[t]);
      s.softmax[t * local + j] = e;
      sum[t] += e;
    }
    auto id = static_cast<size_t>(targets[t]);
    if (id >= s.begin && id < s.end) target[t] = logits[t * local + id - s.begin];
  }
  reduce(sum, weftSum);
  reduce(target, weftSum);
  for (size_t t = 0; t < tokens; ++t) {
    loss[t] = std::log(sum[t]) + max[t] - target[t];
    for (size_t j = 0; j < local; ++j) s.softmax[t * local + j] /= sum[t];
  }
  s.targets.assign(targets.begin(), targets.end());
}

void VocabParallelCrossEntropy::backward(std::span<const float> dloss, std::span<float> dlogits) {
  State& s = *state_;
  size_t tokens = s.targets.size(), local = s.end - s.begin;
  require(!s.softmax.empty() || tokens == 0,
          "VocabParallelCrossEntropy::backward without a forward");
  require_size("dloss", dloss.size(), tokens);
  require_size("dlogits", dlogits.size(), tokens * local);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < local; ++j) dlogits[t * local + j] = s.softmax[t * local + j] * dloss[t];
    auto id = static_cast<size_t>(s.targets[t]);
    if (id >= s.begin && id < s.end) dlogits[t * local + id - s.begin] -= dloss[t];
  }
}

}  // namespace weft::parallel
