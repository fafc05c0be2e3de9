// The CUDA kernels' element functors, run on the CPU: every dtype × op
// (PreMulSum with a host or device scalar and Avg included) through the same
// work-item code the kernel runs (16-byte packs, scalar heads and tails),
// compared bit for bit with Weft's host reduction kernels. No GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>

#include "core/cuda/functors.h"
#include "core/reduce/kernel_table.h"
#include "core/reduce/numeric_types.h"
#include "cuda/reduce_cases.h"

namespace weft::cuda {
namespace {

using testing::Math;

// 16-byte aligned storage with room for an offset of a few elements.
struct Buffer {
  explicit Buffer(size_t bytes)
      : base(static_cast<uint8_t*>(std::aligned_alloc(16, bytes + 64)), &std::free) {}
  std::unique_ptr<uint8_t, decltype(&std::free)> base;
  uint8_t* at(size_t offset) const { return base.get() + offset; }
};

// Runs the kernel's work items on the CPU, in an order unlike the GPU's (last
// first), which the result must not depend on.
template <weftDataType_t D>
void run_items(const ReduceParams& p) {
  using E = Element<D>;
  typename E::S scale{};
  if (p.premul) scale = E::scalar(p);
  for (uint64_t w = E::items(p); w-- > 0;) E::item(p, scale, w);
}

struct Shape {
  int n;
  size_t count;
  size_t in_offset;   // elements each input starts after a 16-byte boundary
  size_t out_offset;  // the same for the output
};

void check(weftDataType_t t, Math m, const Shape& s, uint64_t seed) {
  SCOPED_TRACE(std::string(reduce::dtype_name(t)) + " " + testing::math_name(m) + " n " +
               std::to_string(s.n) + " count " + std::to_string(s.count) + " offsets " +
               std::to_string(s.in_offset) + "/" + std::to_string(s.out_offset));
  std::mt19937_64 rng(seed);
  size_t size = reduce::dtype_size(t);
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<Buffer> stores;
  ReduceParams p{};
  for (int k = 0; k < s.n; ++k) {
    inputs.push_back(testing::random_elements(t, s.count, rng));
    stores.emplace_back(s.count * size);
    memcpy(stores.back().at(s.in_offset * size), inputs.back().data(), s.count * size);
    p.in[k] = stores.back().at(s.in_offset * size);
  }
  std::vector<uint8_t> scalar = testing::premul_scalar(t, rng);
  Buffer out(s.count * size);
  p.out = out.at(s.out_offset * size);
  p.n = s.n;
  p.count = s.count;
  p.op = testing::op_of(m);
  p.premul = testing::is_premul(m);
  if (m == Math::PreMulHost) memcpy(p.scalar, scalar.data(), size);
  if (m == Math::PreMulDevice) p.scalar_source = scalar.data();
  if (m == Math::Avg) p.divisor = static_cast<uint64_t>(s.n);
  plan_packs(p, size);
  if (s.in_offset == s.out_offset && s.count >= 64) {
    EXPECT_GT(p.packs, 0u) << "aligned pointers take the 16-byte path";
  }
  with_dtype(t, [&](auto d) { run_items<d.value>(p); });
  std::vector<uint8_t> want = testing::host_reduce(t, m, inputs, scalar.data(), s.count);
  EXPECT_EQ(testing::first_difference(t, static_cast<uint8_t*>(p.out), want.data(), s.count), "");
}

class FunctorTest : public ::testing::TestWithParam<weftDataType_t> {};

TEST_P(FunctorTest, EveryOpMatchesTheHostKernelsBitForBit) {
  const Shape shapes[] = {
      {1, 1, 0, 0},  {2, 1000, 0, 0}, {3, 257, 1, 1}, {2, 131, 0, 3},
      {5, 77, 2, 0}, {8, 333, 3, 3},  {4, 0, 0, 0},
  };
  uint64_t seed = 1 + static_cast<uint64_t>(GetParam()) * 100;
  for (Math m : testing::kMaths)
    for (const Shape& s : shapes) check(GetParam(), m, s, seed++);
}

// In place: the output is the first input, as a reduce into the receive buffer.
TEST_P(FunctorTest, OutputMayAliasTheFirstInput) {
  weftDataType_t t = GetParam();
  size_t size = reduce::dtype_size(t), count = 203;
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint8_t>> inputs = {testing::random_elements(t, count, rng),
                                              testing::random_elements(t, count, rng)};
  std::vector<uint8_t> want = testing::host_reduce(t, Math::Sum, inputs, nullptr, count);
  Buffer a(count * size), b(count * size);
  memcpy(a.at(size), inputs[0].data(), count * size);
  memcpy(b.at(size), inputs[1].data(), count * size);
  ReduceParams p{};
  p.in[0] = p.out = a.at(size);
  p.in[1] = b.at(size);
  p.n = 2;
  p.count = count;
  p.op = reduce::Op::Sum;
  plan_packs(p, size);
  with_dtype(t, [&](auto d) { run_items<d.value>(p); });
  EXPECT_EQ(testing::first_difference(t, a.at(size), want.data(), count), "");
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, FunctorTest, ::testing::ValuesIn(testing::kDtypes),
                         [](const auto& info) {
                           return std::string(reduce::dtype_name(info.param));
                         });

// Every pair of 8-bit floats under every op, and a sweep of fp16/bf16 pairs.
TEST(FunctorExhaustive, NarrowPairs) {
  for (weftDataType_t t : {weftFloat8e4m3, weftFloat8e5m2, weftFloat16, weftBfloat16}) {
    size_t size = reduce::dtype_size(t);
    size_t count = 65536;
    std::vector<uint8_t> a(count * size), b(count * size), got(count * size), want(count * size);
    std::mt19937_64 rng(11);
    for (size_t i = 0; i < count; ++i) {
      uint64_t x = size == 1 ? i & 0xff : rng(), y = size == 1 ? i >> 8 : rng();
      memcpy(&a[i * size], &x, size);
      memcpy(&b[i * size], &y, size);
    }
    for (int op = 0; op < reduce::kNumOps; ++op) {
      SCOPED_TRACE(std::string(reduce::dtype_name(t)) + " op " + std::to_string(op));
      reduce::apply(t, static_cast<reduce::Op>(op), want.data(), a.data(), b.data(), count);
      with_dtype(t, [&](auto d) {
        using R = Reducer<d.value>;
        for (size_t i = 0; i < count; ++i) {
          typename R::S x, y;
          memcpy(&x, &a[i * size], size);
          memcpy(&y, &b[i * size], size);
          typename R::S r = R::apply(static_cast<reduce::Op>(op), x, y);
          memcpy(&got[i * size], &r, size);
        }
      });
      EXPECT_EQ(testing::first_difference(t, got.data(), want.data(), count), "");
    }
  }
}

// CUDA's conversions against Weft's codec: every narrow pattern to float, and
// floats (a sweep of bit patterns through every exponent, ties included) back.
TEST(FunctorConversions, AgreeWithTheHostCodec) {
  for (weftDataType_t t : {weftFloat8e4m3, weftFloat8e5m2, weftFloat16, weftBfloat16}) {
    SCOPED_TRACE(reduce::dtype_name(t));
    const reduce::KernelTable& host = reduce::kernels(reduce::Isa::Scalar);
    size_t size = reduce::dtype_size(t);
    uint32_t patterns = size == 1 ? 256 : 65536;
    std::vector<float> want(patterns);
    std::vector<uint8_t> codes(patterns * size);
    for (uint32_t c = 0; c < patterns; ++c) memcpy(&codes[c * size], &c, size);
    host.to_float[t](want.data(), codes.data(), patterns);
    with_dtype(t, [&](auto d) {
      using Traits = Dtype<d.value>;
      int wrong = 0;
      for (uint32_t c = 0; c < patterns; ++c) {
        float got = Traits::load(static_cast<typename Traits::Storage>(c));
        bool same = std::isnan(want[c]) ? std::isnan(got)
                                        : bits_as<uint32_t>(got) == bits_as<uint32_t>(want[c]);
        wrong += !same;
      }
      EXPECT_EQ(wrong, 0) << "decoded patterns differ";
      // Floats to encode: a sweep of bit patterns, and the exact midpoints
      // between neighbouring narrow values (the ties to even).
      std::vector<float> floats;
      for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093)
        floats.push_back(bits_as<float>(static_cast<uint32_t>(u)));
      for (uint32_t c = 0; c + 1 < patterns; ++c) {
        float mid = (want[c] + want[c + 1]) * 0.5f;
        floats.push_back(mid);
        floats.push_back(std::nextafter(mid, 0.0f));
      }
      wrong = 0;
      for (float f : floats) {
        if (std::isnan(f)) continue;  // store() writes NaN as the canonical NaN itself
        typename Traits::Storage theirs{};
        host.from_float[t](&theirs, &f, 1);
        wrong += Traits::store(f) != theirs;
      }
      EXPECT_EQ(wrong, 0) << "encoded floats differ";
    });
  }
}

}  // namespace
}  // namespace weft::cuda
