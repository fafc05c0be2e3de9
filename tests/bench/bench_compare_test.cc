// The comparison harness (scripts/bench-compare.py) end to end at tiny sizes on 2 ranks,
// and the peer programs' result check, so that neither can rot unnoticed. One harness run
// serves every case; the Open MPI and Gloo cases skip, saying why, where those peers are
// not built or cannot run.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "peer_driver.h"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

std::string quoted(const std::string& text) {
  return "'" + text + "'";
}

// Runs a shell command, capturing its output.
Outcome run(const std::string& command) {
  Outcome outcome;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;)
    outcome.out.append(buffer, got);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

using CsvRow = std::map<std::string, std::string>;

// The harness writes plain CSV: no quoted fields.
std::vector<CsvRow> read_csv(const fs::path& path) {
  std::ifstream in(path);
  std::vector<CsvRow> rows;
  std::vector<std::string> header;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream fields(line);
    for (std::string cell; std::getline(fields, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    if (header.empty()) {
      header = cells;
      continue;
    }
    CsvRow row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

double number(const CsvRow& row, const std::string& field) {
  auto it = row.find(field);
  return it == row.end() || it->second.empty() ? NAN : std::stod(it->second);
}

constexpr int kRanks = 2;
const std::vector<double> kBandwidthSizes = {1024, 4096};
const std::vector<double> kLatencySizes = {8, 64};

class BenchCompare : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = new fs::path(fs::temp_directory_path() /
                        ("weft-bench-compare-test-" + std::to_string(getpid())));
    const std::string command =
        std::string(PYTHON_PATH) + " " + quoted(BENCH_COMPARE_PATH) + " --build " +
        quoted(BUILD_DIR) + " --ranks " + std::to_string(kRanks) +
        " --collectives allreduce -b 1K -e 4K -f 4 -n 3 -w 1 --repeats 1 --lat-min 8"
        " --lat-max 64 --lat-iters 20 --copy-bytes 8M --copy-repeats 2 --timeout 60 --out " +
        quoted(out_->string());
    outcome_ = new Outcome(run(command));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*out_);
    delete out_;
    delete outcome_;
  }

  // The harness names a library it skips, and why.
  static std::string skip_reason(const std::string& label) {
    std::smatch match;
    const std::regex skipped("skipping " + label + ": ([^\n]*)");
    return std::regex_search(outcome_->out, match, skipped) ? match[1].str() : "";
  }

  // Every bandwidth row of lib passed its check and carries consistent figures; every
  // latency row has quantiles in order.
  static void expect_rows(const std::string& lib) {
    ASSERT_EQ(outcome_->exit_code, 0) << outcome_->out;
    std::map<std::pair<std::string, double>, int> seen;  // (kind, size) -> placements
    for (const CsvRow& row : read_csv(*out_ / "raw.csv")) {
      if (row.at("library") != lib) continue;
      const double size = number(row, "size_bytes");
      SCOPED_TRACE(lib + " " + row.at("kind") + " " + row.at("placement") + " size " +
                   row.at("size_bytes"));
      EXPECT_EQ(number(row, "nranks"), kRanks);
      EXPECT_EQ(row.at("wrong"), "0");
      const double time_us = number(row, "time_us");
      ASSERT_GT(time_us, 0);
      // algbw = bytes / time; AllReduce's bus factor 2(n-1)/n is 1 at 2 ranks.
      EXPECT_NEAR(number(row, "algbw_gbps"), size / time_us / 1e3, 1e-4 * size / time_us + 1e-6);
      EXPECT_NEAR(number(row, "busbw_gbps"), number(row, "algbw_gbps"), 1e-5);
      if (row.at("kind") == "latency") {
        EXPECT_GT(number(row, "median_us"), 0);
        EXPECT_LE(number(row, "median_us"), number(row, "p99_us"));
      }
      ++seen[{row.at("kind"), size}];
    }
    for (double size : kBandwidthSizes) EXPECT_EQ((seen[{"busbw", size}]), 2) << size;
    for (double size : kLatencySizes) EXPECT_EQ((seen[{"latency", size}]), 2) << size;
  }

  static fs::path* out_;
  static Outcome* outcome_;
};

fs::path* BenchCompare::out_ = nullptr;
Outcome* BenchCompare::outcome_ = nullptr;

TEST_F(BenchCompare, PrintsTables) {
  EXPECT_EQ(outcome_->exit_code, 0) << outcome_->out;
  EXPECT_NE(outcome_->out.find("## AllReduce, 2 ranks"), std::string::npos) << outcome_->out;
  EXPECT_NE(outcome_->out.find("| size | Weft busbw | Weft µs |"), std::string::npos)
      << outcome_->out;
  EXPECT_NE(outcome_->out.find("| target | measured | met |\n| --- | --- | --- |"),
            std::string::npos)
      << outcome_->out;
}

TEST_F(BenchCompare, WeftRows) {
  expect_rows("weft");
}

TEST_F(BenchCompare, OpenMpiRows) {
  if (!WEFT_HAVE_PEER_MPI) GTEST_SKIP() << "weft-peer-mpi is not built (MPI not found)";
  if (const std::string why = skip_reason("Open MPI"); !why.empty()) GTEST_SKIP() << why;
  expect_rows("openmpi");
}

TEST_F(BenchCompare, GlooRows) {
  if (!WEFT_HAVE_PEER_GLOO) GTEST_SKIP() << "weft-peer-gloo is not built (Gloo not found)";
  if (const std::string why = skip_reason("Gloo"); !why.empty()) GTEST_SKIP() << why;
  expect_rows("gloo");
}

// AllReduce reads n inputs and writes n outputs of S bytes: at copy bandwidth C (each
// byte read and written), T >= 2nS / 2C, so busbw <= 2(n-1)/n * S / T = 2C(n-1)/n^2.
TEST_F(BenchCompare, CeilingFromCopyBandwidth) {
  const std::vector<CsvRow> rows = read_csv(*out_ / "ceiling.csv");
  ASSERT_EQ(rows.size(), 1u) << outcome_->out;
  const double copy = number(rows[0], "copy_gbps");
  EXPECT_GT(copy, 0.1);
  EXPECT_NEAR(number(rows[0], "ceiling_busbw"), 2 * copy * (kRanks - 1) / (kRanks * kRanks),
              1e-5 * copy);
}

TEST_F(BenchCompare, ChartsHaveOneLinePerLibrary) {
  for (const char* chart : {"busbw_allreduce_2ranks.svg", "latency_allreduce_2ranks.svg"}) {
    std::ifstream in(*out_ / chart);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_TRUE(svg.starts_with("<svg")) << chart;
    EXPECT_NE(svg.find("data-library=\"weft\""), std::string::npos) << chart;
    if (WEFT_HAVE_PEER_MPI && skip_reason("Open MPI").empty()) {
      EXPECT_NE(svg.find("data-library=\"openmpi\""), std::string::npos) << chart;
    }
    if (WEFT_HAVE_PEER_GLOO && skip_reason("Gloo").empty()) {
      EXPECT_NE(svg.find("data-library=\"gloo\""), std::string::npos) << chart;
    }
  }
}

// The peers' check notices a damaged result (WEFT_PERF_CORRUPT=1: rank 1 alters one
// element): the run fails and its row counts the element.
void expect_corruption_caught(const std::string& launcher, const std::string& program) {
  const Outcome o =
      run(launcher + " " + quoted(program) + " allreduce -b 1K -e 1K -n 1 -w 0 --json");
  EXPECT_NE(o.exit_code, 0) << o.out;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(o.out, match, std::regex("\"wrong\":([0-9]+)"))) << o.out;
  EXPECT_EQ(match[1].str(), "1") << o.out;
}

std::string weftrun_launcher() {
  return "WEFT_PERF_CORRUPT=1 " + quoted(WEFTRUN_PATH) + " -n 2 --timeout 60 --no-prefix";
}

TEST(PeerCheck, WeftCatchesCorruption) {
  expect_corruption_caught(weftrun_launcher(), WEFT_PEER_WEFT_PATH);
}

TEST(PeerCheck, OpenMpiCatchesCorruption) {
  if (!WEFT_HAVE_PEER_MPI) GTEST_SKIP() << "weft-peer-mpi is not built (MPI not found)";
  if (run("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun is not on PATH";
  expect_corruption_caught(
      "mpirun --oversubscribe --allow-run-as-root -np 2 -x WEFT_PERF_CORRUPT=1",
      WEFT_PEER_MPI_PATH);
}

TEST(PeerCheck, GlooCatchesCorruption) {
  if (!WEFT_HAVE_PEER_GLOO) GTEST_SKIP() << "weft-peer-gloo is not built (Gloo not found)";
  expect_corruption_caught(weftrun_launcher(), WEFT_PEER_GLOO_PATH);
}

TEST(PeerQuantile, NearestRank) {
  using weft::peers::quantile;
  EXPECT_EQ(quantile({}, 0.5), 0);
  EXPECT_EQ(quantile({7}, 0.99), 7);
  EXPECT_EQ(quantile({5, 1, 3, 2, 4}, 0.5), 3);
  std::vector<double> hundred(100);
  std::iota(hundred.rbegin(), hundred.rend(), 1.0);  // 100 down to 1
  EXPECT_EQ(quantile(hundred, 0.99), 99);
  EXPECT_EQ(quantile(hundred, 0.5), 50);
  EXPECT_EQ(quantile(hundred, 1.0), 100);
}

}  // namespace
