// Pipeline schedules: every family over many (p, m, v) through the checker
// (deadlock-free, matched transfers, complete), bubble and in-flight
// activations against the formulas, and the checker catching broken lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algorithms/pipeline/checker.h"

namespace weft::algo::pipeline {
namespace {

Params params_of(Family family, int p, int m, int v = 1) {
  Params params;
  params.family = family, params.stages = p, params.microbatches = m, params.virtual_stages = v;
  return params;
}

CheckResult built_and_checked(const Params& params) {
  Schedule schedule;
  std::string error;
  EXPECT_TRUE(build(params, &schedule, &error)) << error;
  return check(params, schedule);
}

int max_of(const std::vector<int>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

const int kStages[] = {1, 2, 3, 4, 5, 8, 16, 33, 64};
const int kMicrobatches[] = {1, 2, 3, 4, 7, 8, 16, 31, 64, 256};

std::string where(const Params& params) {
  return std::string(family_name(params.family)) + " p=" + std::to_string(params.stages) +
         " m=" + std::to_string(params.microbatches) +
         " v=" + std::to_string(params.virtual_stages);
}

TEST(PipelineSchedule, GPipeAnd1F1BBubbleIsTheFormula) {
  for (Family family : {Family::GPipe, Family::OneFOneB})
    for (int p : kStages)
      for (int m : kMicrobatches) {
        const Params params = params_of(family, p, m);
        const CheckResult result = built_and_checked(params);
        ASSERT_TRUE(result.ok()) << where(params) << "\n" << result.message();
        EXPECT_NEAR(result.bubble, double(p - 1) / (m + p - 1), 1e-12) << where(params);
        // Every stage boundary carries each micro-batch once per direction.
        EXPECT_EQ(result.forward_transfers, uint64_t(p - 1) * m) << where(params);
        EXPECT_EQ(result.backward_transfers, uint64_t(p - 1) * m) << where(params);
        // GPipe keeps every micro-batch; 1F1B at most p (rank r: p − r).
        if (family == Family::GPipe) {
          EXPECT_EQ(max_of(result.peak_in_flight), m) << where(params);
        } else {
          for (int r = 0; r < p; ++r)
            EXPECT_LE(result.peak_in_flight[r], std::min(p - r, m)) << where(params);
          EXPECT_EQ(max_of(result.peak_in_flight), std::min(p, m)) << where(params);
        }
      }
}

TEST(PipelineSchedule, InterleavedBubbleShrinksWithVirtualStages) {
  for (int p : kStages)
    for (int m : kMicrobatches)
      for (int v : {2, 3, 4}) {
        if (m % p != 0) continue;
        const Params params = params_of(Family::Interleaved, p, m, v);
        const CheckResult result = built_and_checked(params);
        ASSERT_TRUE(result.ok()) << where(params) << "\n" << result.message();
        EXPECT_NEAR(result.bubble, double(p - 1) / (v * m + p - 1), 1e-12) << where(params);
        // One rank passes activations between its own chunks without transfers.
        EXPECT_EQ(result.forward_transfers, p == 1 ? 0 : uint64_t(p * v - 1) * m) << where(params);
        // Megatron's warm-up plus the one forward of the first steady step.
        for (int r = 0; r < p; ++r)
          EXPECT_LE(result.peak_in_flight[r], std::min(2 * (p - r - 1) + (v - 1) * p + 1, v * m))
              << where(params) << " rank " << r;
      }
}

TEST(PipelineSchedule, ZeroBubbleBeats1F1BWithItsMemory) {
  for (int p : kStages)
    for (int m : kMicrobatches) {
      const Params params = params_of(Family::ZeroBubble, p, m);
      const CheckResult zb = built_and_checked(params);
      const CheckResult one = built_and_checked(params_of(Family::OneFOneB, p, m));
      ASSERT_TRUE(zb.ok()) << where(params) << "\n" << zb.message();
      if (p == 1) {
        EXPECT_EQ(zb.bubble, 0) << where(params);
      } else {
        EXPECT_LT(zb.bubble, one.bubble) << where(params);
      }
      // Activations held until W, never more than 1F1B holds until its backward.
      for (int r = 0; r < p; ++r) EXPECT_LE(zb.peak_held[r], std::min(p - r, m)) << where(params);
    }
}

TEST(PipelineSchedule, ZeroBubbleUnderOtherCosts) {
  for (Costs costs : {Costs{2, 2, 1}, Costs{1, 2, 2}, Costs{3, 2, 1}})
    for (int p : {2, 4, 8})
      for (int m : {4, 8, 32}) {
        Params params = params_of(Family::ZeroBubble, p, m);
        params.costs = costs;
        Params one = params_of(Family::OneFOneB, p, m);
        one.costs = costs;
        const CheckResult zb = built_and_checked(params);
        const CheckResult base = built_and_checked(one);
        ASSERT_TRUE(zb.ok()) << where(params) << "\n" << zb.message();
        ASSERT_TRUE(base.ok()) << base.message();
        EXPECT_NEAR(base.bubble, bubble_formula(one), 1e-12) << where(one);
        EXPECT_LT(zb.bubble, base.bubble) << where(params);
      }
}

TEST(PipelineSchedule, SendsAndReceivesOfAStepShareAGroup) {
  // 1F1B steady state on a middle rank: forward's send and the next
  // backward's receive in one group, and the reverse pair.
  Schedule schedule;
  std::string error;
  ASSERT_TRUE(build(params_of(Family::OneFOneB, 3, 6), &schedule, &error)) << error;
  bool send_f_recv_b = false, send_b_recv_f = false;
  const std::vector<Action>& list = schedule.ranks[1];
  for (size_t i = 0; i + 1 < list.size(); ++i) {
    if (list[i].group == 0 || list[i].group != list[i + 1].group) continue;
    send_f_recv_b |= list[i].op == Op::SendForward && list[i + 1].op == Op::RecvBackward;
    send_b_recv_f |= list[i].op == Op::SendBackward && list[i + 1].op == Op::RecvForward;
  }
  EXPECT_TRUE(send_f_recv_b);
  EXPECT_TRUE(send_b_recv_f);
}

TEST(PipelineSchedule, BadArgumentsAreNamed) {
  Schedule schedule;
  std::string error;
  EXPECT_FALSE(build(params_of(Family::Interleaved, 4, 6, 2), &schedule, &error));
  EXPECT_NE(error.find("microbatches 6"), std::string::npos) << error;
  EXPECT_NE(error.find("stages 4"), std::string::npos) << error;
  EXPECT_FALSE(build(params_of(Family::OneFOneB, 4, 8, 2), &schedule, &error));
  EXPECT_NE(error.find("virtual_stages 2"), std::string::npos) << error;
  EXPECT_FALSE(build(params_of(Family::GPipe, 0, 8), &schedule, &error));
  EXPECT_NE(error.find("stages 0"), std::string::npos) << error;
  EXPECT_FALSE(build(params_of(Family::ZeroBubble, 2, 0), &schedule, &error));
  EXPECT_NE(error.find("microbatches 0"), std::string::npos) << error;
  Family family;
  EXPECT_TRUE(parse_family("zb", &family));
  EXPECT_EQ(family, Family::ZeroBubble);
  EXPECT_FALSE(parse_family("pipedream", &family));
}

// A correct schedule broken one way at a time: the checker must say so.
class BrokenSchedule : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(build(params_, &schedule_, &error)) << error;
    ASSERT_TRUE(check(params_, schedule_).ok());
  }
  size_t find(int rank, Op op, int microbatch) const {
    const std::vector<Action>& list = schedule_.ranks[rank];
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].op == op && list[i].microbatch == microbatch) return i;
    ADD_FAILURE() << "no " << op_name(op) << " " << microbatch << " on rank " << rank;
    return 0;
  }
  std::string errors() const { return check(params_, schedule_).message(); }
  Params params_ = params_of(Family::OneFOneB, 3, 4);
  Schedule schedule_;
};

TEST_F(BrokenSchedule, MissingReceiveIsUnmatched) {
  auto& list = schedule_.ranks[1];
  list.erase(list.begin() + long(find(1, Op::RecvForward, 2)));
  EXPECT_NE(errors().find("sends 4 to rank 1, which receives 3"), std::string::npos) << errors();
}

TEST_F(BrokenSchedule, SwappedSendsPairTheWrongMicrobatches) {
  auto& list = schedule_.ranks[0];
  std::swap(list[find(0, Op::SendForward, 0)].microbatch,
            list[find(0, Op::SendForward, 1)].microbatch);
  EXPECT_NE(errors().find("pairs"), std::string::npos) << errors();
}

TEST_F(BrokenSchedule, ReceivingBeforeSendingDeadlocks) {
  // Split the group holding `send` so its receives go first, alone: the rank
  // then waits before it sends.
  auto receive_first = [&](int rank, size_t send) {
    auto& list = schedule_.ranks[rank];
    const uint32_t group = list[send].group;
    for (Action& a : list)
      if (a.group > group) ++a.group;
    std::stable_partition(
        list.begin() + long(send), list.begin() + long(send) + 2,
        [](const Action& a) { return a.op == Op::RecvBackward || a.op == Op::RecvForward; });
    for (size_t i = send; i < send + 2; ++i)
      if (list[i].op == Op::SendForward || list[i].op == Op::SendBackward)
        list[i].group = group + 1;
  };
  // Rank 1 waits for gradient 0 before sending activation 1; the last rank
  // waits for activation 1 before sending gradient 0.
  receive_first(1, find(1, Op::SendForward, 1));
  receive_first(2, find(2, Op::SendBackward, 0));
  EXPECT_NE(errors().find("deadlock"), std::string::npos) << errors();
}

TEST_F(BrokenSchedule, ForwardBeforeItsInputIsCaught) {
  auto& list = schedule_.ranks[2];
  const size_t recv = find(2, Op::RecvForward, 0);
  std::swap(list[recv], list[recv + 1]);  // F0 before RECV_F0
  EXPECT_NE(errors().find("input activation has not arrived"), std::string::npos) << errors();
}

TEST_F(BrokenSchedule, MissingBackwardIsCaught) {
  params_.family = Family::ZeroBubble;
  std::string error;
  ASSERT_TRUE(build(params_, &schedule_, &error));
  auto& list = schedule_.ranks[0];
  list.erase(list.begin() + long(find(0, Op::BackwardWeight, 3)));
  EXPECT_NE(errors().find("forward or backward missing"), std::string::npos) << errors();
}

}  // namespace
}  // namespace weft::algo::pipeline
