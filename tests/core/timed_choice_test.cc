// TimedChoice, the choice between a plain way and an alternative by their timings: the ways
// take turns at first, it keeps the faster per byte by each way's best recent run (the
// alternative only by its margin), every block of kProbeEvery runs has a probe (the way not
// in use, or by the block's parity), and it follows a change of host but not one slow run.
#include "core/timed_choice.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace weft {
namespace {

constexpr double kMargin = 1.45;

// Gives `choice` a full window of runs of one way, each `micros` for `bytes`.
void fill_window(TimedChoice* choice, bool alternative, double micros, uint64_t bytes) {
  for (size_t i = 0; i < TimedChoice::kWindow; ++i) choice->observe(alternative, micros, bytes);
}

TEST(TimedChoice, TakesTurnsUntilEachWayHasAWindow) {
  for (TimedChoice::Probe probe : {TimedChoice::Probe::OtherWay, TimedChoice::Probe::Alternate}) {
    TimedChoice choice(kMargin, probe);
    for (size_t i = 0; i < TimedChoice::kWindow; ++i) {
      // Whatever the counter, a probe's included: the plain way first, then the alternative.
      EXPECT_FALSE(choice.alternative(TimedChoice::kProbeEvery)) << i;
      choice.observe(false, 500, 1000);  // plain runs look slow: a cold start
      EXPECT_TRUE(choice.alternative(1)) << i;
      EXPECT_FALSE(choice.prefers_alternative()) << i;  // no choice before both windows fill
      choice.observe(true, 150, 1000);
    }
    EXPECT_TRUE(choice.prefers_alternative());
  }
}

TEST(TimedChoice, KeepsTheFasterWayPerByteAndProbesTheOther) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  fill_window(&choice, false, 100, 1000);  // 0.1 us per byte
  fill_window(&choice, true, 150, 3000);   // 0.05: slower runs, but faster per byte
  EXPECT_TRUE(choice.prefers_alternative());
  int alternatives = 0;
  for (uint64_t counter = 1; counter <= 4 * TimedChoice::kProbeEvery; ++counter) {
    const bool alternative = choice.alternative(counter);
    alternatives += alternative ? 1 : 0;
    EXPECT_EQ(alternative, counter % TimedChoice::kProbeEvery != 0) << counter;
  }
  EXPECT_EQ(alternatives, 4 * (TimedChoice::kProbeEvery - 1));
}

TEST(TimedChoice, EveryBlockHasAProbeWhicheverRunsAsk) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  fill_window(&choice, false, 100, 1000);
  fill_window(&choice, true, 150, 1000);
  // Only odd counters ask (other work between the runs): none is a multiple of
  // kProbeEvery, yet each block's first run still probes.
  int probes = 0;
  for (uint64_t counter = 1; counter <= 4 * TimedChoice::kProbeEvery; counter += 2) {
    const bool probe = choice.alternative(counter);  // the plain way is faster
    EXPECT_EQ(probe, counter % TimedChoice::kProbeEvery == 1 && counter > 1) << counter;
    probes += probe ? 1 : 0;
  }
  EXPECT_EQ(probes, 3);
}

// Ranks that must agree probe by the block's parity: the alternative in even blocks, the
// plain way in odd ones, whichever each prefers, so that every rank runs both ways.
TEST(TimedChoice, AlternatingProbesFollowTheBlockNotThePreference) {
  for (bool prefers_alternative : {false, true}) {
    TimedChoice choice(1.0, TimedChoice::Probe::Alternate);
    fill_window(&choice, false, 100, 1000);
    fill_window(&choice, true, prefers_alternative ? 50 : 150, 1000);
    ASSERT_EQ(choice.prefers_alternative(), prefers_alternative);
    for (uint64_t counter = 1; counter <= 4 * TimedChoice::kProbeEvery; ++counter) {
      const uint64_t block = counter / TimedChoice::kProbeEvery;
      const bool probe = counter % TimedChoice::kProbeEvery == 0;
      EXPECT_EQ(choice.alternative(counter), probe ? block % 2 == 0 : prefers_alternative)
          << counter << (prefers_alternative ? " (prefers the alternative)" : "");
    }
  }
}

// With a warm-up of one run, the first run after each change of way is not counted: each
// way runs in one stretch of kWindow + 1 runs at first, and a probe lasts two runs.
TEST(TimedChoice, AWarmUpRunAfterEachChangeIsNotCounted) {
  TimedChoice choice(1.0, TimedChoice::Probe::Alternate, 1);
  for (bool way : {false, true})
    for (size_t i = 0; i <= TimedChoice::kWindow; ++i) {
      ASSERT_EQ(choice.alternative(1), way) << i;
      ASSERT_FALSE(choice.prefers_alternative()) << i;
      // The warm-up runs are slow, the alternative's the slowest: counted, they would decide.
      const double micros = i == 0 ? (way ? 900 : 500) : (way ? 80 : 100);
      choice.observe(way, micros, 1000);
    }
  EXPECT_TRUE(choice.prefers_alternative());
  // Block 1's probe: two runs of the plain way; the first, slow, is not counted, the second
  // is, and its figure now beats the alternative's.
  EXPECT_FALSE(choice.alternative(TimedChoice::kProbeEvery));
  choice.observe(false, 10, 1000);
  EXPECT_TRUE(choice.prefers_alternative());
  EXPECT_FALSE(choice.alternative(TimedChoice::kProbeEvery + 1));
  choice.observe(false, 60, 1000);
  EXPECT_FALSE(choice.prefers_alternative());
  EXPECT_FALSE(choice.alternative(TimedChoice::kProbeEvery + 2));  // the choice, no probe
  // Back on the alternative after plain runs: its first run is a warm-up again.
  choice.observe(true, 10, 1000);
  EXPECT_FALSE(choice.prefers_alternative());
  choice.observe(true, 50, 1000);
  EXPECT_TRUE(choice.prefers_alternative());
}

TEST(TimedChoice, TheAlternativeMustWinByItsMargin) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  fill_window(&choice, false, 100, 1000);
  fill_window(&choice, true, 100 / kMargin + 1, 1000);
  EXPECT_FALSE(choice.prefers_alternative());
  fill_window(&choice, true, 100 / kMargin - 1, 1000);
  EXPECT_TRUE(choice.prefers_alternative());
  // With no margin, the faster way wins; a tie keeps the plain way.
  TimedChoice even(1.0, TimedChoice::Probe::Alternate);
  fill_window(&even, false, 100, 1000);
  fill_window(&even, true, 100, 1000);
  EXPECT_FALSE(even.prefers_alternative());
  even.observe(true, 99, 1000);
  EXPECT_TRUE(even.prefers_alternative());
}

TEST(TimedChoice, APreemptedRunDoesNotChangeTheChoice) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  fill_window(&choice, false, 100, 1000);
  fill_window(&choice, true, 150, 1000);
  choice.observe(false, 1000, 1000);  // ten times as long: the rank lost its core
  EXPECT_FALSE(choice.prefers_alternative());
}

TEST(TimedChoice, FollowsTheHostWhenItsStateChanges) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  fill_window(&choice, false, 100, 1000);
  fill_window(&choice, true, 150, 1000);
  EXPECT_FALSE(choice.prefers_alternative());
  // The cores move apart: plain runs now take three times as long. The choice changes once
  // the last fast plain run has left the window.
  for (size_t i = 1; i < TimedChoice::kWindow; ++i) {
    choice.observe(false, 300, 1000);
    EXPECT_FALSE(choice.prefers_alternative()) << i;
  }
  choice.observe(false, 300, 1000);
  EXPECT_TRUE(choice.prefers_alternative());
  // And back: the first plain probe at the old speed brings the plain way back.
  choice.observe(false, 100, 1000);
  EXPECT_FALSE(choice.prefers_alternative());
}

TEST(TimedChoice, AnEmptyRunChangesNothing) {
  TimedChoice choice(kMargin, TimedChoice::Probe::OtherWay);
  choice.observe(false, 100, 0);
  EXPECT_FALSE(choice.prefers_alternative());
  EXPECT_FALSE(choice.alternative(1));
}

}  // namespace
}  // namespace weft
