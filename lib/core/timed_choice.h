#pragma once

#include <cstddef>
#include <cstdint>

namespace weft {

// A choice between two ways of doing the same work, the plain way and an alternative, made
// from how long each takes per byte on this host as it is now. This host moves its cores
// between states in which the faster way differs (docs/shared-memory.md), and no state is
// visible from inside, so the work times itself: the best of each way's last kWindow runs
// per byte. The best, not an average: a run the rank was preempted in is slow whatever way
// it took. The alternative is kept while its best beats the plain way's by the margin. The
// ways take turns until each has kWindow runs (a cold first run must not decide); after
// that the first run of each block of kProbeEvery (counted by the caller, alike on every
// rank) is a probe, so that both figures follow the host. Where the first runs after a
// change of way are slow whichever way it is (the caches, the pages still placed for the
// other way), `warmup` runs after each change are not counted: then each way runs in one
// stretch until it has kWindow counted runs, and a probe lasts warmup + 1 runs.
class TimedChoice {
 public:
  static constexpr uint64_t kProbeEvery = 64;
  static constexpr size_t kWindow = 4;

  // What a block's probe runs: the way not in use (each rank chooses for itself), or the
  // alternative in even blocks and the plain way in odd ones (ranks whose choices must
  // agree to take effect: each runs both, whatever it prefers).
  enum class Probe : uint8_t { OtherWay, Alternate };

  TimedChoice() = default;
  // `margin`: how much faster per byte the alternative must be to be chosen.
  TimedChoice(double margin, Probe probe, uint32_t warmup = 0)
      : margin_(margin), probe_(probe), warmup_(warmup) {}

  // Whether the run numbered `counter` (the same number on every rank; runs that do not
  // ask may be skipped) takes the alternative.
  bool alternative(uint64_t counter);
  // The same, numbered by the runs that asked so far: alike on every rank that asks for the
  // same runs, and a probe per kProbeEvery of them however rare they are among other work.
  bool alternative() { return alternative(asked_++); }
  // A run took `micros` for `bytes`, the alternative's or the plain way's.
  void observe(bool alternative, double micros, uint64_t bytes);
  // Whether the alternative is the faster way, once both have had kWindow runs.
  bool prefers_alternative() const;

 private:
  bool explored() const;
  // The best of a way's last kWindow runs (at least one), per byte.
  double best(bool alternative) const;

  double margin_ = 1;
  Probe probe_ = Probe::OtherWay;
  uint32_t warmup_ = 0;
  uint64_t probed_block_ = 0;  // counter / kProbeEvery of the newest probe
  bool probe_way_ = false;     // the way of the probe in progress
  uint32_t probe_left_ = 0;    // its runs still to come
  uint64_t asked_ = 0;         // runs numbered by alternative() so far
  // The way of the newest run (2: none yet), and runs of it in a row before that one.
  uint8_t last_way_ = 2;
  uint32_t in_a_row_ = 0;
  // Per way (plain, alternative): its last runs' time per byte, and how many it had.
  double micros_per_byte_[2][kWindow] = {};
  uint64_t runs_[2] = {0, 0};
};

}  // namespace weft
