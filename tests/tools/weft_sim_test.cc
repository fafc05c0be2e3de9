// weft-sim --topo: the planning table is consistent with itself (busbw from
// the predicted time, the marked choice is the fastest prediction) and
// refuses what makes no sense. weft-sim -G 1: every algorithm lowered to the
// GPU executor's stream operations, with its counts and device-model time.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct SimRun {
  std::string out;
  int exit_code = -1;
};

SimRun run_sim(const std::string& args) {
  SimRun run;
  const std::string command = std::string(WEFT_SIM_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) run.out.append(buffer, got);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> result;
  for (std::string word; in >> word;) result.push_back(word);
  return result;
}

TEST(WeftSimTopo, ChoiceIsTheFastestAndBusbwFollowsTime) {
  const std::string cluster = std::string(WEFT_SOURCE_DIR) + "/docs/tuning/cpu4.json";
  SimRun run = run_sim("--topo " + cluster + " --coll allreduce --bytes 1K:1M --factor 8");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  std::istringstream in(run.out);
  std::vector<std::string> header;
  int nranks = 0, rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# weft-sim --topo")) {
      const size_t colon = line.find(": ");
      nranks = std::stoi(line.substr(colon + 2));
      continue;
    }
    if (line.starts_with("#")) continue;
    std::vector<std::string> cells = words(line);
    if (!cells.empty() && cells[0] == "size") {
      header = cells;
      continue;
    }
    ASSERT_FALSE(header.empty()) << run.out;
    ASSERT_GT(nranks, 1) << run.out;
    // size, then (name.us, name.bw) per algorithm, then "choice" = name chunk X.
    const size_t algorithms = (header.size() - 2) / 2;
    ASSERT_GE(cells.size(), 1 + 2 * algorithms + 1) << line;
    const double bytes = std::stod(cells[0]) * (cells[0].back() == 'K'   ? 1024.0
                                                : cells[0].back() == 'M' ? 1048576.0
                                                                         : 1.0);
    double best = std::numeric_limits<double>::infinity();
    std::string best_name, marked;
    for (size_t a = 0; a < algorithms; ++a) {
      std::string time = cells[1 + 2 * a];
      if (time == "-") continue;
      const std::string name = header[1 + 2 * a].substr(0, header[1 + 2 * a].find('.'));
      if (time.back() == '*') {
        marked = name;
        time.pop_back();
      }
      const double us = std::stod(time);
      if (us < best) best = us, best_name = name;
      const double busbw = std::stod(cells[2 + 2 * a]);
      const double expected = bytes * 2.0 * (nranks - 1) / nranks / us / 1e3;
      EXPECT_NEAR(busbw, expected, 0.01 + 0.06 * expected) << name << " in " << line;
    }
    EXPECT_EQ(marked, best_name) << line;
    EXPECT_EQ(cells[1 + 2 * algorithms], best_name) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 4) << run.out;  // 1K, 8K, 64K, 512K
}

TEST(WeftSimTopo, RefusesSharedMemoryAcrossNodesAndMissingFiles) {
  const std::string cluster = std::string(WEFT_SOURCE_DIR) + "/docs/tuning/cpu4.json";
  SimRun shm = run_sim("--topo " + cluster + " --coll allreduce --bytes 1K:1M --shm");
  EXPECT_EQ(shm.exit_code, 2) << shm.out;
  EXPECT_NE(shm.out.find("one node"), std::string::npos) << shm.out;
  SimRun missing = run_sim("--topo /nonexistent/cluster.json --coll allreduce --bytes 1K:1M");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.out.find("/nonexistent/cluster.json"), std::string::npos) << missing.out;
}

// Device memory: a ring AllReduce of 4 MiB at 4 ranks through 1 MiB slots writes 2·3 blocks of
// 1 MiB into its peers' slots per rank and copies each out again (staged), 3 reduction kernels;
// busbw follows the printed time; every AllReduce algorithm gets a row; a bad -G is refused.
TEST(WeftSimDevice, LowersEveryAlgorithmAndCountsWhatARankDoes) {
  SimRun run = run_sim("allreduce --algo all -n 4 --bytes 4M -G 1 --slot-bytes 1M");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  std::istringstream in(run.out);
  int rows = 0;
  bool ring = false;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells = words(line);
    if (line.starts_with("#") || cells.empty() || cells[0] == "algo") continue;
    // algo ops copies copied(value unit) to.peers(value unit) kernels flags scratch(value unit)
    // time.us busbw
    ASSERT_EQ(cells.size(), 13u) << line;
    ++rows;
    const double us = std::stod(cells[11]), busbw = std::stod(cells[12]);
    EXPECT_GT(us, 0) << line;
    EXPECT_NEAR(busbw, 4.0 * 1024 * 1024 / (us * 1e3) * 2 * 3 / 4, 0.05 + busbw * 1e-3) << line;
    if (cells[0] == "ring") {
      ring = true;
      EXPECT_EQ(cells[5] + " " + cells[6], "6.00 MiB") << line;   // into peers' slots
      EXPECT_EQ(cells[3] + " " + cells[4], "12.00 MiB") << line;  // and out of its own
      EXPECT_EQ(cells[7], "3") << line;
    }
  }
  EXPECT_TRUE(ring) << run.out;
  EXPECT_GE(rows, 4) << run.out;
  EXPECT_EQ(run_sim("allreduce -n 4 --bytes 4M -G 2").exit_code, 2);
}

}  // namespace
