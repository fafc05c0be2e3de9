// weft-train through weftrun: the validation matrix (every mesh dimension alone, then
// combined, at 2, 4 and 8 ranks) must PASS with losses, gradients and parameters within
// 1e-5 of the single-process reference; bad meshes must fail fast with a message naming the
// option; a perturbed gradient must FAIL.

#include <sys/wait.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

struct Outcome {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
  // No rank printed a sanitizer report (UBSan reports without failing the process).
  bool sanitizer_clean() const {
    return out.find("runtime error:") == std::string::npos &&
           out.find("Sanitizer") == std::string::npos;
  }
  // weft-train's last line (weftrun's own report of a failed rank left out); empty unless
  // it is the one verdict line of the run.
  std::string verdict() const {
    std::istringstream in(out);
    std::string line, last;
    int verdicts = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line.rfind("weftrun: ", 0) == 0) continue;
      last = line;
      verdicts +=
          line.rfind("# weft-train: PASS", 0) == 0 || line.rfind("# weft-train: FAIL", 0) == 0;
    }
    return verdicts == 1 ? last : "";
  }
};

// Runs weft-train on `ranks` local ranks; weftrun's own timeout ends a hang.
Outcome weft_train(int ranks, const std::string& args) {
  const std::string command = std::string(WEFTRUN_PATH) +
                              " --timeout 90 --bind-to none --no-prefix -n " +
                              std::to_string(ranks) + " " + WEFT_TRAIN_PATH + " " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) outcome.out.append(buffer, n);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

// A number from the --json line: "key":value; -1 when absent.
double json_number(const std::string& out, const std::string& key) {
  const std::string token = "\"" + key + "\":";
  const size_t at = out.find(token);
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + token.size(), nullptr);
}

struct Case {
  int ranks;
  std::string args;
};

class MatrixTest : public testing::TestWithParam<Case> {};

TEST_P(MatrixTest, MatchesTheReference) {
  const Case& c = GetParam();
  const Outcome run = weft_train(c.ranks, c.args + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
  EXPECT_TRUE(run.sanitizer_clean()) << run.out;
  EXPECT_NE(run.out.find("\"pass\":true"), std::string::npos) << run.out;
  for (const char* key : {"loss", "grads", "params"}) {
    const double rel = json_number(run.out, key);
    EXPECT_GE(rel, 0) << key << "\n" << run.out;
    EXPECT_LE(rel, 1e-5) << key << "\n" << run.out;
  }
  // The ledger was not empty: the run did communicate.
  if (c.ranks > 1) {
    EXPECT_NE(run.out.find("\"calls\":"), std::string::npos) << run.out;
  }
}

// Small enough to keep the suite well under two minutes on two cores.
INSTANTIATE_TEST_SUITE_P(
    Train, MatrixTest,
    testing::Values(Case{1, ""}, Case{2, "--dp 2"}, Case{2, "--tp 2"}, Case{2, "--tp 2 --sp"},
                    Case{2, "--zero 1"}, Case{2, "--zero 2"}, Case{2, "--zero 3"},
                    Case{4, "--zero 3 --hsdp 2"}, Case{4, "--dp 2 --tp 2"},
                    Case{4, "--dp 2 --tp 2 --sp --zero 1"}, Case{4, "--tp 2 --zero 3"},
                    Case{4, "--tp 4 --sp --zero 2"}, Case{8, "--dp 2 --tp 4 --sp --zero 1"},
                    Case{8, "--tp 2 --zero 3 --hsdp 2"}),
    [](const testing::TestParamInfo<Case>& info) {
      std::string name = "n" + std::to_string(info.param.ranks);
      for (char ch : info.param.args)
        name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return name;
    });

struct BadCase {
  int ranks;
  std::string args, message;
};

class BadInputTest : public testing::TestWithParam<BadCase> {};

TEST_P(BadInputTest, FailsFastNamingTheOption) {
  const BadCase& c = GetParam();
  const Outcome run = weft_train(c.ranks, c.args);
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find(c.message), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("# weft-train: PASS"), std::string::npos) << run.out;
  EXPECT_LT(run.seconds, 30) << run.out;
  EXPECT_TRUE(run.sanitizer_clean()) << run.out;
}

INSTANTIATE_TEST_SUITE_P(
    Train, BadInputTest,
    testing::Values(
        BadCase{4, "--tp 3", "--tp 3 does not divide the world size 4"},
        BadCase{4, "--dp 3", "--dp 3 x --tp 1 = 3 is not the world size 4"},
        BadCase{2, "--tp 2 --hidden 63 --heads 7", "--hidden 63 is not divisible by --tp 2"},
        BadCase{2, "--tp 2 --hidden 48 --heads 3", "--heads 3 is not divisible by --tp 2"},
        BadCase{2, "--tp 2 --sp --seq 15", "--seq 15 is not divisible by --tp 2"},
        BadCase{2, "--dp 2 --batch 3", "--batch 3 is not divisible by dp 2"},
        BadCase{2, "--zero 1 --hsdp 2", "--hsdp needs --zero 3"},
        BadCase{2, "--zero 4", "--zero 4 is not 0-3"}, BadCase{2, "--layers x", "--layers"},
        BadCase{2, "--frobnicate", "unknown option --frobnicate"}));

// The perturbed element: over dp it moves the mean gradient off the reference; over tp it
// makes the two copies of a replicated gradient disagree.
TEST(WeftTrainTest, PerturbedGradientFailsAgainstTheReference) {
  const Outcome run = weft_train(2, "--dp 2 --debug-perturb-grad");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict().rfind("# weft-train: FAIL: gradients differ by ", 0), 0u) << run.out;
  EXPECT_NE(run.verdict().find("lnf.w"), std::string::npos) << run.out;
}

TEST(WeftTrainTest, PerturbedGradientFailsInsideAReplicaGroup) {
  const Outcome run = weft_train(2, "--tp 2 --debug-perturb-grad");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict().rfind("# weft-train: FAIL: gradient lnf.w[0] in replica 0 differs "
                                "between ranks 0 and 1",
                                0),
            0u)
      << run.out;
}

TEST(WeftTrainTest, AnUnexpectedCallFailsTheLedger) {
  const Outcome run = weft_train(2, "--tp 2 --debug-extra-call");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict().rfind("# weft-train: FAIL: rank 0's ledger deviates", 0), 0u) << run.out;
  EXPECT_NE(run.out.find("ledger: debug.extra allreduce over tp of 4 B: 2 calls, none expected"),
            std::string::npos)
      << run.out;
}

TEST(WeftTrainTest, PrintsOneLossPerStepAndTheLedgerWithExpected) {
  const Outcome run = weft_train(2, "--tp 2 --steps 3 --profile");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  for (int step = 1; step <= 3; ++step)
    EXPECT_NE(run.out.find("step " + std::to_string(step) + ": loss "), std::string::npos)
        << run.out;
  EXPECT_NE(run.out.find("max relative difference"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("# profile"), std::string::npos) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
}

}  // namespace
