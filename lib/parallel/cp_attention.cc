// Context-parallel attention: the reference block kernels (forward with
// log-sum-exp, backward from the final lse), the shard layouts, the KV-cache
// rule and the ContextParallelAttention front that hands the work to one
// algorithm family.
#include <algorithm>
#include <numeric>

#include "parallel/cp_internal.h"

namespace weft::parallel {

namespace {

struct Geometry {
  size_t batch, heads, kv_heads, dim, group, q_stride, kv_stride;
  double scale;
  bool causal;
};

Geometry geometry(const AttentionShape& shape) {
  Geometry g{};
  g.batch = shape.batch;
  g.heads = shape.heads;
  g.kv_heads = shape.kv_heads == 0 ? shape.heads : shape.kv_heads;
  g.dim = shape.head_dim;
  g.group = g.kv_heads == 0 ? 1 : g.heads / g.kv_heads;  // no heads: nothing to compute
  g.q_stride = g.batch * g.heads * g.dim;
  g.kv_stride = g.batch * g.kv_heads * g.dim;
  g.scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(g.dim));
  g.causal = shape.causal;
  return g;
}

// Keys of `run` that a query at `position` may see (a prefix of the run).
size_t visible(const SeqRun& run, size_t position, bool causal) {
  if (!causal) return run.count;
  if (position < run.begin) return 0;
  return std::min(run.count, position - run.begin + 1);
}

// The local rows of kv_runs a query at `position` sees, in row order.
void visible_rows(std::span<const SeqRun> kv_runs, size_t position, bool causal,
                  std::vector<size_t>& rows) {
  rows.clear();
  size_t base = 0;
  for (const SeqRun& run : kv_runs) {
    size_t n = visible(run, position, causal);
    for (size_t u = 0; u < n; ++u) rows.push_back(base + u);
    base += run.count;
  }
}

double dot(const float* a, const float* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

// (out, lse) ← merge with (part, part_lse): lse = max + log(1 + e^(min − max)),
// out = e^(lse_a − lse)·out + e^(lse_b − lse)·part.
template <typename Part>
void merge_row(size_t dim, float* out, float* lse, const Part* part, double part_lse) {
  if (part_lse == -std::numeric_limits<double>::infinity()) return;
  double a = *lse, hi = std::max(a, part_lse), lo = std::min(a, part_lse);
  double merged = hi + std::log1p(std::exp(lo - hi));
  double wa = std::exp(a - merged), wb = std::exp(part_lse - merged);
  for (size_t d = 0; d < dim; ++d) out[d] = static_cast<float>(wa * out[d] + wb * part[d]);
  *lse = static_cast<float>(merged);
}

}  // namespace

CpAlgorithm parse_cp_algorithm(std::string_view name) {
  for (CpAlgorithm a :
       {CpAlgorithm::ring, CpAlgorithm::zigzag, CpAlgorithm::passq, CpAlgorithm::allgather,
        CpAlgorithm::ulysses, CpAlgorithm::hier, CpAlgorithm::automatic})
    if (name == cp_algorithm_name(a)) return a;
  detail::fail("cp algorithm '" + std::string(name) +
               "' is not one of ring, zigzag, passq, allgather, ulysses, hier, auto");
}

std::string_view cp_algorithm_name(CpAlgorithm algorithm) {
  switch (algorithm) {
    case CpAlgorithm::ring:
      return "ring";
    case CpAlgorithm::zigzag:
      return "zigzag";
    case CpAlgorithm::passq:
      return "passq";
    case CpAlgorithm::allgather:
      return "allgather";
    case CpAlgorithm::ulysses:
      return "ulysses";
    case CpAlgorithm::hier:
      return "hier";
    case CpAlgorithm::automatic:
      return "auto";
  }
  return "?";
}

std::vector<SeqRun> cp_shard(size_t seq, size_t offset, int cp, int rank, bool zigzag) {
  detail::require(cp > 0 && rank >= 0 && rank < cp,
                  "rank " + std::to_string(rank) + " is outside the cp size " + std::to_string(cp));
  auto p = static_cast<size_t>(cp), r = static_cast<size_t>(rank);
  if (!zigzag) {
    auto sizes = split_sizes(seq, cp);
    size_t begin = offset + std::accumulate(sizes.begin(), sizes.begin() + rank, size_t{0});
    return {{begin, sizes[r]}};
  }
  detail::require(seq % (2 * p) == 0, "sequence length " + std::to_string(seq) +
                                          " is not divisible by 2·cp = " + std::to_string(2 * p) +
                                          " (zigzag holds chunks r and 2·cp−1−r)");
  size_t chunk = seq / (2 * p);
  return {{offset + r * chunk, chunk}, {offset + (2 * p - 1 - r) * chunk, chunk}};
}

CpForwardBytes cp_forward_bytes(const AttentionShape& shape, size_t q_seq, size_t kv_seq, int cp) {
  Geometry g = geometry(shape);
  auto p = static_cast<size_t>(std::max(cp, 1));
  if (kv_seq == 0) kv_seq = q_seq;
  // pass-KV: P−1 shifts of a k|v block (kv_seq/P rows); pass-Q: P−1 shifts
  // of a q block (q_seq/P rows), then each rank returns the partial out and
  // lse it computed for the other P−1 blocks.
  CpForwardBytes bytes;
  bytes.pass_kv = (p - 1) * kv_seq * 2 * g.kv_stride * sizeof(float) / p;
  bytes.pass_q = (p - 1) * q_seq * (2 * g.q_stride + g.batch * g.heads) * sizeof(float) / p;
  return bytes;
}

CpAlgorithm choose_cp_algorithm(const AttentionShape& shape, size_t q_seq, size_t kv_seq, int cp) {
  CpForwardBytes bytes = cp_forward_bytes(shape, q_seq, kv_seq, cp);
  return bytes.pass_q < bytes.pass_kv ? CpAlgorithm::passq : CpAlgorithm::ring;
}

void attention_block_forward(const AttentionShape& shape, const float* q,
                             std::span<const SeqRun> q_runs, const float* k, const float* v,
                             std::span<const SeqRun> kv_runs, float* out, float* lse) {
  Geometry g = geometry(shape);
  std::vector<size_t> rows;
  std::vector<double> scores, part(g.dim);
  size_t qi = 0;
  for (const SeqRun& run : q_runs)
    for (size_t t = 0; t < run.count; ++t, ++qi) {
      visible_rows(kv_runs, run.begin + t, g.causal, rows);
      if (rows.empty()) continue;
      scores.resize(rows.size());
      for (size_t b = 0; b < g.batch; ++b)
        for (size_t h = 0; h < g.heads; ++h) {
          const float* qv = q + qi * g.q_stride + (b * g.heads + h) * g.dim;
          size_t kv_off = (b * g.kv_heads + h / g.group) * g.dim;
          double top = -std::numeric_limits<double>::infinity();
          for (size_t i = 0; i < rows.size(); ++i) {
            scores[i] = g.scale * dot(qv, k + rows[i] * g.kv_stride + kv_off, g.dim);
            top = std::max(top, scores[i]);
          }
          std::fill(part.begin(), part.end(), 0.0);
          double sum = 0;
          for (size_t i = 0; i < rows.size(); ++i) {
            double e = std::exp(scores[i] - top);
            sum += e;
            const float* vv = v + rows[i] * g.kv_stride + kv_off;
            for (size_t d = 0; d < g.dim; ++d) part[d] += e * vv[d];
          }
          for (double& x : part) x /= sum;
          size_t at = (qi * g.batch + b) * g.heads + h;
          merge_row(g.dim, out + at * g.dim, lse + at, part.data(), top + std::log(sum));
        }
    }
}

void attention_block_backward(const AttentionShape& shape, const float* q,
                              std::span<const SeqRun> q_runs, const float* k, const float* v,
                              std::span<const SeqRun> kv_runs, const float* dout, const float* lse,
                              const float* delta, float* dq, float* dk, float* dv) {
  Geometry g = geometry(shape);
  std::vector<size_t> rows;
  std::vector<double> dq_row(g.dim);
  size_t qi = 0;
  for (const SeqRun& run : q_runs)
    for (size_t t = 0; t < run.count; ++t, ++qi) {
      visible_rows(kv_runs, run.begin + t, g.causal, rows);
      if (rows.empty()) continue;
      for (size_t b = 0; b < g.batch; ++b)
        for (size_t h = 0; h < g.heads; ++h) {
          size_t at = (qi * g.batch + b) * g.heads + h;
          if (lse[at] == detail::kNegInf) continue;
          size_t q_off = qi * g.q_stride + (b * g.heads + h) * g.dim;
          size_t kv_off = (b * g.kv_heads + h / g.group) * g.dim;
          const float *qv = q + q_off, *dov = dout + q_off;
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (size_t row : rows) {
            const float *kv = k + row * g.kv_stride + kv_off, *vv = v + row * g.kv_stride + kv_off;
            double p = std::exp(g.scale * dot(qv, kv, g.dim) - lse[at]);
            double ds = p * (dot(dov, vv, g.dim) - delta[at]) * g.scale;
            float *dkv = dk + row * g.kv_stride + kv_off, *dvv = dv + row * g.kv_stride + kv_off;
            for (size_t d = 0; d < g.dim; ++d) {
              dvv[d] += static_cast<float>(p * dov[d]);
              dkv[d] += static_cast<float>(ds * qv[d]);
              dq_row[d] += ds * kv[d];
            }
          }
          for (size_t d = 0; d < g.dim; ++d) dq[q_off + d] += static_cast<float>(dq_row[d]);
        }
    }
}

namespace detail {

void attention_delta(const AttentionShape& shape, size_t rows, const float* dout, const float* out,
                     float* delta) {
  size_t n = rows * shape.batch * shape.heads;
  for (size_t i = 0; i < n; ++i)
    delta[i] = static_cast<float>(
        dot(dout + i * shape.head_dim, out + i * shape.head_dim, shape.head_dim));
}

void merge_partial(const AttentionShape& shape, size_t rows, float* out, float* lse,
                   const float* part, const float* part_lse) {
  size_t n = rows * shape.batch * shape.heads, dim = shape.head_dim;
  for (size_t i = 0; i < n; ++i)
    merge_row(dim, out + i * dim, lse + i, part + i * dim, part_lse[i]);
}

void launch_ring_shift(Inflight& op, const Axis& axis, std::string_view pattern, const float* send,
                       size_t count, float* recv, size_t recv_count) {
  int n = axis.size(), next = (axis.rank() + 1) % n, prev = (axis.rank() + n - 1) % n;
  op.launch(
      axis, pattern, "sendrecv", count * sizeof(float),
      [=](weftComm_t c, weftStream_t s) {
        weftResult_t result = weftGroupStart();
        if (result != weftSuccess) return result;
        weftResult_t sent = weftSend(send, count, weftFloat32, next, c, s);
        weftResult_t got = weftRecv(recv, recv_count, weftFloat32, prev, c, s);
        result = weftGroupEnd();
        if (sent != weftSuccess) return sent;
        return got != weftSuccess ? got : result;
      },
      std::max<size_t>(count * sizeof(float), 1));
}

}  // namespace detail

ContextParallelAttention::ContextParallelAttention(const Axis& axis, const AttentionShape& shape,
                                                   const CpConfig& config)
    : state_(std::make_unique<State>(axis, shape, config)) {
  State& s = *state_;
  using detail::require;
  require(shape.batch > 0, "batch must be positive");
  require(shape.heads > 0, "heads must be positive");
  require(shape.head_dim > 0, "head_dim must be positive");
  size_t kv_heads = shape.kv_heads == 0 ? shape.heads : shape.kv_heads;
  require(shape.heads % kv_heads == 0, "heads (" + std::to_string(shape.heads) +
                                           ") is not a multiple of kv_heads (" +
                                           std::to_string(kv_heads) + ")");
  s.shape.kv_heads = kv_heads;
  require(config.q_seq > 0, "q_seq must be positive");
  if (s.config.kv_seq == 0) s.config.kv_seq = config.q_seq;
  require(s.config.kv_seq >= config.q_seq,
          "kv_seq (" + std::to_string(s.config.kv_seq) + ") is shorter than q_seq (" +
              std::to_string(config.q_seq) + "): the queries are the last positions");
  s.rank = axis.rank();
  s.size = axis.size();
  auto p = static_cast<size_t>(s.size);
  s.algorithm = config.algorithm;
  if (s.algorithm == CpAlgorithm::zigzag) s.config.zigzag = true;
  if (s.algorithm == CpAlgorithm::automatic)
    s.algorithm = choose_cp_algorithm(s.shape, config.q_seq, s.config.kv_seq, s.size);
  if (s.algorithm == CpAlgorithm::ulysses) {
    bool even = shape.heads % p == 0 && kv_heads % p == 0;
    require(shape.heads >= p, "heads (" + std::to_string(shape.heads) +
                                  ") is fewer than the cp size " + std::to_string(p) +
                                  ": ulysses gives every rank at least one head");
    require(even || (config.uneven_heads && kv_heads == shape.heads),
            "heads (" + std::to_string(shape.heads) + ") and kv_heads (" +
                std::to_string(kv_heads) + ") must divide by the cp size " + std::to_string(p) +
                " for ulysses (uneven_heads allows uneven heads when kv_heads = heads)");
  }
  size_t offset = s.config.kv_seq - config.q_seq;
  // hier replaces these shards with its nodes' (zigzag over the nodes).
  bool zigzag = s.config.zigzag && s.algorithm != CpAlgorithm::hier;
  for (int r = 0; r < s.size; ++r) {
    s.q_runs.push_back(cp_shard(config.q_seq, offset, s.size, r, zigzag));
    s.kv_runs.push_back(cp_shard(s.config.kv_seq, 0, s.size, r, zigzag));
    auto rows = [](const std::vector<SeqRun>& runs) {
      size_t n = 0;
      for (const SeqRun& run : runs) n += run.count;
      return n;
    };
    s.q_rows.push_back(rows(s.q_runs.back()));
    s.kv_rows.push_back(rows(s.kv_runs.back()));
  }
  s.max_q = *std::max_element(s.q_rows.begin(), s.q_rows.end());
  s.max_kv = *std::max_element(s.kv_rows.begin(), s.kv_rows.end());
  s.q_stride = shape.batch * shape.heads * shape.head_dim;
  s.kv_stride = shape.batch * kv_heads * shape.head_dim;
  s.lse_stride = shape.batch * shape.heads;
  if (s.algorithm == CpAlgorithm::hier) detail::hier_setup(s);
}

ContextParallelAttention::~ContextParallelAttention() = default;

CpAlgorithm ContextParallelAttention::algorithm() const {
  return state_->algorithm;
}
const std::vector<SeqRun>& ContextParallelAttention::q_runs(int rank) const {
  return state_->q_runs.at(rank);
}
const std::vector<SeqRun>& ContextParallelAttention::kv_runs(int rank) const {
  return state_->kv_runs.at(rank);
}
size_t ContextParallelAttention::q_rows() const {
  return state_->q_rows[state_->rank];
}
size_t ContextParallelAttention::kv_rows() const {
  return state_->kv_rows[state_->rank];
}

void ContextParallelAttention::forward(std::span<const float> q, std::span<const float> k,
                                       std::span<const float> v, std::span<float> out) {
  State& s = *state_;
  size_t nq = q_rows() * s.q_stride, nkv = kv_rows() * s.kv_stride;
  detail::require_size("q", q.size(), nq);
  detail::require_size("k", k.size(), nkv);
  detail::require_size("v", v.size(), nkv);
  detail::require_size("out", out.size(), nq);
  s.q.assign(q.begin(), q.end());
  s.kv.assign(k.begin(), k.end());
  s.kv.insert(s.kv.end(), v.begin(), v.end());
  s.out.assign(nq, 0.0f);
  s.lse.assign(q_rows() * s.lse_stride, detail::kNegInf);
  switch (s.algorithm) {
    case CpAlgorithm::passq:
      detail::passq_forward(s);
      break;
    case CpAlgorithm::allgather:
      detail::allgather_forward(s);
      break;
    case CpAlgorithm::ulysses:
      detail::ulysses_forward(s);
      break;
    case CpAlgorithm::hier:
      detail::hier_forward(s);
      break;
    default:
      detail::ring_forward(s);
      break;
  }
  std::copy(s.out.begin(), s.out.end(), out.begin());
  s.forwarded = true;
}

void ContextParallelAttention::backward(std::span<const float> dout, std::span<float> dq,
                                        std::span<float> dk, std::span<float> dv) {
  State& s = *state_;
  detail::require(s.forwarded, "backward before forward");
  size_t nq = q_rows() * s.q_stride, nkv = kv_rows() * s.kv_stride;
  detail::require_size("dout", dout.size(), nq);
  detail::require_size("dq", dq.size(), nq);
  detail::require_size("dk", dk.size(), nkv);
  detail::require_size("dv", dv.size(), nkv);
  std::fill(dq.begin(), dq.end(), 0.0f);
  std::vector<float> dkv(2 * nkv, 0.0f);
  switch (s.algorithm) {
    case CpAlgorithm::passq:
      detail::passq_backward(s, dout.data(), dq.data(), dkv.data());
      break;
    case CpAlgorithm::allgather:
      detail::allgather_backward(s, dout.data(), dq.data(), dkv.data());
      break;
    case CpAlgorithm::ulysses:
      detail::ulysses_backward(s, dout.data(), dq.data(), dkv.data());
      break;
    case CpAlgorithm::hier:
      detail::hier_backward(s, dout.data(), dq.data(), dkv.data());
      break;
    default:
      detail::ring_backward(s, dout.data(), dq.data(), dkv.data());
      break;
  }
  std::copy(dkv.begin(), dkv.begin() + nkv, dk.begin());
  std::copy(dkv.begin() + nkv, dkv.end(), dv.begin());
}

}  // namespace weft::parallel
