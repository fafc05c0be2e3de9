// The cluster file (WEFT_TOPO_FILE): every way to describe nodes and ranks,
// link classes, dump/parse round trips, and malformed files that must give a
// clear error (line, column, path) and never crash.
#include "topo/cluster_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <random>
#include <string>

#include "topo/damage.h"
#include "topo/discover.h"

namespace weft::topo {
namespace {

Cluster parse_ok(const std::string& text) {
  Cluster cluster;
  Status status = parse_cluster(text, WEFT_TOPO_TEST_DATA, &cluster);
  EXPECT_TRUE(status.ok()) << status.message() << "\n" << text;
  return cluster;
}

std::string parse_error(const std::string& text) {
  Cluster cluster;
  Status status = parse_cluster(text, WEFT_TOPO_TEST_DATA, &cluster);
  EXPECT_FALSE(status.ok()) << "accepted:\n" << text;
  return status.message();
}

void expect_round_trip(const Cluster& cluster) {
  std::string text = dump_cluster(cluster);
  Cluster again = parse_ok(text);
  EXPECT_TRUE(again == cluster) << text;
  EXPECT_EQ(dump_cluster(again), text);
}

TEST(ClusterFile, SyntheticNodesWithCountsAndRanksPerNode) {
  Cluster c = parse_ok(R"({
    "weft_topology": 1,
    "links": {"network": {"bandwidth_gb_s": 12.5, "latency_us": 4}},
    "nodes": [
      {"name": "cpu", "count": 3, "synthetic": "package:2 numa:1 core:4 pu:1", "ranks": 4},
      {"name": "big", "synthetic": "package:1 numa:2 core:2 pu:2", "ranks": 3, "nics": 2}
    ]
  })");
  ASSERT_EQ(c.nodes.size(), 4u);
  EXPECT_EQ(c.nodes[0].name, "cpu-0");
  EXPECT_EQ(c.nodes[2].name, "cpu-2");
  EXPECT_EQ(c.nodes[3].name, "big");
  EXPECT_EQ(c.nodes[0].cores.size(), 8u);
  EXPECT_EQ(c.links[static_cast<int>(LinkClass::Network)], (LinkCost{12.5, 4}));
  EXPECT_EQ(c.links[static_cast<int>(LinkClass::SameNuma)], default_link_cost(LinkClass::SameNuma));
  ASSERT_EQ(c.ranks.size(), 15u);
  // Node by node; in blocks over the NUMA nodes (4 ranks on 2 NUMA nodes: 2 + 2).
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(c.ranks[r].node, r / 4);
    EXPECT_EQ(c.ranks[r].numa, (r % 4) / 2);
  }
  // 3 ranks over 2 NUMA nodes: 0, 0, 1; NICs (no locality) round robin, rail = index.
  EXPECT_EQ(c.ranks[12].numa, 0);
  EXPECT_EQ(c.ranks[14].numa, 1);
  EXPECT_EQ(c.ranks[13].nic, 1);
  EXPECT_EQ(c.nodes[3].nics[1].rail, 1);
  expect_round_trip(c);
}

TEST(ClusterFile, ExplicitMachinesAndRanks) {
  Cluster c = parse_ok(R"({
    "weft_topology": 1,
    "nodes": [{
      "name": "g",
      "packages": 2,
      "numa": [{"os_index": 0, "package": 0, "memory_bytes": 1024},
               {"os_index": 4, "package": 1, "memory_bytes": 2048}],
      "cores": [{"package": 0, "numa": 0, "pus": [0, 2]}, {"package": 1, "numa": 1, "pus": [1, 3]}],
      "caches": [{"level": 2, "kind": "data", "size_bytes": 65536, "count": 2}],
      "numa_distances": [[10, 32], [32, 10]],
      "gpus": [{"bus_id": "0000:01:00.0", "name": "g0", "numa": 0, "nvlink": 0},
               {"bus_id": "0000:81:00.0", "name": "g1", "numa": 1, "nvlink": 0},
               {"name": "g2", "numa": 1}],
      "nics": [{"name": "mlx5_0", "numa": 0, "rail": 0, "bandwidth_gb_s": 50},
               {"name": "mlx5_1", "numa": 1, "rail": 1, "bandwidth_gb_s": 50}]
    }, {"name": "h", "synthetic": "package:1 core:2 pu:1", "nics": 2}],
    "ranks": [{"node": "g", "gpu": 0, "nic": 0, "cpus": [0, 2]},
              {"node": "g", "numa": 1, "gpu": 1, "nic": 1},
              {"node": 0, "gpu": 2},
              {"node": "h", "nic": 1, "cpus": [1]}]
  })");
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[0].numa[1].os_index, 4);
  EXPECT_EQ(c.nodes[0].caches[0], (Cache{2, CacheKind::Data, 65536, 2}));
  ASSERT_EQ(c.ranks.size(), 4u);
  EXPECT_EQ(c.ranks[0].numa, 0);  // from its binding
  EXPECT_EQ(c.ranks[2].numa, -1);
  EXPECT_EQ(c.ranks[3].node, 1);
  EXPECT_EQ(link_between(c, 0, 1), LinkClass::NvLink);
  EXPECT_EQ(link_between(c, 1, 2), LinkClass::Pcie);
  EXPECT_EQ(link_between(c, 0, 3), LinkClass::CrossRail);
  EXPECT_EQ(link_between(c, 1, 3), LinkClass::Network);
  expect_round_trip(c);
}

TEST(ClusterFile, LinkClassesBetweenCpuRanks) {
  Cluster c = parse_ok(R"({"weft_topology": 1, "nodes": [
      {"name": "a", "synthetic": "package:2 numa:2 core:2 pu:1"}, {"name": "b", "synthetic": "core:1 pu:1"}],
    "ranks": [{"node": "a", "cpus": [0]}, {"node": "a", "cpus": [1]}, {"node": "a", "cpus": [2]},
              {"node": "a", "cpus": [4]}, {"node": "a"}, {"node": "b"}]})");
  ASSERT_EQ(c.ranks.size(), 6u);
  EXPECT_EQ(link_between(c, 0, 1), LinkClass::SameNuma);
  EXPECT_EQ(link_between(c, 0, 2), LinkClass::SameSocket);
  EXPECT_EQ(link_between(c, 0, 3), LinkClass::CrossSocket);
  EXPECT_EQ(link_between(c, 0, 4), LinkClass::CrossSocket);  // unbound: nothing shared is known
  EXPECT_EQ(link_between(c, 0, 5), LinkClass::Network);
  expect_round_trip(c);
}

TEST(ClusterFile, DeviceComputeAndMemoryForPlanning) {
  Cluster c = parse_ok(R"({"weft_topology": 1,
    "device": {"tflops": 989, "memory_gb": 80, "memory_gb_s": 3350},
    "nodes": [{"synthetic": "core:2 pu:1", "ranks": 2}]})");
  EXPECT_EQ(c.device.tflops, 989);
  EXPECT_EQ(c.device.memory_gb, 80);
  EXPECT_EQ(c.device.memory_gb_s, 3350);
  expect_round_trip(c);
  // Absent: zeros, and the dump leaves the entry out.
  Cluster plain = parse_ok(R"({"weft_topology": 1, "nodes": [{"synthetic": "core:2 pu:1"}]})");
  EXPECT_TRUE(plain.device == DeviceSpec{});
  EXPECT_EQ(dump_cluster(plain).find("device"), std::string::npos);
  EXPECT_NE(parse_error(R"({"weft_topology": 1, "device": {"tflops": -1},
    "nodes": [{"synthetic": "core:2 pu:1"}]})")
                .find("device.tflops"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"weft_topology": 1, "device": {"flops": 1},
    "nodes": [{"synthetic": "core:2 pu:1"}]})")
                .find("flops"),
            std::string::npos);
}

TEST(ClusterFile, XmlNodesResolveRelativeToTheFile) {
  Cluster c = parse_ok(R"({"weft_topology": 1,
    "nodes": [{"name": "x", "xml": "two_socket_gpus.xml", "count": 2, "ranks": 2}]})");
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[1].name, "x-1");
  EXPECT_EQ(c.nodes[1].gpus.size(), 2u);
  // One rank per GPU, on the GPU's NUMA node and that node's NIC.
  EXPECT_EQ(c.ranks[1].gpu, 1);
  EXPECT_EQ(c.ranks[1].numa, 1);
  EXPECT_EQ(c.ranks[1].nic, 1);
  expect_round_trip(c);
}

TEST(ClusterFile, LoadsFromWeftTopoFile) {
  Cluster loaded;
  bool found = true;
  unsetenv("WEFT_TOPO_FILE");
  ASSERT_TRUE(load_cluster_from_env(&loaded, &found).ok());
  EXPECT_FALSE(found);
  std::string path = ::testing::TempDir() + "/weft_topo_env.json";
  std::ofstream(path)
      << R"({"weft_topology": 1, "nodes": [{"synthetic": "core:2 pu:1", "ranks": 2}]})";
  setenv("WEFT_TOPO_FILE", path.c_str(), 1);
  Status status = load_cluster_from_env(&loaded, &found);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(found);
  EXPECT_EQ(loaded.ranks.size(), 2u);
  std::ofstream(path) << R"({"weft_topology": 1, "nodes": []})";
  status = load_cluster_from_env(&loaded, &found);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("WEFT_TOPO_FILE: " + path), std::string::npos)
      << status.message();
  setenv("WEFT_TOPO_FILE", "/nonexistent/cluster.json", 1);
  EXPECT_NE(load_cluster_from_env(&loaded, &found).message().find("cannot open"),
            std::string::npos);
  unsetenv("WEFT_TOPO_FILE");
}

TEST(ClusterFile, MalformedFilesGiveClearErrors) {
  struct Bad {
    const char* text;
    const char* message;
  };
  const Bad cases[] = {
      {"", "unexpected end of input"},
      {"[]", "top level: expected an object"},
      {R"({"nodes": [{}]})", "missing key \"weft_topology\""},
      {R"({"weft_topology": 2, "nodes": [{}]})", "weft_topology: expected an integer in [1, 1]"},
      {R"({"weft_topology": 1})", "missing key \"nodes\""},
      {R"({"weft_topology": 1, "nodes": []})", "at least one node"},
      {R"({"weft_topology": 1, "nodes": [{"nmae": "x"}]})", "nodes[0]: unknown key \"nmae\""},
      {R"({"weft_topology": 1, "nodes": [{"count": 0}]})",
       "nodes[0].count: expected an integer in [1, 65536]"},
      {R"({"weft_topology": 1, "nodes": [{"count": 1e3}]})", "nodes[0].count: expected an integer"},
      {R"({"weft_topology": 1, "nodes": [{"count": 99999999999999999999}]})",
       "expected an integer"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": "package:2 core:x"}]})",
       "nodes[0].synthetic"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": 5}]})",
       "nodes[0].synthetic: expected a string"},
      {R"({"weft_topology": 1, "nodes": [{"xml": "missing.xml"}]})", "cannot read hwloc XML file"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": "core:1 pu:1", "cores": []}]})",
       "give one of"},
      {R"({"weft_topology": 1, "nodes": [{"name": "a"}, {"name": "a"}]})", "\"a\" is used twice"},
      {R"({"weft_topology": 1, "nodes": [{"name": "a", "count": 2}, {"name": "a-1"}]})",
       "used twice"},
      {R"({"weft_topology": 1, "nodes": [{"cores": [{"numa": 0}]}]})",
       "cores[0]: missing key \"pus\""},
      {R"({"weft_topology": 1, "nodes": [{"cores": [{"numa": 0, "pus": [0]}]}]})",
       "names numa node 0 of 0"},
      {R"({"weft_topology": 1, "nodes": [{"packages": 1, "cores": [{"pus": [0]}, {"pus": [0]}]}]})",
       "PU 0 is negative or on two cores"},
      {R"({"weft_topology": 1, "nodes": [{"cores": [{"pus": [-1]}]}]})",
       "pus[0]: expected an integer"},
      {R"({"weft_topology": 1, "nodes": [{"caches": [{"level": 9}]}]})", "caches[0].level"},
      {R"({"weft_topology": 1, "nodes": [{"caches": [{"level": 1, "kind": "l1"}]}]})",
       "expected unified"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": "numa:2 core:1 pu:1", "numa_distances": [[10]]}]})",
       "numa_distances has 1 rows"},
      {R"({"weft_topology": 1, "nodes": [{"gpus": [{"numa": 3}]}]})", "gpus[0] names numa node 3"},
      {R"({"weft_topology": 1, "nodes": [{"gpus": -1}]})", "nodes[0].gpus: expected an integer"},
      {R"({"weft_topology": 1, "nodes": [{"nics": [{"bandwidth_gb_s": -5}]}]})", "bandwidth_gb_s"},
      {R"({"weft_topology": 1, "links": {"warp": {}}, "nodes": [{}]})",
       "unknown link class \"warp\""},
      {R"({"weft_topology": 1, "links": {"pcie": {"bandwidth_gb_s": 0}}, "nodes": [{}]})",
       "links.pcie.bandwidth_gb_s: expected a finite number"},
      {R"({"weft_topology": 1, "links": {"pcie": {"latency_us": 1e999}}, "nodes": [{}]})",
       "finite"},
      {R"({"weft_topology": 1, "nodes": [{}], "ranks": [{}]})", "ranks[0]: missing key \"node\""},
      {R"({"weft_topology": 1, "nodes": [{}], "ranks": [{"node": "zz"}]})",
       "no node is named \"zz\""},
      {R"({"weft_topology": 1, "nodes": [{}], "ranks": [{"node": 1}]})",
       "ranks[0].node: expected an integer in [0, 0]"},
      {R"({"weft_topology": 1, "nodes": [{}], "ranks": [{"node": 0, "gpu": 0}]})",
       "is not on node"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": "core:2 pu:1"}], "ranks": [{"node": 0, "cpus": [7]}]})",
       "cpu 7 is not on node"},
      {R"({"weft_topology": 1, "nodes": [{"synthetic": "numa:2 core:1 pu:1"}],
          "ranks": [{"node": 0, "numa": 0, "cpus": [1]}]})",
       "its cpus are on numa 1"},
      {R"({"weft_topology": 1, "nodes": [{"ranks": 2}], "ranks": []})", "not both"},
      {R"({"weft_topology": 1, "nodes": [{"count": 65536, "ranks": 65536}]})",
       "more than 1048576 ranks"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.text);
    std::string message = parse_error(bad.text);
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
    if (bad.text[0] != '\0') {
      EXPECT_NE(message.find("line "), std::string::npos) << message;
    }
  }
}

// Random damage to a valid file: either a valid cluster (which then round
// trips) or an error naming a line; never a crash.
TEST(ClusterFile, SurvivesRandomDamage) {
  const std::string valid = R"({"weft_topology": 1,
    "links": {"nvlink": {"bandwidth_gb_s": 300, "latency_us": 1.5}},
    "nodes": [{"name": "n", "count": 2, "synthetic": "package:2 numa:1 core:2 pu:1", "ranks": 3,
               "gpus": [{"bus_id": "0000:01:00.0", "numa": 0, "nvlink": 0}], "nics": 1},
              {"name": "m", "packages": 1, "numa": [{"os_index": 0, "package": 0}],
               "cores": [{"package": 0, "numa": 0, "pus": [0, 1]}]}]})";
  const std::string tokens[] = {"{",
                                "}",
                                "[",
                                "]",
                                ",",
                                ":",
                                "\"",
                                "-1",
                                "1e9",
                                "0",
                                "null",
                                "\"ranks\": 2",
                                "\"count\": 9",
                                "\"numa\": 5",
                                "\"x\""};
  std::mt19937 random(99);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text = damage(valid, random, tokens, 3);
    Cluster cluster;
    Status status = parse_cluster(text, "", &cluster);
    if (status.ok()) {
      ++accepted;
      Cluster again;
      ASSERT_TRUE(parse_cluster(dump_cluster(cluster), "", &again).ok()) << text;
      EXPECT_TRUE(again == cluster) << text;
    } else {
      ++rejected;
      EXPECT_NE(status.message().find("line "), std::string::npos) << status.message();
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 1000);
}

TEST(ClusterFile, DumpOfDiscoveredMachinesRoundTrips) {
  Cluster cluster;
  Machine local, xml;
  ASSERT_TRUE(discover_local(&local).ok());
  ASSERT_TRUE(load_xml_file(WEFT_TOPO_TEST_DATA "/two_socket_gpus.xml", &xml).ok());
  xml.nics[0].bandwidth_gb_s = 1.0 / 3;  // a value with no short decimal form
  xml.nics[0].rail = 3;
  cluster.nodes = {local, xml};
  cluster.links[static_cast<int>(LinkClass::Pcie)] = {0.1 + 0.2, 1e-3};
  place_ranks(cluster.nodes[1], 1, 5, &cluster.ranks);
  cluster.ranks.push_back({0, -1, -1, -1, {local.cores[0].pus[0]}});
  cluster.ranks.back().numa = local.cores[0].numa;
  expect_round_trip(cluster);
}

}  // namespace
}  // namespace weft::topo
