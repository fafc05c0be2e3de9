#include "moe.h"

#include <cmath>
#include <limits>

namespace weft::train {

void route(const MoeShape& s, int n, const float* logits, int32_t* index, float* weight) {
  const size_t k = size_t(s.topk);
  for (int r = 0; r < n; ++r) {
    const float* l = logits + size_t(r) * s.experts;
    int32_t* idx = index + size_t(r) * k;
    for (size_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < s.experts; ++e) {
        bool taken = false;
        for (size_t m = 0; m < j; ++m) taken = taken || idx[m] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      idx[j] = best;
    }
    // Softmax over the chosen: the first is the largest.
    float* w = weight + size_t(r) * k;
    float sum = 0;
    for (size_t j = 0; j < k; ++j) sum += w[j] = std::exp(l[idx[j]] - l[idx[0]]);
    for (size_t j = 0; j < k; ++j) w[j] /= sum;
  }
}

void route_backward(const MoeShape& s, int n, const int32_t* index, const float* weight,
                    const float* d_weight, float* d_logits) {
  const size_t k = size_t(s.topk);
  std::fill(d_logits, d_logits + size_t(n) * s.experts, 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* w = weight + size_t(r) * k;
    const float* dw = d_weight + size_t(r) * k;
    float dot = 0;
    for (size_t j = 0; j < k; ++j) dot += w[j] * dw[j];
    for (size_t j = 0; j < k; ++j)
      d_logits[size_t(r) * s.experts + index[size_t(r) * k + j]] = w[j] * (dw[j] - dot);
  }
}

void expert_forward(const MoeShape& s, int rows, const float* x, const float* w1, const float* w2,
                    float* u, float* g, float* y) {
  linear(rows, s.hidden, s.ffn, x, w1, nullptr, u);
  gelu(size_t(rows) * s.ffn, u, g);
  linear(rows, s.ffn, s.hidden, g, w2, nullptr, y);
}

void expert_backward(const MoeShape& s, int rows, const float* x, const float* u, const float* g,
                     const float* w1, const float* w2, const float* dy, float* du, float* dx,
                     float* dw1, float* dw2) {
  linear_backward_weight(rows, s.ffn, s.hidden, g, dy, dw2, nullptr);
  linear_backward_input(rows, s.ffn, s.hidden, w2, dy, du);
  gelu_backward(size_t(rows) * s.ffn, u, du, du);
  linear_backward_weight(rows, s.hidden, s.ffn, x, du, dw1, nullptr);
  linear_backward_input(rows, s.hidden, s.ffn, w1, du, dx);
}

size_t moe_capacity(double factor, size_t tokens, int topk, int experts) {
  if (factor <= 0) return std::numeric_limits<size_t>::max();
  return size_t(std::ceil(factor * double(tokens) * double(topk) / double(experts)));
}

void moe_forward(const MoeShape& s, double capacity, const std::vector<std::vector<int>>& groups,
                 int n, const float* x, const MoeParams& p, float* out, MoeActs& a) {
  const size_t k = size_t(s.topk), h = size_t(s.hidden), f = size_t(s.ffn);
  a.logits.resize(size_t(n) * s.experts);
  a.index.resize(size_t(n) * k), a.weight.resize(a.index.size());
  linear(n, s.hidden, s.experts, x, p.router, nullptr, a.logits.data());
  route(s, n, a.logits.data(), a.index.data(), a.weight.data());
  a.kept.assign(a.index.size(), 0);
  for (const std::vector<int>& group : groups) {
    const size_t cap = moe_capacity(capacity, group.size(), s.topk, s.experts);
    std::vector<size_t> taken(s.experts, 0);
    for (int r : group)
      for (size_t j = 0; j < k; ++j) {
        size_t i = size_t(r) * k + j;
        if (taken[a.index[i]] < cap) ++taken[a.index[i]], a.kept[i] = 1;
      }
  }
  a.u.assign(a.index.size() * f, 0.0f), a.g.assign(a.u.size(), 0.0f);
  a.y.assign(a.index.size() * h, 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> sum(h, 0.0f);
    for (size_t j = 0; j < k; ++j) {
      size_t i = size_t(r) * k + j;
      if (!a.kept[i]) continue;
      const int32_t e = a.index[i];
      expert_forward(s, 1, x + size_t(r) * h, p.w1 + size_t(e) * f * h, p.w2 + size_t(e) * h * f,
                     &a.u[i * f], &a.g[i * f], &a.y[i * h]);
      for (size_t c = 0; c < h; ++c) sum[c] += a.weight[i] * a.y[i * h + c];
    }
    for (size_t c = 0; c < h; ++c) out[size_t(r) * h + c] = sum[c] + p.bias[c];
  }
}

void moe_backward(const MoeShape& s, int n, const float* x, const MoeParams& p, const MoeActs& a,
                  const float* dout, float* dx, const MoeGrads& g) {
  const size_t k = size_t(s.topk), h = size_t(s.hidden), f = size_t(s.ffn);
  std::vector<float> d_weight(a.index.size(), 0.0f), dy(h), du(f), dxi(h);
  std::fill(dx, dx + size_t(n) * h, 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* d = dout + size_t(r) * h;
    for (size_t c = 0; c < h; ++c) g.bias[c] += d[c];
    for (size_t j = 0; j < k; ++j) {
      size_t i = size_t(r) * k + j;
      if (!a.kept[i]) continue;
      const int32_t e = a.index[i];
      double dot = 0;
      for (size_t c = 0; c < h; ++c) {
        dy[c] = a.weight[i] * d[c];
        dot += double(d[c]) * a.y[i * h + c];
      }
      d_weight[i] = float(dot);
      expert_backward(s, 1, x + size_t(r) * h, &a.u[i * f], &a.g[i * f], p.w1 + size_t(e) * f * h,
                      p.w2 + size_t(e) * h * f, dy.data(), du.data(), dxi.data(),
                      g.w1 + size_t(e) * f * h, g.w2 + size_t(e) * h * f);
      for (size_t c = 0; c < h; ++c) dx[size_t(r) * h + c] += dxi[c];
    }
  }
  std::vector<float> d_logits(size_t(n) * s.experts), through(size_t(n) * h);
  route_backward(s, n, a.index.data(), a.weight.data(), d_weight.data(), d_logits.data());
  linear_backward_weight(n, s.hidden, s.experts, x, d_logits.data(), g.router, nullptr);
  linear_backward_input(n, s.hidden, s.experts, p.router, d_logits.data(), through.data());
  for (size_t i = 0; i < through.size(); ++i) dx[i] += through[i];
}

std::vector<std::vector<int>> dp_groups(int seq, int batch, int dp) {
  const int b = batch / dp;
  std::vector<std::vector<int>> groups(dp);
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < seq; ++t)
      for (int i = 0; i < b; ++i) groups[d].push_back(t * batch + d * b + i);
  return groups;
}

}  // namespace weft::train
