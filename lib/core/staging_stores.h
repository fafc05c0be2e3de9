#pragma once

#include <cstddef>
#include <cstdint>

namespace weft {

// Copies `bytes` with streaming (non-temporal) stores where the CPU has them: the lines go
// to memory without being read first or kept in this core's cache. Elsewhere, memcpy.
// Streaming stores are weakly ordered: call streaming_fence() before publishing them.
void copy_streaming(std::byte* dst, const std::byte* src, size_t bytes);

// Orders the streaming stores before every later store (the release that publishes them).
void streaming_fence();

// Whether copy_streaming bypasses the cache on this build (x86-64).
bool streaming_stores_available();

// How a rank writes the large staging rounds of one collective. A staging line a peer has
// just read sits in that peer's cache, and an ordinary store must first take it back. When
// the host places the two cores far apart (it moves them: a 2-rank 8-byte AllReduce takes
// 0.12 µs one minute and 0.35 the next), that take-back halves a large round's speed, and
// streaming stores, which skip it and leave the lines in memory for the readers, run such
// rounds 1.5-1.8× faster. Where the cores share their lines quickly, they are 1.3-1.5×
// slower (the readers go to memory). Neither the state nor its changes are visible, so each
// rank times its rounds (its pack and its unpack, not its waits) per byte and streams when
// the best of its last kWindow streamed rounds beats the best of its ordinary ones by
// kStreamingMargin. The best, not an average: a round the rank was preempted in is slow
// whatever its stores, and this host preempts often. The margin: part of streaming's cost
// falls outside the rank's rounds. The kinds take turns until each has kWindow rounds;
// after that the first timed round of each block of kProbeEvery rounds of the communicator
// is written with the other kind, on every rank at once, so that both figures follow the
// host. Each rank decides alone: the choice changes no byte another rank reads.
class StagingStores {
 public:
  static constexpr uint64_t kProbeEvery = 64;
  static constexpr size_t kWindow = 4;
  // How much faster per byte streaming rounds must be to be chosen.
  static constexpr double kStreamingMargin = 1.45;

  // Which rounds are timed at all (WEFT_SHM_STREAM_BYTES) is the direct path's choice.
  // Whether the communicator's round `round` (the same count on every rank) is written
  // with streaming stores. The first timed round of each block of kProbeEvery rounds is
  // the probe: whichever rounds are timed, each block has one.
  bool stream(uint64_t round);
  // A timed round, streamed or not, took `micros` to write and read `bytes`.
  void observe(bool streamed, double micros, uint64_t bytes);
  // Whether streaming stores are the faster kind, once both kinds have had kWindow rounds.
  bool streaming() const;

 private:
  bool explored() const;
  // The best of a kind's last kWindow rounds (at least one), per byte.
  double best(bool streamed) const;

  uint64_t probed_block_ = 0;  // round / kProbeEvery of the newest probe
  // Per kind (ordinary, streaming): its last rounds' time per byte, and how many it had.
  double micros_per_byte_[2][kWindow] = {};
  uint64_t rounds_[2] = {0, 0};
};
}  // namespace weft
