#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace weft::train {

void gemm(int m, int n, int k, const float* a, bool trans_a, const float* b, bool trans_b, float* c,
          bool accumulate) {
  if (!accumulate) std::memset(c, 0, sizeof(float) * size_t(m) * n);
  // Each case keeps the innermost loop on contiguous memory.
  if (trans_b) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        float sum = 0;
        for (int p = 0; p < k; ++p)
          sum += (trans_a ? a[size_t(p) * m + i] : a[size_t(i) * k + p]) * b[size_t(j) * k + p];
        c[size_t(i) * n + j] += sum;
      }
  } else if (trans_a) {
    for (int p = 0; p < k; ++p)
      for (int i = 0; i < m; ++i) {
        const float a_ip = a[size_t(p) * m + i];
        for (int j = 0; j < n; ++j) c[size_t(i) * n + j] += a_ip * b[size_t(p) * n + j];
      }
  } else {
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p) {
        const float a_ip = a[size_t(i) * k + p];
        for (int j = 0; j < n; ++j) c[size_t(i) * n + j] += a_ip * b[size_t(p) * n + j];
      }
  }
}

void linear(int n, int in, int out, const float* x, const float* w, const float* b, float* y) {
  gemm(n, out, in, x, false, w, true, y, false);
  if (b != nullptr)
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < out; ++j) y[size_t(r) * out + j] += b[j];
}
void linear_backward_weight(int n, int in, int out, const float* x, const float* dy, float* dw,
                            float* db) {
  gemm(out, in, n, dy, true, x, false, dw, true);
  if (db != nullptr)
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < out; ++j) db[j] += dy[size_t(r) * out + j];
}
void linear_backward_input(int n, int in, int out, const float* w, const float* dy, float* dx) {
  gemm(n, in, out, dy, false, w, false, dx, false);
}

constexpr float kLayernormEps = 1e-5f;

void layernorm(int rows, int w, const float* x, const float* gamma, const float* beta, float* y,
               float* mean, float* rstd) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * w;
    float mu = 0, var = 0;
    for (int i = 0; i < w; ++i) mu += xr[i];
    mu /= w;
    for (int i = 0; i < w; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    const float rs = 1.0f / std::sqrt(var / w + kLayernormEps);
    for (int i = 0; i < w; ++i) y[size_t(r) * w + i] = (xr[i] - mu) * rs * gamma[i] + beta[i];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void layernorm_backward(int rows, int w, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* dy, float* dx, float* dgamma,
                        float* dbeta) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * w;
    const float* dyr = dy + size_t(r) * w;
    float mean_g = 0, mean_gx = 0;  // means of dxhat and dxhat·xhat
    for (int i = 0; i < w; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      const float g = dyr[i] * gamma[i];
      mean_g += g;
      mean_gx += g * xhat;
      dgamma[i] += dyr[i] * xhat;
      dbeta[i] += dyr[i];
    }
    mean_g /= w;
    mean_gx /= w;
    for (int i = 0; i < w; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      dx[size_t(r) * w + i] = rstd[r] * (dyr[i] * gamma[i] - mean_g - xhat * mean_gx);
    }
  }
}

constexpr float kGeluC = 0.7978845608f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

void gelu(size_t n, const float* x, float* y) {
  for (size_t i = 0; i < n; ++i)
    y[i] = 0.5f * x[i] * (1 + std::tanh(kGeluC * (x[i] + kGeluA * x[i] * x[i] * x[i])));
}

void gelu_backward(size_t n, const float* x, const float* dy, float* dx) {
  for (size_t i = 0; i < n; ++i) {
    const float t = std::tanh(kGeluC * (x[i] + kGeluA * x[i] * x[i] * x[i]));
    const float dt = kGeluC * (1 + 3 * kGeluA * x[i] * x[i]) * (1 - t * t);
    dx[i] = dy[i] * (0.5f * (1 + t) + 0.5f * x[i] * dt);
  }
}

namespace {

// Strides of one head's q, k, v and output rows in the [s, b, ·] layout.
struct HeadView {
  const AttentionShape& s;
  int qkv_cols() const { return s.heads * 3 * s.head_dim; }
  int out_cols() const { return s.heads * s.head_dim; }
  size_t row(int t, int i) const { return size_t(t) * s.batch + i; }
  size_t qkv(int t, int i, int j, int part) const {
    return row(t, i) * qkv_cols() + size_t(j) * 3 * s.head_dim + size_t(part) * s.head_dim;
  }
  size_t out(int t, int i, int j) const { return row(t, i) * out_cols() + size_t(j) * s.head_dim; }
  float* probs(float* p, int i, int j) const {
    return p + (size_t(i) * s.heads + j) * s.seq * s.seq;
  }
};

float dot(const float* a, const float* b, int n) {
  float sum = 0;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

}  // namespace

void attention(const AttentionShape& shape, const float* qkv, float* out, float* probs) {
  const HeadView v{shape};
  const int dh = shape.head_dim;
  const float scale = 1.0f / std::sqrt(float(dh));
  for (int i = 0; i < shape.batch; ++i)
    for (int j = 0; j < shape.heads; ++j) {
      float* p = v.probs(probs, i, j);
      for (int t = 0; t < shape.seq; ++t) {
        float* pt = p + size_t(t) * shape.seq;
        float max = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          pt[u] = scale * dot(qkv + v.qkv(t, i, j, 0), qkv + v.qkv(u, i, j, 1), dh);
          max = std::max(max, pt[u]);
        }
        float sum = 0;
        for (int u = 0; u <= t; ++u) sum += pt[u] = std::exp(pt[u] - max);
        for (int u = 0; u < shape.seq; ++u) pt[u] = u <= t ? pt[u] / sum : 0.0f;
        float* o = out + v.out(t, i, j);
        std::fill(o, o + dh, 0.0f);
        for (int u = 0; u <= t; ++u) {
          const float* vu = qkv + v.qkv(u, i, j, 2);
          for (int d = 0; d < dh; ++d) o[d] += pt[u] * vu[d];
        }
      }
    }
}

void attention_backward(const AttentionShape& shape, const float* qkv, const float* probs,
                        const float* dout, float* dqkv) {
  const HeadView v{shape};
  const int dh = shape.head_dim;
  const float scale = 1.0f / std::sqrt(float(dh));
  std::fill(dqkv, dqkv + size_t(shape.seq) * shape.batch * v.qkv_cols(), 0.0f);
  std::vector<float> dp(shape.seq);
  for (int i = 0; i < shape.batch; ++i)
    for (int j = 0; j < shape.heads; ++j) {
      const float* p = v.probs(const_cast<float*>(probs), i, j);
      for (int t = 0; t < shape.seq; ++t) {
        const float* pt = p + size_t(t) * shape.seq;
        const float* dot_t = dout + v.out(t, i, j);
        float weighted = 0;  // Σ_u P·dP, the softmax backward's correction
        for (int u = 0; u <= t; ++u) {
          dp[u] = dot(dot_t, qkv + v.qkv(u, i, j, 2), dh);
          weighted += pt[u] * dp[u];
          float* dv = dqkv + v.qkv(u, i, j, 2);
          for (int d = 0; d < dh; ++d) dv[d] += pt[u] * dot_t[d];
        }
        float* dq = dqkv + v.qkv(t, i, j, 0);
        const float* q = qkv + v.qkv(t, i, j, 0);
        for (int u = 0; u <= t; ++u) {
          const float ds = pt[u] * (dp[u] - weighted) * scale;
          const float* k = qkv + v.qkv(u, i, j, 1);
          float* dk = dqkv + v.qkv(u, i, j, 1);
          for (int d = 0; d < dh; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
    }
}

namespace {

// The mean keys and values of every block of one batch element and head, [blocks, dh] each.
struct CompressedBlocks {
  int count;
  std::vector<float> k, v;
};

CompressedBlocks compress(const HeadView& view, Compression c, const float* qkv, int i, int j) {
  const int dh = view.s.head_dim;
  CompressedBlocks blocks{view.s.seq < c.block ? 0 : (view.s.seq - c.block) / c.stride + 1, {}, {}};
  blocks.k.assign(size_t(blocks.count) * dh, 0.0f);
  blocks.v.assign(blocks.k.size(), 0.0f);
  for (int b = 0; b < blocks.count; ++b)
    for (int u = b * c.stride; u < b * c.stride + c.block; ++u)
      for (int d = 0; d < dh; ++d) {
        blocks.k[size_t(b) * dh + d] += qkv[view.qkv(u, i, j, 1) + d] / float(c.block);
        blocks.v[size_t(b) * dh + d] += qkv[view.qkv(u, i, j, 2) + d] / float(c.block);
      }
  return blocks;
}

// The blocks closed at position t, and their softmax weights for t's query.
int closed_blocks(Compression c, int t, int count) {
  return t + 1 < c.block ? 0 : std::min(count, (t + 1 - c.block) / c.stride + 1);
}
void block_softmax(const float* q, const CompressedBlocks& blocks, int seen, int dh,
                   std::vector<float>& p) {
  const float scale = 1.0f / std::sqrt(float(dh));
  p.resize(size_t(seen));
  float max = -INFINITY, sum = 0;
  for (int b = 0; b < seen; ++b)
    max = std::max(max, p[b] = scale * dot(q, &blocks.k[size_t(b) * dh], dh));
  for (int b = 0; b < seen; ++b) sum += p[b] = std::exp(p[b] - max);
  for (int b = 0; b < seen; ++b) p[b] /= sum;
}

}  // namespace

void compressed_attention(const AttentionShape& shape, Compression c, const float* qkv,
                          float* out) {
  const HeadView view{shape};
  const int dh = shape.head_dim;
  std::vector<float> p;
  for (int i = 0; i < shape.batch; ++i)
    for (int j = 0; j < shape.heads; ++j) {
      const CompressedBlocks blocks = compress(view, c, qkv, i, j);
      for (int t = 0; t < shape.seq; ++t) {
        const int seen = closed_blocks(c, t, blocks.count);
        block_softmax(qkv + view.qkv(t, i, j, 0), blocks, seen, dh, p);
        float* o = out + view.out(t, i, j);
        std::fill(o, o + dh, 0.0f);
        for (int b = 0; b < seen; ++b)
          for (int d = 0; d < dh; ++d) o[d] += p[b] * blocks.v[size_t(b) * dh + d];
      }
    }
}

void compressed_attention_backward(const AttentionShape& shape, Compression c, const float* qkv,
                                   const float* dout, float* dqkv) {
  const HeadView view{shape};
  const int dh = shape.head_dim;
  const float scale = 1.0f / std::sqrt(float(dh));
  std::fill(dqkv, dqkv + size_t(shape.seq) * shape.batch * view.qkv_cols(), 0.0f);
  std::vector<float> p, dp;
  for (int i = 0; i < shape.batch; ++i)
    for (int j = 0; j < shape.heads; ++j) {
      const CompressedBlocks blocks = compress(view, c, qkv, i, j);
      std::vector<float> dk(blocks.k.size(), 0.0f), dv(blocks.v.size(), 0.0f);
      for (int t = 0; t < shape.seq; ++t) {
        const int seen = closed_blocks(c, t, blocks.count);
        const float* q = qkv + view.qkv(t, i, j, 0);
        const float* g = dout + view.out(t, i, j);
        block_softmax(q, blocks, seen, dh, p);
        dp.resize(size_t(seen));
        float weighted = 0;  // Σ_b P·dP
        for (int b = 0; b < seen; ++b)
          weighted += p[b] * (dp[b] = dot(g, &blocks.v[size_t(b) * dh], dh));
        float* dq = dqkv + view.qkv(t, i, j, 0);
        for (int b = 0; b < seen; ++b) {
          const float ds = p[b] * (dp[b] - weighted) * scale;
          for (int d = 0; d < dh; ++d) {
            dq[d] += ds * blocks.k[size_t(b) * dh + d];
            dk[size_t(b) * dh + d] += ds * q[d];
            dv[size_t(b) * dh + d] += p[b] * g[d];
          }
        }
      }
      // Each block's mean spreads its gradient evenly over its positions.
      for (int b = 0; b < blocks.count; ++b)
        for (int u = b * c.stride; u < b * c.stride + c.block; ++u)
          for (int d = 0; d < dh; ++d) {
            dqkv[view.qkv(u, i, j, 1) + d] += dk[size_t(b) * dh + d] / float(c.block);
            dqkv[view.qkv(u, i, j, 2) + d] += dv[size_t(b) * dh + d] / float(c.block);
          }
    }
}

double cross_entropy(int rows, int vocab, const float* logits, const int32_t* targets, float scale,
                     float* dlogits) {
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    const float* lr = logits + size_t(r) * vocab;
    const float max = *std::max_element(lr, lr + vocab);
    float sum = 0;
    for (int c = 0; c < vocab; ++c) sum += std::exp(lr[c] - max);
    total += std::log(sum) + max - lr[targets[r]];
    for (int c = 0; c < vocab; ++c)
      dlogits[size_t(r) * vocab + c] =
          scale * (std::exp(lr[c] - max) / sum - (c == targets[r] ? 1.0f : 0.0f));
  }
  return total;
}

void adam_step(const AdamConfig& config, int step, std::span<float> param,
               std::span<const float> grad, std::span<float> m, std::span<float> v) {
  const float c1 = 1 - std::pow(config.beta1, float(step));
  const float c2 = 1 - std::pow(config.beta2, float(step));
  for (size_t i = 0; i < param.size(); ++i) {
    m[i] = config.beta1 * m[i] + (1 - config.beta1) * grad[i];
    v[i] = config.beta2 * v[i] + (1 - config.beta2) * grad[i] * grad[i];
    param[i] -= config.lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + config.eps);
  }
}

}  // namespace weft::train
