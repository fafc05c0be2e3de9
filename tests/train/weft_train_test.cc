// weft-train through weftrun: the validation matrix (every mesh dimension alone, then
// combined, at 2, 4 and 8 ranks) must PASS with losses, gradients and parameters within
// 1e-5 of the single-process reference; bad meshes must fail fast with a message naming the
// option; a perturbed gradient must FAIL; a killed run resumes from its checkpoint with the
// same losses, and its survivors shrink and go on.

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/command.h"

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
Outcome weft_train(int ranks, const std::string& args, const std::string& weftrun_args = "") {
  const std::string command = std::string(WEFTRUN_PATH) + " " + weftrun_args +
                              " --timeout 90 --bind-to none --no-prefix -n " +
                              std::to_string(ranks) + " " + WEFT_TRAIN_PATH + " " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Outcome outcome;
  outcome.exit_code = weft::testing::run_command(command, &outcome.out);
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

// The numbers of a --json list, "key":[a,b,...] (17 significant digits: exact doubles).
std::vector<double> json_list(const std::string& out, const std::string& key) {
  const std::string token = "\"" + key + "\":[";
  std::vector<double> values;
  const size_t at = out.find(token);
  if (at == std::string::npos) return values;
  const char* p = out.c_str() + at + token.size();
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    values.push_back(std::strtod(p, &end));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return values;
}

// Every row (the start of a ledger table line: pattern, primitive, dim, calls) is printed.
void expect_ledger_rows(const Outcome& run, std::initializer_list<const char*> rows) {
  for (const char* row : rows)
    EXPECT_NE(run.out.find(row), std::string::npos) << row << "\n" << run.out;
}

struct Case {
  int ranks;
  std::string args;
  int victim = 2;  // ShrinkTest: the world rank killed
};

class MatrixTest : public testing::TestWithParam<Case> {};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name = "n" + std::to_string(info.param.ranks);
  for (char ch : info.param.args) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  if (info.param.victim != Case{}.victim) name += "_victim" + std::to_string(info.param.victim);
  return name;
}

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
                    Case{8, "--tp 2 --zero 3 --hsdp 2"}, Case{2, "--ep 2 --experts 4 --topk 2"},
                    Case{3, "--ep 3 --experts 6 --topk 1 --capacity 0.8 --batch 9"},
                    Case{4, "--ep 2 --experts 4 --topk 2 --capacity 1.0"},
                    Case{4, "--ep 4 --experts 4 --topk 2 --capacity 1.0 --ep-sync-free"},
                    Case{8, "--ep 4 --experts 8 --topk 2 --layers 1"},
                    // Pipeline parallel: layers over stages, micro-batch gradients accumulated.
                    Case{1, "--microbatches 4 --schedule gpipe"},
                    Case{2, "--pp 2 --microbatches 4 --schedule gpipe"},
                    Case{2, "--pp 2 --microbatches 4 --schedule 1f1b"},
                    Case{2,
                         "--pp 2 --microbatches 4 --schedule interleaved --virtual 2 --layers 4"},
                    Case{2, "--pp 2 --microbatches 4 --schedule zb"},
                    Case{4, "--pp 4 --microbatches 4 --schedule 1f1b --layers 4"},
                    Case{4, "--pp 2 --tp 2 --microbatches 2 --schedule zb"},
                    Case{4,
                         "--pp 2 --dp 2 --microbatches 2 --schedule interleaved --virtual 2 "
                         "--layers 4"},
                    Case{8, "--pp 2 --tp 2 --dp 2 --microbatches 2 --schedule 1f1b"}),
    case_name);

struct BadCase {
  int ranks;
  std::string args, message;
};

class BadInputTest : public testing::TestWithParam<BadCase> {};

std::string bad_case_name(const testing::TestParamInfo<BadCase>& info) {
  return weft::testing::command_case_name(info.index, info.param.args);
}

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
        BadCase{2, "--frobnicate", "unknown option --frobnicate"},
        BadCase{2, "--ep 2", "--ep and --ep-sync-free need --experts"},
        BadCase{2, "--experts 4 --topk 5", "--topk 5 is not in [1, --experts 4]"},
        BadCase{4, "--ep 4 --experts 6", "--experts 6 is not divisible by --ep 4"},
        BadCase{4, "--ep 3 --experts 6", "--ep 3 does not divide dp 4"},
        BadCase{2, "--experts 4 --tp 2", "--experts needs --tp 1"},
        BadCase{2, "--experts 4 --capacity -1", "--capacity -1"},
        BadCase{2, "--experts 4 --capacity x", "--capacity: 'x' is not a number"},
        BadCase{3, "--pp 2", "--tp 1 x --pp 2 does not divide the world size 3"},
        BadCase{2, "--pp 2 --layers 3", "--layers 3 is not divisible by --pp x --virtual = 2"},
        BadCase{2, "--pp 2 --schedule interleaved --virtual 2 --layers 8 --microbatches 1",
                "--microbatches 1 must be a multiple of --pp 2 for the interleaved schedule"},
        BadCase{2, "--pp 2 --schedule 1f1b --virtual 2 --layers 4",
                "--virtual 2 needs --schedule interleaved"},
        BadCase{2, "--pp 2 --schedule pipedream", "--schedule pipedream is not gpipe"},
        BadCase{2, "--pp 2 --microbatches 3", "is not divisible by --microbatches 3"},
        BadCase{2, "--pp 2 --zero 1", "--zero 1 with --pp or --microbatches is not supported"}),
    bad_case_name);

// ep × dp with a capacity: the MoE layers went through the EP dispatcher (the ledger has its
// AllToAllv and the expert-DP reduction beside their expected calls) and pairs were dropped.
TEST(WeftTrainTest, MoeDispatchesOverEpAndReducesExpertsOverExpertDp) {
  const Outcome run = weft_train(4, "--ep 2 --experts 4 --topk 2 --capacity 0.5");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
  expect_ledger_rows(run, {"ep.dispatch            alltoallv     expert:ep            4",
                           "ep.dispatch_backward   alltoallv     expert:ep            4",
                           "dp.bucket              allreduce     expert:edp           2"});
  const size_t at = run.out.find("dropped by rank 0 ");
  ASSERT_NE(at, std::string::npos) << run.out;
  EXPECT_GT(std::strtod(run.out.c_str() + at + 18, nullptr), 0) << run.out;
}

// Count-sync-free: the same model with no count exchange before the transfers.
TEST(WeftTrainTest, MoeCountSyncFreeExchangesNoCounts) {
  const Outcome run = weft_train(2, "--ep 2 --experts 4 --topk 2 --ep-sync-free");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
  EXPECT_NE(run.out.find("ep.combine             alltoallv     expert:ep"), std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("ep.counts"), std::string::npos) << run.out;
}

// Context parallel: every algorithm, alone and with dp, tp (and sp) and ZeRO.
INSTANTIATE_TEST_SUITE_P(
    TrainCp, MatrixTest,
    testing::Values(Case{2, "--cp 2"}, Case{3, "--cp 3 --cp-algo passq --seq 12"},
                    Case{4, "--cp 4 --cp-algo zigzag"}, Case{4, "--cp 2 --tp 2 --cp-algo ulysses"},
                    Case{4, "--cp 2 --dp 2 --cp-algo allgather --zero 3"},
                    Case{4, "--cp 4 --cp-algo auto"},
                    Case{8, "--dp 2 --tp 2 --cp 2 --cp-algo zigzag --sp --zero 1"},
                    // hier on emulated nodes: 2 nodes of 2 cp ranks; tp inside a node (cp
                    // across: the ring alone); 2 nodes of 2 cp ranks in each of 2 dp replicas.
                    Case{4, "--cp 4 --cp-algo hier --nodes 2"},
                    Case{4, "--cp 2 --tp 2 --cp-algo hier --nodes 2"},
                    Case{8, "--dp 2 --cp 4 --cp-algo hier --nodes 4 --zero 2"},
                    // Compressed attention: the model itself changes, so also on one rank;
                    // disjoint blocks, tp with sp, every position starting a block with dp.
                    Case{1, "--cp-algo compressed"}, Case{2, "--cp 2 --cp-algo compressed"},
                    Case{4, "--cp 4 --cp-algo compressed --compress-block 3 --compress-stride 3"},
                    Case{4, "--cp 2 --tp 2 --cp-algo compressed --sp --zero 2"},
                    Case{4,
                         "--cp 2 --dp 2 --cp-algo compressed --zero 3 --compress-block 5 "
                         "--compress-stride 1"}),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    TrainCp, BadInputTest,
    testing::Values(
        BadCase{4, "--cp 4 --cp-algo zigzag --seq 12", "--seq 12 is not divisible by 2 x --cp 8"},
        BadCase{2, "--cp 2 --seq 15", "--seq 15 is not divisible by --cp 2"},
        BadCase{4, "--cp 4 --cp-algo ulysses --heads 6 --hidden 48",
                "--heads 6 / --tp does not divide by --cp 4"},
        BadCase{2, "--cp 2 --cp-algo spiral", "--cp-algo 'spiral' is not"},
        BadCase{4, "--cp 3 --seq 12", "--tp 1 x --cp 3 does not divide the world size 4"},
        BadCase{4, "--cp 4 --cp-algo hier --nodes 3", "--nodes 3 does not divide the world size 4"},
        BadCase{4, "--cp 4 --cp-algo compressed --compress-block 6",
                "--seq 16 / --cp 4 is fewer positions than --compress-block 6 - 1"},
        BadCase{2, "--cp 2 --cp-algo compressed --compress-stride 5",
                "--compress-stride 5 must be in [1, --compress-block 4]"},
        BadCase{2, "--cp-algo compressed --pp 2",
                "--cp-algo compressed with --pp or --microbatches is not supported"}),
    bad_case_name);

// Compressed attention trains through the adapter's backward: its ReduceScatter of the
// entries' gradients and the halo's way back, 2 layers x 2 steps each, beside the forward's.
TEST(WeftTrainTest, CompressedCpRunsTheAdapterBackward) {
  const Outcome run = weft_train(2, "--cp 2 --cp-algo compressed");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
  expect_ledger_rows(run, {"cp.compressed_halo     sendrecv      cp                   4",
                           "cp.compressed_blocks   allgather     cp                   4",
                           "cp.compressed_blocks_grad reducescatter cp                   4",
                           "cp.compressed_halo_grad sendrecv      cp                   4"});
}

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

TEST(WeftTrainTest, PipelineBooksItsTransfersAndReportsItsBubble) {
  const Outcome run = weft_train(2, "--pp 2 --microbatches 4 --schedule 1f1b --profile --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict(), "# weft-train: PASS") << run.out;
  // Stage 0 sends each micro-batch's activation (2·16·64 fp32) forward, 2 steps of 4, in the
  // ledger and in its closed form.
  const std::string entry =
      "{\"pattern\":\"pp.forward\",\"primitive\":\"send\",\"dim\":\"pp\",\"calls\":8,"
      "\"bytes_per_call\":8192,";
  const size_t first = run.out.find(entry);
  ASSERT_NE(first, std::string::npos) << run.out;
  EXPECT_NE(run.out.find(entry, first + 1), std::string::npos) << run.out;
  for (const char* stage : {"# rank 0 (pp 0, 1f1b): pipeline bubble measured",
                            "# rank 1 (pp 1, 1f1b): pipeline bubble measured"})
    EXPECT_NE(run.out.find(stage), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("simulated 20.0%, formula 20.0%"), std::string::npos) << run.out;
}

TEST(WeftTrainTest, PerturbedPipelineGradientFails) {
  const Outcome run = weft_train(2, "--pp 2 --microbatches 2 --debug-perturb-grad");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.verdict().rfind("# weft-train: FAIL: gradients differ by ", 0), 0u) << run.out;
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

// Checkpoints. A run killed at the start of step 5 (checkpoints every 2 steps) and resumed
// from its newest complete checkpoint (step 4) repeats the uninterrupted run's losses of
// steps 5 and 6 bit for bit: the same state on the same mesh does the same arithmetic.
class ResumeTest : public testing::TestWithParam<Case> {};

TEST_P(ResumeTest, KilledRunResumedFromItsCheckpointRepeatsTheLossesBitwise) {
  const Case& c = GetParam();
  weft::testing::TempDir dir;
  const std::string run_args = c.args + " --steps 6 --json --checkpoint-dir " + dir.path();
  const Outcome whole = weft_train(c.ranks, c.args + " --steps 6 --json");
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  const std::vector<double> expected = json_list(whole.out, "losses");
  ASSERT_EQ(expected.size(), 6u) << whole.out;

  const Outcome killed =
      weft_train(c.ranks, run_args + " --checkpoint-every 2 --debug-kill-rank " +
                              std::to_string(c.ranks - 1) + " --debug-kill-step 5");
  EXPECT_NE(killed.exit_code, 0) << killed.out;
  EXPECT_EQ(killed.out.find("# weft-train: PASS"), std::string::npos) << killed.out;
  for (const char* file :
       {"step-00000002/manifest", "step-00000004/manifest", "step-00000004/rank-0.bin"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(file))) << file;
  EXPECT_FALSE(std::filesystem::exists(dir.file("step-00000006"))) << killed.out;

  const Outcome resumed = weft_train(c.ranks, run_args + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_EQ(resumed.verdict(), "# weft-train: PASS") << resumed.out;
  EXPECT_EQ(json_number(resumed.out, "first_step"), 4) << resumed.out;
  const std::vector<double> losses = json_list(resumed.out, "losses");
  ASSERT_EQ(losses.size(), 2u) << resumed.out;
  EXPECT_EQ(losses[0], expected[4]) << resumed.out;
  EXPECT_EQ(losses[1], expected[5]) << resumed.out;
}

INSTANTIATE_TEST_SUITE_P(
    Train, ResumeTest,
    testing::Values(Case{2, "--dp 2"}, Case{2, "--tp 2 --sp"}, Case{4, "--dp 2 --tp 2"},
                    Case{2, "--zero 1"}, Case{2, "--zero 2"}, Case{2, "--zero 3"},
                    Case{4, "--zero 3 --hsdp 2"}, Case{4, "--dp 2 --tp 2 --sp --zero 1"},
                    Case{2, "--pp 2"}, Case{2, "--microbatches 2"},
                    Case{4, "--pp 2 --tp 2 --microbatches 2"},
                    Case{4, "--pp 2 --dp 2 --microbatches 2 --batch 4 --schedule zb"},
                    Case{2, "--cp 2"}, Case{4, "--cp 2 --dp 2 --cp-algo zigzag --zero 1"},
                    Case{2, "--ep 2 --experts 4 --topk 2"},
                    Case{4, "--ep 2 --experts 4 --topk 2 --capacity 1.0"}),
    case_name);

// A run that went on from the step-4 checkpoint of a 6-step run on dp 2, another dp than the
// writer's: step 5's forward runs on the same parameters, so its loss differs from the
// uninterrupted run's only by the order of the loss sum; step 6 follows gradients summed in
// another order (fp32), so it agrees to the verdict's tolerance. Returns its losses.
std::vector<double> expect_went_on_with_dp2(const Outcome& run,
                                            const std::vector<double>& expected) {
  EXPECT_EQ(json_number(run.out, "dp"), 2) << run.out;
  EXPECT_EQ(json_number(run.out, "first_step"), 4) << run.out;
  const std::vector<double> losses = json_list(run.out, "losses");
  EXPECT_EQ(losses.size(), 2u) << run.out;
  if (losses.size() == 2 && expected.size() == 6) {
    EXPECT_NEAR(losses[0], expected[4], 1e-12 * expected[4]) << run.out;
    EXPECT_NEAR(losses[1], expected[5], 1e-5 * expected[5]) << run.out;
  }
  return losses;
}

// A ZeRO checkpoint is re-sharded for another dp: written by 4 ranks of ZeRO-2, resumed on 2.
TEST(WeftTrainTest, ZeroCheckpointResumesOnAnotherDp) {
  weft::testing::TempDir dir;
  const std::string model = "--zero 2 --batch 4 --steps 6 --json --checkpoint-dir " + dir.path();
  const Outcome written = weft_train(4, model + " --checkpoint-every 4");
  ASSERT_EQ(written.exit_code, 0) << written.out;
  const std::vector<double> expected = json_list(written.out, "losses");
  ASSERT_EQ(expected.size(), 6u) << written.out;
  std::filesystem::remove_all(dir.file("step-00000006"));

  const Outcome resumed = weft_train(2, model + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_EQ(resumed.verdict(), "# weft-train: PASS") << resumed.out;
  expect_went_on_with_dp2(resumed, expected);
}

// Rank 2 of 3 (dp 3) dies as step 5 begins; the survivors shrink the world, read the step-4
// checkpoint (rank 2's shard too) and finish on dp 2 with the same global batch: with DP
// bucketing, and with ZeRO-1 (the checkpoint re-sharded over the survivors); and rank 0,
// whose process hosts the world's bootstrap root (the survivors agree without it).
class ShrinkTest : public testing::TestWithParam<Case> {};

TEST_P(ShrinkTest, SurvivorsOfAKilledRankShrinkAndGoOnFromTheCheckpoint) {
  weft::testing::TempDir dir;
  const std::string model = GetParam().args + " --batch 6 --steps 6 --json";
  const Outcome whole = weft_train(3, model);
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  const std::vector<double> expected = json_list(whole.out, "losses");
  ASSERT_EQ(expected.size(), 6u) << whole.out;

  const Outcome run = weft_train(3,
                                 model + " --checkpoint-dir " + dir.path() +
                                     " --checkpoint-every 2 --shrink-on-failure "
                                     "--debug-kill-rank " +
                                     std::to_string(GetParam().victim) + " --debug-kill-step 5",
                                 "--keep-going");
  EXPECT_EQ(run.exit_code, 128 + 9) << run.out;  // weftrun reports the killed rank
  // The victim dies as step 5 begins, once through step 4's checkpoint; the survivors may
  // still be leaving that checkpoint's last barrier when the verdict comes, and then report
  // the failure in step 4.
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex("# weft-train: rank " + std::to_string(GetParam().victim) +
                          " died in step [45]; 2 survivors go on from "
                          "step 4 with dp 2")))
      << run.out;
  EXPECT_NE(run.out.find("# weft-train: PASS"), std::string::npos) << run.out;
  EXPECT_EQ(json_number(run.out, "world"), 2) << run.out;
  const std::vector<double> losses = expect_went_on_with_dp2(run, expected);
  ASSERT_EQ(losses.size(), 2u) << run.out;
  EXPECT_LE(json_number(run.out, "loss"), 1e-5) << run.out;

  // The survivors' continuation is a resume on the smaller mesh: a fresh 2-rank run from the
  // same (3-rank) checkpoint repeats its losses bit for bit.
  ASSERT_TRUE(std::filesystem::exists(dir.file("step-00000006/manifest"))) << run.out;
  std::filesystem::remove_all(dir.file("step-00000006"));
  const Outcome resumed = weft_train(2, model + " --checkpoint-dir " + dir.path() + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_EQ(json_number(resumed.out, "first_step"), 4) << resumed.out;
  EXPECT_EQ(json_list(resumed.out, "losses"), losses) << resumed.out;
}

INSTANTIATE_TEST_SUITE_P(Train, ShrinkTest,
                         testing::Values(Case{3, ""}, Case{3, "--zero 1"}, Case{3, "", 0}),
                         case_name);

// Checkpoint options without a directory, or with meshes they do not cover, are refused
// before anything runs.
INSTANTIATE_TEST_SUITE_P(
    TrainCheckpoint, BadInputTest,
    testing::Values(BadCase{2, "--checkpoint-every 2", "--checkpoint-every needs --checkpoint-dir"},
                    BadCase{2, "--resume", "--resume needs --checkpoint-dir"},
                    BadCase{2, "--shrink-on-failure", "--shrink-on-failure needs --checkpoint-dir"},
                    BadCase{2, "--checkpoint-dir /tmp --checkpoint-every -1",
                            "--checkpoint-every -1 must be >= 0"},
                    BadCase{2, "--pp 2 --checkpoint-dir /tmp --shrink-on-failure",
                            "--shrink-on-failure with --pp or --microbatches is not supported"},
                    BadCase{
                        2, "--resume --checkpoint-dir /nonexistent/weft-train-checkpoints",
                        "--checkpoint-dir /nonexistent/weft-train-checkpoints is not a directory"}),
    bad_case_name);

// What a checkpoint directory can hold that --resume must refuse (or skip), each named.
TEST(WeftTrainTest, BadCheckpointsAreRefusedNamingTheProblem) {
  weft::testing::TempDir dir;
  const std::string at = " --checkpoint-dir " + dir.path();
  const Outcome empty = weft_train(2, "--tp 2 --resume" + at);
  EXPECT_EQ(empty.exit_code, 2) << empty.out;
  EXPECT_NE(empty.out.find("--resume: no complete checkpoint in " + dir.path()), std::string::npos)
      << empty.out;

  const Outcome written = weft_train(2, "--tp 2 --steps 2 --checkpoint-every 1" + at);
  ASSERT_EQ(written.exit_code, 0) << written.out;
  struct Refusal {
    std::string args, message;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {"--dp 2 --steps 4",
            "was written on the mesh dp 1 x tp 2 x cp 1 x pp 1 x ep 1, zero 0, without --sp; this "
            "run's is dp 2 x tp 1 x cp 1 x pp 1 x ep 1, zero 0, without --sp (all but dp must "
            "match)"},
           {"--tp 2 --sp --steps 4",
            "this run's is dp 1 x tp 2 x cp 1 x pp 1 x ep 1, zero 0, with --sp"},
           {"--tp 2 --zero 1 --steps 4",
            "this run's is dp 1 x tp 2 x cp 1 x pp 1 x ep 1, zero 1, without --sp"},
           {"--cp 2 --steps 4", "this run's is dp 1 x tp 1 x cp 2 x pp 1 x ep 1"},
           {"--ep 2 --experts 4 --steps 4", "this run's is dp 2 x tp 1 x cp 1 x pp 1 x ep 2"},
           {"--tp 2 --steps 4 --seed 2", "was written with --seed 1; this run has --seed 2"},
           {"--tp 2 --steps 2", "is of step 2, not before --steps 2"}}) {
    const Outcome run = weft_train(2, r.args + " --resume" + at);
    EXPECT_EQ(run.exit_code, 2) << r.args << "\n" << run.out;
    EXPECT_NE(run.out.find("weft-train: error: --resume: "), std::string::npos) << run.out;
    EXPECT_NE(run.out.find(r.message), std::string::npos) << r.args << "\n" << run.out;
  }

  // A step without a manifest is incomplete: the newest complete one is used.
  std::filesystem::remove(dir.file("step-00000002/manifest"));
  const Outcome older = weft_train(2, "--tp 2 --steps 3 --json --resume" + at);
  ASSERT_EQ(older.exit_code, 0) << older.out;
  EXPECT_EQ(json_number(older.out, "first_step"), 1) << older.out;
  EXPECT_EQ(older.verdict(), "# weft-train: PASS") << older.out;

  // A truncated shard names its file.
  std::filesystem::resize_file(dir.file("step-00000001/rank-1.bin"), 100);
  const Outcome truncated = weft_train(2, "--tp 2 --steps 3 --resume" + at);
  EXPECT_EQ(truncated.exit_code, 2) << truncated.out;
  EXPECT_NE(truncated.out.find(dir.file("step-00000001/rank-1.bin") + " is truncated"),
            std::string::npos)
      << truncated.out;

  // A directory that cannot be made: its path is named.
  std::ofstream(dir.file("plain-file")) << "not a directory";
  const Outcome blocked =
      weft_train(2, "--tp 2 --checkpoint-every 1 --checkpoint-dir " + dir.file("plain-file"));
  EXPECT_EQ(blocked.exit_code, 2) << blocked.out;
  EXPECT_NE(blocked.out.find("--checkpoint-dir: cannot create " + dir.file("plain-file")),
            std::string::npos)
      << blocked.out;
}

}  // namespace
