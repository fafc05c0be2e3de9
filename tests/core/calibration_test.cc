// The cost model's machine inputs come from WEFT_TUNER_FILE when it is set:
// a value changed in the file changes the predictions by exactly what the
// model's arithmetic says (no timing involved).
#include "core/calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/tuner.h"

namespace weft {
namespace {

using algo::Algorithm;
using algo::Collective;

// `nranks` ranks of one discovered (not injected) node.
CommTopology one_node(int nranks) {
  CommTopology topology;
  for (int r = 0; r < nranks; ++r) topology.places.push_back(topo::RankPlace{42, 0, 0, -1});
  return topology;
}

// Writes `text` to a file that WEFT_TUNER_FILE names while the object lives.
class TunerFile {
 public:
  explicit TunerFile(const std::string& text) {
    char name[] = "/tmp/weft-tuner-XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
    setenv("WEFT_TUNER_FILE", path_.c_str(), 1);
  }
  ~TunerFile() {
    unsetenv("WEFT_TUNER_FILE");
    std::remove(path_.c_str());
  }

 private:
  std::string path_;
};

// The prediction on `nranks` ranks of one node with WEFT_TUNER_FILE = `text`,
// after turning off the defaults' optional costs (call, cache tier, slicing),
// so that each test sees only the figures it sets.
// Lane calls, where lane_bytes is set, as the direct path's: up to 512 bytes, a window of 32
// (its window from 6 to 13 ranks, and where /dev/shm is short).
double predict_with(const std::string& text, int nranks, Algorithm algorithm, uint64_t bytes,
                    bool shared_memory = false, Collective collective = Collective::AllReduce,
                    uint64_t single_copy_bytes = 0, uint64_t lane_bytes = 0) {
  TunerFile file(
      "call_us 0\ncache_bytes 0\nslice_latency_us 0\ndirect_slice_latency_us 0\n"
      "sliced_link_bandwidth_gb_s 0\nsliced_single_copy_bandwidth_gb_s 0\n" +
      text);
  Calibration machine;
  const Status status = load_calibration(&machine);
  EXPECT_TRUE(status.ok()) << status.message();
  TuneContext context =
      tune_context(one_node(nranks), shared_memory, AlgorithmOverrides(), machine);
  context.single_copy_bytes[static_cast<size_t>(collective)] = single_copy_bytes;
  context.lane_bytes = lane_bytes;
  context.lane_window = 32;
  const Tuner tuner(std::move(context));
  return tuner.predict_us(collective, algorithm, 0, bytes);
}

TEST(Calibration, ParsesEveryKey) {
  Calibration c;
  ASSERT_TRUE(parse_calibration("# weft calibration\n"
                                "call_us 1.5\nlink_latency_us 0.75   # UCX\n"
                                "link_bandwidth_gb_s 7\nmemory_overhead_us 0.1\n"
                                "memory_bandwidth_gb_s 9\ndirect_latency_us 0.3\n"
                                "direct_bandwidth_gb_s 11\nsingle_copy_latency_us 0.9\n"
                                "single_copy_bandwidth_gb_s 13\n\ncores 3\nslice_latency_us 40\n"
                                "direct_slice_latency_us 4\nsliced_link_bandwidth_gb_s 2\n"
                                "sliced_single_copy_bandwidth_gb_s 1.25\n"
                                "cache_bytes 524288\ncache_bandwidth_gb_s 40\n"
                                "direct_cache_bandwidth_gb_s 30\n",
                                "test", &c)
                  .ok());
  EXPECT_EQ(c.call_us, 1.5);
  EXPECT_EQ(c.link.latency_us, 0.75);
  EXPECT_EQ(c.link.bandwidth_gb_s, 7);
  EXPECT_EQ(c.memory.latency_us, 0.1);
  EXPECT_EQ(c.memory.bandwidth_gb_s, 9);
  EXPECT_EQ(c.direct.latency_us, 0.3);
  EXPECT_EQ(c.direct.bandwidth_gb_s, 11);
  EXPECT_EQ(c.single_copy.latency_us, 0.9);
  EXPECT_EQ(c.single_copy.bandwidth_gb_s, 13);
  EXPECT_EQ(c.cores, 3);
  EXPECT_EQ(c.slice_latency_us, 40);
  EXPECT_EQ(c.direct_slice_latency_us, 4);
  EXPECT_EQ(c.sliced_link_bandwidth_gb_s, 2);
  EXPECT_EQ(c.sliced_single_copy_bandwidth_gb_s, 1.25);
  EXPECT_EQ(c.cache_bytes, 524288);
  EXPECT_EQ(c.cache_bandwidth_gb_s, 40);
  EXPECT_EQ(c.direct_cache_bandwidth_gb_s, 30);
}

TEST(Calibration, AFileWithItsOwnDirectFigureKeepsTheCopiesFactorForIt) {
  // The default cache figure of the direct reads belongs to the default direct figure.
  Calibration own;
  ASSERT_TRUE(parse_calibration("direct_bandwidth_gb_s 40\n", "test", &own).ok());
  EXPECT_EQ(own.direct_cache_bandwidth_gb_s, 0);
  Calibration both;
  ASSERT_TRUE(
      parse_calibration("direct_bandwidth_gb_s 40\ndirect_cache_bandwidth_gb_s 60\n", "t", &both)
          .ok());
  EXPECT_EQ(both.direct_cache_bandwidth_gb_s, 60);
  Calibration other;
  ASSERT_TRUE(parse_calibration("memory_bandwidth_gb_s 20\n", "test", &other).ok());
  EXPECT_EQ(other.direct_cache_bandwidth_gb_s, Calibration().direct_cache_bandwidth_gb_s);
}

TEST(Calibration, BadFilesNameTheLineAndKey) {
  const auto error = [](const char* text) {
    Calibration c;
    const Status status = parse_calibration(text, "f.txt", &c);
    EXPECT_FALSE(status.ok()) << text;
    return status.message();
  };
  EXPECT_NE(error("call_us 1\nbogus 2\n").find("f.txt line 2: unknown key 'bogus'"),
            std::string::npos);
  EXPECT_NE(error("link_bandwidth_gb_s 0\n").find("link_bandwidth_gb_s must be positive"),
            std::string::npos);
  EXPECT_NE(error("call_us fast\n").find("call_us: 'fast' is not a number"), std::string::npos);
  EXPECT_NE(error("call_us -1\n").find("call_us: '-1'"), std::string::npos);
  EXPECT_NE(error("cores 2.5\n").find("cores: '2.5' is not a whole number"), std::string::npos);
  EXPECT_NE(error("call_us\n").find("expected 'key value'"), std::string::npos);
  EXPECT_NE(error("call_us 1 2\n").find("expected 'key value'"), std::string::npos);

  setenv("WEFT_TUNER_FILE", "/nonexistent/weft-tuner", 1);
  Calibration c;
  const Status status = load_calibration(&c);
  unsetenv("WEFT_TUNER_FILE");
  EXPECT_EQ(status.code(), weftInvalidArgument);
  EXPECT_NE(status.message().find("/nonexistent/weft-tuner"), std::string::npos);
}

TEST(Calibration, UnsetFileKeepsTheDefaults) {
  unsetenv("WEFT_TUNER_FILE");
  Calibration loaded;
  loaded.call_us = 99;
  ASSERT_TRUE(load_calibration(&loaded).ok());
  const Calibration defaults;
  EXPECT_EQ(loaded.call_us, defaults.call_us);
  EXPECT_EQ(loaded.link, defaults.link);
  EXPECT_EQ(loaded.memory.bandwidth_gb_s, defaults.memory.bandwidth_gb_s);
}

// Fixed figures, no oversubscription (cores >= ranks); each test changes one.
const std::string kBase =
    "cores 8\nlink_latency_us 1\nlink_bandwidth_gb_s 6\nmemory_overhead_us 0.2\n"
    "memory_bandwidth_gb_s 12\ndirect_latency_us 0.15\ndirect_bandwidth_gb_s 25\n";

TEST(Calibration, FileValuesReachThePredictions) {
  const uint64_t bytes = 1 << 20;
  const double base = predict_with(kBase, 4, Algorithm::Ring, bytes);
  ASSERT_GT(base, 0);
  // The call overhead is added once per call.
  EXPECT_NEAR(predict_with(kBase + "call_us 5\n", 4, Algorithm::Ring, bytes), base + 5, 1e-9);
  // Ring AllReduce: 2(n-1) messages one after the other, each paying α once.
  EXPECT_NEAR(predict_with(kBase + "link_latency_us 3\n", 4, Algorithm::Ring, bytes),
              base + 2 * 3 * 2.0, 1e-9);
  // Each of those messages carries S/n bytes: at half the bandwidth each takes
  // S/(n·β) longer.
  EXPECT_NEAR(predict_with(kBase + "link_bandwidth_gb_s 3\n", 4, Algorithm::Ring, bytes),
              base + 6 * (bytes / 4.0) / (6 * 1e3), 1e-6);
  // Direct one-shot: the copy into staging (at the copy throughput) + one synchronisation +
  // reading n-1 peers' staging (at the direct throughput).
  const double direct = predict_with(kBase, 4, Algorithm::OneShot, bytes, true);
  EXPECT_NEAR(predict_with(kBase + "direct_latency_us 2.15\n", 4, Algorithm::OneShot, bytes, true),
              direct + 2, 1e-9);
  EXPECT_NEAR(direct, 0.2 + bytes / 12e3 + 0.15 + 3 * bytes / 25e3, 1e-9);
}

// Blocks read in place by cross-memory attach (the communicator's CMA floor): two
// synchronisations, no staging copy, the own block copied and each peer's read once.
TEST(Calibration, SingleCopyReadsReachThePredictions) {
  const uint64_t bytes = 1 << 20;
  const std::string single = kBase + "single_copy_latency_us 0.9\nsingle_copy_bandwidth_gb_s 10\n";
  const auto predict = [&](const std::string& text, Collective collective, uint64_t floor) {
    return predict_with(text, 4, Algorithm::OneShot, bytes, true, collective, floor);
  };
  const double read = 0.9 + bytes / 10e3;
  EXPECT_NEAR(predict(single, Collective::AllGather, 4096), 2 * 0.15 + bytes / 12e3 + 3 * read,
              1e-9);
  EXPECT_NEAR(predict(single, Collective::AllToAll, 4096), 2 * 0.15 + bytes / 12e3 + 3 * read,
              1e-9);
  EXPECT_NEAR(predict(single, Collective::Broadcast, 4096), 2 * 0.15 + read, 1e-9);
  EXPECT_NEAR(predict(single + "single_copy_latency_us 1.9\n", Collective::AllGather, 4096),
              predict(single, Collective::AllGather, 4096) + 3, 1e-9);
  // Blocks under the floor, no floor, or a reduction: staged, the figures unused.
  for (const auto& [collective, floor] :
       {std::pair{Collective::AllGather, bytes + 1}, std::pair{Collective::AllGather, uint64_t{0}},
        std::pair{Collective::AllReduce, uint64_t{4096}}})
    EXPECT_NEAR(predict(single, collective, floor), predict(kBase, collective, 0), 1e-9)
        << algo::collective_name(collective) << " floor " << floor;
  EXPECT_NE(predict(single, Collective::AllGather, 4096), predict(kBase, Collective::AllGather, 0));
}

// Oversubscribed, a single-copy read runs at the measured throughput at s = 2, scaled by
// 2 / s for other shares; 0 leaves bandwidth / s.
TEST(Calibration, OversubscribedSingleCopyReadsFollowTheirMeasuredThroughput) {
  const uint64_t bytes = 4 << 20;
  const std::string single = kBase + "single_copy_latency_us 0.9\nsingle_copy_bandwidth_gb_s 10\n";
  const auto predict = [&](const std::string& text, int nranks) {
    return predict_with(text, nranks, Algorithm::OneShot, bytes, true, Collective::AllToAll, 4096);
  };
  // 4 and 8 ranks on 2 cores: s = 2 and 4; the block is bytes, memory runs at 12 / s.
  const auto expected = [&](int nranks, double read_gb_s) {
    const double s = nranks / 2.0;
    return 2 * 0.15 + bytes / (12e3 / s) + (nranks - 1) * (0.9 + bytes / (read_gb_s * 1e3));
  };
  const std::string two_cores = single + "cores 2\n";
  EXPECT_NEAR(predict(two_cores, 4), expected(4, 5), 1e-6);
  EXPECT_NEAR(predict(two_cores, 8), expected(8, 2.5), 1e-6);
  const std::string measured = two_cores + "sliced_single_copy_bandwidth_gb_s 2\n";
  EXPECT_NEAR(predict(measured, 4), expected(4, 2), 1e-6);
  EXPECT_NEAR(predict(measured, 8), expected(8, 1), 1e-6);
  // A core per rank: the key changes nothing.
  EXPECT_NEAR(predict(single + "sliced_single_copy_bandwidth_gb_s 2\n", 4), predict(single, 4),
              1e-9);
  EXPECT_EQ(Calibration::sliced_single_copy_bandwidth(10, 1, 2), 10);
  EXPECT_EQ(Calibration::sliced_single_copy_bandwidth(10, 4, 0), 2.5);
}

TEST(Calibration, LaneCallsTakeTheDirectLatencyOnTheirShareOfTheCore) {
  const auto predict = [&](const std::string& text, int nranks, Collective collective,
                           uint64_t bytes) {
    return predict_with(text, nranks, Algorithm::OneShot, bytes, true, collective, 0, 512);
  };
  // A core per rank: one direct latency, the copy into the slot and the reads, no wait.
  EXPECT_NEAR(predict(kBase, 4, Collective::Reduce, 512), 0.15 + 512 / 12e3 + 3 * 512 / 25e3, 1e-9);
  EXPECT_NEAR(predict(kBase, 4, Collective::Broadcast, 64), 0.15 + 64 / 12e3 + 64 / 25e3, 1e-9);
  // Larger calls are staged: the lanes change nothing there.
  EXPECT_EQ(predict(kBase, 4, Collective::Broadcast, 513),
            predict_with(kBase, 4, Algorithm::OneShot, 513, true, Collective::Broadcast));
  EXPECT_EQ(predict(kBase, 4, Collective::AllReduce, 8),
            predict_with(kBase, 4, Algorithm::OneShot, 8, true));
  // 8 ranks on 2 cores (s = 4): the latency on a quarter of a core, a slice wait per
  // window of 32 calls, throughputs / 4.
  const std::string sliced = kBase + "cores 2\ndirect_slice_latency_us 4\n";
  EXPECT_NEAR(predict(sliced, 8, Collective::Broadcast, 64),
              4 * (0.15 + 3 * 4.0 / 32) + 64 / 3e3 + 64 / 6.25e3, 1e-9);
}

TEST(Calibration, OversubscribedRanksTimeShareTheCores) {
  const uint64_t bytes = 256 << 10;
  // 4 ranks on 2 cores (s = 2) cost what 4 unshared ranks cost on a machine
  // with half every throughput, the call overhead doubled and every message's
  // latency raised by one slice latency (local steps wait for nobody).
  const std::string shared =
      "cores 2\ncall_us 1\nslice_latency_us 30\nlink_latency_us 1\nlink_bandwidth_gb_s 6\n"
      "memory_overhead_us 0.2\nmemory_bandwidth_gb_s 12\n";
  const std::string equivalent =
      "cores 4\ncall_us 2\nslice_latency_us 30\nlink_latency_us 31\nlink_bandwidth_gb_s 3\n"
      "memory_overhead_us 0.2\nmemory_bandwidth_gb_s 6\n";
  for (Algorithm algorithm : {Algorithm::Ring, Algorithm::Rd, Algorithm::Rhd}) {
    const double sliced = predict_with(shared, 4, algorithm, bytes);
    EXPECT_NEAR(sliced, predict_with(equivalent, 4, algorithm, bytes), 1e-6)
        << algo::algorithm_name(algorithm);
    // Two ranks fit the two cores: no slicing.
    EXPECT_LT(predict_with(shared, 2, algorithm, bytes) * 1.5, sliced);
  }
  // The slice latency is what makes small oversubscribed calls slow.
  EXPECT_GT(predict_with(shared, 4, Algorithm::Rd, 8),
            predict_with(shared + "slice_latency_us 0\n", 4, Algorithm::Rd, 8) + 2 * 30 - 1e-9);
  // A direct synchronisation waits its own slice latency, once per synchronisation.
  const std::string direct = shared + "direct_latency_us 0.5\ndirect_bandwidth_gb_s 20\n";
  EXPECT_NEAR(predict_with(direct + "direct_slice_latency_us 4\n", 4, Algorithm::TwoShot, 8, true),
              predict_with(direct, 4, Algorithm::TwoShot, 8, true) + 2 * 4, 1e-9);
  // A measured link throughput at s = 2 replaces bandwidth / 2 ...
  EXPECT_NEAR(predict_with(shared + "sliced_link_bandwidth_gb_s 1.5\n", 4, Algorithm::Ring, bytes),
              predict_with(equivalent + "link_bandwidth_gb_s 1.5\n", 4, Algorithm::Ring, bytes),
              1e-6);
  // ... and sets the power of s for other shares: 6 GB/s at s = 1 and 1.5 at
  // s = 2 is 6 / s^2, so 8 ranks on 2 cores (s = 4) get 0.375 GB/s.
  EXPECT_NEAR(Calibration::sliced_link_bandwidth(6, 4, 1.5), 0.375, 1e-12);
  EXPECT_EQ(Calibration::sliced_link_bandwidth(6, 4, 0), 1.5);
  EXPECT_EQ(Calibration::sliced_link_bandwidth(6, 1, 1.5), 6);
}

TEST(Calibration, CallsThatFitTheCacheCopyAtTheCachesSpeed) {
  // Memory 12 GB/s, cache 24 GB/s up to 1 MiB, and no cache figure of the transfers
  // between cores: a call that fits runs every copy, UCX message and direct read at twice
  // the calibrated throughput.
  const std::string cached =
      kBase + "cache_bytes 1048576\ncache_bandwidth_gb_s 24\ndirect_cache_bandwidth_gb_s 0\n";
  const std::string doubled =
      "cores 8\nlink_latency_us 1\nlink_bandwidth_gb_s 12\nmemory_overhead_us 0.2\n"
      "memory_bandwidth_gb_s 24\ndirect_latency_us 0.15\ndirect_bandwidth_gb_s 50\n";
  for (Algorithm algorithm : {Algorithm::Ring, Algorithm::Rhd, Algorithm::OneShot}) {
    const bool direct = algorithm == Algorithm::OneShot;
    EXPECT_NEAR(predict_with(cached, 4, algorithm, 256 << 10, direct),
                predict_with(doubled, 4, algorithm, 256 << 10, direct), 1e-6)
        << algo::algorithm_name(algorithm);
  }
  // A call of 2 MiB copies its first MiB at 24 GB/s and the second at 12: 4/3 the throughput.
  EXPECT_NEAR(Calibration::cache_speedup(2 << 20, 1 << 20, 24, 12), 4.0 / 3, 1e-12);
  EXPECT_EQ(Calibration::cache_speedup(2 << 20, 0, 24, 12), 1);
  // Past the cache the large call is timed at memory's speed, within that first MiB's gain.
  const double large = predict_with(cached, 4, Algorithm::Ring, 64 << 20);
  const double uncached = predict_with(kBase, 4, Algorithm::Ring, 64 << 20);
  EXPECT_LT(large, uncached);
  EXPECT_GT(large, uncached * 0.95);
}

TEST(Calibration, TransfersBetweenCoresHaveTheirOwnCacheTier) {
  // Copies double in the cache (24 against 12 GB/s); direct reads triple (75 against 25),
  // and the node's UCX links gain by that same factor (6 to 18 GB/s).
  const std::string cached =
      kBase + "cache_bytes 1048576\ncache_bandwidth_gb_s 24\ndirect_cache_bandwidth_gb_s 75\n";
  const std::string equivalent =
      "cores 8\nlink_latency_us 1\nlink_bandwidth_gb_s 18\nmemory_overhead_us 0.2\n"
      "memory_bandwidth_gb_s 24\ndirect_latency_us 0.15\ndirect_bandwidth_gb_s 75\n";
  for (Algorithm algorithm : {Algorithm::Ring, Algorithm::OneShot}) {
    const bool direct = algorithm == Algorithm::OneShot;
    EXPECT_NEAR(predict_with(cached, 4, algorithm, 256 << 10, direct),
                predict_with(equivalent, 4, algorithm, 256 << 10, direct), 1e-6)
        << algo::algorithm_name(algorithm);
  }
  // The reads' tier is judged by the input a peer staged, the copies' by the larger buffer:
  // a 4-rank AllGather of 512 KiB per rank stages them all in the cache (reads at 75)
  // and writes 2 MiB (its first MiB at 24 GB/s, the second at 12: 16 GB/s).
  const std::string gathered =
      "cores 8\nlink_latency_us 1\nlink_bandwidth_gb_s 6\nmemory_overhead_us 0.2\n"
      "memory_bandwidth_gb_s 16\ndirect_latency_us 0.15\ndirect_bandwidth_gb_s 75\n";
  EXPECT_NEAR(predict_with(cached, 4, Algorithm::OneShot, 512 << 10, true, Collective::AllGather),
              predict_with(gathered, 4, Algorithm::OneShot, 512 << 10, true, Collective::AllGather),
              1e-6);
  // Its ring's messages are judged by the 2 MiB too: the first MiB at 75 GB/s, the second at
  // 25, so the links gain 1.5x (9 GB/s).
  const std::string ring_gathered =
      "cores 8\nlink_latency_us 1\nlink_bandwidth_gb_s 9\nmemory_overhead_us 0.2\n"
      "memory_bandwidth_gb_s 16\ndirect_latency_us 0.15\ndirect_bandwidth_gb_s 25\n";
  EXPECT_NEAR(
      predict_with(cached, 4, Algorithm::Ring, 512 << 10, true, Collective::AllGather),
      predict_with(ring_gathered, 4, Algorithm::Ring, 512 << 10, true, Collective::AllGather),
      1e-6);
  // A Broadcast's readers read at the copy throughput gained by the reads' factor (12 GB/s
  // times 3), the root's staging copy at the copies' (4x: 48 GB/s) ...
  const double bytes = 256 << 10;
  const std::string copies_faster =
      kBase + "cache_bytes 1048576\ncache_bandwidth_gb_s 48\ndirect_cache_bandwidth_gb_s 75\n";
  EXPECT_NEAR(
      predict_with(copies_faster, 4, Algorithm::OneShot, 256 << 10, true, Collective::Broadcast),
      0.2 + bytes / 48e3 + 0.15 + bytes / 36e3, 1e-6);
  // ... and never faster than that copy: with copies at 2x (24 GB/s), at 24.
  EXPECT_NEAR(predict_with(cached, 4, Algorithm::OneShot, 256 << 10, true, Collective::Broadcast),
              0.2 + bytes / 24e3 + 0.15 + bytes / 24e3, 1e-6);
  // Cache figures no faster than memory_bandwidth and direct_bandwidth gain nothing.
  EXPECT_NEAR(predict_with(kBase + "cache_bytes 1048576\ncache_bandwidth_gb_s 12\n"
                                   "direct_cache_bandwidth_gb_s 20\n",
                           2, Algorithm::OneShot, 256 << 10, true),
              predict_with(kBase, 2, Algorithm::OneShot, 256 << 10, true), 1e-6);
}

// A host at half the speed of the figures' (docs/tuning.md, "Host speed"): every throughput
// halves, the latencies of the ranks' own work double, and a UCX message's latency and a
// cross-memory read's system call stay; a direct one-shot call, all work of the ranks' own
// cores, then takes exactly twice as long.
TEST(Calibration, HostSpeedScalesThroughputsAndTheCoresOwnLatencies) {
  Calibration given;
  given.call_us = 0.3;
  Calibration slow = given;
  slow.scale_to_speed(0.5);
  for (auto [from, to] :
       {std::pair{given.link.bandwidth_gb_s, slow.link.bandwidth_gb_s},
        {given.memory.bandwidth_gb_s, slow.memory.bandwidth_gb_s},
        {given.direct.bandwidth_gb_s, slow.direct.bandwidth_gb_s},
        {given.single_copy.bandwidth_gb_s, slow.single_copy.bandwidth_gb_s},
        {given.cache_bandwidth_gb_s, slow.cache_bandwidth_gb_s},
        {given.direct_cache_bandwidth_gb_s, slow.direct_cache_bandwidth_gb_s},
        {given.sliced_link_bandwidth_gb_s, slow.sliced_link_bandwidth_gb_s},
        {given.sliced_single_copy_bandwidth_gb_s, slow.sliced_single_copy_bandwidth_gb_s}})
    EXPECT_DOUBLE_EQ(to, from / 2);
  for (auto [from, to] : {std::pair{given.call_us, slow.call_us},
                          {given.memory.latency_us, slow.memory.latency_us},
                          {given.direct.latency_us, slow.direct.latency_us},
                          {given.slice_latency_us, slow.slice_latency_us},
                          {given.direct_slice_latency_us, slow.direct_slice_latency_us}})
    EXPECT_DOUBLE_EQ(to, from * 2);
  EXPECT_EQ(slow.link.latency_us, given.link.latency_us);
  EXPECT_EQ(slow.single_copy.latency_us, given.single_copy.latency_us);
  EXPECT_EQ(slow.cache_bytes, given.cache_bytes);
  EXPECT_EQ(slow.cores, given.cores);

  const auto predict = [](const Calibration& machine, int nranks) {
    const Tuner tuner(tune_context(one_node(nranks), true, AlgorithmOverrides(), machine));
    return tuner.predict_us(Collective::AllReduce, Algorithm::OneShot, 0, 1 << 20);
  };
  for (int nranks : {2, 8}) {  // 8: time-sliced on this machine's cores
    Calibration cores = given;
    cores.cores = 2;
    Calibration slow_cores = cores;
    slow_cores.scale_to_speed(0.5);
    EXPECT_NEAR(predict(slow_cores, nranks), 2 * predict(cores, nranks),
                1e-9 * predict(cores, nranks))
        << nranks << " ranks";
  }
}

// Each rank's view of the speed: WEFT_HOST_SPEED in percent when set and valid, else its
// copy from the cache (measured once) over the figures' cache_bandwidth_gb_s; within
// [1/20, 20].
TEST(Calibration, HostSpeedComesFromTheVariableOrTheProbeAgainstTheCacheFigure) {
  const double probe = probe_cache_copy_gb_s();
  ASSERT_GT(probe, 0);
  ASSERT_TRUE(std::isfinite(probe));
  EXPECT_EQ(probe_cache_copy_gb_s(), probe);  // kept for the process
  unsetenv("WEFT_HOST_SPEED");
  Calibration machine;
  machine.cache_bandwidth_gb_s = probe * 2;
  EXPECT_DOUBLE_EQ(local_host_speed(machine), 0.5);
  machine.cache_bandwidth_gb_s = probe / 100;
  EXPECT_DOUBLE_EQ(local_host_speed(machine), 20);
  machine.cache_bandwidth_gb_s = probe * 100;
  EXPECT_DOUBLE_EQ(local_host_speed(machine), 1.0 / 20);
  setenv("WEFT_HOST_SPEED", "250", 1);
  EXPECT_DOUBLE_EQ(local_host_speed(machine), 2.5);
  setenv("WEFT_HOST_SPEED", "fast", 1);  // not a number: the probe's
  EXPECT_DOUBLE_EQ(local_host_speed(machine), 1.0 / 20);
  unsetenv("WEFT_HOST_SPEED");
}

// A peer's record whose speed local_host_speed could not give is malformed (a NaN would
// leave the median undefined).
TEST(Calibration, OnlySpeedsARankCanGiveAreValid) {
  for (double speed : {1.0 / 20, 0.34, 1.0, 20.0}) EXPECT_TRUE(valid_host_speed(speed)) << speed;
  for (double speed : {0.0, 0.049, 20.5, -1.0, std::nan(""), HUGE_VAL})
    EXPECT_FALSE(valid_host_speed(speed)) << speed;
}

// A communicator's ranks apply one speed: the median of their views (the lower middle one
// for an even count), whatever their order.
TEST(Calibration, RanksAgreeOnTheMedianSpeed) {
  EXPECT_EQ(agreed_host_speed({}), 1);
  EXPECT_EQ(agreed_host_speed({0.3}), 0.3);
  EXPECT_EQ(agreed_host_speed({4, 0.25, 1}), 1);
  EXPECT_EQ(agreed_host_speed({1, 4, 0.25}), 1);
  EXPECT_EQ(agreed_host_speed({0.5, 2}), 0.5);
  EXPECT_EQ(agreed_host_speed({2, 0.5, 3, 1}), 1);
}

}  // namespace
}  // namespace weft
