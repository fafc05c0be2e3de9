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
  return CallRecord{sequence, fingerprint, text, {}};
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

// AllToAllv rows: send counts then receive counts, 3 ranks; pair (i, j) sends 1 + i + 2j.
CallRecord alltoallv(uint64_t sequence, int rank, int lie_to = -1, uint64_t lie = 0) {
  CallRecord record = call(sequence, 42, "alltoallv(int32)");
  for (int q = 0; q < 3; ++q) record.counts.push_back(q == lie_to ? lie : 1 + rank + 2 * q);
  for (int q = 0; q < 3; ++q) record.counts.push_back(1 + q + 2 * rank);
  return record;
}

TEST(CallRecords, AllToAllvRowsAreComparedPairByPair) {
  // Consistent rows, whatever order they come in: no mismatch.
  EXPECT_EQ(find_call_mismatch({{alltoallv(3, 0)}, {alltoallv(3, 1)}, {alltoallv(3, 2)}}), "");
  // Rank 2 sends 0 to rank 1, which receives 1 + 2 + 2 = 5 from it: found as soon as both
  // rows are in, rank 0's report not needed.
  EXPECT_EQ(find_call_mismatch({{}, {alltoallv(3, 1)}, {alltoallv(3, 2, 1, 0)}}),
            "mismatched alltoallv counts: rank 2 sends 0 elements to rank 1 while rank 1 "
            "receives 5 from rank 2, sequence 3");
  // Several disagreeing pairs: the first in (from, to) order, whoever reported first.
  CallComparison comparison;
  comparison.add(2, {alltoallv(4, 2, 0, 9)});
  comparison.add(1, {alltoallv(4, 1, 2, 9)});
  EXPECT_EQ(comparison.mismatch(),
            "mismatched alltoallv counts: rank 1 sends 9 elements to rank 2 while rank 2 "
            "receives 6 from rank 1, sequence 4");
  comparison.add(0, {alltoallv(4, 0)});
  EXPECT_EQ(comparison.mismatch(),
            "mismatched alltoallv counts: rank 1 sends 9 elements to rank 2 while rank 2 "
            "receives 6 from rank 1, sequence 4");
  // A different call at a sequence comes before different counts at a later one.
  comparison.add(0, {call(2, 1, "allreduce(count=1)")});
  comparison.add(1, {call(2, 2, "allreduce(count=2)")});
  EXPECT_EQ(comparison.mismatch(),
            "mismatched collectives: rank 1 called allreduce(count=2) while rank 0 called "
            "allreduce(count=1), sequence 2");
}

TEST(CallRecords, RoundTripAndBounds) {
  const std::vector<CallRecord> calls = {call(1, 0xfeed, "allreduce(count=3, float, sum)"),
                                         call(2, 0, ""), alltoallv(3, 1)};
  std::vector<CallRecord> back;
  ASSERT_TRUE(decode_calls(encode_calls(calls), &back));
  EXPECT_EQ(back, calls);
  Blob truncated = encode_calls(calls);
  truncated.pop_back();
  EXPECT_FALSE(decode_calls(truncated, &back));
  EXPECT_FALSE(decode_calls(encode_calls(std::vector<CallRecord>(kMaxCallRecords + 1)), &back));
  EXPECT_TRUE(decode_calls(encode_calls(std::vector<CallRecord>(kMaxCallRecords)), &back));
  // Count rows: an even number of counts, at most 2 · kMaxCountedRanks.
  CallRecord odd = alltoallv(1, 0);
  odd.counts.pop_back();
  EXPECT_FALSE(decode_calls(encode_calls({odd}), &back));
  CallRecord huge = call(1, 0, "");
  huge.counts.assign(2 * kMaxCountedRanks + 2, 0);
  EXPECT_FALSE(decode_calls(encode_calls({huge}), &back));
  huge.counts.resize(2 * kMaxCountedRanks);
  EXPECT_TRUE(decode_calls(encode_calls({huge}), &back));
}

}  // namespace
}  // namespace weft
