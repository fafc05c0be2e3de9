// The schedule interface: names, the support table, argument checks and
// buffer sizes.
#include "algorithms/schedule.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace weft::algo {
namespace {

// Every value's name parses back to it, and names are unique.
template <typename T>
void expect_round_trip(int count, const char* (*name_of)(T), bool (*parse)(std::string_view, T*),
                       std::set<std::string>* seen) {
  for (int i = 0; i < count; ++i) {
    T value{};
    const char* name = name_of(static_cast<T>(i));
    ASSERT_TRUE(parse(name, &value)) << name;
    EXPECT_EQ(static_cast<int>(value), i);
    EXPECT_TRUE(seen->insert(name).second) << name;
  }
}

TEST(Schedule, NamesRoundTrip) {
  std::set<std::string> seen;
  expect_round_trip<Collective>(kNumCollectives, collective_name, parse_collective, &seen);
  expect_round_trip<Algorithm>(kNumAlgorithms, algorithm_name, parse_algorithm, &seen);
  Collective c{};
  Algorithm a{};
  EXPECT_FALSE(parse_collective("allreduc", &c));
  EXPECT_FALSE(parse_algorithm("Ring", &a));
  EXPECT_STREQ(collective_name(Collective::ReduceScatter), "reducescatter");
  EXPECT_STREQ(algorithm_name(Algorithm::Dissemination), "dissemination");
}

TEST(Schedule, SupportTable) {
  using A = Algorithm;
  using C = Collective;
  const std::set<std::pair<A, C>> expected = {
      {A::Ring, C::AllReduce},         {A::Tree, C::AllReduce},
      {A::Rhd, C::AllReduce},          {A::Rd, C::AllReduce},
      {A::Ring, C::ReduceScatter},     {A::Rhd, C::ReduceScatter},
      {A::Pairwise, C::ReduceScatter}, {A::Ring, C::AllGather},
      {A::Bruck, C::AllGather},        {A::Rd, C::AllGather},
      {A::Binomial, C::Broadcast},     {A::Chain, C::Broadcast},
      {A::Binomial, C::Reduce},        {A::Chain, C::Reduce},
      {A::Pairwise, C::AllToAll},      {A::Bruck, C::AllToAll},
      {A::Pairwise, C::AllToAllv},     {A::Binomial, C::Gather},
      {A::Binomial, C::Scatter},       {A::Dissemination, C::Barrier},
      {A::OneShot, C::AllReduce},      {A::OneShot, C::ReduceScatter},
      {A::OneShot, C::AllGather},      {A::OneShot, C::Broadcast},
      {A::OneShot, C::Reduce},         {A::OneShot, C::AllToAll},
      {A::OneShot, C::AllToAllv},      {A::TwoShot, C::AllReduce},
      {A::Hierarchical, C::AllReduce}, {A::Hierarchical, C::ReduceScatter},
      {A::Hierarchical, C::AllGather}, {A::Hierarchical, C::Broadcast},
      {A::Hierarchical, C::Reduce},    {A::Hierarchical, C::AllToAll},
      {A::Hierarchical, C::AllToAllv}, {A::NodeLeader, C::AllReduce},
      {A::NodeLeader, C::Broadcast},   {A::NodeLeader, C::Reduce},
  };
  for (int a = 0; a < kNumAlgorithms; ++a) {
    for (int c = 0; c < kNumCollectives; ++c) {
      EXPECT_EQ(supports(A(a), C(c)), expected.count({A(a), C(c)}) == 1)
          << algorithm_name(A(a)) << " " << collective_name(C(c));
    }
  }
}

TEST(Schedule, RejectsBadArguments) {
  Program program;
  std::string error;
  Params p;
  p.nranks = 4;
  p.count = 8;
  p.collective = Collective::AllGather;
  p.algorithm = Algorithm::Tree;
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_NE(error.find("tree"), std::string::npos) << error;

  p.collective = Collective::AllReduce;
  p.rank = 4;
  EXPECT_FALSE(build(p, &program, &error));
  p.rank = 0;
  p.nranks = 0;
  EXPECT_FALSE(build(p, &program, &error));
  p.nranks = 4;
  EXPECT_TRUE(build(p, &program, &error)) << error;

  p.collective = Collective::Broadcast;
  p.algorithm = Algorithm::Binomial;
  p.root = 4;
  EXPECT_FALSE(build(p, &program, &error));
  p.root = -1;
  EXPECT_FALSE(build(p, &program, &error));

  p.collective = Collective::AllToAllv;
  p.algorithm = Algorithm::Pairwise;
  p.root = 0;
  EXPECT_FALSE(build(p, &program, &error));  // no counts
  const std::vector<uint64_t> counts(4, 2), displs = {0, 2, 4, 6};
  p.send_counts = p.recv_counts = counts.data();
  p.send_displs = p.recv_displs = displs.data();
  EXPECT_TRUE(build(p, &program, &error)) << error;
  p.in_place = true;
  EXPECT_FALSE(build(p, &program, &error));

  // Hierarchical AllToAllv relays others' pieces: it needs the whole count
  // matrix, consistent with this rank's own counts.
  p.in_place = false;
  p.algorithm = Algorithm::Hierarchical;
  std::string why;
  EXPECT_FALSE(applicable(p, &why));
  EXPECT_NE(why.find("all_send_counts"), std::string::npos) << why;
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_EQ(error, why);
  std::vector<uint64_t> matrix(16, 2);
  p.all_send_counts = matrix.data();
  EXPECT_TRUE(applicable(p, &why)) << why;
  EXPECT_TRUE(build(p, &program, &error)) << error;
  matrix[3 * 4 + 0] = 5;  // rank 3 claims to send rank 0 more than it expects
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_NE(error.find("rank 3 sends 5 elements"), std::string::npos) << error;
  matrix[3 * 4 + 0] = 2;
  matrix[0 * 4 + 1] = 0;  // this rank's row disagrees with its send counts
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_NE(error.find("send counts say 2"), std::string::npos) << error;

  p = Params{};
  p.nranks = 3;
  p.count = UINT64_MAX / 2;
  p.collective = Collective::AllGather;
  EXPECT_FALSE(build(p, &program, &error));
}

TEST(Schedule, RejectsDirectAlgorithmsAndBadLayouts) {
  Program program;
  std::string error;
  Params p;
  p.nranks = 4;
  p.count = 8;
  p.algorithm = Algorithm::OneShot;
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_NE(error.find("shared memory"), std::string::npos) << error;

  p.algorithm = Algorithm::Ring;
  Layout layout;
  p.layout = &layout;
  layout.node_of = {0, 0, 1};  // one entry short
  EXPECT_FALSE(build(p, &program, &error));
  EXPECT_NE(error.find("layout"), std::string::npos) << error;
  layout.node_of = {0, 0, 1, 1};
  layout.ring = {0, 1, 1, 3};  // not a permutation
  EXPECT_FALSE(build(p, &program, &error));
  layout.ring = {0, 2, 1, 3};
  EXPECT_TRUE(build(p, &program, &error)) << error;
}

// Hierarchical schedules that pair ranks across nodes by their index in
// the node need equal nodes; applicable() says so before build() fails.
TEST(Schedule, ApplicableExplainsLayoutLimits) {
  Layout layout;
  layout.node_of = {0, 1, 0};  // two ranks on node 0, one on node 1
  Params p;
  p.nranks = 3;
  p.count = 8;
  p.layout = &layout;
  p.algorithm = Algorithm::Hierarchical;
  for (Collective c : {Collective::ReduceScatter, Collective::AllGather, Collective::AllToAll}) {
    p.collective = c;
    std::string why, error;
    EXPECT_FALSE(applicable(p, &why)) << collective_name(c);
    EXPECT_NE(why.find("same number of ranks"), std::string::npos) << why;
    Program program;
    EXPECT_FALSE(build(p, &program, &error));
    EXPECT_EQ(error, why);
  }
  for (Collective c : {Collective::AllReduce, Collective::Broadcast, Collective::Reduce}) {
    p.collective = c;
    EXPECT_TRUE(applicable(p, nullptr)) << collective_name(c);
  }
  p.collective = Collective::AllGather;
  layout.node_of = {0, 0, 0};
  EXPECT_TRUE(applicable(p, nullptr));
  p.layout = nullptr;
  EXPECT_TRUE(applicable(p, nullptr));
  p.algorithm = Algorithm::Tree;  // not a pair: refused like build()
  EXPECT_FALSE(applicable(p, nullptr));
}

TEST(Schedule, EmptyVectorsGiveEmptyPrograms) {
  for (int c = 0; c < kNumCollectives; ++c) {
    for (int a = 0; a < kNumAlgorithms; ++a) {
      if (!supports(Algorithm(a), Collective(c)) || is_direct(Algorithm(a)) ||
          Collective(c) == Collective::Barrier)
        continue;
      for (int n : {1, 2, 7}) {
        const std::vector<uint64_t> zeros(n * n, 0);
        Params p;
        p.collective = Collective(c);
        p.algorithm = Algorithm(a);
        p.nranks = n;
        p.rank = n - 1;
        p.count = 0;
        p.send_counts = p.recv_counts = p.send_displs = p.recv_displs = zeros.data();
        p.all_send_counts = zeros.data();
        Program program;
        std::string error;
        ASSERT_TRUE(build(p, &program, &error)) << error;
        EXPECT_TRUE(program.steps.empty()) << collective_name(p.collective) << " n=" << n;
        EXPECT_EQ(program.scratch_count, 0u);
      }
    }
  }
}

TEST(Schedule, BufferSizesFollowTheCollective) {
  Params p;
  p.nranks = 4;
  p.rank = 1;
  p.root = 2;
  p.count = 10;
  auto sizes = [&](Collective c) {
    p.collective = c;
    return std::make_pair(input_count(p), output_count(p));
  };
  using C = Collective;
  EXPECT_EQ(sizes(C::AllReduce), std::make_pair(uint64_t{10}, uint64_t{10}));
  EXPECT_EQ(sizes(C::ReduceScatter), std::make_pair(uint64_t{40}, uint64_t{10}));
  EXPECT_EQ(sizes(C::AllGather), std::make_pair(uint64_t{10}, uint64_t{40}));
  EXPECT_EQ(sizes(C::AllToAll), std::make_pair(uint64_t{40}, uint64_t{40}));
  EXPECT_EQ(sizes(C::Broadcast), std::make_pair(uint64_t{0}, uint64_t{10}));
  EXPECT_EQ(sizes(C::Reduce), std::make_pair(uint64_t{10}, uint64_t{0}));
  EXPECT_EQ(sizes(C::Gather), std::make_pair(uint64_t{10}, uint64_t{0}));
  EXPECT_EQ(sizes(C::Scatter), std::make_pair(uint64_t{0}, uint64_t{10}));
  EXPECT_EQ(sizes(C::Barrier), std::make_pair(uint64_t{0}, uint64_t{0}));
  p.rank = 2;
  EXPECT_EQ(sizes(C::Broadcast), std::make_pair(uint64_t{10}, uint64_t{10}));
  EXPECT_EQ(sizes(C::Gather), std::make_pair(uint64_t{10}, uint64_t{40}));
  EXPECT_EQ(sizes(C::Scatter), std::make_pair(uint64_t{40}, uint64_t{10}));
  const std::vector<uint64_t> counts = {1, 0, 3, 2}, displs = {0, 50, 7, 2};
  p.send_counts = p.recv_counts = counts.data();
  p.send_displs = p.recv_displs = displs.data();
  EXPECT_EQ(sizes(C::AllToAllv), std::make_pair(uint64_t{10}, uint64_t{10}));
}

TEST(Schedule, ProgramAddRecordsDependencies) {
  Program program;
  Step step;
  EXPECT_EQ(program.add(step), 0u);
  EXPECT_EQ(program.add(step, {0}), 1u);
  EXPECT_EQ(program.add(step, std::vector<uint32_t>{0, 1}), 2u);
  ASSERT_EQ(program.steps.size(), 3u);
  EXPECT_EQ(program.steps[2].num_deps, 2u);
  EXPECT_EQ(program.deps[program.steps[2].first_dep + 1], 1u);
  EXPECT_EQ(program.steps[1].num_deps, 1u);
  EXPECT_EQ(program.steps[0].num_deps, 0u);
}

TEST(Schedule, BuildIsDeterministic) {
  Params p;
  p.nranks = 11;
  p.rank = 3;
  p.count = 1000;
  p.chunk = 37;
  for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Rhd, Algorithm::Rd}) {
    p.algorithm = a;
    Program x, y;
    std::string error;
    ASSERT_TRUE(build(p, &x, &error));
    ASSERT_TRUE(build(p, &y, &error));
    ASSERT_EQ(x.steps.size(), y.steps.size());
    EXPECT_EQ(x.deps, y.deps);
    EXPECT_EQ(x.scratch_count, y.scratch_count);
    for (size_t i = 0; i < x.steps.size(); ++i) {
      EXPECT_EQ(x.steps[i].dst.offset, y.steps[i].dst.offset);
      EXPECT_EQ(x.steps[i].a.offset, y.steps[i].a.offset);
    }
    // Messages respect the chunk limit.
    for (const Step& s : x.steps) {
      const uint64_t len = s.kind == StepKind::Send ? s.a.count : s.dst.count;
      if (s.kind == StepKind::Send || s.kind == StepKind::Recv) {
        EXPECT_LE(len, p.chunk);
      }
    }
  }
}

}  // namespace
}  // namespace weft::algo
