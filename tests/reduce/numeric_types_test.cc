// fp16 / bf16 / fp8 conversions against the textbook references.
#include "core/reduce/numeric_types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "reduce/reference.h"

namespace weft::reduce {
namespace {

using testing::bits_float;
using testing::float_bits;
using testing::RefFormat;

struct Case {
  const char* name;
  RefFormat format;
  float (*to_float)(uint32_t);
  uint32_t (*from_float)(float);
};

const Case kCases[] = {
    {"fp16", testing::kRefFp16, [](uint32_t b) { return fp16_to_float(static_cast<uint16_t>(b)); },
     [](float x) -> uint32_t { return float_to_fp16(x); }},
    {"bf16", testing::kRefBf16, [](uint32_t b) { return bf16_to_float(static_cast<uint16_t>(b)); },
     [](float x) -> uint32_t { return float_to_bf16(x); }},
    {"e4m3", testing::kRefE4m3,
     [](uint32_t b) { return fp8e4m3_to_float(static_cast<uint8_t>(b)); },
     [](float x) -> uint32_t { return float_to_fp8e4m3(x); }},
    {"e5m2", testing::kRefE5m2,
     [](uint32_t b) { return fp8e5m2_to_float(static_cast<uint8_t>(b)); },
     [](float x) -> uint32_t { return float_to_fp8e5m2(x); }},
};

class ConversionTest : public ::testing::TestWithParam<Case> {};

// Every pattern decodes to its exact value; NaNs to a NaN of the same sign:
// quiet (IEEE-like formats keep the payload under the quiet bit), except
// that bf16 widens by a plain shift.
TEST_P(ConversionTest, DecodesEveryPattern) {
  const Case& c = GetParam();
  const RefFormat& f = c.format;
  for (uint32_t p = 0; p < testing::ref_patterns(f); ++p) {
    float got = c.to_float(p);
    bool negative = (p & testing::ref_sign_bit(f)) != 0;
    if (testing::ref_is_nan(f, p)) {
      ASSERT_TRUE(std::isnan(got)) << c.name << " " << p;
      ASSERT_EQ(std::signbit(got), negative) << c.name << " " << p;
      uint32_t expect_man = f.has_inf ? (p & ((1u << f.man_bits) - 1)) << (23 - f.man_bits) : 0;
      uint32_t quiet = f.exp_bits == 8 ? 0 : 0x400000u;
      ASSERT_EQ(float_bits(got) & 0x7fffffu, quiet | expect_man) << c.name << " " << p;
    } else {
      double want = testing::ref_value(f, p);
      ASSERT_EQ(static_cast<double>(got), want) << c.name << " " << p;
      ASSERT_EQ(std::signbit(got), negative) << c.name << " " << p;  // -0 included
    }
  }
}

// narrow -> float -> narrow is the identity, NaNs included, except that
// signalling NaNs come back quiet and saturating formats turn infinities
// into the largest finite value.
TEST_P(ConversionTest, RoundTripsEveryPattern) {
  const Case& c = GetParam();
  const RefFormat& f = c.format;
  uint32_t quiet = f.has_inf ? 1u << (f.man_bits - 1) : 0;
  for (uint32_t p = 0; p < testing::ref_patterns(f); ++p) {
    uint32_t want = p;
    if (testing::ref_is_nan(f, p)) want = p | quiet;
    if (f.saturate && std::isinf(testing::ref_value(f, p))) want = p - 1;  // max finite
    ASSERT_EQ(c.from_float(c.to_float(p)), want) << c.name << " " << p;
  }
}

// Rounding: every value, every midpoint between neighbours and the floats
// just either side of it, then random floats of every kind.
TEST_P(ConversionTest, RoundsToNearestEven) {
  const Case& c = GetParam();
  const RefFormat& f = c.format;
  std::vector<double> positive = testing::ref_positive_values(f);
  std::vector<float> inputs;
  for (size_t i = 0; i + 1 < positive.size(); ++i) {
    float mid = static_cast<float>((positive[i] + positive[i + 1]) / 2);
    ASSERT_EQ(static_cast<double>(mid), (positive[i] + positive[i + 1]) / 2);  // exact in fp32
    for (float x : {static_cast<float>(positive[i]), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, INFINITY)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) inputs.push_back(bits_float(rng()));
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, 1e38f, 3.4028235e38f}) {
    inputs.push_back(x);
  }
  for (float x : inputs) {
    ASSERT_EQ(c.from_float(x), testing::ref_encode(f, positive, x))
        << c.name << " x=" << x << " bits=" << std::hex << float_bits(x);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ConversionTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// Hand-worked cases: ties, subnormals, saturation, infinities.
TEST(ConversionExamples, Fp16) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);      // tie: down to even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: up to even
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);             // half the least subnormal
  EXPECT_EQ(float_to_fp16(3 * 0x1p-25f), 0x0002);         // subnormal tie, to even
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);             // least subnormal
  EXPECT_EQ(float_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // overflow to inf
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0xfc00), -INFINITY);
}

TEST(ConversionExamples, Bf16) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie: down to even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie: up to even
  EXPECT_EQ(float_to_bf16(0x1p-133f), 0x0001);           // least subnormal
  EXPECT_EQ(float_to_bf16(0x1p-134f), 0x0000);           // its half: tie to even
  EXPECT_EQ(float_to_bf16(3.4028235e38f), 0x7f80);       // FLT_MAX overflows
  EXPECT_EQ(bf16_to_float(0xff80), -INFINITY);
}

TEST(ConversionExamples, Fp8e4m3) {
  EXPECT_EQ(float_to_fp8e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(464.0f), 0x7e);  // saturates
  EXPECT_EQ(float_to_fp8e4m3(1e10f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_fp8e4m3(NAN), 0x7f);
  EXPECT_EQ(float_to_fp8e4m3(-NAN), 0xff);
  EXPECT_EQ(float_to_fp8e4m3(0x1p-9f), 0x01);       // least subnormal
  EXPECT_EQ(float_to_fp8e4m3(0x1p-10f), 0x00);      // its half: tie to even
  EXPECT_EQ(float_to_fp8e4m3(3 * 0x1p-10f), 0x02);  // tie up to even
  EXPECT_EQ(fp8e4m3_to_float(0x7e), kFp8e4m3Max);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(0x7f)));
  EXPECT_EQ(fp8e4m3_to_float(0x01), 0x1p-9f);
}

TEST(ConversionExamples, Fp8e5m2) {
  EXPECT_EQ(float_to_fp8e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_fp8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(61440.0f), 0x7b);  // saturates
  EXPECT_EQ(float_to_fp8e5m2(INFINITY), 0x7b);
  EXPECT_EQ(float_to_fp8e5m2(-INFINITY), 0xfb);
  EXPECT_EQ(float_to_fp8e5m2(NAN) & 0x7c, 0x7c);
  EXPECT_EQ(float_to_fp8e5m2(0x1p-16f), 0x01);  // least subnormal
  EXPECT_EQ(float_to_fp8e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(fp8e5m2_to_float(0x7b), kFp8e5m2Max);
  EXPECT_EQ(fp8e5m2_to_float(0x7c), INFINITY);
  EXPECT_EQ(fp8e5m2_to_float(0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(fp8e5m2_to_float(0x7d)));
}

}  // namespace
}  // namespace weft::reduce
