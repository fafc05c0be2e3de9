// weft-plan: its ledger equals the one weft-train records on the same configuration, entry
// for entry; its collective times are the ones a communicator on the same cluster file
// predicts; the pipeline bubble and memory follow their formulas; bad input is one line
// naming the argument with exit status 2; --search ranks what fits and says why the rest
// does not.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "planner.h"
#include "support/command.h"
#include "support/multirank.h"
#include "topo/cluster_file.h"
#include "weft/weft.h"

namespace {

namespace plan = weft::plan;

const std::string kData = std::string(WEFT_SOURCE_DIR) + "/tests/tools/data/";

struct Outcome {
  int exit_code = -1;
  std::string out;
};

Outcome run_command(const std::string& command) {
  Outcome outcome;
  outcome.exit_code = weft::testing::run_command(command, &outcome.out);
  return outcome;
}

Outcome weft_plan(const std::string& args, bool with_stderr = false) {
  return run_command(std::string(WEFT_PLAN_PATH) + " " + args +
                     (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// (pattern, primitive, dim, bytes_per_call) -> calls, from the objects of the JSON array
// that follows `key` (weft-train's "ledger", weft-plan's "entries").
using Key = std::tuple<std::string, std::string, std::string, size_t>;
std::map<Key, size_t> ledger_of(const std::string& json, const std::string& key) {
  std::map<Key, size_t> out;
  const size_t at = json.find("\"" + key + "\":[");
  if (at == std::string::npos) return out;
  const size_t end = json.find(']', at);
  const std::string array = json.substr(at, end - at);
  const std::regex entry(
      "\\{\"pattern\":\"([^\"]*)\",\"primitive\":\"([^\"]*)\",\"dim\":\"([^\"]*)\"[^}]*?"
      "\"calls\":([0-9]+)[^}]*?\"bytes_per_call\":([0-9]+)");
  for (std::sregex_iterator it(array.begin(), array.end(), entry), last; it != last; ++it)
    out[{(*it)[1], (*it)[2], (*it)[3], std::stoull((*it)[5])}] += std::stoull((*it)[4]);
  return out;
}

double number_after(const std::string& text, const std::string& key, size_t from = 0) {
  const size_t at = text.find("\"" + key + "\":", from);
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + key.size() + 3, nullptr);
}

// ---------------------------------------------------------------------------

struct TrainCase {
  int ranks;
  int tp;
  std::string args;             // the flags both tools take
  std::string train_args = "";  // weft-train's only (the ledger does not depend on them)
  int pp = 1, cp = 1, ep = 1, microbatches = 1;
  std::string cluster = "plan-2x4.json";  // weft-train's --nodes must place ranks as it does
};

class LedgerTest : public testing::TestWithParam<TrainCase> {};

std::string train_case_name(const testing::TestParamInfo<TrainCase>& info) {
  const TrainCase& c = info.param;
  return weft::testing::command_case_name(
      info.index, std::to_string(c.ranks) + " ranks tp " + std::to_string(c.tp) + " pp " +
                      std::to_string(c.pp) + " cp " + std::to_string(c.cp) + " ep " +
                      std::to_string(c.ep) + " " + c.args + " " + c.train_args);
}

// weft-train's defaults: 2 layers, hidden 64, 8 heads, ffn 128, vocab 128, seq 16, batch 8.
TEST_P(LedgerTest, PlannerLedgerEqualsWeftTrainsEntryForEntry) {
  const TrainCase& c = GetParam();
  const std::string mesh = " --tp " + std::to_string(c.tp) + " --pp " + std::to_string(c.pp) +
                           " --cp " + std::to_string(c.cp) + " --ep " + std::to_string(c.ep) +
                           " --microbatches " + std::to_string(c.microbatches) + " " + c.args;
  const Outcome train =
      run_command(std::string(WEFTRUN_PATH) + " --timeout 90 --bind-to none --no-prefix -n " +
                  std::to_string(c.ranks) + " " + WEFT_TRAIN_PATH + mesh + " " + c.train_args +
                  " --steps 1 --json 2>&1");
  ASSERT_EQ(train.exit_code, 0) << train.out;
  // weft-train's data-parallel ranks (EP among them); the planner's dp is expert-DP.
  const int dp = c.ranks / (c.tp * c.pp * c.cp);
  const Outcome planned = weft_plan(
      "--arch reference --layers 2 --hidden 64 --heads 8 --ffn 128 --vocab 128 "
      "--comm-dtype fp32 --train 8," +
      std::to_string(8 / (dp * c.microbatches)) + ",16 --dp " + std::to_string(dp / c.ep) + mesh +
      " --cluster " + kData + c.cluster + " --json");
  ASSERT_EQ(planned.exit_code, 0) << planned.out;
  const auto recorded = ledger_of(train.out, "ledger");
  const auto expected = ledger_of(planned.out, "entries");
  ASSERT_FALSE(recorded.empty()) << train.out;
  EXPECT_EQ(expected, recorded) << "weft-train:\n" << train.out << "\nweft-plan:\n" << planned.out;
}

INSTANTIATE_TEST_SUITE_P(Patterns, LedgerTest,
                         testing::Values(TrainCase{2, 1, "--zero 0"}, TrainCase{2, 2, "--zero 0"},
                                         TrainCase{2, 2, "--sp"}, TrainCase{2, 1, "--zero 1"},
                                         TrainCase{2, 1, "--zero 2"}, TrainCase{2, 1, "--zero 3"},
                                         TrainCase{4, 2, "--sp --zero 1"},
                                         TrainCase{4, 1, "--zero 3 --hsdp 2"},
                                         TrainCase{8, 2, "--zero 3 --hsdp 2"}),
                         train_case_name);

// MoE: the count AllGather (not with --ep-sync-free), dispatch and combine over EP and the
// experts' buckets over expert-DP; capacity drops tokens but not calls or buffer sizes.
INSTANTIATE_TEST_SUITE_P(
    Experts, LedgerTest,
    testing::Values(TrainCase{2, 1, "--experts 4 --topk 2", "", 1, 1, 2},
                    TrainCase{4, 1, "--experts 4 --topk 2", "--capacity 1.25", 1, 1, 2},
                    TrainCase{4, 1, "--experts 4 --topk 1 --ep-sync-free", "", 1, 1, 4},
                    TrainCase{4, 1, "--experts 8 --topk 2 --ep-sync-free", "--capacity 1", 1, 1,
                              2}),
    train_case_name);

// Pipelines: every schedule's stage-to-stage transfers, with TP and DP beside them.
INSTANTIATE_TEST_SUITE_P(
    Pipeline, LedgerTest,
    testing::Values(TrainCase{2, 1, "--schedule gpipe", "", 2, 1, 1, 2},
                    TrainCase{2, 1, "--schedule 1f1b", "", 2, 1, 1, 4},
                    TrainCase{4, 2, "--schedule zb", "", 2, 1, 1, 2},
                    TrainCase{4, 1, "--schedule interleaved --virtual 2 --layers 4", "", 2, 1, 1,
                              2},
                    TrainCase{8, 1, "--schedule 1f1b --layers 4", "", 4, 1, 1, 2}),
    train_case_name);

// Context parallelism: every attention algorithm's exchange, and DP over dp-cp.
INSTANTIATE_TEST_SUITE_P(
    Context, LedgerTest,
    testing::Values(TrainCase{2, 1, "--cp-algo ring", "", 1, 2},
                    TrainCase{2, 1, "--cp-algo zigzag", "", 1, 2},
                    TrainCase{2, 1, "--cp-algo passq", "", 1, 2},
                    TrainCase{2, 1, "--cp-algo allgather", "", 1, 2},
                    TrainCase{2, 1, "--cp-algo ulysses", "", 1, 2},
                    TrainCase{2, 1, "--cp-algo auto", "", 1, 2},
                    TrainCase{4, 2, "--cp-algo ulysses", "", 1, 2},
                    TrainCase{8, 1, "--cp-algo zigzag --zero 1", "", 1, 4},
                    // hier: Ulysses over the 2 ranks of a node, ring over 2
                    TrainCase{4, 1, "--cp-algo hier", "--nodes 2", 1, 4, 1, 1, "plan-2x2.json"},
                    TrainCase{8, 1, "--cp-algo hier --zero 1", "--nodes 2", 1, 4}),
    train_case_name);

// ---------------------------------------------------------------------------

// (pattern, primitive, dim, bytes_per_call) -> calls of a Ledger::table's rows whose
// pattern starts with `family` ("cp.", "ep.").
std::map<Key, size_t> rows_of_table(const std::string& table, const std::string& family) {
  std::map<Key, size_t> out;
  const std::regex row("^  (" + family + "[^ ]+) +([a-z]+) +([^ ]+) +([0-9]+) +([0-9]+) ");
  std::smatch m;
  for (size_t from = 0, nl; (nl = table.find('\n', from)) != std::string::npos; from = nl + 1) {
    const std::string line = table.substr(from, nl - from);
    if (std::regex_search(line, m, row))
      out[{m[1], m[2], m[3], std::stoull(m[5])}] += std::stoull(m[4]);
  }
  return out;
}

// The entries of a weft-plan --json whose pattern starts with `family`.
std::map<Key, size_t> entries_of(const std::string& json, const std::string& family) {
  std::map<Key, size_t> out;
  for (const auto& [key, calls] : ledger_of(json, "entries"))
    if (std::get<0>(key).starts_with(family)) out[key] = calls;
  return out;
}

struct CpCase {
  int ranks;
  std::string mixer;  // adapter_ledger_job's: attention, affine, compressed
  std::string algo;   // weft-plan's --cp-algo
  int heads, kv_heads;
  std::string job_args = "";  // adapter_ledger_job's only
  std::string plan_args = "";
  std::string cluster = "plan-2x4.json";
};

class CpLedgerTest : public testing::TestWithParam<CpCase> {};

std::string cp_case_name(const testing::TestParamInfo<CpCase>& info) {
  const CpCase& c = info.param;
  return weft::testing::command_case_name(info.index, std::to_string(c.ranks) + " ranks " + c.algo +
                                                          " heads " + std::to_string(c.heads) +
                                                          " kv " + std::to_string(c.kv_heads));
}

// The adapters of lib/parallel on a real weftrun job (one layer, batch 2, head dim 8,
// 32 positions) book what weft-plan plans for one layer and micro-batch, entry for
// entry: grouped-query K/V (kv_heads < heads) in every softmax algorithm, the
// hierarchical one's two levels, and the affine and compressed recurrences.
TEST_P(CpLedgerTest, PlannedCpTrafficEqualsTheAdaptersEntryForEntry) {
  const CpCase& c = GetParam();
  const std::string kv = std::to_string(c.kv_heads), heads = std::to_string(c.heads);
  const Outcome job =
      run_command(std::string(WEFTRUN_PATH) + " --timeout 90 --bind-to none --no-prefix -n " +
                  std::to_string(c.ranks) + " " + ADAPTER_LEDGER_JOB_PATH + " " + c.mixer +
                  " --algo " + (c.mixer == "attention" ? c.algo : "ring") + " --batch 2 --heads " +
                  heads + " --kv-heads " + kv + " --head-dim 8 --seq 32 " + c.job_args + " 2>&1");
  ASSERT_EQ(job.exit_code, 0) << job.out;
  const Outcome planned = weft_plan("--layers 1 --hidden " + std::to_string(8 * c.heads) +
                                    " --heads " + heads + " --kv-heads " + kv +
                                    " --ffn 64 --vocab 64 --comm-dtype fp32 --train 2,2,32 --cp " +
                                    std::to_string(c.ranks) + " --dp 1 --cp-algo " + c.algo + " " +
                                    c.plan_args + " --cluster " + kData + c.cluster + " --json");
  ASSERT_EQ(planned.exit_code, 0) << planned.out;
  const auto recorded = rows_of_table(job.out, "cp\\.");
  ASSERT_FALSE(recorded.empty()) << job.out;
  EXPECT_EQ(entries_of(planned.out, "cp."), recorded) << "adapter:\n"
                                                      << job.out << "\nweft-plan:\n"
                                                      << planned.out;
}

INSTANTIATE_TEST_SUITE_P(
    Context, CpLedgerTest,
    testing::Values(CpCase{2, "attention", "ring", 4, 2}, CpCase{4, "attention", "zigzag", 4, 1},
                    CpCase{2, "attention", "passq", 4, 2},
                    CpCase{4, "attention", "allgather", 8, 2},
                    CpCase{2, "attention", "ulysses", 4, 2},
                    CpCase{4, "attention", "hier", 8, 2, "--nodes 2", "", "plan-2x2.json"},
                    CpCase{2, "affine", "affine", 4, 4}, CpCase{4, "affine", "affine", 2, 2},
                    CpCase{2, "compressed", "compressed", 4, 2, "--block 4 --stride 2",
                           "--cp-block 4 --cp-stride 2"},
                    CpCase{4, "compressed", "compressed", 4, 1, "--block 6 --stride 4",
                           "--cp-block 6 --cp-stride 4"}),
    cp_case_name);

// ---------------------------------------------------------------------------

// The planned time of a collective is the tuner's prediction on the cluster file: a
// communicator built on the same file (WEFT_TOPO_FILE) reports the same algorithm and
// time for the same call.
TEST(PlanPrediction, EqualsTheCommunicatorsOnTheSameClusterFile) {
  const std::string file = kData + "plan-2x2.json";
  const Outcome planned = weft_plan(
      "--arch reference --layers 2 --hidden 64 --heads 8 --ffn 128 --vocab 128 --comm-dtype fp32 "
      "--train 4,4,16 --tp 4 --dp 1 --sp --cluster " +
      file + " --json");
  ASSERT_EQ(planned.exit_code, 0) << planned.out;
  struct Call {
    std::string primitive;
    size_t bytes;
    std::string algorithm;
    double us;
  };
  // And an AllToAll: Ulysses CP over the same 4 ranks.
  const Outcome ulysses = weft_plan(
      "--arch reference --layers 2 --hidden 64 --heads 8 --ffn 128 --vocab 128 --comm-dtype fp32 "
      "--train 4,4,16 --cp 4 --dp 1 --cp-algo ulysses --cluster " +
      file + " --json");
  ASSERT_EQ(ulysses.exit_code, 0) << ulysses.out;
  std::vector<Call> calls;
  for (const auto& [json, pattern] : {std::pair{&planned.out, "tp.sp_grads"},
                                      {&planned.out, "sp.gather_from"},
                                      {&ulysses.out, "cp.ulysses"}}) {
    const size_t at = json->find(std::string("{\"pattern\":\"") + pattern);
    ASSERT_NE(at, std::string::npos) << *json;
    Call call;
    const size_t prim = json->find("\"primitive\":\"", at) + 13;
    call.primitive = json->substr(prim, json->find('"', prim) - prim);
    call.bytes = static_cast<size_t>(number_after(*json, "bytes_per_call", at));
    const size_t alg = json->find("\"algorithm\":\"", at) + 13;
    call.algorithm = json->substr(alg, json->find('"', alg) - alg);
    call.us = number_after(*json, "predicted_us", at);
    ASSERT_GT(call.us, 0) << *json;
    calls.push_back(call);
  }
  ASSERT_EQ(calls[0].primitive, "allreduce");
  ASSERT_EQ(calls[1].primitive, "allgather");
  ASSERT_EQ(calls[2].primitive, "alltoall");

  // The library's figure is what the tool printed (to its 9 digits).
  weft::topo::Cluster cluster;
  ASSERT_TRUE(weft::topo::load_cluster_file(file, &cluster).ok());
  std::vector<plan::CallPrediction> library;
  for (const Call& call : calls) {
    library.push_back(plan::predict_call(cluster, {0, 1, 2, 3}, call.primitive, call.bytes, 4));
    EXPECT_EQ(library.back().algorithm, call.algorithm);
    EXPECT_NEAR(library.back().us, call.us, call.us * 1e-8);
  }

  weft::testing::RunOptions options;
  options.env = {{"WEFT_TOPO_FILE", file.c_str()}, {"WEFT_SHM_DISABLE", "1"}};
  weft::testing::run_ranks(
      4,
      [&](const weft::testing::RankContext& context) {
        weftComm_t comm = weft::testing::init_comm(context);
        for (size_t i = 0; i < calls.size(); ++i) {
          const size_t floats = calls[i].bytes / sizeof(float);
          std::vector<float> send(floats, 1.0f), recv(floats, 0.0f);
          if (calls[i].primitive == "allreduce")
            ASSERT_EQ(weftAllReduce(send.data(), recv.data(), floats, weftFloat32, weftSum, comm,
                                    nullptr),
                      weftSuccess);
          else if (calls[i].primitive == "allgather")
            ASSERT_EQ(weftAllGather(send.data(), recv.data(), floats / context.nranks, weftFloat32,
                                    comm, nullptr),
                      weftSuccess);
          else  // the planned buffer, a piece per peer
            ASSERT_EQ(weftAllToAll(send.data(), recv.data(), floats / context.nranks, weftFloat32,
                                   comm, nullptr),
                      weftSuccess);
          EXPECT_EQ(recv[floats - 1], calls[i].primitive == "allreduce" ? 4.0f : 1.0f);
          const char* algorithm = nullptr;
          double us = -1;
          ASSERT_EQ(weftCommLastAlgorithm(comm, &algorithm, &us), weftSuccess);
          EXPECT_EQ(std::string(algorithm), library[i].algorithm) << calls[i].primitive;
          EXPECT_DOUBLE_EQ(us, library[i].us) << calls[i].primitive;
        }
        ASSERT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

// The DeepSeek-V3-like dispatch (docs/planning.md): 448 MiB of routed rows (1 × 4096
// tokens × top-8 × 7168 × bf16) per AllToAllv over EP 64 on 8 nodes of the modelled
// cluster is timed, as the AllToAllv of its per-peer pieces (uniform routing).
TEST(PlanPrediction, DeepSeekV3DispatchOverSixtyFourRanksIsTimed) {
  const Outcome out = weft_plan(
      "--model deepseek-v3 --layers 4 --dense-layers 0 --train 128,1,4096 --tp 1 --ep 64 --dp 2 "
      "--bucket-kb 4194304 --cluster " +
      std::string(WEFT_SOURCE_DIR) + "/docs/planning/h100-16x8.json");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  EXPECT_EQ(out.out.find("not timed"), std::string::npos) << out.out;
  const std::regex row(
      "\n  (ep\\.[a-z_]+) +alltoallv +expert:ep +64 +4 +1 +448 MiB .* ([0-9.]+) +[0-9.]+ +- ");
  size_t timed = 0;
  for (std::sregex_iterator it(out.out.begin(), out.out.end(), row), end; it != end; ++it) {
    // No faster than the 7/8 of a rank's pieces that leave its node, on its 50 GB/s link.
    EXPECT_GE(std::stod((*it)[2]), 448.0 * (1 << 20) * 7 / 8 / 50e3) << (*it)[0];
    ++timed;
  }
  EXPECT_EQ(timed, 4u) << "dispatch, combine and their backward:\n" << out.out;
}

// ---------------------------------------------------------------------------

plan::Options llama_70b() {
  plan::Options o;
  EXPECT_TRUE(plan::preset("llama3-70b", &o.model));
  o.global_batch = 64, o.micro_batch = 1, o.seq = 4096;
  o.tp = 2, o.pp = 4, o.dp = 1;
  o.bucket_bytes = o.first_bucket_bytes = size_t{1} << 32;  // few buckets: quick to time
  return o;
}

weft::topo::Cluster test_cluster() {
  weft::topo::Cluster cluster;
  EXPECT_TRUE(weft::topo::load_cluster_file(kData + "plan-2x4.json", &cluster).ok());
  cluster.device.tflops = 500;
  return cluster;
}

// The bubble is (p−1)/(m+p−1) for 1F1B, (p−1)/(v·m+p−1) interleaved, a third of 1F1B's
// idle time with zero-bubble (ZB-H1).
TEST(PlanPipeline, BubbleFollowsTheScheduleFormulas) {
  const weft::topo::Cluster cluster = test_cluster();
  plan::Options o = llama_70b();
  ASSERT_EQ(plan::validate(o, cluster), "");
  const plan::Result one = plan::plan(o, cluster);
  const double p = 4, m = 64;
  ASSERT_EQ(one.microbatches, 64);
  EXPECT_NEAR(one.bubble_fraction, (p - 1) / (m + p - 1), 1e-12);
  o.schedule = "interleaved", o.virtual_stages = 2;
  ASSERT_EQ(plan::validate(o, cluster), "");
  EXPECT_NEAR(plan::plan(o, cluster).bubble_fraction, (p - 1) / (2 * m + p - 1), 1e-12);
  o.schedule = "zb", o.virtual_stages = 1;
  EXPECT_NEAR(plan::plan(o, cluster).bubble_fraction, (p - 1) / 3 / (m + (p - 1) / 3), 1e-12);
  // The step is at least the compute, and the MFU bound below 1.
  EXPECT_GE(one.step_s, one.compute_s);
  EXPECT_GT(one.mfu, 0);
  EXPECT_LT(one.mfu, 1);
}

// ZeRO-1 shards the optimizer states over the data-parallel ranks, ZeRO-2 also the
// gradients, ZeRO-3 also the weights; SP divides the activations by tp.
TEST(PlanMemory, ZeroStagesAndSequenceParallelShardWhatTheySay) {
  const weft::topo::Cluster cluster = test_cluster();
  plan::Options o;
  ASSERT_TRUE(plan::preset("llama3-8b", &o.model));
  o.model.layers = 4, o.model.vocab = 32000;
  o.global_batch = 8, o.micro_batch = 1, o.seq = 1024;
  o.tp = 2, o.dp = 4;
  o.bucket_bytes = o.first_bucket_bytes = size_t{1} << 32;
  ASSERT_EQ(plan::validate(o, cluster), "");
  const plan::Result base = plan::plan(o, cluster);
  o.zero = 1;
  const plan::Result z1 = plan::plan(o, cluster);
  EXPECT_NEAR(z1.memory.optimizer, base.memory.optimizer / 4, base.memory.optimizer * 1e-9);
  EXPECT_EQ(z1.memory.grads, base.memory.grads);
  o.zero = 2;
  const plan::Result z2 = plan::plan(o, cluster);
  EXPECT_NEAR(z2.memory.grads, base.memory.grads / 4, base.memory.grads * 1e-9);
  EXPECT_EQ(z2.memory.weights, base.memory.weights);
  o.zero = 3;
  EXPECT_NEAR(plan::plan(o, cluster).memory.weights, base.memory.weights / 4,
              base.memory.weights * 1e-9);
  // Selective recomputation without SP: s·b·h·(10 + 24/t) bytes per layer (16-bit).
  const double sbh = 1024.0 * 1 * 4096;
  EXPECT_NEAR(base.memory.activations, sbh * (10 + 24 / 2.0) * 4, 1);
  o.zero = 0, o.sp = true;
  EXPECT_NEAR(plan::plan(o, cluster).memory.activations, sbh * 34 / 2 * 4, 1);
}

// Adam's moments in bf16 (as DeepSeek-V3 keeps them): 2·2 bytes per parameter instead of
// 2·4, beside the fp32 master copy of bf16 weights.
TEST(PlanMemory, MomentsDtypeSizesTheOptimizerStates) {
  const weft::topo::Cluster cluster = test_cluster();
  plan::Options o = llama_70b();
  o.zero = 1;
  const double fp32 = plan::plan(o, cluster).memory.optimizer;
  o.moments = weftBfloat16;
  EXPECT_NEAR(plan::plan(o, cluster).memory.optimizer, fp32 * (2 * 2 + 4) / (2 * 4 + 4),
              fp32 * 1e-12);
}

TEST(PlanModel, PresetsMatchTheirPublishedParameterCounts) {
  struct Want {
    const char* name;
    double total, active;  // billions
  } wants[] = {{"llama3-8b", 8.03, 8.03},
               {"llama3-70b", 70.6, 70.6},
               {"mixtral-8x7b", 46.7, 12.9},
               {"deepseek-v3", 671, 37}};
  for (const Want& w : wants) {
    plan::ModelSpec model;
    ASSERT_TRUE(plan::preset(w.name, &model));
    const plan::ParameterCounts counts = plan::parameter_counts(model);
    EXPECT_NEAR(counts.total / 1e9, w.total, w.total * 0.01) << w.name;
    EXPECT_NEAR(counts.active / 1e9, w.active, w.active * 0.02) << w.name;
  }
}

// A hot expert taking share x of the routed slots loads its EP rank with
// x + (1−x)·(E/ep − 1)/(E − 1) of them against 1/ep on average; uniform (x = 1/E) is 1.
TEST(PlanModel, RoutingSkewGivesTheBusiestRanksShare) {
  weft::topo::Cluster cluster = test_cluster();
  plan::Options o;
  o.model.layers = 2, o.model.hidden = 512, o.model.heads = 8, o.model.ffn = 1024;
  o.model.vocab = 1024, o.model.experts = 8, o.model.topk = 2, o.model.moe_ffn = 1024;
  o.global_batch = 8, o.micro_batch = 1, o.seq = 512, o.ep = 4, o.dp = 2;
  o.bucket_bytes = o.first_bucket_bytes = size_t{1} << 32;
  ASSERT_EQ(plan::validate(o, cluster), "");
  o.hot_expert_share = 1.0 / 8;
  EXPECT_NEAR(plan::plan(o, cluster).imbalance, 1.0, 1e-12);
  o.hot_expert_share = 0.5;
  const plan::Result skewed = plan::plan(o, cluster);
  EXPECT_NEAR(skewed.imbalance, (0.5 + 0.5 * (2.0 - 1) / 7) * 4, 1e-12);
  // Skew changes the compute, not the traffic: the dispatch is the same on its EP group.
  size_t dispatches = 0;
  for (const plan::Entry& e : skewed.entries)
    if (e.ledger.pattern == "ep.dispatch") {
      EXPECT_EQ(e.group, 4);
      dispatches += e.ledger.calls;
    }
  EXPECT_EQ(dispatches, 2u) << "one per MoE layer and micro-batch (one here)";
}

// Hierarchical MoE dispatch (--ep-dispatch hier): HierMoeDispatcher on a weftrun job over
// 2 emulated nodes books what weft-plan plans, entry for entry: the inter-node stage over
// EP, the intra-node stage over the node's EP ranks with the proxy's rows. The routing
// sends every token to k consecutive experts, with k larger than the experts outside any
// node, so every token reaches every node, as uniform routing's expectation then says.
TEST(PlanExperts, HierarchicalDispatchEqualsTheAdaptersEntryForEntry) {
  struct Case {
    int ranks, experts, topk;
    const char* cluster;
  };
  for (const Case& c : {Case{4, 4, 3, "plan-2x2.json"}, Case{8, 8, 5, "plan-2x4.json"}}) {
    const std::string experts = std::to_string(c.experts), topk = std::to_string(c.topk);
    const Outcome job = run_command(
        std::string(WEFTRUN_PATH) + " --timeout 90 --bind-to none --no-prefix -n " +
        std::to_string(c.ranks) + " " + ADAPTER_LEDGER_JOB_PATH + " hier-moe --experts " + experts +
        " --topk " + topk + " --hidden 16 --tokens 16 --nodes 2 2>&1");
    ASSERT_EQ(job.exit_code, 0) << job.out;
    const Outcome planned =
        weft_plan("--layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 64 --experts " + experts +
                  " --topk " + topk + " --comm-dtype fp32 --train " + std::to_string(2 * c.ranks) +
                  ",2,8 --ep " + std::to_string(c.ranks) + " --dp 1 --ep-dispatch hier --cluster " +
                  kData + c.cluster + " --json");
    ASSERT_EQ(planned.exit_code, 0) << planned.out;
    const auto recorded = rows_of_table(job.out, "ep\\.");
    ASSERT_EQ(recorded.size(), 10u) << job.out;  // counts + 4 AllToAllv, inter and intra
    EXPECT_EQ(entries_of(planned.out, "ep."), recorded) << "adapter:\n"
                                                        << job.out << "\nweft-plan:\n"
                                                        << planned.out;
  }
}

// GQA's K/V carry kv_heads, not heads: the ring's K|V shift is kv_heads/heads of the
// multi-head one (one TP rank keeps one replica when tp exceeds kv_heads).
TEST(PlanContext, RingKvShiftsCarryTheKvHeads) {
  const weft::topo::Cluster cluster = test_cluster();
  auto shift_bytes = [&](int kv_heads, int tp) {
    plan::Options o;
    o.model.layers = 2, o.model.hidden = 1024, o.model.heads = 16, o.model.kv_heads = kv_heads;
    o.model.ffn = 2048, o.model.vocab = 1024;
    o.global_batch = 1, o.micro_batch = 1, o.seq = 4096, o.cp = 2, o.tp = tp, o.dp = 1;
    o.cp_algo = "ring";
    EXPECT_EQ(plan::validate(o, cluster), "") << kv_heads;
    for (const plan::Entry& e : plan::plan(o, cluster).entries)
      if (e.ledger.pattern == "cp.ring_kv") return e.ledger.bytes_per_call;
    return size_t{0};
  };
  // K|V of seq/cp rows, kv heads of 64 values, 2 bytes (bf16).
  EXPECT_EQ(shift_bytes(16, 1), size_t{2} * 2048 * 16 * 64 * 2);
  EXPECT_EQ(shift_bytes(4, 1), size_t{2} * 2048 * 4 * 64 * 2);
  EXPECT_EQ(shift_bytes(1, 1), size_t{2} * 2048 * 1 * 64 * 2);
  EXPECT_EQ(shift_bytes(4, 2), size_t{2} * 2048 * 2 * 64 * 2);
  EXPECT_EQ(shift_bytes(1, 2), size_t{2} * 2048 * 1 * 64 * 2);
}

// The ring's shifts are posted before the block of attention they overlap: a layer's forward
// (backward) shifts are exposed by what exceeds its cp − 1 blocks of attention (twice that in
// backward, where K|V and the dK|dV accumulators travel together), each block a cp-th of the
// rank's attention FLOPs: 2·(seq/cp)·seq·heads·(2·head_dim)·½ (causal).
TEST(PlanContext, RingShiftsHideBehindTheBlockOfAttentionTheyOverlap) {
  weft::topo::Cluster cluster = test_cluster();
  plan::Options o;
  o.model.layers = 2, o.model.hidden = 1024, o.model.heads = 16, o.model.kv_heads = 16;
  o.model.ffn = 2048, o.model.vocab = 1024;
  o.global_batch = 2, o.micro_batch = 1, o.seq = 8192, o.cp = 4, o.dp = 2, o.cp_algo = "ring";
  ASSERT_EQ(plan::validate(o, cluster), "");
  const double attention_flops = 2.0 * (8192 / 4) * 8192 * 16 * (2 * 64) * 0.5, block = 1.0 / 4;
  struct Window {
    double comm_s = 0, exposed_s = 0, shift_s = 0;
  };
  auto windows = [&](double tflops) {
    cluster.device.tflops = tflops;
    std::map<std::string, Window> out;
    for (const plan::Entry& e : plan::plan(o, cluster).entries) {
      if (!e.ledger.pattern.starts_with("cp.")) continue;
      EXPECT_TRUE(e.window == "attn" || e.window == "attn-bwd") << e.ledger.pattern;
      EXPECT_EQ(e.calls_per_layer, 3) << e.ledger.pattern;
      Window& w = out[e.window];
      w.comm_s += e.total_s, w.exposed_s += e.exposed_s, w.shift_s += e.call_us * 1e-6;
    }
    EXPECT_EQ(out.size(), 2u);
    return out;
  };
  // A device so fast that attention takes no time: every shift is exposed.
  for (const auto& [name, w] : windows(1e12)) EXPECT_NEAR(w.exposed_s, w.comm_s, 1e-9) << name;
  // So slow that each block outlasts its shifts: none is.
  for (const auto& [name, w] : windows(1e-6)) EXPECT_EQ(w.exposed_s, 0) << name;
  // In between: a forward block of half a step's shifts (backward: twice as long as forward).
  const Window fwd = windows(1)["attn"];
  const double tflops = attention_flops * block / (fwd.shift_s / 2) / 1e12;
  for (const auto& [name, w] : windows(tflops)) {
    const double block_s = (name == "attn" ? 1 : 2) * attention_flops * block / (tflops * 1e12);
    const double per_step = std::max(0.0, w.shift_s - block_s);
    EXPECT_GT(per_step, 0) << name;
    // 3 steps per layer, 2 layers, 2 micro-batches... of which the step's are the one rank's.
    EXPECT_NEAR(w.exposed_s, per_step * 3 * 2 * 1, w.comm_s * 1e-9) << name;
  }
}

// The pipeline's sends are asynchronous (the library waits only for receives): a transfer
// hides behind the next micro-batch's compute except on the fill and the drain, where each of
// the pp − 1 links is crossed once forward and once backward in turn.
TEST(PlanPipeline, OnlyTheFillAndTheDrainWaitForTransfers) {
  const weft::topo::Cluster cluster = test_cluster();
  const plan::Options o = llama_70b();
  ASSERT_EQ(plan::validate(o, cluster), "");
  const plan::Result r = plan::plan(o, cluster);
  const plan::Entry *send = nullptr, *recv = nullptr;
  for (const plan::Entry& e : r.entries) {
    if (e.ledger.pattern == "pp.forward" && e.ledger.primitive == "send") send = &e;
    if (e.ledger.pattern == "pp.backward" && e.ledger.primitive == "recv") recv = &e;
  }
  ASSERT_TRUE(send != nullptr && recv != nullptr);
  EXPECT_EQ(send->window, "pp");
  EXPECT_EQ(send->ledger.calls, 64u);  // one per micro-batch
  EXPECT_GT(send->call_us, 0);
  EXPECT_NEAR(send->exposed_s, 3 * send->call_us * 1e-6, 1e-12);
  // The backward transfer carries the same bytes over the same link: the same hop.
  EXPECT_EQ(recv->ledger.bytes_per_call, send->ledger.bytes_per_call);
  EXPECT_NEAR(recv->exposed_s, send->exposed_s, 1e-12);
  EXPECT_LT(send->exposed_s, send->total_s / 10);
}

// The hierarchical dispatch's intra-node stage: the proxy sends a row once to each other
// rank of its node that one of the row's k slots names. Its planned bytes are the
// expectation over every equally likely choice of k distinct experts, enumerated here.
TEST(PlanExperts, HierarchicalIntraNodeBytesAreTheEnumeratedExpectation) {
  constexpr int kExperts = 16, kTopk = 4, kEp = 8, kNodeRanks = 4, kNodes = 2, kHidden = 512;
  constexpr int kTokens = 1024, kPerRank = kExperts / kEp;
  double named = 0, choices = 0;  // other ranks of the proxy's node named, over all choices
  for (unsigned mask = 0; mask < (1u << kExperts); ++mask) {
    if (__builtin_popcount(mask) != kTopk) continue;
    choices += 1;
    for (int rank = 1; rank < kNodeRanks; ++rank)
      named += ((mask >> (rank * kPerRank)) & ((1u << kPerRank) - 1)) != 0;
  }
  const double rows = double(kTokens) * kNodes * named / choices;  // from both nodes' sources
  const Outcome planned = weft_plan(
      "--layers 1 --hidden " + std::to_string(kHidden) + " --heads 8 --ffn 1024 --vocab 1024 " +
      "--experts " + std::to_string(kExperts) + " --topk " + std::to_string(kTopk) +
      " --comm-dtype fp32 --train 8,1," + std::to_string(kTokens) + " --ep " + std::to_string(kEp) +
      " --dp 1 --ep-dispatch hier --cluster " + kData + "plan-2x4.json --json");
  ASSERT_EQ(planned.exit_code, 0) << planned.out;
  const size_t at = planned.out.find("{\"pattern\":\"ep.intra.dispatch\"");
  ASSERT_NE(at, std::string::npos) << planned.out;
  const double calls = number_after(planned.out, "calls", at);
  ASSERT_GT(calls, 0);
  EXPECT_NEAR(number_after(planned.out, "bytes_sent", at) / calls, rows * kHidden * 4, 1)
      << planned.out;
}

// The EP, CP and PP entries are timed by the tuner on their groups as DP's and TP's are:
// a collective over the dim's ranks, a point-to-point transfer as the Broadcast of its
// bytes from rank 0 to its neighbour along the dim, a recv not again.
TEST(PlanPrediction, EpCpAndPpCallsAreTheTunersOnTheirGroups) {
  const weft::topo::Cluster cluster = test_cluster();
  struct Mesh {
    int tp, cp, ep, dp, pp;
    const char* cp_algo;
  };
  std::set<std::string> seen;
  for (const Mesh& mesh : {Mesh{1, 2, 2, 2, 1, "allgather"}, Mesh{2, 2, 2, 1, 1, "zigzag"},
                           Mesh{1, 2, 1, 1, 2, "ulysses"}, Mesh{1, 4, 1, 1, 2, "passq"},
                           Mesh{1, 1, 4, 1, 2, "zigzag"}}) {
    plan::Options o;
    o.model.layers = 4, o.model.hidden = 512, o.model.heads = 8, o.model.ffn = 1024;
    o.model.vocab = 1024, o.model.experts = 8, o.model.topk = 2, o.model.moe_ffn = 1024;
    o.tp = mesh.tp, o.cp = mesh.cp, o.ep = mesh.ep, o.dp = mesh.dp, o.pp = mesh.pp;
    o.cp_algo = mesh.cp_algo;
    o.global_batch = 4 * mesh.ep * mesh.dp, o.micro_batch = 1, o.seq = 1024;
    o.bucket_bytes = o.first_bucket_bytes = size_t{1} << 32;
    ASSERT_EQ(plan::validate(o, cluster), "") << mesh.cp_algo;
    const plan::Result r = plan::plan(o, cluster);
    for (const plan::Entry& e : r.entries) {
      const std::string family = e.ledger.pattern.substr(0, 3);
      if (family != "cp." && family != "ep." && family != "pp.") continue;
      seen.insert(e.ledger.pattern);
      const std::vector<int> ranks = plan::group_ranks(o, e.ledger.dim);
      const std::string& primitive = e.ledger.primitive;
      if (primitive == "recv") {
        EXPECT_EQ(e.total_s, 0) << e.ledger.pattern;
        continue;
      }
      plan::CallPrediction want;
      // An AllToAllv: equal pieces whose n − 1 remote ones are the call's bytes sent.
      const size_t n = ranks.size();
      const size_t bytes = primitive == "alltoallv"
                               ? e.ledger.bytes_sent / e.ledger.calls / (n - 1) * n
                               : e.ledger.bytes_per_call;
      if (primitive == "send" || primitive == "sendrecv")
        want = plan::predict_call(cluster, {ranks[0], ranks[1]}, "broadcast", bytes, 2);
      else
        want = plan::predict_call(cluster, ranks, primitive, bytes, 2);
      if (want.us < 0 && primitive == "alltoallv")  // untimeable: as the AllToAll of its bytes
        want = plan::predict_call(cluster, ranks, "alltoall", bytes, 2);
      ASSERT_GT(want.us, 0) << e.ledger.pattern << " " << primitive;
      EXPECT_EQ(e.algorithm, want.algorithm) << e.ledger.pattern;
      EXPECT_DOUBLE_EQ(e.call_us, want.us) << e.ledger.pattern;
      EXPECT_NEAR(e.total_s, want.us * 1e-6 * double(e.ledger.calls), e.total_s * 1e-12)
          << e.ledger.pattern;
    }
  }
  for (const char* pattern :
       {"cp.allgather_kv", "cp.allgather_dkv", "cp.ring_kv", "cp.ulysses", "cp.passq_q",
        "cp.passq_out", "ep.counts", "ep.dispatch", "pp.forward", "pp.backward"})
    EXPECT_EQ(seen.count(pattern), 1u) << pattern << " was not planned";
}

// Groups follow the mesh order tp-cp-ep-dp-pp (tp fastest); HSDP splits the gradient
// group into an inner shard and an outer replica dim.
TEST(PlanMesh, GroupsFollowTheMeshOrder) {
  plan::Options o;
  o.tp = 2, o.cp = 1, o.ep = 1, o.dp = 2, o.pp = 2;
  EXPECT_EQ(plan::group_ranks(o, "tp"), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan::group_ranks(o, "dp"), (std::vector<int>{0, 2}));
  EXPECT_EQ(plan::group_ranks(o, "pp"), (std::vector<int>{0, 4}));
  EXPECT_EQ(plan::group_ranks(o, "tp-pp"), (std::vector<int>{0, 1, 4, 5}));
  o.pp = 1, o.dp = 4, o.hsdp = 2;
  EXPECT_EQ(plan::group_ranks(o, "dp_shard"), (std::vector<int>{0, 2}));
  EXPECT_EQ(plan::group_ranks(o, "dp_replicate"), (std::vector<int>{0, 4}));
  // cp and ep sit between tp and dp, and the dense gradient group spans all three.
  o.hsdp = 1, o.cp = 2, o.dp = 1;
  EXPECT_EQ(plan::group_ranks(o, "cp"), (std::vector<int>{0, 2}));
  EXPECT_EQ(plan::group_ranks(o, "dp"), (std::vector<int>{0, 2}));
}

// Inference plans the forward collectives only.
TEST(PlanInference, DecodeHasNoBackwardCollectives) {
  const Outcome out = weft_plan("--model llama3-8b --decode 8,4096 --tp 4 --dp 1 --cluster " +
                                kData + "plan-2x4.json --json");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  EXPECT_NE(out.out.find("\"tp.reduce_from\""), std::string::npos) << out.out;
  EXPECT_EQ(out.out.find("\"tp.copy_to\""), std::string::npos) << out.out;
  EXPECT_GT(number_after(out.out, "kv_cache"), 0) << out.out;
}

// ---------------------------------------------------------------------------

struct BadCase {
  std::string args;
  std::string names;  // what the one line must contain
};

class BadInputTest : public testing::TestWithParam<BadCase> {};

std::string bad_case_name(const testing::TestParamInfo<BadCase>& info) {
  return weft::testing::command_case_name(info.index, info.param.args);
}

TEST_P(BadInputTest, OneLineNamingTheArgumentExit2) {
  const BadCase& c = GetParam();
  const std::string cluster =
      c.args.find("--cluster") == std::string::npos ? " --cluster " + kData + "plan-2x4.json" : "";
  const Outcome out = weft_plan(c.args + cluster, true);
  EXPECT_EQ(out.exit_code, 2) << out.out;
  EXPECT_NE(out.out.find(c.names), std::string::npos) << out.out;
  EXPECT_EQ(out.out.find('\n'), out.out.size() - 1) << "one line: " << out.out;
}

INSTANTIATE_TEST_SUITE_P(
    Plan, BadInputTest,
    testing::Values(
        BadCase{"--model llama3-8b --train 64,1,4096 --tp 3 --dp 1", "--tp=3: heads=32"},
        BadCase{"--model llama3-8b --train 64,1,4096 --pp 3 --dp 1", "--pp=3"},
        BadCase{"--model llama3-8b --train 64,1,4096 --pp 4 --schedule interleaved --virtual 3 "
                "--dp 1",
                "layers=32 do not divide by pp·virtual=12"},
        BadCase{"--model mixtral-8x7b --train 64,1,4096 --ep 3 --dp 1", "--ep=3: experts=8"},
        BadCase{"--model llama3-8b --train 64,1,4100 --cp 4 --dp 1", "2·cp (zigzag)"},
        BadCase{"--model llama3-8b --train 64,1,4096 --cp 2 --cp-algo p2p --dp 1",
                "--cp-algo=p2p is not ring, zigzag, passq, allgather, ulysses, hier, auto, affine "
                "or compressed"},
        BadCase{"--model llama3-8b --decode 1,4096 --cp 2 --cp-algo compressed --dp 1",
                "--cp-algo compressed: the library's compressed-attention CP has no decode step"},
        BadCase{"--model llama3-8b --prefill 1,64 --cp 8 --cp-algo compressed --dp 1",
                "--cp-block=32: context/cp=8 positions per rank are fewer than the halo"},
        BadCase{"--model llama3-8b --prefill 1,4096 --cp 2 --cp-algo compressed --cp-stride 64 "
                "--dp 1",
                "--cp-block=32 --cp-stride=64: need 0 < stride <= block"},
        BadCase{"--model llama3-8b --train 64,1,4096 --tp 2 --cp 8 --cp-algo ulysses --dp 1",
                "--cp-algo ulysses: kv-heads per tp rank 4 do not divide by cp"},
        BadCase{"--model llama3-8b --train 64,1,4098 --tp 2 --cp 3 --cp-algo hier --dp 1",
                "--cp-algo hier: the cluster's nodes hold different numbers of rank 0's cp=3"},
        BadCase{"--model llama3-8b --train 64,1,4096 --kv-heads 2 --tp 2 --cp 4 --cp-algo hier "
                "--dp 1",
                "--cp-algo hier: heads and kv-heads per tp rank (16, 1) do not divide by the 2"},
        BadCase{"--model llama3-8b --train 64,1,4096 --tp 8 --cp 8 --cp-algo ulysses --dp 1",
                "--cp-algo ulysses: heads=32 do not divide by tp·cp"},
        BadCase{"--model mixtral-8x7b --train 64,1,4096 --ep 2 --ep-dispatch ring --dp 1",
                "--ep-dispatch=ring is not flat or hier"},
        BadCase{"--model mixtral-8x7b --train 64,1,4096 --ep 2 --ep-dispatch hier --ep-sync-free "
                "--dp 1",
                "--ep-dispatch hier with --ep-sync-free"},
        BadCase{
            "--model mixtral-8x7b --experts 6 --train 60,1,4096 --ep 6 --ep-dispatch hier --dp 1",
            "--ep-dispatch hier: the cluster's nodes hold different numbers of rank 0's ep=6"},
        BadCase{"--model llama3-8b --train 64,1,4096 --ep-sync-free --dp 1",
                "--ep-sync-free: the model has no experts"},
        BadCase{"--model llama3-8b --train 64,1,4096 --tp 4 --dp 4", "larger than the cluster"},
        BadCase{"--model llama3-8b --train 64,1,4096 --tp 4 --cluster " + kData +
                    "plan-no-network.json",
                "link class \"network\""},
        BadCase{"--model llama3-8b --train 64,1,4096 --cluster " + kData + "plan-no-ranks.json",
                "places no ranks"},
        BadCase{"--model llama3-8b --train 64,1,4096 --cluster " + kData + "plan-no-device.json",
                "no device.tflops"},
        BadCase{"--model llama3-9b --train 64,1,4096", "--model=llama3-9b"},
        BadCase{"--model llama3-8b --train 64,1", "--train=64,1"},
        BadCase{"--model llama3-8b --train 63,1,4096 --tp 4", "global batch 63"},
        BadCase{"--model llama3-8b --train 64,1,4096 --frobnicate 1", "--frobnicate"},
        BadCase{"--model llama3-8b --train 64,1,4096 --reserve-gb 16", "--reserve-gb=16"},
        BadCase{"--model llama3-8b --train 64,1,4096 --search --reserve-gb 20", "--reserve-gb=20"},
        BadCase{"--model llama3-8b --train 64,1,4096 --cluster /nonexistent.json", "--cluster"}),
    bad_case_name);

// ---------------------------------------------------------------------------

// --search: what fits ranked by step time, each rejected mesh with its reason.
TEST(PlanSearch, RanksWhatFitsAndSaysWhyTheRestDoesNot) {
  const Outcome out = weft_plan(
      "--layers 6 --hidden 1024 --heads 16 --kv-heads 8 --ffn 4096 --vocab 32000 --train 16,1,2048 "
      "--search --top 50 --memory-gb 1 "
      "--cluster " +
      kData + "plan-2x4.json");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  EXPECT_NE(
      out.out.find(
          "tp=8 cp=1 ep=1 pp=1 zero=0 schedule=1f1b v=1: tp=8 crosses nodes (4 ranks per node)"),
      std::string::npos)
      << out.out;
  EXPECT_NE(out.out.find("layers=6 do not divide by pp·virtual=4"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("does not fit:"), std::string::npos) << out.out;
  // The ranked lines: step times non-decreasing, at least one mesh fits.
  const std::regex row("^ +[0-9]+ tp=.* +([0-9.]+) +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+$");
  std::vector<double> steps;
  size_t from = 0;
  for (size_t nl; (nl = out.out.find('\n', from)) != std::string::npos; from = nl + 1) {
    std::smatch m;
    const std::string line = out.out.substr(from, nl - from);
    if (std::regex_match(line, m, row)) steps.push_back(std::stod(m[1]));
  }
  ASSERT_FALSE(steps.empty()) << out.out;
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_LE(steps[i - 1], steps[i]);
}

// A mesh that does not fit with selective recomputation is tried with full recomputation
// (a fourth pass for the activations of one layer input each), and says so.
TEST(PlanSearch, TriesFullRecomputationWhenSelectiveDoesNotFit) {
  const std::string model =
      "--layers 8 --hidden 4096 --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 "
      "--train 16,2,8192 --cluster " +
      kData + "plan-2x4.json";
  const Outcome out = weft_plan(model + " --search --top 1000 --memory-gb 10");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  const std::regex full(
      "^ +[0-9]+ (tp=[0-9]+ cp=1 ep=1 dp=([0-9]+) pp=([0-9]+)( sp)? zero=([0-9])"
      " recompute=full schedule=1f1b v=1) .*$");
  size_t from = 0, checked = 0;
  for (size_t nl; (nl = out.out.find('\n', from)) != std::string::npos && checked == 0;
       from = nl + 1) {
    std::smatch m;
    const std::string line = out.out.substr(from, nl - from);
    if (!std::regex_match(line, m, full)) continue;
    // The same mesh planned alone: over 10 GB with selective recomputation, within with full.
    const std::string tp =
        line.substr(line.find("tp=") + 3, line.find(' ', line.find("tp=")) - line.find("tp=") - 3);
    const std::string mesh = " --tp " + tp + " --dp " + m[2].str() + " --pp " + m[3].str() +
                             (m[4].matched ? " --sp" : "") + " --zero " + m[5].str() + " --json";
    const Outcome selective = weft_plan(model + mesh);
    const Outcome recomputed = weft_plan(model + mesh + " --recompute full");
    ASSERT_EQ(selective.exit_code, 0) << selective.out;
    const size_t a = selective.out.find("\"memory\":"), b = recomputed.out.find("\"memory\":");
    EXPECT_GT(number_after(selective.out, "total", a), 10e9) << m[1];
    EXPECT_LE(number_after(recomputed.out, "total", b), 10e9) << m[1];
    ++checked;
  }
  EXPECT_EQ(checked, 1u) << out.out;
}

// --reserve-gb keeps memory free of the plan: a mesh that fits the device fits the search
// only with the reserve left over, and the rejection says so.
TEST(PlanSearch, ReserveKeepsMemoryFreeOfThePlan) {
  const std::string model =
      "--layers 8 --hidden 1024 --heads 16 --kv-heads 8 --ffn 4096 --vocab 32000 "
      "--train 16,1,2048 --search --top 1000 --json --memory-gb 4 --cluster " +
      kData + "plan-2x4.json";
  const Outcome open = weft_plan(model), reserved = weft_plan(model + " --reserve-gb 2");
  ASSERT_EQ(open.exit_code, 0) << open.out;
  ASSERT_EQ(reserved.exit_code, 0) << reserved.out;
  auto totals = [](const std::string& json) {
    std::vector<double> out;
    for (size_t at = 0; (at = json.find("\"memory\":", at)) != std::string::npos; ++at)
      out.push_back(number_after(json, "total", at));
    return out;
  };
  const std::vector<double> all = totals(open.out), kept = totals(reserved.out);
  ASSERT_FALSE(kept.empty()) << reserved.out;
  for (double total : kept) EXPECT_LE(total, 2e9);
  EXPECT_GT(std::count_if(all.begin(), all.end(), [](double t) { return t > 2e9; }), 0)
      << "the reserve must reject some mesh that fits the device";
  EXPECT_NE(reserved.out.find("GB per rank > 2 GB (2 GB reserved)"), std::string::npos)
      << reserved.out;
}

// The search varies what a user would: ZeRO 0-3, HSDP for ZeRO-3 (shard groups inside a
// node), and the pipeline schedule; every one of them is planned and ranked.
TEST(PlanSearch, TriesZeroTwoHsdpAndEverySchedule) {
  const Outcome out = weft_plan(
      "--layers 8 --hidden 1024 --heads 16 --kv-heads 8 --ffn 4096 --vocab 32000 --train 16,1,2048 "
      "--search --top 1000 --memory-gb 1000 --cluster " +
      kData + "plan-2x4.json");
  ASSERT_EQ(out.exit_code, 0) << out.out;
  const std::regex row("^ +[0-9]+ (tp=.*v=[0-9]+) +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+$");
  std::vector<std::string> meshes;
  size_t from = 0;
  for (size_t nl; (nl = out.out.find('\n', from)) != std::string::npos; from = nl + 1) {
    std::smatch m;
    const std::string line = out.out.substr(from, nl - from);
    if (std::regex_match(line, m, row)) meshes.push_back(m[1]);
  }
  auto count = [&](const std::string& part) {
    return std::count_if(meshes.begin(), meshes.end(),
                         [&](const std::string& m) { return m.find(part) != std::string::npos; });
  };
  EXPECT_GT(count(" zero=2 "), 0) << out.out;
  EXPECT_GT(count(" hsdp=2 "), 0) << out.out;  // 8 ranks, 4 per node: replicas across the 2
  EXPECT_GT(count("schedule=zb v=1"), 0) << out.out;
  EXPECT_GT(count("schedule=interleaved v=2"), 0) << out.out;
  EXPECT_GT(count("schedule=1f1b v=1"), 0) << out.out;
  // No mesh twice.
  std::vector<std::string> sorted = meshes;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << out.out;
}

}  // namespace
