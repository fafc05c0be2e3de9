// hwloc discovery into weft::topo::Machine: synthetic machines of many
// shapes, an XML machine with GPUs, NICs, NUMA distances and NVLink, this
// host and this process's binding, and clear errors for bad input.
#include "topo/discover.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>

namespace weft::topo {
namespace {

struct Shape {
  int packages, numa_per_package, cores_per_numa, pus_per_core;
  std::string description() const {
    return "package:" + std::to_string(packages) + " numa:" + std::to_string(numa_per_package) +
           " core:" + std::to_string(cores_per_numa) + " pu:" + std::to_string(pus_per_core);
  }
};

class Synthetic : public ::testing::TestWithParam<Shape> {};

TEST_P(Synthetic, MatchesTheDescription) {
  const Shape s = GetParam();
  Machine m;
  Status status = load_synthetic(s.description(), &m);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(m.packages, s.packages);
  ASSERT_EQ(m.numa.size(), static_cast<size_t>(s.packages * s.numa_per_package));
  ASSERT_EQ(m.cores.size(), m.numa.size() * s.cores_per_numa);
  EXPECT_EQ(m.pu_count(), static_cast<int>(m.cores.size()) * s.pus_per_core);
  for (size_t n = 0; n < m.numa.size(); ++n)
    EXPECT_EQ(m.numa[n].package, static_cast<int>(n) / s.numa_per_package) << "numa " << n;
  // Synthetic machines number PUs in order: core c holds PUs c*p .. c*p+p-1.
  for (size_t c = 0; c < m.cores.size(); ++c) {
    const Core& core = m.cores[c];
    int numa = static_cast<int>(c) / s.cores_per_numa;
    EXPECT_EQ(core.numa, numa) << "core " << c;
    EXPECT_EQ(core.package, numa / s.numa_per_package) << "core " << c;
    ASSERT_EQ(core.pus.size(), static_cast<size_t>(s.pus_per_core));
    for (int p = 0; p < s.pus_per_core; ++p)
      EXPECT_EQ(core.pus[p], static_cast<int>(c) * s.pus_per_core + p);
  }
  EXPECT_TRUE(m.gpus.empty());
  EXPECT_TRUE(validate(m, "synthetic").ok());
  // A binding to one core's PUs locates to its NUMA node and package.
  const Core& last = m.cores.back();
  EXPECT_EQ(locate(m, last.pus), (Locality{last.package, last.numa}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Synthetic,
                         ::testing::Values(Shape{1, 1, 1, 1}, Shape{1, 1, 4, 2}, Shape{2, 1, 8, 1},
                                           Shape{2, 2, 16, 1}, Shape{4, 2, 3, 2},
                                           Shape{8, 1, 2, 4}));

TEST(Synthetic, LocatesBindingsThatSpanDomains) {
  Machine m;
  ASSERT_TRUE(load_synthetic("package:2 numa:2 core:2 pu:1", &m).ok());
  // PUs 0,1 are NUMA node 0; 0-3 are package 0 across two NUMA nodes; 0-7 everything.
  EXPECT_EQ(locate(m, std::vector<int>{0, 1}), (Locality{0, 0}));
  EXPECT_EQ(locate(m, std::vector<int>{1, 2}), (Locality{0, -1}));
  EXPECT_EQ(locate(m, std::vector<int>{3, 4}), (Locality{-1, -1}));
  EXPECT_EQ(locate(m, std::vector<int>{}), (Locality{-1, -1}));
  EXPECT_EQ(locate(m, std::vector<int>{0, 99}), (Locality{-1, -1}));  // unknown PU
}

TEST(Synthetic, RejectsBadDescriptions) {
  Machine m;
  for (const char* bad : {"", "package:", "package:two", "package:2 numa:2 core:x", "bogus:3",
                          "package:2 (", "core:0"}) {
    SCOPED_TRACE(bad);
    Status status = load_synthetic(bad, &m);
    EXPECT_FALSE(status.ok());
    EXPECT_FALSE(status.message().empty());
  }
  Status huge = load_synthetic("package:1000 core:1000 pu:1000", &m);
  EXPECT_FALSE(huge.ok());
  EXPECT_NE(huge.message().find("more than"), std::string::npos) << huge.message();
}

TEST(SyntheticPuCount, MultipliesLevelCounts) {
  uint64_t pus = 0;
  ASSERT_TRUE(synthetic_pu_count("package:2 numa:2 core:16 pu:2", &pus).ok());
  EXPECT_EQ(pus, 128u);
  ASSERT_TRUE(
      synthetic_pu_count("pack:2 [numa(memory=1GB)] l3:2(size=32MB) core:4 pu:1", &pus).ok());
  EXPECT_EQ(pus, 16u);
  ASSERT_TRUE(synthetic_pu_count("3 5", &pus).ok());
  EXPECT_EQ(pus, 15u);
  // Up to kMaxSyntheticPus: hwloc takes seconds, then minutes, beyond it.
  ASSERT_TRUE(synthetic_pu_count("package:4096 pu:1", &pus).ok());
  EXPECT_EQ(pus, kMaxSyntheticPus);
  for (const char* wide : {"package:4097 pu:1", "package:16 core:1024 pu:4", "x:46666 pu:1"}) {
    Status status = synthetic_pu_count(wide, &pus);
    EXPECT_FALSE(status.ok()) << wide;
    EXPECT_NE(status.message().find("more than 4096 PUs"), std::string::npos) << status.message();
  }
  // A level without the space before the next: hwloc reads a count there, so it is refused.
  EXPECT_FALSE(synthetic_pu_count("x:466660pu:1", &pus).ok());
  Status joined = synthetic_pu_count("x:4pu:1", &pus);
  EXPECT_FALSE(joined.ok());
  EXPECT_NE(joined.message().find("has no count"), std::string::npos) << joined.message();
}

TEST(Xml, FindsGpusNicsDistancesAndNvlink) {
  Machine m;
  Status status = load_xml_file(WEFT_TOPO_TEST_DATA "/two_socket_gpus.xml", &m);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(m.name, "gpunode");
  EXPECT_EQ(m.packages, 2);
  ASSERT_EQ(m.numa.size(), 2u);
  EXPECT_EQ(m.cores.size(), 4u);
  EXPECT_EQ(m.pu_count(), 8);
  ASSERT_EQ(m.gpus.size(), 2u);
  EXPECT_EQ(m.gpus[0], (Gpu{"0000:17:00.0", "cuda0", 0, 0}));
  EXPECT_EQ(m.gpus[1], (Gpu{"0000:b1:00.0", "cuda1", 1, 0}));
  ASSERT_EQ(m.nics.size(), 2u);
  EXPECT_EQ(m.nics[0].bus_id, "0000:3b:00.0");
  EXPECT_EQ(m.nics[0].name, "mlx5_0");  // the fabric name wins over "ib0"
  EXPECT_EQ(m.nics[0].numa, 0);
  EXPECT_EQ(m.nics[1].name, "eth1");
  EXPECT_EQ(m.nics[1].numa, 1);
  EXPECT_EQ(m.numa_distances, (std::vector<std::vector<uint64_t>>{{10, 21}, {21, 10}}));
  ASSERT_EQ(m.caches.size(), 1u);
  EXPECT_EQ(m.caches[0], (Cache{3, CacheKind::Unified, 16u << 20, 2}));
}

TEST(Xml, ReportsUnreadableAndMalformedFiles) {
  Machine m;
  Status missing = load_xml_file("/nonexistent/topology.xml", &m);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/topology.xml"), std::string::npos);
  std::string path = ::testing::TempDir() + "/weft_bad_topology.xml";
  std::ofstream(path) << "<?xml version=\"1.0\"?><topology version=\"2.0\"><object type=";
  Status malformed = load_xml_file(path, &m);
  EXPECT_FALSE(malformed.ok());
  EXPECT_NE(malformed.message().find(path), std::string::npos) << malformed.message();
}

TEST(Local, DiscoversThisHostAndBinding) {
  Machine m;
  Status status = discover_local(&m);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_FALSE(m.name.empty());
  EXPECT_GE(m.packages, 1);
  EXPECT_GE(m.cores.size(), 1u);
  EXPECT_TRUE(validate(m, "local").ok());
  std::vector<int> binding;
  ASSERT_TRUE(process_binding(&binding).ok());
  // Compare with the kernel's own view of this process's affinity.
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> expected;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) expected.push_back(cpu);
  EXPECT_EQ(binding, expected);
  std::set<int> pus;
  for (const Core& core : m.cores) pus.insert(core.pus.begin(), core.pus.end());
  for (int pu : binding) EXPECT_EQ(pus.count(pu), 1u) << "bound PU " << pu << " is on no core";
}

TEST(Validate, CatchesInconsistentMachines) {
  Machine m;
  ASSERT_TRUE(load_synthetic("package:2 numa:1 core:2 pu:1", &m).ok());
  auto broken = [&](auto change) {
    Machine copy = m;
    change(copy);
    return validate(copy, "test").message();
  };
  EXPECT_NE(broken([](Machine& x) { x.cores[1].pus = {0}; }).find("on two cores"),
            std::string::npos);
  EXPECT_NE(broken([](Machine& x) { x.cores[0].numa = 5; }).find("numa node 5"), std::string::npos);
  EXPECT_NE(broken([](Machine& x) { x.numa[1].package = 2; }).find("package 2"), std::string::npos);
  EXPECT_NE(broken([](Machine& x) { x.numa_distances = {{10}}; }).find("rows"), std::string::npos);
  EXPECT_NE(broken([](Machine& x) {
              x.gpus.push_back({"", "g", 7, -1});
            }).find("gpus[0]"),
            std::string::npos);
  EXPECT_NE(broken([](Machine& x) { x.cores[0].pus.clear(); }).find("no PUs"), std::string::npos);
}

}  // namespace
}  // namespace weft::topo
