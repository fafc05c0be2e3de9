#include "algorithms/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace weft::algo {
namespace {

constexpr LinkTime kFreeMemory{0, 1e12};  // reductions and copies cost nothing

double predicted(Collective collective, Algorithm algorithm, int n, uint64_t count,
                 const CostNetwork& network, uint64_t chunk = 0) {
  Params params;
  params.collective = collective;
  params.algorithm = algorithm;
  params.nranks = n;
  params.count = count;
  params.chunk = chunk;
  CostResult result;
  std::string error;
  EXPECT_TRUE(predict(params, 4, network, &result, &error)) << error;
  return result.time_us;
}

TEST(CostModel, RingAllReduceMatchesClosedForm) {
  const LinkTime link{2.5, 20};
  for (int n : {2, 3, 8, 16}) {
    const uint64_t count = 4096 * static_cast<uint64_t>(n);  // divisible: equal pieces
    const double bytes = 4.0 * static_cast<double>(count);
    const double expected =
        2 * (n - 1) * (link.latency_us + bytes / n / (link.bandwidth_gb_s * 1e3));
    const double got = predicted(Collective::AllReduce, Algorithm::Ring, n, count,
                                 CostNetwork::uniform(n, link, kFreeMemory));
    EXPECT_NEAR(got, expected, 1e-6 * expected) << n << " ranks";
  }
}

TEST(CostModel, RecursiveDoublingIsLogarithmic) {
  const LinkTime link{3, 10};
  for (int n : {2, 4, 16, 64}) {
    const uint64_t count = 1000;
    const double expected = std::log2(n) * link.time_us(4.0 * count);
    EXPECT_NEAR(predicted(Collective::AllReduce, Algorithm::Rd, n, count,
                          CostNetwork::uniform(n, link, kFreeMemory)),
                expected, 1e-6 * expected);
  }
}

TEST(CostModel, ReductionsCostMemoryBandwidth) {
  // Two ranks, one exchange: the reduction of the received vector adds
  // overhead + bytes / memory bandwidth to the critical path.
  const LinkTime link{1, 10};
  const LinkTime memory{0.5, 5};
  const uint64_t count = 1 << 16;
  const double bytes = 4.0 * count;
  EXPECT_NEAR(predicted(Collective::AllReduce, Algorithm::Rd, 2, count,
                        CostNetwork::uniform(2, link, memory)),
              link.time_us(bytes) + memory.time_us(bytes), 1e-9 * bytes);
}

TEST(CostModel, SenderPortSerialisesMessages) {
  // Pairwise all-to-all: each rank sends n-1 pieces through one port, so the
  // bandwidth terms add up while the latencies overlap.
  const LinkTime link{4, 8};
  const int n = 8;
  const uint64_t count = 1 << 14;
  const double piece = 4.0 * count;
  const double got = predicted(Collective::AllToAll, Algorithm::Pairwise, n, count,
                               CostNetwork::uniform(n, link, kFreeMemory));
  EXPECT_GE(got, (n - 1) * link.transfer_us(piece) + link.latency_us - 1e-9);
  EXPECT_LE(got, (n - 1) * link.time_us(piece) + 1e-9);
}

TEST(CostModel, CopiesByTheCoreDoNotOverlapItsReductions) {
  // A pipelined 2-rank ring AllReduce: each rank sends S/2 (reduce-scatter) and S/2
  // (all-gather) and reduces S/2. Over a link its core copies, those take turns on the one
  // core; over a NIC the sends overlap the reductions.
  const LinkTime link{1, 8};
  const LinkTime memory{0.2, 12};
  const uint64_t count = 1 << 20;
  const double half = 4.0 * count / 2;
  CostNetwork network = CostNetwork::uniform(2, link, memory);
  const double overlapped =
      predicted(Collective::AllReduce, Algorithm::Ring, 2, count, network, count / 16);
  network.cpu_copied_classes = 1;
  const double serial =
      predicted(Collective::AllReduce, Algorithm::Ring, 2, count, network, count / 16);
  EXPECT_GE(serial, 2 * link.transfer_us(half) + memory.transfer_us(half));
  EXPECT_LT(overlapped, serial - 0.5 * memory.transfer_us(half));
}

TEST(CostModel, SlowLinkDominatesRing) {
  // One slow pair on the ring slows every step of a ring all-reduce.
  const int n = 8;
  CostNetwork network = CostNetwork::uniform(n, {1, 100}, kFreeMemory);
  const double fast = predicted(Collective::AllReduce, Algorithm::Ring, n, 1 << 20, network);
  network.classes.push_back({1, 10});
  network.pair_class.assign(n * n, 0);
  network.pair_class[3 * n + 4] = 1;
  const double slow = predicted(Collective::AllReduce, Algorithm::Ring, n, 1 << 20, network);
  // Every step but possibly the first waits for the slow pair's transfer.
  const double piece = 4.0 * (1 << 20) / n;
  const double extra = piece / 10e3 - piece / 100e3;
  EXPECT_GE(slow - fast, (2 * (n - 1) - 1) * extra - 1e-6);
  EXPECT_LE(slow - fast, 2 * (n - 1) * extra + 1e-6);
}

TEST(CostModel, PipeliningHidesLatencyOfAChain) {
  // A chain broadcast of many chunks costs about (n-1) hops of one chunk
  // plus the whole vector once, far below (n-1) hops of the whole vector.
  const int n = 8;
  const LinkTime link{1, 10};
  const uint64_t count = 1 << 20, chunk = 1 << 14;
  const CostNetwork network = CostNetwork::uniform(n, link, kFreeMemory);
  const double whole = predicted(Collective::Broadcast, Algorithm::Chain, n, count, network);
  const double piped = predicted(Collective::Broadcast, Algorithm::Chain, n, count, network, chunk);
  EXPECT_NEAR(whole, (n - 1) * link.time_us(4.0 * count), 1e-6 * whole);
  const double chunks = static_cast<double>(count / chunk);
  const double expected =
      (n - 2 + chunks) * link.transfer_us(4.0 * chunk) + (n - 1) * link.latency_us;
  EXPECT_NEAR(piped, expected, 0.01 * expected);
}

TEST(CostModel, DirectAlgorithmsHaveClosedForms) {
  const int n = 4;
  const LinkTime shm{0.5, 8};
  const LinkTime memory{0.1, 16};
  CostNetwork network = CostNetwork::uniform(n, {100, 1}, memory);  // links unused
  network.direct = shm;
  const uint64_t count = 1 << 18;
  const double bytes = 4.0 * count;
  // The copy into the rank's own staging at the copy throughput; the reads of the peers'
  // staging at the direct throughput.
  const double staging = memory.time_us(bytes);
  EXPECT_NEAR(predicted(Collective::AllReduce, Algorithm::OneShot, n, count, network),
              staging + shm.latency_us + (n - 1) * shm.transfer_us(bytes), 1e-6);
  // Two-shot: a second copy, of the rank's reduced n-th, and a second synchronisation.
  EXPECT_NEAR(predicted(Collective::AllReduce, Algorithm::TwoShot, n, count, network),
              staging + memory.time_us(bytes / n) + 2 * shm.latency_us +
                  2.0 * (n - 1) / n * shm.transfer_us(bytes),
              1e-6);
  // Broadcast: only the root's vector is read, once by every other rank, and at the copy
  // throughput: no rank writes what another reads while it reads.
  EXPECT_NEAR(predicted(Collective::Broadcast, Algorithm::OneShot, n, count, network),
              staging + shm.latency_us + memory.transfer_us(bytes), 1e-6);
}

TEST(CostModel, LaneCallsWaitForNoSynchronisation) {
  const int n = 4;
  const LinkTime memory{0.1, 16};
  CostNetwork network = CostNetwork::uniform(n, {100, 1}, memory);  // links unused
  network.direct = {0.5, 8};
  const CostNetwork staged = network;
  network.lane_bytes = 256;
  network.lane_us = 0.25;
  // Up to lane_bytes: lane_us, the writer's copy into its slot, then a Broadcast's readers
  // read the root's slot, a Reduce's root the n - 1 others.
  EXPECT_NEAR(predicted(Collective::Broadcast, Algorithm::OneShot, n, 64, network),
              0.25 + memory.transfer_us(256) + network.direct.transfer_us(256), 1e-9);
  EXPECT_NEAR(predicted(Collective::Reduce, Algorithm::OneShot, n, 64, network),
              0.25 + memory.transfer_us(256) + (n - 1) * network.direct.transfer_us(256), 1e-9);
  // Beyond them, and for the other collectives, the staged form as before.
  for (const auto& [collective, count] :
       {std::pair{Collective::Broadcast, 65}, {Collective::Reduce, 65}, {Collective::AllReduce, 2}})
    EXPECT_EQ(predicted(collective, Algorithm::OneShot, n, count, network),
              predicted(collective, Algorithm::OneShot, n, count, staged))
        << collective_name(collective);
}

TEST(CostModel, RefusesWhatItCannotTime) {
  Params params;
  params.nranks = 16;
  params.count = 1 << 20;
  params.chunk = 64;
  CostNetwork network = CostNetwork::uniform(16, {1, 1}, kFreeMemory);
  network.max_steps = 1000;
  CostResult result;
  std::string error;
  EXPECT_FALSE(predict(params, 4, network, &result, &error));
  EXPECT_NE(error.find("steps"), std::string::npos) << error;
  params.nranks = 8;
  EXPECT_FALSE(predict(params, 4, network, &result, &error));
  params.nranks = 16;
  params.algorithm = Algorithm::TwoShot;
  params.collective = Collective::AllGather;
  EXPECT_FALSE(predict(params, 4, network, &result, &error));
  EXPECT_NE(error.find("twoshot"), std::string::npos) << error;
}

}  // namespace
}  // namespace weft::algo
