#include "cp_attention.h"

namespace weft::train {

namespace par = weft::parallel;

namespace {

par::AttentionShape causal_shape(int batch, int heads, int head_dim) {
  par::AttentionShape shape;
  shape.batch = size_t(batch), shape.heads = size_t(heads), shape.head_dim = size_t(head_dim);
  shape.causal = true;
  return shape;
}

}  // namespace

CpAttention::CpAttention(const par::Axis& cp, par::CpAlgorithm algorithm,
                         const std::vector<std::string>& hosts, int seq, int batch, int heads,
                         int head_dim)
    : rank_(cp.rank()), heads_(size_t(heads)), dim_(size_t(head_dim)) {
  par::CpConfig config;
  config.algorithm = algorithm, config.q_seq = size_t(seq);
  config.hosts = hosts;
  attention_ = std::make_unique<par::ContextParallelAttention>(
      cp, causal_shape(batch, heads, head_dim), config);
  rows_ = attention_->q_rows() * size_t(batch);
}

CpAttention::CpAttention(const par::Axis& cp, Compression compression, int seq, int batch,
                         int heads, int head_dim)
    : rank_(cp.rank()), heads_(size_t(heads)), dim_(size_t(head_dim)) {
  // Empty weights: the mean of each block, as the reference's kernel compresses.
  const par::CompressedConfig config{
      size_t(seq), size_t(compression.block), size_t(compression.stride), {}};
  compressed_ = std::make_unique<par::CompressedAttentionCp>(
      cp, causal_shape(batch, heads, head_dim), config);
  rows_ = compressed_->rows() * size_t(batch);
}

std::vector<int> CpAttention::positions() const {
  const std::vector<par::SeqRun> runs =
      attention_ ? attention_->q_runs(rank_) : std::vector<par::SeqRun>{compressed_->run(rank_)};
  std::vector<int> out;
  for (const par::SeqRun& run : runs)
    for (size_t t = 0; t < run.count; ++t) out.push_back(int(run.begin + t));
  return out;
}

void CpAttention::forward(const float* qkv, float* out) {
  // Row r, head j: q, k, v at qkv[r·3·heads·dh + j·3dh + {0, dh, 2dh}].
  const size_t width = heads_ * dim_;
  std::vector<float> q(rows_ * width), k(q.size()), v(q.size());
  for (size_t r = 0; r < rows_; ++r)
    for (size_t j = 0; j < heads_; ++j) {
      const float* from = qkv + (r * heads_ + j) * 3 * dim_;
      const size_t to = r * width + j * dim_;
      std::copy(from, from + dim_, q.begin() + to);
      std::copy(from + dim_, from + 2 * dim_, k.begin() + to);
      std::copy(from + 2 * dim_, from + 3 * dim_, v.begin() + to);
    }
  if (attention_)
    attention_->forward(q, k, v, {out, rows_ * width});
  else
    compressed_->forward(q, k, v, {out, rows_ * width});
}

void CpAttention::backward(const float* dout, float* dqkv) {
  const size_t width = heads_ * dim_;
  std::vector<float> dq(rows_ * width), dk(dq.size()), dv(dq.size());
  if (attention_) {
    attention_->backward({dout, rows_ * width}, dq, dk, dv);
  } else {
    // The block weights are fixed (the mean): their gradient is not used.
    std::vector<float> dweights(compressed_->halo() + 1);
    compressed_->backward({dout, rows_ * width}, dq, dk, dv, dweights);
  }
  for (size_t r = 0; r < rows_; ++r)
    for (size_t j = 0; j < heads_; ++j) {
      float* to = dqkv + (r * heads_ + j) * 3 * dim_;
      const size_t from = r * width + j * dim_;
      std::copy_n(dq.begin() + from, dim_, to);
      std::copy_n(dk.begin() + from, dim_, to + dim_);
      std::copy_n(dv.begin() + from, dim_, to + 2 * dim_);
    }
}

}  // namespace weft::train
