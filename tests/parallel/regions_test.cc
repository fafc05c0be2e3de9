// The TP and SP region operations, forward and backward, against a dense
// single-process computation: every dtype, odd and uneven shapes, any dim.
#include <functional>
#include <numeric>
#include <string>

#include "parallel/support.h"
#include "support/typed_values.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::Pass;
using parallel::Tensor;

constexpr weftDataType_t kDtypes[] = {weftInt8,    weftUint8,    weftInt32,      weftUint32,
                                      weftInt64,   weftUint64,   weftFloat16,    weftFloat32,
                                      weftFloat64, weftBfloat16, weftFloat8e4m3, weftFloat8e5m2};

struct Case {
  std::vector<size_t> shape;  // the full tensor
  int dim;
  std::vector<size_t> sizes;  // empty: the default split
};

// Small values whose sums over 8 ranks are exact in every dtype (fp8 holds
// integers to 8 exactly in both formats).
double value(weftDataType_t dtype, int source, size_t index) {
  int mod = (dtype == weftFloat8e4m3 || dtype == weftFloat8e5m2) ? 2 : 5;
  return static_cast<double>((source * 3 + index * 7 + 1) % mod);
}

struct Buffer {
  std::vector<uint8_t> bytes;
  Tensor tensor;
  Buffer(weftDataType_t dtype, std::vector<size_t> shape) {
    tensor.shape = std::move(shape);
    tensor.dtype = dtype;
    bytes.assign(tensor.numel() * dtype_size(dtype) + 1, 0xab);  // never empty
    tensor.data = bytes.data();
  }
  void fill(const std::function<double(size_t)>& f) {
    for (size_t i = 0; i < tensor.numel(); ++i) store_value(tensor.dtype, tensor.data, i, f(i));
  }
  double at(size_t i) const { return load_value(tensor.dtype, tensor.data, i); }
};

// The dense slicing rule: full index -> (owning rank, index in its piece).
struct Slicer {
  std::vector<size_t> shape, sizes, offsets;
  size_t inner = 1, extent = 0;
  int d = 0;
  Slicer(const Case& c, int nranks) : shape(c.shape) {
    d = c.dim < 0 ? c.dim + static_cast<int>(shape.size()) : c.dim;
    extent = shape[d];
    sizes = c.sizes.empty() ? parallel::split_sizes(extent, nranks) : c.sizes;
    offsets.assign(sizes.size(), 0);
    std::partial_sum(sizes.begin(), sizes.end() - 1, offsets.begin() + 1);
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  }
  std::vector<size_t> piece_shape(int rank) const {
    std::vector<size_t> piece = shape;
    piece[d] = sizes[rank];
    return piece;
  }
  // -1 when another rank owns index i.
  long local_index(size_t i, int rank) const {
    size_t c = (i / inner) % extent, outer = i / inner / extent;
    if (c < offsets[rank] || c >= offsets[rank] + sizes[rank]) return -1;
    return static_cast<long>((outer * sizes[rank] + c - offsets[rank]) * inner + i % inner);
  }
};

size_t numel_of(const std::vector<size_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), size_t{1}, std::multiplies<>());
}

void check_all(const Axis& axis, weftDataType_t dtype, const Case& c) {
  int n = axis.size(), rank = axis.rank();
  Slicer slicer(c, n);
  size_t full = numel_of(c.shape);
  auto sum_over_ranks = [&](size_t i) {
    double total = 0;
    for (int r = 0; r < n; ++r) total += value(dtype, r, i);
    return total;
  };
  std::string where = "dtype " + std::to_string(dtype) + " dim " + std::to_string(c.dim) +
                      " extent " + std::to_string(slicer.extent);
  // The dense tensor X every rank knows, and each rank's own contribution Y_r.
  Buffer x(dtype, c.shape), y(dtype, c.shape), piece(dtype, slicer.piece_shape(rank));
  x.fill([&](size_t i) { return value(dtype, 11, i); });
  y.fill([&](size_t i) { return value(dtype, rank, i); });
  piece.fill([](size_t) { return 0.0; });
  std::span<const size_t> sizes(c.sizes);

  auto expect_full = [&](const Buffer& out, const std::function<double(size_t)>& want,
                         const char* op) {
    for (size_t i = 0; i < full; ++i)
      ASSERT_EQ(out.at(i), want(i)) << op << " " << where << " element " << i;
  };
  auto expect_piece = [&](const Buffer& out, const std::function<double(size_t)>& want,
                          const char* op) {
    for (size_t i = 0; i < full; ++i) {
      long local = slicer.local_index(i, rank);
      if (local >= 0) {
        ASSERT_EQ(out.at(static_cast<size_t>(local)), want(i))
            << op << " " << where << " element " << i;
      }
    }
  };
  auto own_x = [&]() {
    Buffer own(dtype, slicer.piece_shape(rank));
    for (size_t i = 0; i < full; ++i) {
      long local = slicer.local_index(i, rank);
      if (local >= 0) store_value(dtype, own.tensor.data, static_cast<size_t>(local), x.at(i));
    }
    return own;
  };
  auto x_at = [&](size_t i) { return x.at(i); };

  Buffer out(dtype, c.shape);
  // Identity / AllReduce pairs.
  parallel::copy_to_tp(axis, Pass::forward, y.tensor, out.tensor);
  expect_full(
      out, [&](size_t i) { return value(dtype, rank, i); }, "copy_to_tp forward");
  parallel::copy_to_tp(axis, Pass::backward, y.tensor, out.tensor);
  expect_full(out, sum_over_ranks, "copy_to_tp backward");
  parallel::reduce_from_tp(axis, Pass::forward, y.tensor, out.tensor);
  expect_full(out, sum_over_ranks, "reduce_from_tp forward");
  parallel::reduce_from_tp(axis, Pass::backward, y.tensor, out.tensor);
  expect_full(
      out, [&](size_t i) { return value(dtype, rank, i); }, "reduce_from_tp backward");

  // Split / AllGather pairs, TP (last dim by default, here any) and SP.
  Buffer own = own_x();
  using SplitOp =
      void (*)(const Axis&, Pass, const Tensor&, const Tensor&, int, std::span<const size_t>);
  for (auto [op, name] : {std::pair<SplitOp, const char*>{parallel::scatter_to_tp, "scatter_to_tp"},
                          {parallel::scatter_to_sp, "scatter_to_sp"}}) {
    op(axis, Pass::forward, x.tensor, piece.tensor, c.dim, sizes);
    expect_piece(piece, x_at, name);
    out.fill([](size_t) { return 99.0; });
    op(axis, Pass::backward, own.tensor, out.tensor, c.dim, sizes);
    expect_full(out, x_at, name);
  }
  parallel::gather_from_tp(axis, Pass::forward, own.tensor, out.tensor, c.dim, sizes);
  expect_full(out, x_at, "gather_from_tp forward");
  parallel::gather_from_tp(axis, Pass::backward, x.tensor, piece.tensor, c.dim, sizes);
  expect_piece(piece, x_at, "gather_from_tp backward");

  // AllGather / ReduceScatter pairs (SP).
  parallel::gather_from_sp(axis, Pass::forward, own.tensor, out.tensor, c.dim, sizes);
  expect_full(out, x_at, "gather_from_sp forward");
  parallel::gather_from_sp(axis, Pass::backward, y.tensor, piece.tensor, c.dim, sizes);
  expect_piece(piece, sum_over_ranks, "gather_from_sp backward");
  parallel::reduce_scatter_to_sp(axis, Pass::forward, y.tensor, piece.tensor, c.dim, sizes);
  expect_piece(piece, sum_over_ranks, "reduce_scatter_to_sp forward");
  out.fill([](size_t) { return 99.0; });
  parallel::reduce_scatter_to_sp(axis, Pass::backward, own.tensor, out.tensor, c.dim, sizes);
  expect_full(out, x_at, "reduce_scatter_to_sp backward");
}

std::vector<Case> cases_for(int n) {
  auto u = static_cast<size_t>(n);
  return {
      {{2 * u, 3}, 0, {}},             // even, outermost: the collective runs in place
      {{5, 2 * u + 1, 3}, 1, {}},      // uneven, a middle dim
      {{3, 2, 2 * u + 3}, -1, {}},     // uneven, last dim
      {{2, 7}, 0, {}},                 // fewer rows than some rank counts: empty pieces
      {{1, 3 * u, 2}, 1, {}},          // leading extent 1: still direct
      {{4, u}, 1, n > 1 ? [&] {  // explicit sizes (they sum to n), rank 0 empty
         std::vector<size_t> s(u, 1);
         s[0] = 0;
         s[1] = 2;
         return s;
       }()
                                       : std::vector<size_t>{}},
  };
}

class Regions : public ::testing::TestWithParam<int> {};

TEST_P(Regions, ForwardAndBackwardMatchTheDenseComputation) {
  int nranks = GetParam();
  run_ranks(nranks, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = tp_mesh(world);
    parallel::Ledger ledger;
    Axis tp(mesh, "tp", &ledger);
    ASSERT_EQ(tp.size(), context.nranks);
    std::vector<Case> cases = cases_for(context.nranks);
    // Few dtypes at 8 ranks: every rank count already covers the layouts.
    std::vector<weftDataType_t> dtypes(std::begin(kDtypes), std::end(kDtypes));
    if (context.nranks == 8) dtypes = {weftInt8, weftBfloat16, weftFloat8e5m2, weftFloat64};
    for (weftDataType_t dtype : dtypes)
      for (const Case& c : cases) {
        check_all(tp, dtype, c);
        if (::testing::Test::HasFatalFailure()) return;
      }
    // The ledger: two AllReduces per case and dtype, nothing on one rank.
    size_t allreduces = 0;
    for (const auto& entry : ledger.entries())
      if (entry.primitive == "allreduce") allreduces += entry.calls;
    EXPECT_EQ(allreduces, context.nranks == 1 ? 0 : 2 * dtypes.size() * cases.size());
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Regions, ::testing::Values(1, 2, 3, 4, 8));

TEST(RegionErrors, BadShapesAndSizesAreNamedWithoutHanging) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh = tp_mesh(world);
    Axis tp(mesh, "tp");
    std::vector<float> a(12), b(5);
    // Every check fails before any communication, on every rank alike.
    expect_error(
        [&] {
          parallel::copy_to_tp(tp, Pass::backward, parallel::view(a.data(), {12}),
                               parallel::view(b.data(), {5}));
        },
        "does not hold");
    expect_error(
        [&] {
          parallel::gather_from_tp(tp, Pass::forward, parallel::view(b.data(), {5}),
                                   parallel::view(a.data(), {12}), 0);
        },
        "piece of rank");
    std::vector<size_t> sizes = {4, 4};
    expect_error(
        [&] {
          parallel::gather_from_sp(tp, Pass::forward, parallel::view(b.data(), {4}),
                                   parallel::view(a.data(), {12}), 0, sizes);
        },
        "sizes sum to 8");
    expect_error(
        [&] {
          parallel::scatter_to_sp(tp, Pass::forward, parallel::view(a.data(), {12}),
                                  parallel::view(b.data(), {6}), 2);
        },
        "dim 2 is out of range");
    tp.comm();  // still usable afterwards
    std::vector<float> ones(3, 1.0f), sum(3);
    parallel::reduce_from_tp(tp, Pass::forward, parallel::view(ones.data(), {3}),
                             parallel::view(sum.data(), {3}));
    EXPECT_EQ(sum, std::vector<float>(3, 2.0f));
  });
}

}  // namespace
}  // namespace weft::testing
