// Context-parallel attention for weft-train: the layer's qkv activations (head j's q, k, v
// at columns j·3dh + {0, dh, 2dh}, rows t·b + i over this rank's positions) handed to
// weft::parallel::ContextParallelAttention (or, for --cp-algo compressed, to
// CompressedAttentionCp) and its output and gradients put back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "weft/parallel.hpp"

namespace weft::train {

class CpAttention {
 public:
  // heads: this TP rank's; seq: the whole sequence (every CP rank's positions).
  // hosts: the node of every CP rank (hier).
  CpAttention(const parallel::Axis& cp, parallel::CpAlgorithm algorithm,
              const std::vector<std::string>& hosts, int seq, int batch, int heads, int head_dim);
  // Compressed attention (kernels.h) over contiguous CP segments.
  CpAttention(const parallel::Axis& cp, Compression compression, int seq, int batch, int heads,
              int head_dim);
  // The sequence positions this rank holds, in row order (row = local t · batch + i).
  std::vector<int> positions() const;
  // qkv [rows, heads·3dh] -> out [rows, heads·dh].
  void forward(const float* qkv, float* out);
  // dout [rows, heads·dh] -> dqkv [rows, heads·3dh] (overwritten).
  void backward(const float* dout, float* dqkv);

 private:
  int rank_;
  size_t rows_, heads_, dim_;
  std::unique_ptr<parallel::ContextParallelAttention> attention_;
  std::unique_ptr<parallel::CompressedAttentionCp> compressed_;
};

}  // namespace weft::train
