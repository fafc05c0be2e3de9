// weft-topo as a user runs it: dump then load gives the same topology, the
// rank/ring/tree report matches the library, errors exit non-zero with a
// message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "topo/cluster_file.h"
#include "topo/discover.h"
#include "topo/shapes.h"

namespace weft::topo {
namespace {

struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ToolRun run_tool(const std::string& args, const std::string& env = "") {
  std::string command = env + " " WEFT_TOPO_TOOL " " + args + " 2>&1";
  ToolRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t got = 0;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, got);
  int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/weft_topo_tool_" + name;
}

TEST(Tool, DumpThenLoadGivesTheSameTopology) {
  const std::string a = temp("a.json"), b = temp("b.json");
  ToolRun first =
      run_tool("--synthetic 'package:2 numa:2 core:4 pu:2' --ranks-per-node 3 --dump " + a);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ToolRun second = run_tool("--file " + a + " --ranks --dump " + b);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(read_file(a), read_file(b));
  EXPECT_EQ(first.output, second.output);  // the same report from the dumped file
  // And it is the machine the library builds from the same description.
  Cluster expected;
  Machine machine;
  ASSERT_TRUE(load_synthetic("package:2 numa:2 core:4 pu:2", &machine).ok());
  machine.name = "synthetic";
  expected.nodes = {machine};
  place_ranks(machine, 0, 3, &expected.ranks);
  Cluster loaded;
  ASSERT_TRUE(load_cluster_file(a, &loaded).ok());
  EXPECT_TRUE(loaded == expected);
}

TEST(Tool, DumpsXmlMachinesWithDevices) {
  const std::string a = temp("xml.json"), b = temp("xml2.json");
  ASSERT_EQ(run_tool("--xml " WEFT_TOPO_TEST_DATA "/two_socket_gpus.xml --dump " + a).exit_code, 0);
  ToolRun again = run_tool("--file " + a + " --dump " + b);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_file(a), read_file(b));
  EXPECT_NE(again.output.find("gpu 1: cuda1 0000:b1:00.0, numa 1, nvlink domain 0"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("nic 0: mlx5_0 0000:3b:00.0, numa 0"), std::string::npos);
}

TEST(Tool, ReportsRanksRingAndTreeFromWeftTopoFile) {
  const std::string path = temp("cluster.json");
  std::ofstream(path) << R"({"weft_topology": 1,
    "nodes": [{"name": "a", "synthetic": "package:2 numa:1 core:2 pu:1"},
              {"name": "b", "synthetic": "package:1 numa:1 core:2 pu:1"}],
    "ranks": [{"node": "a", "cpus": [0]}, {"node": "b"}, {"node": "a", "cpus": [2]},
              {"node": "b"}, {"node": "a", "cpus": [1]}]})";
  ToolRun run = run_tool("--ranks --root 1", "WEFT_TOPO_FILE=" + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  Cluster cluster;
  ASSERT_TRUE(load_cluster_file(path, &cluster).ok());
  ClusterView view(places_of(cluster));
  std::string ring = "ring (crosses nodes 2 times, domains 3 times):";
  for (int r : ring_order(view)) ring += " " + std::to_string(r);
  EXPECT_NE(run.output.find(ring + "\n"), std::string::npos) << run.output;
  TreeShape tree = tree_shape(view, 1);
  for (int r = 0; r < view.nranks(); ++r) {
    std::string line = "  rank " + std::to_string(r) + ": parent " +
                       (tree.parent[r] < 0 ? "-" : std::to_string(tree.parent[r])) + ", children";
    if (tree.children[r].empty()) line += " none";
    for (int child : tree.children[r]) line += " " + std::to_string(child);
    EXPECT_NE(run.output.find(line + "\n"), std::string::npos) << line << "\n" << run.output;
  }
  EXPECT_NE(run.output.find("rank 2: node a, package 1, numa 1"), std::string::npos);
  EXPECT_NE(run.output.find("1 edges cross nodes"), std::string::npos);
}

TEST(Tool, FailsClearly) {
  const std::string path = temp("bad.json");
  std::ofstream(path) << "{\"weft_topology\": 1, \"nodes\": [{\"cores\": 5}]}";
  ToolRun bad_file = run_tool("--file " + path);
  EXPECT_EQ(bad_file.exit_code, 1);
  EXPECT_NE(bad_file.output.find("line 1, column 42: nodes[0].cores: expected an array"),
            std::string::npos)
      << bad_file.output;
  ToolRun bad_env = run_tool("--ranks", "WEFT_TOPO_FILE=/nonexistent.json");
  EXPECT_EQ(bad_env.exit_code, 1);
  EXPECT_NE(bad_env.output.find("WEFT_TOPO_FILE"), std::string::npos);
  EXPECT_EQ(run_tool("--synthetic 'pu:0'").exit_code, 1);
  EXPECT_EQ(run_tool("--bogus").exit_code, 2);
  EXPECT_EQ(run_tool("--xml a --file b").exit_code, 2);
  EXPECT_EQ(run_tool("--ranks-per-node -1").exit_code, 2);
  EXPECT_EQ(run_tool("--synthetic 'core:2 pu:1' --ranks-per-node 2 --root 5").exit_code, 2);
  EXPECT_EQ(run_tool("--help").exit_code, 0);
}

TEST(Tool, DescribesThisHost) {
  ToolRun run = run_tool("");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  Machine local;
  ASSERT_TRUE(discover_local(&local).ok());
  EXPECT_EQ(run.output.rfind("this process: PUs ", 0), 0u) << run.output;
  EXPECT_NE(run.output.find("node " + local.name + ": "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(std::to_string(local.cores.size()) + " cores"), std::string::npos);
}

}  // namespace
}  // namespace weft::topo
