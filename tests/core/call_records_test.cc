// What the bootstrap root compares for communicators without shared segments
// (docs/reliability.md, "Across nodes"): the ranks' latest calls, and the message every
// rank fails with at the first disagreement.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/bootstrap_protocol.h"

namespace weft {
namespace {

CallRecord call(uint64_t sequence, uint64_t fingerprint, const char* text) {
  return CallRecord{sequence, fingerprint, text};
}

// The root's view once every rank's report (by rank) arrived.
std::string find_call_mismatch(const std::vector<std::vector<CallRecord>>& by_rank) {
  CallComparison comparison;
  for (size_t rank = 0; rank < by_rank.size(); ++rank)
    comparison.add(static_cast<int>(rank), by_rank[rank]);
  return comparison.mismatch();
}

TEST(CallRecords, AgreeingCallsAreNoMismatch) {
  EXPECT_EQ(find_call_mismatch({}), "");
  EXPECT_EQ(find_call_mismatch({{call(4, 7, "a"), call(5, 8, "b")}, {}, {call(5, 8, "b")}}), "");
  // Windows that do not overlap (a rank far ahead) compare nothing.
  EXPECT_EQ(find_call_mismatch({{call(1, 7, "a")}, {call(9, 3, "b")}}), "");
}

TEST(CallRecords, TheLowestSequenceNamesTheLowestRanks) {
  // Sequence 6 differs between ranks 0 and 1 (and 3); 5 agrees.
  EXPECT_EQ(find_call_mismatch({{call(5, 1, "x"), call(6, 2, "allreduce(count=1000)")},
                                {call(5, 1, "x"), call(6, 3, "allreduce(count=2000)")},
                                {},
                                {call(6, 4, "allgather(count=1000)")}}),
            "mismatched collectives: rank 1 called allreduce(count=2000) while rank 0 called "
            "allreduce(count=1000), sequence 6");
  // Sequence 3, which rank 0 no longer holds, comes before 7: ranks 1 and 2 name it.
  EXPECT_EQ(find_call_mismatch(
                {{call(7, 9, "p")}, {call(3, 1, "q"), call(7, 9, "p")}, {call(3, 2, "r")}}),
            "mismatched collectives: rank 2 called r while rank 1 called q, sequence 3");
  // Every rank's view of the same records gives the same message, whoever reported last.
  const std::vector<std::vector<CallRecord>> reports = {
      {call(2, 5, "b0")}, {call(2, 6, "b1")}, {call(2, 6, "b1")}};
  EXPECT_EQ(find_call_mismatch(reports),
            "mismatched collectives: rank 1 called b1 while rank 0 called b0, sequence 2");
}

TEST(CallRecords, ReportsOnlyAddAndOldSequencesAreForgotten) {
  CallComparison comparison;
  comparison.add(0, {call(5, 1, "a")});
  comparison.add(1, {call(6, 2, "b")});
  EXPECT_EQ(comparison.mismatch(), "");
  comparison.add(1, {call(5, 3, "c")});  // rank 1's later report still held call 5
  EXPECT_EQ(comparison.mismatch(),
            "mismatched collectives: rank 1 called c while rank 0 called a, sequence 5");
  // Beyond the kept sequences the oldest go, with their disagreement.
  std::vector<CallRecord> many;
  for (uint64_t s = 100; s < 100 + CallComparison::kKeptSequences; ++s)
    many.push_back(call(s, 7, "x"));
  for (size_t at = 0; at < many.size(); at += kMaxCallRecords)
    comparison.add(
        2, std::vector<CallRecord>(many.begin() + at,
                                   many.begin() + std::min(many.size(), at + kMaxCallRecords)));
  EXPECT_EQ(comparison.mismatch(), "");
}

TEST(CallRecords, RoundTripAndBounds) {
  const std::vector<CallRecord> calls = {call(1, 0xfeed, "allreduce(count=3, float, sum)"),
                                         call(2, 0, "")};
  std::vector<CallRecord> back;
  ASSERT_TRUE(decode_calls(encode_calls(calls), &back));
  EXPECT_EQ(back, calls);
  Blob truncated = encode_calls(calls);
  truncated.pop_back();
  EXPECT_FALSE(decode_calls(truncated, &back));
  EXPECT_FALSE(decode_calls(encode_calls(std::vector<CallRecord>(kMaxCallRecords + 1)), &back));
  EXPECT_TRUE(decode_calls(encode_calls(std::vector<CallRecord>(kMaxCallRecords)), &back));
}

}  // namespace
}  // namespace weft
