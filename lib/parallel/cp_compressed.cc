// Compressed-attention CP: blocks of `block` positions every `stride`
// positions are compressed to one key and one value by a weighted sum, and
// queries attend over the closed blocks. A block is compressed by the rank
// holding its last position, with the previous rank's tail (the halo) for
// the positions before its segment; the compressed entries, padded to a
// fixed count per rank, are all-gathered. Every block and every query is
// computed by the same arithmetic in the same order whatever the CP degree,
// so the output is bit-identical for any number of ranks. Backward is the
// adjoint: the compressed entries' gradients are reduce-scattered to their
// owners (summed over the ranks, so equal to one rank's up to the order of
// that sum), which spread them over their rows and send the halo's part back.
#include <algorithm>
#include <functional>
#include <initializer_list>

#include "parallel/cp_internal.h"

namespace weft::parallel {

namespace {

size_t block_count(const CompressedConfig& c) {
  return c.seq < c.block ? 0 : (c.seq - c.block) / c.stride + 1;
}

// Blocks whose last position is before `end`.
size_t blocks_closed_before(const CompressedConfig& c, size_t end) {
  return end < c.block ? 0 : std::min(block_count(c), (end - c.block) / c.stride + 1);
}

size_t most_blocks(const CompressedConfig& c, int cp) {
  size_t most = 1;  // at least one entry, so that the AllGather always runs
  for (int r = 0; r < cp; ++r) most = std::max(most, compressed_blocks(c, cp, r).count);
  return most;
}

size_t kv_stride(const AttentionShape& shape) {
  return shape.batch * (shape.kv_heads == 0 ? shape.heads : shape.kv_heads) * shape.head_dim;
}

// One query's softmax over the first `seen` compressed keys: scores[j] =
// exp(scale·q·k̃_j − max); returns their sum.
double softmax_terms(const float* q, const std::vector<const float*>& blocks, size_t seen,
                     size_t kv_off, size_t dim, double scale, std::vector<double>& scores) {
  scores.resize(seen);
  double top = -std::numeric_limits<double>::infinity(), sum = 0;
  for (size_t j = 0; j < seen; ++j) {
    double dot = 0;
    for (size_t d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * blocks[j][kv_off + d];
    scores[j] = scale * dot;
    top = std::max(top, scores[j]);
  }
  for (double& s : scores) sum += (s = std::exp(s - top));
  return sum;
}

}  // namespace

BlockRange compressed_blocks(const CompressedConfig& config, int cp, int rank) {
  SeqRun run = cp_shard(config.seq, 0, cp, rank, false)[0];
  size_t first = blocks_closed_before(config, run.begin);
  size_t last = blocks_closed_before(config, run.begin + run.count);
  return {first, last - first};
}

void add_compressed_cp_expected(Ledger& ledger, const AttentionShape& shape,
                                const CompressedConfig& config, int cp, int rank, bool backward) {
  if (cp <= 1) return;
  size_t row = 2 * kv_stride(shape) * sizeof(float);
  size_t bytes = static_cast<size_t>(cp) * most_blocks(config, cp) * row;
  auto halo = [&](std::string_view pattern, bool sends) {
    size_t sent = sends ? (config.block - 1) * row : 0;
    if (config.block > 1) ledger.record(pattern, "sendrecv", "cp", sent, sent, "", 0, 0);
  };
  halo("cp.compressed_halo", rank + 1 < cp);
  ledger.record("cp.compressed_blocks", "allgather", "cp", bytes,
                detail::bytes_sent("allgather", "ring", cp, bytes), "", 0, 0);
  if (!backward) return;
  ledger.record("cp.compressed_blocks_grad", "reducescatter", "cp", bytes,
                detail::bytes_sent("reducescatter", "ring", cp, bytes), "", 0, 0);
  halo("cp.compressed_halo_grad", rank > 0);
}

CompressedAttentionCp::CompressedAttentionCp(const Axis& axis, const AttentionShape& shape,
                                             const CompressedConfig& config)
    : axis_(axis), shape_(shape), config_(config) {
  using detail::require;
  require(shape.batch > 0 && shape.heads > 0 && shape.head_dim > 0,
          "batch, heads and head_dim must be positive");
  if (shape_.kv_heads == 0) shape_.kv_heads = shape.heads;
  require(shape.heads % shape_.kv_heads == 0, "heads (" + std::to_string(shape.heads) +
                                                  ") is not a multiple of kv_heads (" +
                                                  std::to_string(shape_.kv_heads) + ")");
  require(config.seq > 0, "seq must be positive");
  require(config.block > 0, "block must be positive");
  require(config.stride > 0 && config.stride <= config.block,
          "stride (" + std::to_string(config.stride) +
              ") must be in [1, block = " + std::to_string(config.block) + "]");
  if (config_.weights.empty()) config_.weights.assign(config.block, 1.0f / config.block);
  require(config_.weights.size() == config.block,
          "weights has " + std::to_string(config_.weights.size()) +
              " entries, expected block = " + std::to_string(config.block));
  int p = axis.size();
  for (int r = 0; r < p; ++r) {
    runs_.push_back(cp_shard(config.seq, 0, p, r, false)[0]);
    require(r + 1 == p || runs_[r].count >= halo(),
            "seq (" + std::to_string(config.seq) + ") over cp " + std::to_string(p) +
                " gives rank " + std::to_string(r) + " " + std::to_string(runs_[r].count) +
                " positions, fewer than the halo block − 1 = " + std::to_string(halo()));
  }
  entries_ = most_blocks(config_, p);
}

SeqRun CompressedAttentionCp::run(int rank) const {
  return runs_.at(rank);
}
size_t CompressedAttentionCp::rows() const {
  return runs_[axis_.rank()].count;
}
size_t CompressedAttentionCp::halo() const {
  return config_.block - 1;
}
size_t CompressedAttentionCp::entries() const {
  return entries_;
}

namespace {

// The sizes of four spans shaped like q, k, v and out (or their gradients).
void require_sizes(std::initializer_list<std::pair<std::string_view, size_t>> spans, size_t q_size,
                   size_t kv_size) {
  const size_t want[4] = {q_size, kv_size, kv_size, q_size};
  const auto* span = spans.begin();
  for (size_t i = 0; i < 4; ++i, ++span) detail::require_size(span->first, span->second, want[i]);
}

// One halo transfer as a group: `sending` floats to rank `to` and `receiving`
// from rank `from` (either may be 0), booked with the bytes sent.
void exchange_halo(const Axis& axis, std::string_view pattern, const float* send, size_t sending,
                   int to, float* recv, size_t receiving, int from) {
  detail::blocking(axis, pattern, "sendrecv", sending * sizeof(float),
                   [=](weftComm_t c, weftStream_t s) {
                     weftResult_t result = weftGroupStart();
                     if (result != weftSuccess) return result;
                     if (sending > 0) result = weftSend(send, sending, weftFloat32, to, c, s);
                     if (result == weftSuccess && receiving > 0)
                       result = weftRecv(recv, receiving, weftFloat32, from, c, s);
                     weftResult_t ended = weftGroupEnd();
                     return result != weftSuccess ? result : ended;
                   });
}

}  // namespace

std::vector<const float*> CompressedAttentionCp::gathered_blocks() const {
  std::vector<const float*> blocks;
  size_t entry = 2 * kv_stride(shape_);
  for (int r = 0; r < axis_.size(); ++r) {
    BlockRange range = compressed_blocks(config_, axis_.size(), r);
    for (size_t e = 0; e < range.count; ++e)
      blocks.push_back(gathered_.data() + (r * entries_ + e) * entry);
  }
  return blocks;
}

void CompressedAttentionCp::for_each_query(
    size_t blocks, const std::function<void(size_t, size_t, size_t)>& visit) const {
  size_t dim = shape_.head_dim, group = shape_.heads / shape_.kv_heads;
  for (size_t t = 0; t < rows(); ++t) {
    size_t seen =
        shape_.causal ? blocks_closed_before(config_, runs_[axis_.rank()].begin + t + 1) : blocks;
    for (size_t b = 0; b < shape_.batch; ++b)
      for (size_t h = 0; h < shape_.heads; ++h)
        visit((t * shape_.batch * shape_.heads + b * shape_.heads + h) * dim,
              (b * shape_.kv_heads + h / group) * dim, seen);
  }
}

void CompressedAttentionCp::forward(std::span<const float> q, std::span<const float> k,
                                    std::span<const float> v, std::span<float> out) {
  int rank = axis_.rank(), p = axis_.size();
  size_t n = rows(), qs = shape_.batch * shape_.heads * shape_.head_dim, ks = kv_stride(shape_);
  require_sizes({{"q", q.size()}, {"k", k.size()}, {"v", v.size()}, {"out", out.size()}}, n * qs,
                n * ks);
  // Local k|v rows: the previous rank's tail (rank > 0), then the own rows.
  size_t before = rank > 0 ? halo() : 0, m = halo(), entry = 2 * ks;
  kv_.assign((before + n) * entry, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    std::copy_n(k.data() + t * ks, ks, kv_.data() + (before + t) * entry);
    std::copy_n(v.data() + t * ks, ks, kv_.data() + (before + t) * entry + ks);
  }
  if (p > 1 && m > 0) {
    std::vector<float> tail(rank + 1 < p ? m * entry : 0);
    if (!tail.empty()) std::copy_n(kv_.data() + (before + n - m) * entry, tail.size(), tail.data());
    exchange_halo(axis_, "cp.compressed_halo", tail.data(), tail.size(), rank + 1, kv_.data(),
                  before * entry, rank - 1);
  }
  // Compress the blocks this rank owns into entries of k̃ then ṽ.
  size_t origin = runs_[rank].begin - before;
  BlockRange mine = compressed_blocks(config_, p, rank);
  std::vector<float> local(entries_ * entry, 0.0f);
  gathered_.assign(p * local.size(), 0.0f);
  for (size_t e = 0; e < mine.count; ++e) {
    size_t start = (mine.first + e) * config_.stride - origin;
    for (size_t x = 0; x < entry; ++x) {
      double sum = 0;
      for (size_t i = 0; i < config_.block; ++i)
        sum += static_cast<double>(config_.weights[i]) * kv_[(start + i) * entry + x];
      local[e * entry + x] = static_cast<float>(sum);
    }
  }
  detail::fp32_collective(axis_, "cp.compressed_blocks", "allgather", local.data(),
                          gathered_.data(), local.size(), gathered_.size());
  q_.assign(q.begin(), q.end());
  std::vector<const float*> blocks = gathered_blocks();
  size_t dim = shape_.head_dim;
  double scale = shape_.scale != 0 ? shape_.scale : 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> scores;
  for_each_query(blocks.size(), [&](size_t at, size_t kv_off, size_t seen) {
    double sum = softmax_terms(q.data() + at, blocks, seen, kv_off, dim, scale, scores);
    for (size_t d = 0; d < dim; ++d) {
      double acc = 0;
      for (size_t j = 0; j < seen; ++j) acc += scores[j] * blocks[j][ks + kv_off + d];
      out[at + d] = seen == 0 ? 0.0f : static_cast<float>(acc / sum);
    }
  });
}

void CompressedAttentionCp::backward(std::span<const float> dout, std::span<float> dq,
                                     std::span<float> dk, std::span<float> dv,
                                     std::span<float> dweights) {
  detail::require(!gathered_.empty(), "backward before forward");
  int rank = axis_.rank(), p = axis_.size();
  size_t n = rows(), qs = shape_.batch * shape_.heads * shape_.head_dim, ks = kv_stride(shape_);
  require_sizes({{"dout", dout.size()}, {"dk", dk.size()}, {"dv", dv.size()}, {"dq", dq.size()}},
                n * qs, n * ks);
  detail::require_size("dweights", dweights.size(), config_.block);
  // The softmax backward per query, accumulating the gradients of every
  // compressed entry it saw, laid out as the gathered entries.
  std::vector<const float*> blocks = gathered_blocks();
  size_t dim = shape_.head_dim, entry = 2 * ks;
  double scale = shape_.scale != 0 ? shape_.scale : 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> d_entries(gathered_.size(), 0.0), scores, dprob;
  for_each_query(blocks.size(), [&](size_t at, size_t kv_off, size_t seen) {
    const float *qv = q_.data() + at, *g = dout.data() + at;
    double sum = softmax_terms(qv, blocks, seen, kv_off, dim, scale, scores);
    dprob.assign(seen, 0.0);
    double delta = 0;  // Σ_j P_j·dP_j
    for (size_t j = 0; j < seen; ++j) {
      scores[j] /= sum;
      for (size_t d = 0; d < dim; ++d)
        dprob[j] += static_cast<double>(g[d]) * blocks[j][ks + kv_off + d];
      delta += scores[j] * dprob[j];
    }
    std::vector<double> dq_acc(dim, 0.0);
    for (size_t j = 0; j < seen; ++j) {
      double ds = scores[j] * (dprob[j] - delta) * scale;
      double* dk_j = d_entries.data() + (blocks[j] - gathered_.data()) + kv_off;
      for (size_t d = 0; d < dim; ++d) {
        dq_acc[d] += ds * blocks[j][kv_off + d];
        dk_j[d] += ds * qv[d];
        dk_j[ks + d] += scores[j] * g[d];
      }
    }
    for (size_t d = 0; d < dim; ++d) dq[at + d] = static_cast<float>(dq_acc[d]);
  });
  // Every rank's part of the entries' gradients, summed at their owners.
  std::vector<float> partial(d_entries.begin(), d_entries.end()), mine(entries_ * entry);
  detail::fp32_collective(axis_, "cp.compressed_blocks_grad", "reducescatter", partial.data(),
                          mine.data(), partial.size(), mine.size());
  // Each owned entry back onto its block's rows (halo rows first) and weights.
  size_t before = rank > 0 ? halo() : 0, m = halo();
  size_t origin = runs_[rank].begin - before;
  BlockRange owned = compressed_blocks(config_, p, rank);
  std::vector<double> dkv((before + n) * entry, 0.0), dw(config_.block, 0.0);
  for (size_t e = 0; e < owned.count; ++e) {
    size_t start = (owned.first + e) * config_.stride - origin;
    for (size_t i = 0; i < config_.block; ++i)
      for (size_t x = 0; x < entry; ++x) {
        double g = mine[e * entry + x];
        dkv[(start + i) * entry + x] += config_.weights[i] * g;
        dw[i] += g * kv_[(start + i) * entry + x];
      }
  }
  std::vector<float> rows_grad(dkv.begin(), dkv.end());
  if (p > 1 && m > 0) {
    // The halo rows' gradient goes back to the previous rank, which adds it
    // to its tail.
    std::vector<float> tail(rank + 1 < p ? m * entry : 0);
    exchange_halo(axis_, "cp.compressed_halo_grad", rows_grad.data(), before * entry, rank - 1,
                  tail.data(), tail.size(), rank + 1);
    for (size_t x = 0; x < tail.size(); ++x) rows_grad[(before + n - m) * entry + x] += tail[x];
  }
  for (size_t t = 0; t < n; ++t) {
    std::copy_n(rows_grad.data() + (before + t) * entry, ks, dk.data() + t * ks);
    std::copy_n(rows_grad.data() + (before + t) * entry + ks, ks, dv.data() + t * ks);
  }
  std::copy(dw.begin(), dw.end(), dweights.begin());
}

}  // namespace weft::parallel
