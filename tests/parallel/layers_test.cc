// Column/row-parallel linears (with and without SP), the vocabulary-parallel
// embedding and cross-entropy against the dense single-process computation.
#include <cmath>
#include <functional>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;

// C = A·Bᵀ (+ bias) in double, written apart from the library's GEMM.
std::vector<float> matmul_bt(const std::vector<float>& a, const std::vector<float>& b, size_t m,
                             size_t n, size_t k, const std::vector<float>* bias = nullptr) {
  std::vector<float> c(m * n);
  for (size_t i = 0; i < m; ++i)
    for (size_t j = 0; j < n; ++j) {
      double sum = bias ? (*bias)[j] : 0.0;
      for (size_t p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[j * k + p];
      c[i * n + j] = static_cast<float>(sum);
    }
  return c;
}

std::vector<float> transpose(const std::vector<float>& a, size_t rows, size_t cols) {
  std::vector<float> t(a.size());
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// Rows [begin, begin + count) and columns [cbegin, cbegin + ccount) of a [rows, cols] matrix.
std::vector<float> block(const std::vector<float>& a, size_t cols, size_t begin, size_t count,
                         size_t cbegin, size_t ccount) {
  std::vector<float> out;
  for (size_t i = begin; i < begin + count; ++i)
    for (size_t j = cbegin; j < cbegin + ccount; ++j) out.push_back(a[i * cols + j]);
  return out;
}

std::vector<float> column_sums(const std::vector<float>& a, size_t rows, size_t cols,
                               size_t begin = 0, size_t count = SIZE_MAX) {
  count = std::min(count, rows - begin);
  std::vector<float> sums(cols, 0.0f);
  for (size_t i = begin; i < begin + count; ++i)
    for (size_t j = 0; j < cols; ++j) sums[j] += a[i * cols + j];
  return sums;
}

constexpr double kTolerance = 1e-5;
constexpr size_t kTokens = 12, kIn = 6, kOut = 12;

void column_case(const Axis& tp, bool sp, bool gather) {
  size_t n = tp.size(), r = tp.rank(), lo = kOut / n, rows = kTokens / n;
  auto x = random_floats(kTokens * kIn, 1), w = random_floats(kOut * kIn, 2),
       b = random_floats(kOut, 3), dy = random_floats(kTokens * kOut, 4);
  parallel::LinearOptions options;
  options.sequence_parallel = sp;
  options.gather_output = gather;
  parallel::ColumnParallelLinear layer(tp, kIn, kOut, options);
  ASSERT_EQ(layer.local_out(), lo);
  auto w_r = block(w, kIn, r * lo, lo, 0, kIn), b_r = block(b, kOut, 0, 1, r * lo, lo);
  auto x_in = sp ? block(x, kIn, r * rows, rows, 0, kIn) : x;
  std::vector<float> y(kTokens * (gather ? kOut : lo));
  layer.forward(x_in, kTokens, w_r, b_r, y);
  auto y_full = matmul_bt(x, w, kTokens, kOut, kIn, &b);
  std::string what =
      std::string("column sp=") + (sp ? "1" : "0") + " gather=" + (gather ? "1" : "0");
  expect_close(y, gather ? y_full : block(y_full, kOut, 0, kTokens, r * lo, lo), kTolerance,
               (what + " y").c_str());

  auto dy_in = gather ? dy : block(dy, kOut, 0, kTokens, r * lo, lo);
  std::vector<float> dx(x_in.size()), dw(w_r.size(), 0.0f), db(lo, 0.0f);
  layer.backward(dy_in, w_r, dx, dw, db);
  // dense: dx = dy·W, dW = dyᵀ·x, db = column sums of dy
  auto dx_full = matmul_bt(dy, transpose(w, kOut, kIn), kTokens, kIn, kOut);
  expect_close(dx, sp ? block(dx_full, kIn, r * rows, rows, 0, kIn) : dx_full, kTolerance,
               (what + " dx").c_str());
  auto dw_full =
      matmul_bt(transpose(dy, kTokens, kOut), transpose(x, kTokens, kIn), kOut, kIn, kTokens);
  expect_close(dw, block(dw_full, kIn, r * lo, lo, 0, kIn), kTolerance, (what + " dW").c_str());
  expect_close(db, block(column_sums(dy, kTokens, kOut), kOut, 0, 1, r * lo, lo), kTolerance,
               (what + " db").c_str());
}

void row_case(const Axis& tp, bool sp) {
  size_t n = tp.size(), r = tp.rank(), li = kOut / n, rows = kTokens / n;
  // in = kOut (the column's output), out = kIn
  auto x = random_floats(kTokens * kOut, 5), w = random_floats(kIn * kOut, 6),
       b = random_floats(kIn, 7), dy = random_floats(kTokens * kIn, 8);
  parallel::LinearOptions options;
  options.sequence_parallel = sp;
  parallel::RowParallelLinear layer(tp, kOut, kIn, options);
  auto x_r = block(x, kOut, 0, kTokens, r * li, li), w_r = block(w, kOut, 0, kIn, r * li, li);
  std::vector<float> y((sp ? rows : kTokens) * kIn);
  layer.forward(x_r, kTokens, w_r, b, y);
  auto y_full = matmul_bt(x, w, kTokens, kIn, kOut, &b);
  std::string what = std::string("row sp=") + (sp ? "1" : "0");
  expect_close(y, sp ? block(y_full, kIn, r * rows, rows, 0, kIn) : y_full, kTolerance,
               (what + " y").c_str());
  auto dy_in = sp ? block(dy, kIn, r * rows, rows, 0, kIn) : dy;
  std::vector<float> dx(x_r.size()), dw(w_r.size(), 0.0f), db(kIn, 0.0f);
  layer.backward(dy_in, w_r, dx, dw, db);
  auto dx_full = matmul_bt(dy, transpose(w, kIn, kOut), kTokens, kOut, kIn);
  expect_close(dx, block(dx_full, kOut, 0, kTokens, r * li, li), kTolerance,
               (what + " dx").c_str());
  auto dw_full =
      matmul_bt(transpose(dy, kTokens, kIn), transpose(x, kTokens, kOut), kIn, kOut, kTokens);
  expect_close(dw, block(dw_full, kOut, 0, kIn, r * li, li), kTolerance, (what + " dW").c_str());
  // With SP the bias gradient is this rank's rows' partial sum.
  expect_close(db,
               sp ? column_sums(dy, kTokens, kIn, r * rows, rows) : column_sums(dy, kTokens, kIn),
               kTolerance, (what + " db").c_str());
}

void vocab_case(const Axis& tp, bool sp) {
  size_t n = tp.size(), r = tp.rank(), vocab = 12, hidden = 5, lv = vocab / n, rows = kTokens / n;
  std::vector<int32_t> ids(kTokens);
  for (size_t t = 0; t < kTokens; ++t) ids[t] = static_cast<int32_t>((t * 7 + 3) % vocab);
  auto table = random_floats(vocab * hidden, 9), dout = random_floats(kTokens * hidden, 10);
  parallel::VocabParallelEmbedding embedding(tp, vocab, hidden, sp);
  ASSERT_EQ(embedding.vocab_begin(), r * lv);
  auto owned = block(table, hidden, r * lv, lv, 0, hidden);
  std::vector<float> out((sp ? rows : kTokens) * hidden);
  embedding.forward(ids, owned, out);
  std::vector<float> dense;
  for (int32_t id : ids)
    for (size_t j = 0; j < hidden; ++j) dense.push_back(table[id * hidden + j]);
  EXPECT_EQ(out, sp ? block(dense, hidden, r * rows, rows, 0, hidden) : dense);  // exact: x + 0
  std::vector<float> grad(owned.size(), 0.0f), want(vocab * hidden, 0.0f);
  embedding.backward(sp ? block(dout, hidden, r * rows, rows, 0, hidden) : dout, grad);
  for (size_t t = 0; t < kTokens; ++t)
    for (size_t j = 0; j < hidden; ++j) want[ids[t] * hidden + j] += dout[t * hidden + j];
  expect_close(grad, block(want, hidden, r * lv, lv, 0, hidden), kTolerance, "embedding grad");
  std::vector<int32_t> bad = {0, 12};
  EXPECT_THROW(embedding.forward(bad, owned, out), weft::Error);

  // Cross-entropy over logits [tokens, vocab] sharded on vocab.
  auto logits = random_floats(kTokens * vocab, 11), dloss = random_floats(kTokens, 12);
  for (float& l : logits) l *= 4.0f;
  parallel::VocabParallelCrossEntropy loss_fn(tp, vocab);
  std::vector<float> loss(kTokens), dlogits(kTokens * lv);
  loss_fn.forward(block(logits, vocab, 0, kTokens, r * lv, lv), ids, loss);
  std::vector<float> want_loss(kTokens), want_grad(kTokens * vocab);
  for (size_t t = 0; t < kTokens; ++t) {
    double max = -1e30, sum = 0;
    for (size_t v = 0; v < vocab; ++v)
      max = std::max(max, static_cast<double>(logits[t * vocab + v]));
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(logits[t * vocab + v] - max);
    want_loss[t] = static_cast<float>(std::log(sum) + max - logits[t * vocab + ids[t]]);
    for (size_t v = 0; v < vocab; ++v)
      want_grad[t * vocab + v] = static_cast<float>(
          (std::exp(logits[t * vocab + v] - max) / sum - (v == static_cast<size_t>(ids[t]))) *
          dloss[t]);
  }
  expect_close(loss, want_loss, kTolerance, "cross-entropy loss");
  loss_fn.backward(dloss, dlogits);
  expect_close(dlogits, block(want_grad, vocab, 0, kTokens, r * lv, lv), kTolerance,
               "cross-entropy dlogits");
}

class Layers : public ::testing::TestWithParam<int> {};

TEST_P(Layers, MatchTheDenseComputation) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = tp_mesh(world);
    parallel::Ledger ledger;
    Axis tp(mesh, "tp", &ledger);
    for (bool sp : {false, true}) {
      column_case(tp, sp, false);
      row_case(tp, sp);
      vocab_case(tp, sp);
    }
    column_case(tp, false, true);
    // The overlapped backward collectives were booked (with their time).
    auto calls = [&](const char* pattern, const char* primitive) {
      size_t total = 0;
      for (const auto& e : ledger.entries())
        if (e.pattern == pattern && e.primitive == primitive) {
          total += e.calls;
          EXPECT_GE(e.comm_s, e.exposed_s);
        }
      return total;
    };
    bool parallel = context.nranks > 1;
    EXPECT_EQ(calls("tp.copy_to", "allreduce"), parallel ? 2u : 0u);
    EXPECT_EQ(calls("sp.regather", "allgather"), parallel ? 1u : 0u);
    EXPECT_EQ(calls("sp.gather_from", "reducescatter"), parallel ? 1u : 0u);
    EXPECT_EQ(calls("tp.reduce_from", "allreduce"), parallel ? 1u : 0u);
    EXPECT_EQ(calls("tp.cross_entropy", "allreduce"), parallel ? 6u : 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Layers, ::testing::Values(1, 2, 3, 4));

TEST(LayerErrors, IndivisibleFeaturesAndTokensAreNamed) {
  run_ranks(3, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = tp_mesh(world);
    Axis tp(mesh, "tp");
    expect_error([&] { parallel::ColumnParallelLinear bad(tp, 4, 10); },
                 "out_features=10 does not divide by the 3 ranks");
    parallel::LinearOptions options;
    options.sequence_parallel = true;
    parallel::ColumnParallelLinear column(tp, 2, 3, options);
    std::vector<float> x(2 * 2), w(2), b(1), y(4);
    expect_error([&] { column.forward(x, 4, w, b, y); }, "tokens=4 does not divide");
    expect_error([&] { parallel::VocabParallelEmbedding bad(tp, 10, 4); }, "vocab=10");
    expect_error(
        [&] {
          parallel::RowParallelLinear bad(tp, 3, 3, {true, false, true, {}});
        },
        "gather_output applies to the column-parallel linear only");
  });
}

}  // namespace
}  // namespace weft::testing
