// weft-perf's pieces on their own: the narrow-float codecs, the exactness of the check's
// inputs, flag parsing and the table layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "element.h"
#include "minifloat.h"
#include "options.h"
#include "pattern.h"
#include "report.h"

namespace weft::perf {
namespace {

struct Known {
  MiniFloatFormat format;
  double value;
  uint32_t bits;
};

// Encodings fixed by the formats' definitions (IEEE binary16, bfloat16, OCP fp8).
TEST(MiniFloat, KnownEncodings) {
  const Known cases[] = {
      {kFloat16Format, 1.0, 0x3C00},       {kFloat16Format, -2.0, 0xC000},
      {kFloat16Format, 65504.0, 0x7BFF},   {kFloat16Format, std::ldexp(1.0, -24), 0x0001},
      {kFloat16Format, INFINITY, 0x7C00},  {kBfloat16Format, 1.0, 0x3F80},
      {kBfloat16Format, -3.0, 0xC040},     {kFloat8e4m3Format, 1.0, 0x38},
      {kFloat8e4m3Format, 448.0, 0x7E},    {kFloat8e4m3Format, -0.5, 0xB0},
      {kFloat8e4m3Format, 16.0, 0x58},     {kFloat8e4m3Format, std::ldexp(1.0, -9), 0x01},
      {kFloat8e5m2Format, 1.0, 0x3C},      {kFloat8e5m2Format, 57344.0, 0x7B},
      {kFloat8e5m2Format, INFINITY, 0x7C}, {kFloat8e5m2Format, std::ldexp(1.0, -16), 0x01},
  };
  for (const Known& c : cases) {
    EXPECT_EQ(minifloat_encode(c.format, c.value), c.bits) << c.value;
    EXPECT_EQ(minifloat_decode(c.format, c.bits), c.value) << std::hex << c.bits;
  }
}

TEST(MiniFloat, RoundsToNearestEvenAndOverflows) {
  // Halfway between 1 and the next half (1 + 2^-10): ties go to the even mantissa, 1.
  EXPECT_EQ(minifloat_encode(kFloat16Format, 1 + std::ldexp(1.0, -11)), 0x3C00u);
  EXPECT_EQ(minifloat_encode(kFloat16Format, 1 + 3 * std::ldexp(1.0, -11)), 0x3C02u);
  // Halfway past the largest half rounds up to infinity.
  EXPECT_EQ(minifloat_encode(kFloat16Format, 65520.0), 0x7C00u);
  // e4m3 has no infinity: 464 ties to 448 (even), anything larger is NaN.
  EXPECT_EQ(minifloat_encode(kFloat8e4m3Format, 464.0), 0x7Eu);
  EXPECT_TRUE(
      std::isnan(minifloat_decode(kFloat8e4m3Format, minifloat_encode(kFloat8e4m3Format, 465.0))));
  EXPECT_TRUE(std::isnan(minifloat_decode(kFloat8e4m3Format, 0x7F)));
  EXPECT_EQ(minifloat_decode(kFloat8e4m3Format, 0x7E), 448.0);
}

// Every bit pattern decodes to a value that encodes back to the same pattern, and the
// finite values grow with the pattern (so no two patterns share a value).
TEST(MiniFloat, EveryPatternRoundTrips) {
  const MiniFloatFormat formats[] = {kFloat16Format, kBfloat16Format, kFloat8e4m3Format,
                                     kFloat8e5m2Format};
  for (const MiniFloatFormat& format : formats) {
    const uint32_t positive = 1u << (format.exponent_bits + format.mantissa_bits);
    double previous = -1;
    for (uint32_t bits = 0; bits < 2 * positive; ++bits) {
      const double value = minifloat_decode(format, bits);
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(minifloat_decode(format, minifloat_encode(format, value))));
        continue;
      }
      ASSERT_EQ(minifloat_encode(format, value), bits) << format.mantissa_bits << " " << bits;
      if (bits < positive && !std::isinf(value)) {
        EXPECT_GT(value, previous) << bits;
        previous = value;
      }
    }
  }
}

#if defined(__FLT16_MAX__)
// The compiler's own double-to-half conversion (correctly rounded) as an independent check.
TEST(MiniFloat, HalfMatchesCompilerConversion) {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> exponent(-26, 17);
  for (int i = 0; i < 200000; ++i) {
    const double value = std::exp2(exponent(random)) * ((i & 1) ? -1 : 1);
    const auto half = static_cast<_Float16>(value);
    uint16_t bits;
    std::memcpy(&bits, &half, sizeof(bits));
    ASSERT_EQ(minifloat_encode(kFloat16Format, value), bits) << value;
  }
}
#endif

// bfloat16 is the upper half of a float; rounding a float's bits to nearest even is an
// independent way to get the same answer.
TEST(MiniFloat, Bfloat16MatchesFloatBitRounding) {
  std::mt19937 random(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = random();
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    if (!std::isfinite(value)) continue;
    const uint32_t rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
    ASSERT_EQ(minifloat_encode(kBfloat16Format, value), rounded) << value;
  }
}

TEST(Element, StoreLoadEveryType) {
  for (int type = 0; type < weftNumTypes; ++type) {
    const auto dtype = static_cast<weftDataType_t>(type);
    std::vector<unsigned char> buffer(3 * dtype_size(dtype));
    for (double value : {0.0, 1.0, 7.0, static_cast<double>(exact_integer_limit(dtype))}) {
      store_element(dtype, buffer.data(), 1, value);
      EXPECT_EQ(load_element(dtype, buffer.data(), 1), value) << dtype_name(dtype);
    }
    const double power = std::ldexp(1.0, max_power_of_two(dtype));
    store_element(dtype, buffer.data(), 2, power);
    EXPECT_EQ(load_element(dtype, buffer.data(), 2), power) << dtype_name(dtype);
    // One past the limit is not exact in the narrow floats (it rounds to a neighbour).
    if (is_float_type(dtype) && dtype_size(dtype) <= 2) {
      const double past = static_cast<double>(exact_integer_limit(dtype) + 1);
      store_element(dtype, buffer.data(), 0, past);
      EXPECT_NE(load_element(dtype, buffer.data(), 0), past) << dtype_name(dtype);
    }
  }
  EXPECT_EQ(ulp(weftFloat16, 1.0), std::ldexp(1.0, -10));
  EXPECT_EQ(ulp(weftFloat8e4m3, 10.0), 1.0);
  EXPECT_EQ(ulp(weftInt32, 10.0), 0.0);
}

// Combines two values in the dtype's own arithmetic: the exact result rounded to dtype,
// which is what any implementation stores between steps.
double combine_in_dtype(weftDataType_t dtype, weftRedOp_t op, double a, double b) {
  double exact = a + b;
  if (op == weftProd) exact = a * b;
  if (op == weftMax) exact = std::max(a, b);
  if (op == weftMin) exact = std::min(a, b);
  unsigned char cell[8];
  store_element(dtype, cell, 0, exact);
  return load_element(dtype, cell, 0);
}

// The inputs are representable, and combining them in the dtype gives the exact expected
// value in any association order (left to right, right to left, pairwise).
TEST(InputPattern, ReductionsAreExactInEveryOrder) {
  const weftRedOp_t ops[] = {weftSum, weftProd, weftMax, weftMin, weftAvg};
  for (int type = 0; type < weftNumTypes; ++type) {
    const auto dtype = static_cast<weftDataType_t>(type);
    for (weftRedOp_t op : ops) {
      for (int nranks : {1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 130, 300}) {
        const InputPattern pattern(dtype, op, nranks);
        const weftRedOp_t accumulate = op == weftAvg ? weftSum : op;
        for (size_t index = 0; index < 40; ++index) {
          std::vector<double> values;
          for (int rank = 0; rank < nranks; ++rank) {
            const double v = pattern.input(rank, index);
            unsigned char cell[8];
            store_element(dtype, cell, 0, v);
            ASSERT_EQ(load_element(dtype, cell, 0), v) << "input not representable";
            values.push_back(v);
          }
          double expected = pattern.reduced(index);
          if (op == weftAvg) expected *= nranks;
          ASSERT_EQ(expected, std::round(expected)) << "avg of integers must be an integer";
          double forward = values[0], backward = values.back();
          for (int r = 1; r < nranks; ++r) {
            forward = combine_in_dtype(dtype, accumulate, forward, values[r]);
            backward = combine_in_dtype(dtype, accumulate, backward, values[nranks - 1 - r]);
          }
          std::vector<double> tree = values;  // pairwise, like a tree or halving-doubling
          while (tree.size() > 1) {
            std::vector<double> next;
            for (size_t i = 0; i + 1 < tree.size(); i += 2)
              next.push_back(combine_in_dtype(dtype, accumulate, tree[i], tree[i + 1]));
            if (tree.size() % 2) next.push_back(tree.back());
            tree.swap(next);
          }
          ASSERT_EQ(forward, expected)
              << dtype_name(dtype) << " " << op_name(op) << " n " << nranks << " index " << index;
          ASSERT_EQ(backward, expected) << dtype_name(dtype) << " " << op_name(op);
          ASSERT_EQ(tree[0], expected) << dtype_name(dtype) << " " << op_name(op);
        }
      }
    }
  }
}

// A rank whose contribution is dropped or doubled must change some expected value:
// every rank feeds a non-neutral value into some element.
TEST(InputPattern, EveryRankMatters) {
  for (int type = 0; type < weftNumTypes; ++type) {
    const auto dtype = static_cast<weftDataType_t>(type);
    for (weftRedOp_t op : {weftSum, weftProd}) {
      for (int nranks : {2, 3, 8, 17}) {
        const InputPattern pattern(dtype, op, nranks);
        const double neutral = op == weftSum ? 0 : 1;
        for (int rank = 0; rank < nranks; ++rank) {
          bool matters = false;
          for (size_t index = 0; index < 4096 && !matters; ++index)
            matters = pattern.input(rank, index) != neutral;
          EXPECT_TRUE(matters) << dtype_name(dtype) << " " << op_name(op) << " rank " << rank;
        }
      }
    }
  }
}

TEST(InputPattern, DataMovementLabelsDifferBetweenNeighbours) {
  for (int type = 0; type < weftNumTypes; ++type) {
    const auto dtype = static_cast<weftDataType_t>(type);
    const InputPattern pattern(dtype, std::nullopt, 4);
    for (size_t index = 0; index < 100; ++index) {
      EXPECT_NE(pattern.input(0, index), pattern.input(1, index)) << dtype_name(dtype);
      EXPECT_NE(pattern.input(0, index), pattern.input(0, index + 1)) << dtype_name(dtype);
    }
  }
}

std::optional<std::string> parse(std::vector<const char*> args, Options* options) {
  args.insert(args.begin(), "weft-perf");
  return parse_options(static_cast<int>(args.size()), args.data(), options);
}

TEST(Options, SizesWithSuffixes) {
  EXPECT_EQ(parse_size("8"), 8u);
  EXPECT_EQ(parse_size("1K"), 1024u);
  EXPECT_EQ(parse_size("64M"), size_t{64} << 20);
  EXPECT_EQ(parse_size("2g"), size_t{2} << 30);
  EXPECT_EQ(parse_size("1X"), std::nullopt);
  EXPECT_EQ(parse_size("-1"), std::nullopt);
  EXPECT_EQ(parse_size(""), std::nullopt);
  EXPECT_EQ(parse_size("M"), std::nullopt);
}

TEST(Options, FlagsLikeNcclTests) {
  Options o;
  ASSERT_EQ(parse({"sendrecv", "-b", "8",  "-e1M", "-f", "4",        "-n",     "3",  "-w", "1",
                   "-c",       "0",  "-o", "all",  "-d", "bfloat16", "-r",     "1",  "-a", "3",
                   "-z",       "1",  "-T", "9",    "-A", "ring",     "--json", "-g", "1"},
                  &o),
            std::nullopt);
  EXPECT_EQ(o.collective, "sendrecv");
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, size_t{1} << 20);
  EXPECT_EQ(o.step_factor, 4u);
  EXPECT_EQ(o.iters, 3);
  EXPECT_EQ(o.warmup_iters, 1);
  EXPECT_FALSE(o.check);
  EXPECT_EQ(o.ops.size(), 5u);
  ASSERT_EQ(o.dtypes.size(), 1u);
  EXPECT_EQ(o.dtypes[0], weftBfloat16);
  EXPECT_EQ(o.root, 1);
  EXPECT_EQ(o.average, AverageMode::kMax);
  EXPECT_EQ(o.blocking, 1);
  EXPECT_EQ(o.timeout_s, 9);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(forced_algorithm(o), "sendrecv:ring");
  o.algorithm = "allreduce:tree";
  EXPECT_EQ(forced_algorithm(o), "allreduce:tree");

  Options all;
  ASSERT_EQ(parse({"--datatype=all", "--op", "max", "allreduce"}, &all), std::nullopt);
  EXPECT_EQ(all.dtypes.size(), static_cast<size_t>(weftNumTypes));
  EXPECT_EQ(all.ops, std::vector<weftRedOp_t>{weftMax});
}

TEST(Options, RejectsBadInput) {
  const std::vector<std::vector<const char*>> bad = {
      {},                                               // no collective
      {"sendrecv", "allreduce"},                        // two
      {"sendrecv", "-q", "1"},                          // unknown flag
      {"sendrecv", "-b"},                               // missing value
      {"sendrecv", "-c", "2"},                          // out of range
      {"sendrecv", "-o", "mulsum"},                     // not supported
      {"sendrecv", "-d", "float32"},                    // not an nccl-tests name
      {"sendrecv", "-b", "2K", "-e", "1K"},             // min > max
      {"sendrecv", "-b", "1K", "-e", "2K", "-i", "0"},  // no progress
      {"sendrecv", "-n", "0"},
      {"sendrecv", "-t", "2"},
      {"sendrecv", "--json=1"},
  };
  for (const auto& args : bad) {
    Options o;
    EXPECT_NE(parse(args, &o), std::nullopt) << (args.empty() ? "" : args.back());
  }
}

TEST(Options, SizeSequences) {
  Options o;
  o.min_bytes = 8;
  o.max_bytes = 1 << 20;
  o.step_factor = 4;
  std::vector<size_t> expected;
  for (size_t s = 8; s <= (1u << 20); s *= 4) expected.push_back(s);
  EXPECT_EQ(benchmark_sizes(o), expected);
  o.step_factor = 1;
  o.min_bytes = 1000;
  o.max_bytes = 4000;
  o.step_bytes = 1500;
  EXPECT_EQ(benchmark_sizes(o), (std::vector<size_t>{1000, 2500, 4000}));
  o.max_bytes = 1000;
  EXPECT_EQ(benchmark_sizes(o), std::vector<size_t>{1000});
  o.min_bytes = 0;
  o.max_bytes = 0;
  o.step_factor = 2;  // 0 * 2 never grows: one row, not a loop forever
  EXPECT_EQ(benchmark_sizes(o), std::vector<size_t>{0});
}

// Every cell of a row ends in the same column as its title.
TEST(Report, RowsLineUpWithTitles) {
  Options o;
  o.collective = "sendrecv";
  const std::string header = format_header(o, 2, 100, {{0, 1, "a"}, {1, 2, "b"}});
  std::string titles;
  for (size_t start = 0; start < header.size();) {
    size_t end = header.find('\n', start);
    std::string line = header.substr(start, end - start);
    if (line.find("busbw") != std::string::npos) titles = line;
    start = end + 1;
  }
  ASSERT_FALSE(titles.empty());
  Row row{.bytes = 1048576,
          .count = 262144,
          .type = "float",
          .redop = "none",
          .root = -1,
          .out_of_place = {12.5, 83.89, 83.89, 0},
          .in_place = {123456.0, 1.5, 1.5, std::nullopt}};
  const std::string line = format_row(row);
  auto word_ends = [](const std::string& text) {
    std::vector<size_t> ends;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != ' ' && text[i] != '\n' &&
          (i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '\n'))
        ends.push_back(i);
    }
    return ends;
  };
  std::vector<size_t> title_ends = word_ends(titles);
  title_ends.erase(title_ends.begin());  // the leading '#'
  EXPECT_EQ(word_ends(line), title_ends) << titles << "\n" << line;
  EXPECT_NE(line.find(" 12.50 "), std::string::npos) << line;
  EXPECT_NE(line.find(" 123456 "), std::string::npos) << line;
  EXPECT_NE(line.find("N/A"), std::string::npos) << line;
}

}  // namespace
}  // namespace weft::perf
