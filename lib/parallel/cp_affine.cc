// Affine-state CP: a linear recurrence S_t = M_t·S_{t−1} + U_t split over
// contiguous segments. Each rank reduces its segment to the affine map
// (M, S̃) it applies to the incoming state, the fixed-size maps are
// all-gathered, and the prefix of the maps of the ranks before it gives the
// state it starts from; then it runs its segment again from that state.
// Backward is the same in reverse: the gradient of the state flows from the
// end of the sequence through the transposed maps, so each rank reduces its
// segment to the gradient it hands to the state before it (from a zero
// gradient at its end), the summaries are all-gathered again, and the
// suffix over the ranks after it gives the gradient entering its end.
#include <algorithm>

#include "parallel/cp_internal.h"

namespace weft::parallel {

namespace {

// One head's view of a position: q, k, alpha (dk), v (dv), beta.
struct Token {
  const float *q, *k, *alpha, *v;
  float beta;
};

// The saved inputs [q | k | alpha | v | beta] of n rows, per position and
// head.
struct Inputs {
  const float* data;
  size_t n, heads, dk, dv;
  Token operator()(size_t t, size_t h) const {
    size_t at = t * heads + h, keys = n * heads * dk;
    return Token{data + at * dk, data + keys + at * dk, data + 2 * keys + at * dk,
                 data + 3 * keys + at * dv, data[3 * keys + n * heads * dv + at]};
  }
};

// x ← (I − β·k·kᵀ)·diag(α)·x for x [dk, n] row-major: the gated delta
// rule's transition, applied without forming the dk×dk matrix.
void transition(const Token& t, size_t dk, size_t n, double* x, std::vector<double>& row) {
  row.assign(n, 0.0);
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < n; ++j) {
      x[i * n + j] *= t.alpha[i];
      row[j] += t.k[i] * x[i * n + j];
    }
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < n; ++j) x[i * n + j] -= t.beta * t.k[i] * row[j];
}

// S ← M_t·S + β·k·vᵀ for S [dk, dv].
void advance(const Token& t, size_t dk, size_t dv, double* s, std::vector<double>& row) {
  transition(t, dk, dv, s, row);
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < dv; ++j) s[i * dv + j] += t.beta * t.k[i] * t.v[j];
}

// x ← diag(α)·(I − β·k·kᵀ)·x: the adjoint of transition.
void transition_adjoint(const Token& t, size_t dk, size_t n, double* x, std::vector<double>& row) {
  row.assign(n, 0.0);
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < n; ++j) row[j] += t.k[i] * x[i * n + j];
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < n; ++j)
      x[i * n + j] = t.alpha[i] * (x[i * n + j] - t.beta * t.k[i] * row[j]);
}

// g[dk, dv] += q·doutᵀ: the output's share of the state gradient.
void add_output_gradient(const float* q, const float* dout, size_t dk, size_t dv, double* g) {
  for (size_t i = 0; i < dk; ++i)
    for (size_t j = 0; j < dv; ++j) g[i * dv + j] += static_cast<double>(q[i]) * dout[j];
}

// c[dk, n] = a[dk, dk]·b[dk, n] + c.
void multiply_add(const double* a, const double* b, size_t dk, size_t n, double* c) {
  for (size_t i = 0; i < dk; ++i)
    for (size_t l = 0; l < dk; ++l)
      for (size_t j = 0; j < n; ++j) c[i * n + j] += a[i * dk + l] * b[l * n + j];
}

}  // namespace

void add_affine_cp_expected(Ledger& ledger, const AffineShape& shape, int cp, bool backward) {
  if (cp <= 1) return;
  size_t heads = shape.batch * shape.heads, dk = shape.key_dim, dv = shape.value_dim;
  auto book = [&](std::string_view pattern, size_t floats) {
    size_t bytes = static_cast<size_t>(cp) * floats * sizeof(float);
    ledger.record(pattern, "allgather", "cp", bytes,
                  detail::bytes_sent("allgather", "ring", cp, bytes), "", 0, 0);
  };
  book("cp.affine_state", heads * dk * (dk + dv));
  if (backward) book("cp.affine_grad", heads * dk * dv);
}

AffineStateCp::AffineStateCp(const Axis& axis, const AffineShape& shape, size_t seq)
    : axis_(axis), shape_(shape) {
  detail::require(shape.batch > 0 && shape.heads > 0,
                  "batch and heads of the affine state must be positive");
  detail::require(shape.key_dim > 0 && shape.value_dim > 0,
                  "key_dim and value_dim of the affine state must be positive");
  for (int r = 0; r < axis.size(); ++r) runs_.push_back(cp_shard(seq, 0, axis.size(), r, false)[0]);
}

SeqRun AffineStateCp::run(int rank) const {
  return runs_.at(rank);
}
size_t AffineStateCp::rows() const {
  return runs_[axis_.rank()].count;
}

void AffineStateCp::forward(std::span<const float> q, std::span<const float> k,
                            std::span<const float> v, std::span<const float> alpha,
                            std::span<const float> beta, std::span<float> out) {
  size_t heads = shape_.batch * shape_.heads, dk = shape_.key_dim, dv = shape_.value_dim;
  size_t n = rows(), p = runs_.size();
  detail::require_size("q", q.size(), n * heads * dk);
  detail::require_size("k", k.size(), n * heads * dk);
  detail::require_size("alpha", alpha.size(), n * heads * dk);
  detail::require_size("v", v.size(), n * heads * dv);
  detail::require_size("beta", beta.size(), n * heads);
  detail::require_size("out", out.size(), n * heads * dv);
  saved_.clear();
  for (std::span<const float> x : {q, k, alpha, v, beta})
    saved_.insert(saved_.end(), x.begin(), x.end());
  Inputs token{saved_.data(), n, heads, dk, dv};
  // The summary of every head: M (dk·dk) then S̃ (dk·dv), from M = I, S = 0.
  size_t m_size = dk * dk, size = m_size + dk * dv;
  std::vector<double> map(heads * size, 0.0), row;
  for (size_t h = 0; h < heads; ++h) {
    double *m = map.data() + h * size, *s = m + m_size;
    for (size_t i = 0; i < dk; ++i) m[i * dk + i] = 1.0;
    for (size_t t = 0; t < n; ++t) {
      Token tok = token(t, h);
      transition(tok, dk, dk, m, row);
      advance(tok, dk, dv, s, row);
    }
  }
  std::vector<float> mine(map.begin(), map.end());
  summaries_.resize(p * mine.size());
  detail::fp32_collective(axis_, "cp.affine_state", "allgather", mine.data(), summaries_.data(),
                          mine.size(), summaries_.size());
  // The state entering this segment: the prefix (M_b, S̃_b)∘(M_a, S̃_a) over
  // ranks 0 … rank−1, starting from the identity (I, 0). Only its S̃ part is
  // needed (its M part would map an initial state, which is 0 here), so
  // each step is S ← M_b·S + S̃_b.
  std::vector<double> state(heads * dk * dv, 0.0), next, m_b(m_size);
  for (int b = 0; b < axis_.rank(); ++b)
    for (size_t h = 0; h < heads; ++h) {
      const float* summary = summaries_.data() + (b * heads + h) * size;
      double* s = state.data() + h * dk * dv;
      next.assign(summary + m_size, summary + size);
      std::copy(summary, summary + m_size, m_b.begin());
      multiply_add(m_b.data(), s, dk, dv, next.data());
      std::copy(next.begin(), next.end(), s);
    }
  state_in_ = state;
  for (size_t h = 0; h < heads; ++h) {
    double* s = state.data() + h * dk * dv;
    for (size_t t = 0; t < n; ++t) {
      Token tok = token(t, h);
      advance(tok, dk, dv, s, row);
      float* o = out.data() + (t * heads + h) * dv;
      for (size_t j = 0; j < dv; ++j) {
        double sum = 0;
        for (size_t i = 0; i < dk; ++i) sum += s[i * dv + j] * tok.q[i];
        o[j] = static_cast<float>(sum);
      }
    }
  }
}

void AffineStateCp::backward(std::span<const float> dout, std::span<float> dq,
                             std::span<float> dk_out, std::span<float> dv_out,
                             std::span<float> dalpha, std::span<float> dbeta) {
  detail::require(!summaries_.empty(), "backward before forward");
  size_t heads = shape_.batch * shape_.heads, dk = shape_.key_dim, dv = shape_.value_dim;
  size_t n = rows(), p = runs_.size(), sdim = dk * dv, size = dk * dk + sdim;
  detail::require_size("dout", dout.size(), n * heads * dv);
  detail::require_size("dq", dq.size(), n * heads * dk);
  detail::require_size("dk", dk_out.size(), n * heads * dk);
  detail::require_size("dalpha", dalpha.size(), n * heads * dk);
  detail::require_size("dv", dv_out.size(), n * heads * dv);
  detail::require_size("dbeta", dbeta.size(), n * heads);
  Inputs token{saved_.data(), n, heads, dk, dv};
  auto dout_of = [&](size_t t, size_t h) { return dout.data() + (t * heads + h) * dv; };
  // The gradient this segment hands to the state before it, from a zero
  // gradient at its end: G ← A_tᵀ·(G + q_t·dout_tᵀ), last position first.
  std::vector<double> carry(heads * sdim, 0.0), row;
  for (size_t h = 0; h < heads; ++h) {
    double* g = carry.data() + h * sdim;
    for (size_t t = n; t-- > 0;) {
      Token tok = token(t, h);
      add_output_gradient(tok.q, dout_of(t, h), dk, dv, g);
      transition_adjoint(tok, dk, dv, g, row);
    }
  }
  std::vector<float> mine(carry.begin(), carry.end()), all(p * mine.size());
  detail::fp32_collective(axis_, "cp.affine_grad", "allgather", mine.data(), all.data(),
                          mine.size(), all.size());
  // The gradient entering this segment's end: the suffix over the later
  // ranks, c ← M_bᵀ·c + G̃_b from the last rank back.
  std::vector<double> grad(heads * sdim, 0.0), next(sdim);
  for (size_t b = p; b-- > static_cast<size_t>(axis_.rank()) + 1;)
    for (size_t h = 0; h < heads; ++h) {
      const float* m = summaries_.data() + (b * heads + h) * size;
      const float* g_b = all.data() + (b * heads + h) * sdim;
      double* c = grad.data() + h * sdim;
      for (size_t i = 0; i < dk; ++i)
        for (size_t j = 0; j < dv; ++j) {
          double x = g_b[i * dv + j];
          for (size_t l = 0; l < dk; ++l) x += static_cast<double>(m[l * dk + i]) * c[l * dv + j];
          next[i * dv + j] = x;
        }
      std::copy(next.begin(), next.end(), c);
    }
  // Per head: the states S_{t−1} of the segment again, then the reverse
  // pass with the true gradient. With P = diag(α)·S_{t−1}, u = Pᵀ·k and
  // S_t = P + β·k·(v − u)ᵀ: dv = β·Gᵀ·k, du = −dv, dβ = kᵀ·G·(v − u),
  // dk = β·G·(v − u) + P·du, dα_i = Σ_j (G + k·duᵀ)_ij·S_{t−1,ij}.
  std::vector<double> states((n + 1) * sdim), pm(sdim), u(dv), du(dv);
  for (size_t h = 0; h < heads; ++h) {
    std::copy_n(state_in_.data() + h * sdim, sdim, states.data());
    for (size_t t = 0; t < n; ++t) {
      std::copy_n(states.data() + t * sdim, sdim, states.data() + (t + 1) * sdim);
      advance(token(t, h), dk, dv, states.data() + (t + 1) * sdim, row);
    }
    double* g = grad.data() + h * sdim;
    for (size_t t = n; t-- > 0;) {
      Token tok = token(t, h);
      size_t at = t * heads + h;
      const float* o_grad = dout_of(t, h);
      add_output_gradient(tok.q, o_grad, dk, dv, g);
      const double *before = states.data() + t * sdim, *after = before + sdim;
      for (size_t i = 0; i < dk; ++i) {
        double x = 0;
        for (size_t j = 0; j < dv; ++j) x += after[i * dv + j] * o_grad[j];
        dq[at * dk + i] = static_cast<float>(x);
      }
      std::fill(u.begin(), u.end(), 0.0);
      for (size_t i = 0; i < dk; ++i)
        for (size_t j = 0; j < dv; ++j) {
          pm[i * dv + j] = tok.alpha[i] * before[i * dv + j];
          u[j] += tok.k[i] * pm[i * dv + j];
        }
      double d_beta = 0;
      for (size_t j = 0; j < dv; ++j) {
        double x = 0;
        for (size_t i = 0; i < dk; ++i) x += g[i * dv + j] * tok.k[i];
        dv_out[at * dv + j] = static_cast<float>(tok.beta * x);
        du[j] = -tok.beta * x;
        d_beta += x * (tok.v[j] - u[j]);
      }
      dbeta[at] = static_cast<float>(d_beta);
      for (size_t i = 0; i < dk; ++i) {
        double d_k = 0, d_alpha = 0;
        for (size_t j = 0; j < dv; ++j) {
          d_k += tok.beta * g[i * dv + j] * (tok.v[j] - u[j]) + pm[i * dv + j] * du[j];
          d_alpha += (g[i * dv + j] + tok.k[i] * du[j]) * before[i * dv + j];
        }
        dk_out[at * dk + i] = static_cast<float>(d_k);
        dalpha[at * dk + i] = static_cast<float>(d_alpha);
      }
      transition_adjoint(tok, dk, dv, g, row);
    }
  }
}

}  // namespace weft::parallel
