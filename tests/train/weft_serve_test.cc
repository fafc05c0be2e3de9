// weft-serve through weftrun: prefill on one TP group, decode on another, every pairing of
// TP sizes the ranks allow must PASS (tokens identical to one process, received caches
// within 1e-5, the ledger equal to its closed form); a corrupted cache must FAIL; bad
// options fail fast naming the option.
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "support/command.h"

namespace {

struct Outcome {
  int exit_code = -1;
  std::string out;
};

Outcome weft_serve(int ranks, const std::string& args) {
  Outcome o;
  o.exit_code = weft::testing::run_command(
      std::string(WEFTRUN_PATH) + " --timeout 90 --bind-to none --no-prefix -n " +
          std::to_string(ranks) + " " + WEFT_SERVE_PATH + " " + args + " 2>&1",
      &o.out);
  return o;
}

std::string verdict(const std::string& out) {
  size_t at = out.find("# weft-serve: ");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

class WeftServe : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(WeftServe, DecodeGroupGeneratesWhatOneProcessGenerates) {
  auto [prefill, decode] = GetParam();
  Outcome o = weft_serve(prefill + decode, "--prefill-tp " + std::to_string(prefill) +
                                               " --decode-tp " + std::to_string(decode) +
                                               " --layers 3 --prompt 11 --generate 6");
  EXPECT_EQ(o.exit_code, 0) << o.out;
  EXPECT_EQ(verdict(o.out).rfind("# weft-serve: PASS", 0), 0u) << o.out;
  // Two sequences of six tokens each were printed.
  EXPECT_NE(o.out.find("sequence 1: prompt 11 tokens, generated"), std::string::npos) << o.out;
}

INSTANTIATE_TEST_SUITE_P(PrefillDecode, WeftServe,
                         ::testing::Values(std::tuple{1, 1}, std::tuple{2, 1}, std::tuple{1, 2},
                                           std::tuple{2, 2}, std::tuple{4, 2}, std::tuple{2, 4}),
                         [](const auto& info) {
                           return "p" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(WeftServeCheck, ACorruptedCacheFails) {
  Outcome o = weft_serve(3, "--prefill-tp 2 --decode-tp 1 --perturb-kv");
  EXPECT_NE(o.exit_code, 0) << o.out;
  EXPECT_EQ(verdict(o.out).rfind("# weft-serve: FAIL", 0), 0u) << o.out;
}

TEST(WeftServeCheck, BadOptionsAreNamed) {
  Outcome o = weft_serve(3, "--prefill-tp 2 --decode-tp 2");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.out.find("the run has 3 ranks; --prefill-tp + --decode-tp = 4"), std::string::npos)
      << o.out;
  o = weft_serve(2, "--prefill-tp 1 --decode-tp 1 --heads 3");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.out.find("--hidden=64 does not divide by --heads"), std::string::npos) << o.out;
  o = weft_serve(2, "--prefill-tp 1 --decode-tp 1 --page-tokens 0");
  EXPECT_NE(o.out.find("--page-tokens=0 must be at least 1"), std::string::npos) << o.out;
}

}  // namespace
