// The reduction kernels: every dtype x op x instruction set against an
// element-by-element reference, and every SIMD variant bit for bit against
// the scalar one.
#include "core/reduce/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/reduce/kernel_table.h"
#include "core/reduce/numeric_types.h"
#include "reduce/reference.h"

namespace weft::reduce {
namespace {

constexpr weftDataType_t kDtypes[] = {weftInt8,    weftUint8,    weftInt32,      weftUint32,
                                      weftInt64,   weftUint64,   weftFloat16,    weftFloat32,
                                      weftFloat64, weftBfloat16, weftFloat8e4m3, weftFloat8e5m2};
constexpr Op kOps[] = {Op::Sum, Op::Prod, Op::Max, Op::Min};
constexpr size_t kCounts[] = {0, 1, 7, 33, 1001, 4099};
constexpr size_t kGuard = 16;  // bytes checked untouched past the end
constexpr uint8_t kSentinel = 0xa5;

const char* op_name(Op op) {
  constexpr const char* kNames[] = {"sum", "prod", "max", "min"};
  return kNames[static_cast<int>(op)];
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

bool is_signed_int(weftDataType_t t) {
  return t == weftInt8 || t == weftInt32 || t == weftInt64;
}
bool is_int(weftDataType_t t) {
  return is_signed_int(t) || t == weftUint8 || t == weftUint32 || t == weftUint64;
}

uint64_t load_bits(const uint8_t* p, size_t i, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p + i * size, size);
  return v;
}
void store_bits(uint8_t* p, size_t i, size_t size, uint64_t v) {
  std::memcpy(p + i * size, &v, size);
}
uint64_t mask_of(size_t size) {
  return size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1;
}
int64_t sign_extend(uint64_t v, size_t size) {
  int shift = 64 - 8 * static_cast<int>(size);
  return static_cast<int64_t>(v << shift) >> shift;
}

// Narrow conversions (numeric_types_test checks them against the textbook).
float narrow_to_float(weftDataType_t t, uint64_t bits) {
  switch (t) {
    case weftFloat16:
      return fp16_to_float(static_cast<uint16_t>(bits));
    case weftBfloat16:
      return bf16_to_float(static_cast<uint16_t>(bits));
    case weftFloat8e4m3:
      return fp8e4m3_to_float(static_cast<uint8_t>(bits));
    default:
      return fp8e5m2_to_float(static_cast<uint8_t>(bits));
  }
}
uint64_t float_to_narrow(weftDataType_t t, float x) {
  switch (t) {
    case weftFloat16:
      return float_to_fp16(x);
    case weftBfloat16:
      return float_to_bf16(x);
    case weftFloat8e4m3:
      return float_to_fp8e4m3(x);
    default:
      return float_to_fp8e5m2(x);
  }
}

// The documented semantics, one element at a time. fp32 results are computed
// in double and rounded once, which equals the correctly rounded fp32 result
// for + * / (53 >= 2 * 24 + 2). Every NaN result is the one quiet NaN.
template <class F>
F canonical(F x) {
  return std::isnan(x) ? std::numeric_limits<F>::quiet_NaN() : x;
}
template <class F>
F combine_float(Op op, F a, F b) {
  using Wide = std::conditional_t<sizeof(F) == 4, double, F>;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
  switch (op) {
    case Op::Sum:
      return canonical(static_cast<F>(static_cast<Wide>(a) + static_cast<Wide>(b)));
    case Op::Prod:
      return canonical(static_cast<F>(static_cast<Wide>(a) * static_cast<Wide>(b)));
    case Op::Max:
      return a > b ? a : b;
    case Op::Min:
      return a < b ? a : b;
  }
  return a;
}

uint64_t ref_combine(weftDataType_t t, Op op, uint64_t a, uint64_t b) {
  size_t size = dtype_size(t);
  if (is_int(t)) {
    bool a_greater = is_signed_int(t) ? sign_extend(a, size) > sign_extend(b, size) : a > b;
    switch (op) {
      case Op::Sum:
        return (a + b) & mask_of(size);
      case Op::Prod:
        return (a * b) & mask_of(size);
      case Op::Max:
        return a_greater ? a : b;
      case Op::Min:
        return a_greater ? b : a;
    }
  }
  if (t == weftFloat32) {
    return testing::float_bits(combine_float(op, testing::bits_float(static_cast<uint32_t>(a)),
                                             testing::bits_float(static_cast<uint32_t>(b))));
  }
  if (t == weftFloat64) {
    double x, y;
    std::memcpy(&x, &a, 8);
    std::memcpy(&y, &b, 8);
    double r = combine_float(op, x, y);
    uint64_t bits;
    std::memcpy(&bits, &r, 8);
    return bits;
  }
  return float_to_narrow(t, combine_float(op, narrow_to_float(t, a), narrow_to_float(t, b)));
}

uint64_t ref_divide(weftDataType_t t, uint64_t a, uint64_t d) {
  size_t size = dtype_size(t);
  if (is_int(t)) {
    if (d == 0) return 0;
    if (!is_signed_int(t)) return a / d;
    __int128 q = static_cast<__int128>(sign_extend(a, size)) / static_cast<__int128>(d);
    return static_cast<uint64_t>(q) & mask_of(size);
  }
  if (t == weftFloat64) {
    double x;
    std::memcpy(&x, &a, 8);
    x = canonical(x / static_cast<double>(d));
    uint64_t bits;
    std::memcpy(&bits, &x, 8);
    return bits;
  }
  float x =
      t == weftFloat32 ? testing::bits_float(static_cast<uint32_t>(a)) : narrow_to_float(t, a);
  float q = canonical(static_cast<float>(static_cast<double>(x) / static_cast<float>(d)));
  return t == weftFloat32 ? testing::float_bits(q) : float_to_narrow(t, q);
}

// Random elements that exercise rounding (nearby exponents) and the special
// values: NaNs of both signs and several payloads, infinities, zeros,
// subnormals, extremes.
std::vector<uint8_t> random_elements(weftDataType_t t, size_t count, std::mt19937_64& rng) {
  size_t size = dtype_size(t);
  std::vector<uint8_t> out(count * size);
  auto pick = [&](std::initializer_list<uint64_t> specials) {
    return *(specials.begin() + rng() % specials.size());
  };
  for (size_t i = 0; i < count; ++i) {
    uint64_t r = rng();
    bool special = rng() % 8 == 0;
    uint64_t v;
    if (t == weftFloat32) {
      v = special ? pick({0x0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
                          0x7f800001, 0xff812345, 0x00000001, 0x807fffff, 0x7f7fffff, 0x00800000})
                  : ((r & 0x807fffff) | ((127 - 6 + (r >> 32) % 13) << 23));
    } else if (t == weftFloat64) {
      v = special ? pick({0x0, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
                          0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001,
                          0x0000000000000001, 0x7fefffffffffffff})
                  : ((r & 0x800fffffffffffff) | ((1023 - 6 + (rng() % 13)) << 52));
    } else if (is_int(t)) {
      v = special ? pick({0, 1, ~uint64_t{0}, uint64_t{1} << (8 * size - 1),
                          (uint64_t{1} << (8 * size - 1)) - 1})
                  : r;
    } else {
      v = r;  // narrow: every pattern is fair game
    }
    store_bits(out.data(), i, size, v & mask_of(size));
  }
  return out;
}

enum class Placement { OutOfPlace, DstIsA, DstIsB };

// Runs one kernel on a, b (offset by `offset` bytes from an aligned base) and
// checks every element against the reference and the guard bytes after it.
struct Harness {
  weftDataType_t dtype;
  size_t count;
  size_t offset;
  Placement placement;
  std::vector<uint8_t> a, b;  // inputs, unshifted
  std::vector<uint8_t> dst_store, a_store, b_store;
  uint8_t *dst_ptr = nullptr, *a_ptr = nullptr, *b_ptr = nullptr;

  Harness(weftDataType_t t, size_t n, size_t off, Placement p, std::mt19937_64& rng)
      : dtype(t), count(n), offset(off), placement(p) {
    a = random_elements(t, n, rng);
    b = random_elements(t, n, rng);
    size_t bytes = n * dtype_size(t) + offset + kGuard;
    a_store.assign(bytes, kSentinel);
    b_store.assign(bytes, kSentinel);
    dst_store.assign(bytes, kSentinel);
    a_ptr = a_store.data() + offset;
    b_ptr = b_store.data() + offset;
    std::copy(a.begin(), a.end(), a_ptr);
    std::copy(b.begin(), b.end(), b_ptr);
    dst_ptr = placement == Placement::DstIsA   ? a_ptr
              : placement == Placement::DstIsB ? b_ptr
                                               : dst_store.data() + offset;
  }

  // want(i) gives the expected bits of element i.
  template <class Want>
  void check(Want want, const std::string& what) const {
    size_t size = dtype_size(dtype);
    for (size_t i = 0; i < count; ++i) {
      uint64_t got = load_bits(dst_ptr, i, size);
      uint64_t expected = want(i);
      ASSERT_EQ(got, expected) << what << " element " << i << " of " << count << std::hex << " a=0x"
                               << load_bits(a.data(), i, size) << " b=0x"
                               << load_bits(b.data(), i, size);
    }
    for (size_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(dst_ptr[count * size + g], kSentinel) << what << ": wrote past the end";
    }
  }

  std::string describe(Isa isa, const char* op) const {
    return std::string(isa_name(isa)) + " " + dtype_name(dtype) + " " + op +
           " n=" + std::to_string(count) + " offset=" + std::to_string(offset) +
           " placement=" + std::to_string(static_cast<int>(placement));
  }
};

class ReduceKernelTest : public ::testing::TestWithParam<weftDataType_t> {
 protected:
  std::mt19937_64 rng_{static_cast<uint64_t>(GetParam()) * 7919 + 1};

  // Every count, alignment offset and placement.
  template <class Body>
  void for_each_layout(Body body) {
    for (size_t count : kCounts) {
      for (size_t offset : {0, 1}) {
        for (Placement p : {Placement::OutOfPlace, Placement::DstIsA, Placement::DstIsB}) {
          body(Harness(GetParam(), count, offset, p, rng_));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
};

TEST_P(ReduceKernelTest, ApplyMatchesReference) {
  weftDataType_t t = GetParam();
  size_t size = dtype_size(t);
  for (Isa isa : supported_isas()) {
    for (Op op : kOps) {
      for_each_layout([&](Harness h) {
        kernels(isa).apply[t][static_cast<int>(op)](h.dst_ptr, h.a_ptr, h.b_ptr, h.count);
        h.check(
            [&](size_t i) {
              return ref_combine(t, op, load_bits(h.a.data(), i, size),
                                 load_bits(h.b.data(), i, size));
            },
            h.describe(isa, op_name(op)));
      });
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(ReduceKernelTest, DivideMatchesReference) {
  weftDataType_t t = GetParam();
  size_t size = dtype_size(t);
  for (Isa isa : supported_isas()) {
    for (uint64_t d : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{1000},
                       (uint64_t{1} << 40) + 1, uint64_t{1} << 63, ~uint64_t{0}, uint64_t{0}}) {
      for_each_layout([&](Harness h) {
        kernels(isa).divide[t](h.dst_ptr, h.a_ptr, d, h.count);
        h.check([&](size_t i) { return ref_divide(t, load_bits(h.a.data(), i, size), d); },
                h.describe(isa, ("divide " + std::to_string(d)).c_str()));
      });
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(ReduceKernelTest, ScaleMatchesReference) {
  weftDataType_t t = GetParam();
  size_t size = dtype_size(t);
  std::vector<uint8_t> scalars = random_elements(t, 8, rng_);
  for (Isa isa : supported_isas()) {
    for (size_t s = 0; s < 8; ++s) {
      uint64_t scalar = load_bits(scalars.data(), s, size);
      for_each_layout([&](Harness h) {
        kernels(isa).scale[t](h.dst_ptr, h.a_ptr, scalars.data() + s * size, h.count);
        h.check(
            [&](size_t i) {
              return ref_combine(t, Op::Prod, load_bits(h.a.data(), i, size), scalar);
            },
            h.describe(isa, "scale"));
      });
      if (HasFatalFailure()) return;
    }
  }
}

// Every SIMD variant against the scalar one, bit for bit, on a long run.
TEST_P(ReduceKernelTest, IsaVariantsAgreeBitForBit) {
  weftDataType_t t = GetParam();
  const size_t n = 20011;
  size_t bytes = n * dtype_size(t);
  std::vector<uint8_t> a = random_elements(t, n, rng_), b = random_elements(t, n, rng_);
  std::vector<uint8_t> want(bytes), got(bytes);
  const KernelTable& scalar = kernels(Isa::Scalar);
  for (Isa isa : supported_isas()) {
    const KernelTable& k = kernels(isa);
    for (Op op : kOps) {
      scalar.apply[t][static_cast<int>(op)](want.data(), a.data(), b.data(), n);
      k.apply[t][static_cast<int>(op)](got.data(), a.data(), b.data(), n);
      ASSERT_EQ(want, got) << isa_name(isa) << " " << op_name(op);
    }
    scalar.divide[t](want.data(), a.data(), 5, n);
    k.divide[t](got.data(), a.data(), 5, n);
    ASSERT_EQ(want, got) << isa_name(isa) << " divide";
    scalar.scale[t](want.data(), a.data(), b.data(), n);
    k.scale[t](got.data(), a.data(), b.data(), n);
    ASSERT_EQ(want, got) << isa_name(isa) << " scale";
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ReduceKernelTest, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<weftDataType_t>& info) {
                           return std::string(dtype_name(info.param));
                         });

// fp8: every pair of patterns. fp16/bf16: every pattern against several
// partners. Every op, every variant, against the reference.
TEST(ReduceExhaustive, NarrowTypes) {
  for (weftDataType_t t : {weftFloat8e4m3, weftFloat8e5m2, weftFloat16, weftBfloat16}) {
    size_t size = dtype_size(t);
    std::vector<uint8_t> a(65536 * size), b(65536 * size), dst(65536 * size);
    for (int partner = 0; partner < (size == 1 ? 1 : 4); ++partner) {
      for (uint64_t i = 0; i < 65536; ++i) {
        store_bits(a.data(), i, size, size == 1 ? i & 0xff : i);
        store_bits(b.data(), i, size, size == 1 ? i >> 8 : (i * 40503 + partner * 977) & 0xffff);
      }
      for (Isa isa : supported_isas()) {
        for (Op op : kOps) {
          kernels(isa).apply[t][static_cast<int>(op)](dst.data(), a.data(), b.data(), 65536);
          for (size_t i = 0; i < 65536; ++i) {
            uint64_t x = load_bits(a.data(), i, size), y = load_bits(b.data(), i, size);
            ASSERT_EQ(load_bits(dst.data(), i, size), ref_combine(t, op, x, y))
                << isa_name(isa) << " " << dtype_name(t) << " " << op_name(op) << std::hex
                << " a=0x" << x << " b=0x" << y;
          }
        }
      }
    }
  }
}

// The bulk conversions of every variant equal the scalar functions: every
// pattern to float; from float, every value and midpoint (and the floats
// either side), and random floats of every kind.
TEST(ReduceConversions, BulkMatchesScalar) {
  std::mt19937_64 rng(3);
  for (weftDataType_t t : {weftFloat8e4m3, weftFloat8e5m2, weftFloat16, weftBfloat16}) {
    size_t size = dtype_size(t);
    size_t patterns = size_t{1} << (8 * size);
    std::vector<uint8_t> codes(patterns * size);
    for (size_t p = 0; p < patterns; ++p) store_bits(codes.data(), p, size, p);
    std::vector<float> floats;
    for (size_t p = 0; p + 1 < patterns; ++p) {
      float lo = narrow_to_float(t, p), hi = narrow_to_float(t, p + 1);
      float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
      for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        floats.push_back(x);
      }
    }
    for (int i = 0; i < 100000; ++i)
      floats.push_back(testing::bits_float(static_cast<uint32_t>(rng())));
    std::vector<float> decoded(patterns);
    std::vector<uint8_t> encoded(floats.size() * size);
    for (Isa isa : supported_isas()) {
      kernels(isa).to_float[t](decoded.data(), codes.data(), patterns);
      for (size_t p = 0; p < patterns; ++p) {
        ASSERT_EQ(testing::float_bits(decoded[p]), testing::float_bits(narrow_to_float(t, p)))
            << isa_name(isa) << " " << dtype_name(t) << " pattern " << p;
      }
      kernels(isa).from_float[t](encoded.data(), floats.data(), floats.size());
      for (size_t i = 0; i < floats.size(); ++i) {
        ASSERT_EQ(load_bits(encoded.data(), i, size), float_to_narrow(t, floats[i]))
            << isa_name(isa) << " " << dtype_name(t) << " float bits " << std::hex
            << testing::float_bits(floats[i]);
      }
    }
  }
}

// The documented NaN of each floating type, whatever NaN went in, from
// every op and from inf - inf, in every variant.
TEST(ReduceNan, ResultsAreTheCanonicalQuietNan) {
  struct Case {
    weftDataType_t dtype;
    uint64_t nan_in, one, inf, neg_inf, canonical;
  };
  const Case cases[] = {
      {weftFloat32, 0xff812345, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00000},
      {weftFloat64, 0xfff0000000000123, 0x3ff0000000000000, 0x7ff0000000000000, 0xfff0000000000000,
       0x7ff8000000000000},
      {weftFloat16, 0xfd23, 0x3c00, 0x7c00, 0xfc00, 0x7e00},
      {weftBfloat16, 0xff85, 0x3f80, 0x7f80, 0xff80, 0x7fc0},
      {weftFloat8e4m3, 0xff, 0x38, 0x7f, 0x7f, 0x7f},  // no inf: NaN stands in
      {weftFloat8e5m2, 0xfd, 0x3c, 0x7c, 0xfc, 0x7e},
  };
  for (const Case& c : cases) {
    size_t size = dtype_size(c.dtype);
    // Pairs (a, b) whose result is NaN for every op.
    const uint64_t pairs[][2] = {{c.nan_in, c.one}, {c.one, c.nan_in}, {c.nan_in, c.nan_in}};
    std::vector<uint8_t> a(3 * size), b(3 * size), dst(3 * size);
    for (size_t i = 0; i < 3; ++i) {
      store_bits(a.data(), i, size, pairs[i][0]);
      store_bits(b.data(), i, size, pairs[i][1]);
    }
    for (Isa isa : supported_isas()) {
      const KernelTable& k = kernels(isa);
      for (Op op : kOps) {
        k.apply[c.dtype][static_cast<int>(op)](dst.data(), a.data(), b.data(), 3);
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(load_bits(dst.data(), i, size), c.canonical)
              << isa_name(isa) << " " << dtype_name(c.dtype) << " " << op_name(op) << " pair " << i;
        }
      }
      store_bits(a.data(), 0, size, c.inf);
      store_bits(b.data(), 0, size, c.neg_inf);
      k.apply[c.dtype][static_cast<int>(Op::Sum)](dst.data(), a.data(), b.data(), 1);
      EXPECT_EQ(load_bits(dst.data(), 0, size), c.canonical) << dtype_name(c.dtype) << " inf-inf";
      store_bits(a.data(), 0, size, c.nan_in);
      k.divide[c.dtype](dst.data(), a.data(), 3, 1);
      EXPECT_EQ(load_bits(dst.data(), 0, size), c.canonical) << dtype_name(c.dtype) << " divide";
      k.scale[c.dtype](dst.data(), b.data(), a.data(), 1);
      EXPECT_EQ(load_bits(dst.data(), 0, size), c.canonical) << dtype_name(c.dtype) << " scale";
    }
  }
}

TEST(ReduceDtypes, SizesAndNames) {
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  const char* names[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  for (int t = 0; t < weftNumTypes; ++t) {
    auto dtype = static_cast<weftDataType_t>(t);
    EXPECT_TRUE(dtype_valid(dtype));
    EXPECT_EQ(dtype_size(dtype), sizes[t]);
    EXPECT_STREQ(dtype_name(dtype), names[t]);
  }
  for (int bad : {-1, static_cast<int>(weftNumTypes), 1000}) {
    auto dtype = static_cast<weftDataType_t>(bad);
    EXPECT_FALSE(dtype_valid(dtype));
    EXPECT_EQ(dtype_size(dtype), 0u);
    EXPECT_STREQ(dtype_name(dtype), "invalid");
  }
}

TEST(ReduceIsa, ChooseParsesAndClampsToTheCpu) {
  EXPECT_EQ(choose_isa(nullptr, Isa::Avx512), Isa::Avx512);
  EXPECT_EQ(choose_isa("", Isa::Avx2), Isa::Avx2);
  EXPECT_EQ(choose_isa("scalar", Isa::Avx512), Isa::Scalar);
  EXPECT_EQ(choose_isa("avx2", Isa::Avx512), Isa::Avx2);
  EXPECT_EQ(choose_isa("AVX512", Isa::Avx512), Isa::Avx512);
  EXPECT_EQ(choose_isa("avx512", Isa::Avx2), Isa::Avx2);
  EXPECT_EQ(choose_isa("avx2", Isa::Scalar), Isa::Scalar);
  EXPECT_EQ(choose_isa("sse9", Isa::Avx2), Isa::Avx2);
}

TEST(ReduceIsa, ActiveIsSupportedAndWithinBest) {
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_LE(active_isa(), best_isa());
  EXPECT_STREQ(isa_name(Isa::Avx512), "avx512");
}

// The public entry points run the active variant; bad arguments write nothing.
TEST(ReducePublicApi, MatchesReferenceAndIgnoresInvalidDtype) {
  std::mt19937_64 rng(11);
  const size_t n = 777;
  for (weftDataType_t t : kDtypes) {
    size_t size = dtype_size(t);
    std::vector<uint8_t> a = random_elements(t, n, rng), b = random_elements(t, n, rng);
    std::vector<uint8_t> dst(n * size);
    for (Op op : kOps) {
      apply(t, op, dst.data(), a.data(), b.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(load_bits(dst.data(), i, size),
                  ref_combine(t, op, load_bits(a.data(), i, size), load_bits(b.data(), i, size)))
            << dtype_name(t) << " " << op_name(op) << " element " << i;
      }
    }
    divide(t, dst.data(), a.data(), 3, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(load_bits(dst.data(), i, size), ref_divide(t, load_bits(a.data(), i, size), 3));
    }
    scale(t, dst.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(
          load_bits(dst.data(), i, size),
          ref_combine(t, Op::Prod, load_bits(a.data(), i, size), load_bits(b.data(), 0, size)));
    }
  }
  std::vector<uint8_t> a(64, 1), dst(64, kSentinel);
  auto bad = static_cast<weftDataType_t>(weftNumTypes);
  apply(bad, Op::Sum, dst.data(), a.data(), a.data(), 8);
  divide(bad, dst.data(), a.data(), 2, 8);
  scale(bad, dst.data(), a.data(), a.data(), 8);
  EXPECT_EQ(dst, std::vector<uint8_t>(64, kSentinel));
}

}  // namespace
}  // namespace weft::reduce
