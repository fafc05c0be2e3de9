// Reference fp32 CPU kernels for weft-train: small and readable, not fast. The adapters
// are the product; these only give the model something to compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace weft::train {

// C[m×n] = op(A)·op(B) (+ C when accumulate). Row-major; op(A) is m×k, op(B) is k×n.
// trans_a: A is stored k×m; trans_b: B is stored n×k.
void gemm(int m, int n, int k, const float* a, bool trans_a, const float* b, bool trans_b, float* c,
          bool accumulate);

// y[n×out] = x[n×in]·Wᵀ + b with W [out, in] (b may be null), and its backward:
// dW += dyᵀ·x, db += Σ rows of dy (db may be null), dx = dy·W.
void linear(int n, int in, int out, const float* x, const float* w, const float* b, float* y);
void linear_backward_weight(int n, int in, int out, const float* x, const float* dy, float* dw,
                            float* db);
void linear_backward_input(int n, int in, int out, const float* w, const float* dy, float* dx);

// Layer normalisation of each of rows rows of width w: y = (x - mean) * rstd * gamma + beta.
// mean and rstd (one per row) are saved for the backward.
void layernorm(int rows, int w, const float* x, const float* gamma, const float* beta, float* y,
               float* mean, float* rstd);
// dx = d/dx; dgamma and dbeta are accumulated (+=).
void layernorm_backward(int rows, int w, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta);

// GELU, tanh approximation.
void gelu(size_t n, const float* x, float* y);
void gelu_backward(size_t n, const float* x, const float* dy, float* dx);

// Causal multi-head self-attention over activations laid out [s, b, ·] (row = t·b + i).
// qkv has heads·3·dh columns, head j's q, k, v at columns j·3dh + {0, dh, 2dh}: a column
// shard of whole heads is then a contiguous range. out has heads·dh columns; probs
// (b·heads·s·s) is saved for the backward.
struct AttentionShape {
  int seq, batch, heads, head_dim;
};
void attention(const AttentionShape& shape, const float* qkv, float* out, float* probs);
void attention_backward(const AttentionShape& shape, const float* qkv, const float* probs,
                        const float* dout, float* dqkv);

// Compressed attention (weft-train's --cp-algo compressed): per batch element and head,
// block j of `block` positions starting at j·stride is compressed to the mean of its keys
// and of its values; the query at t attends by softmax over the blocks that end at or
// before t (none: output 0). Same qkv and out layouts as attention; the backward
// recomputes the softmax.
struct Compression {
  int block, stride;
};
void compressed_attention(const AttentionShape& shape, Compression compression, const float* qkv,
                          float* out);
void compressed_attention_backward(const AttentionShape& shape, Compression compression,
                                   const float* qkv, const float* dout, float* dqkv);

// Softmax cross-entropy of rows×vocab logits against targets, summed over rows (the caller
// scales). dlogits = scale · (softmax − onehot).
double cross_entropy(int rows, int vocab, const float* logits, const int32_t* targets, float scale,
                     float* dlogits);

// Adam on n elements (bias-corrected, step counted from 1).
struct AdamConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-5f;
};
void adam_step(const AdamConfig& config, int step, std::span<float> param,
               std::span<const float> grad, std::span<float> m, std::span<float> v);

}  // namespace weft::train
