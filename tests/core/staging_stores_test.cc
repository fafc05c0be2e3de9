// The streaming copy into staging (every alignment and length, nothing outside the
// destination touched) and StagingStores' choice between ordinary and streaming stores:
// which rounds it times, that the kinds take turns at first, that it keeps the faster per
// byte by each kind's best recent round (streaming only by its margin), that every
// kProbeEvery-th round tries the other kind, and that it follows a change of host but not
// one slow round.
#include "core/staging_stores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace weft {
namespace {

TEST(CopyStreaming, EveryAlignmentAndLengthExactly) {
  constexpr size_t kGuard = 64;
  const size_t lengths[] = {0, 1, 15, 63, 64, 65, 127, 128, 1000, 4096, 65536 + 7};
  for (size_t length : lengths)
    for (size_t dst_offset : {0, 1, 8, 16, 33, 63})
      for (size_t src_offset : {0, 3, 16}) {
        std::vector<std::byte> src(length + src_offset), dst(length + dst_offset + 2 * kGuard);
        for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 131 + 7);
        std::memset(dst.data(), 0xA5, dst.size());
        std::byte* to = dst.data() + kGuard + dst_offset;
        copy_streaming(to, src.data() + src_offset, length);
        ASSERT_TRUE(std::equal(to, to + length, src.data() + src_offset))
            << length << " bytes, dst offset " << dst_offset << ", src offset " << src_offset;
        for (std::byte* b = dst.data(); b < to; ++b) ASSERT_EQ(*b, std::byte{0xA5});
        for (std::byte* b = to + length; b < dst.data() + dst.size(); ++b)
          ASSERT_EQ(*b, std::byte{0xA5});
      }
}

// Gives `stores` a full window of rounds of one kind, each `micros` for `bytes`.
void fill_window(StagingStores* stores, bool streamed, double micros, uint64_t bytes) {
  for (size_t i = 0; i < StagingStores::kWindow; ++i) stores->observe(streamed, micros, bytes);
}

TEST(StagingStores, TakesTurnsUntilEachKindHasAWindow) {
  StagingStores stores;
  for (size_t i = 0; i < StagingStores::kWindow; ++i) {
    // Whatever the round, a probe's included: ordinary first, then streaming.
    EXPECT_FALSE(stores.stream(StagingStores::kProbeEvery)) << i;
    stores.observe(false, 500, 1000);  // ordinary rounds look slow: a cold start
    EXPECT_TRUE(stores.stream(1)) << i;
    EXPECT_FALSE(stores.streaming()) << i;  // no choice before both windows are full
    stores.observe(true, 150, 1000);
  }
  EXPECT_TRUE(stores.streaming());
}

TEST(StagingStores, KeepsTheFasterKindPerByteAndProbesTheOther) {
  StagingStores stores;
  fill_window(&stores, false, 100, 1000);  // 0.1 us per byte
  fill_window(&stores, true, 150, 3000);   // 0.05: slower rounds, but faster per byte
  EXPECT_TRUE(stores.streaming());
  int streamed = 0;
  for (uint64_t round = 1; round <= 4 * StagingStores::kProbeEvery; ++round) {
    const bool stream = stores.stream(round);
    streamed += stream ? 1 : 0;
    EXPECT_EQ(stream, round % StagingStores::kProbeEvery != 0) << round;
  }
  EXPECT_EQ(streamed, 4 * (StagingStores::kProbeEvery - 1));
}

TEST(StagingStores, EveryBlockOfRoundsHasAProbeWhicheverRoundsAreTimed) {
  StagingStores stores;
  fill_window(&stores, false, 100, 1000);
  fill_window(&stores, true, 150, 1000);
  // Only odd rounds timed (a small staged op between two large ones): no timed round is a
  // multiple of kProbeEvery, yet each block's first timed round still probes.
  int probes = 0;
  for (uint64_t round = 1; round <= 4 * StagingStores::kProbeEvery; round += 2) {
    const bool probe = stores.stream(round);  // ordinary is faster: a probe streams
    EXPECT_EQ(probe, round % StagingStores::kProbeEvery == 1 && round > 1) << round;
    probes += probe ? 1 : 0;
  }
  EXPECT_EQ(probes, 3);
}

TEST(StagingStores, StreamingMustWinByItsMargin) {
  StagingStores stores;
  fill_window(&stores, false, 100, 1000);
  fill_window(&stores, true, 100 / StagingStores::kStreamingMargin + 1, 1000);
  EXPECT_FALSE(stores.streaming());
  fill_window(&stores, true, 100 / StagingStores::kStreamingMargin - 1, 1000);
  EXPECT_TRUE(stores.streaming());
}

TEST(StagingStores, APreemptedRoundDoesNotChangeTheChoice) {
  StagingStores stores;
  fill_window(&stores, false, 100, 1000);
  fill_window(&stores, true, 150, 1000);
  stores.observe(false, 1000, 1000);  // ten times as long: the rank lost its core
  EXPECT_FALSE(stores.streaming());
}

TEST(StagingStores, FollowsTheHostWhenItsStateChanges) {
  StagingStores stores;
  fill_window(&stores, false, 100, 1000);
  fill_window(&stores, true, 150, 1000);
  EXPECT_FALSE(stores.streaming());
  // The cores move apart: ordinary rounds now take three times as long. The choice changes
  // once the last fast ordinary round has left the window.
  for (size_t i = 1; i < StagingStores::kWindow; ++i) {
    stores.observe(false, 300, 1000);
    EXPECT_FALSE(stores.streaming()) << i;
  }
  stores.observe(false, 300, 1000);
  EXPECT_TRUE(stores.streaming());
  // And back: the first ordinary probe at the old speed brings ordinary stores back.
  stores.observe(false, 100, 1000);
  EXPECT_FALSE(stores.streaming());
}

TEST(StagingStores, AnEmptyRoundChangesNothing) {
  StagingStores stores;
  stores.observe(false, 100, 0);
  EXPECT_FALSE(stores.streaming());
  EXPECT_FALSE(stores.stream(1));
}

}  // namespace
}  // namespace weft
