#include "core/timed_choice.h"

#include <algorithm>

namespace weft {

double TimedChoice::best(bool alternative) const {
  const size_t way = alternative ? 1 : 0;
  return *std::min_element(micros_per_byte_[way],
                           micros_per_byte_[way] + std::min<uint64_t>(runs_[way], kWindow));
}

bool TimedChoice::explored() const {
  return runs_[0] >= kWindow && runs_[1] >= kWindow;
}

bool TimedChoice::prefers_alternative() const {
  return explored() && best(true) * margin_ < best(false);
}

bool TimedChoice::alternative(uint64_t counter) {
  // Exploring: by turns, or (with a warm-up) the plain way's stretch, then the alternative's.
  if (!explored()) return warmup_ == 0 ? runs_[1] < runs_[0] : runs_[0] >= kWindow;
  const uint64_t block = counter / kProbeEvery;
  if (block != probed_block_) {
    probed_block_ = block;
    probe_way_ = probe_ == Probe::OtherWay ? !prefers_alternative() : block % 2 == 0;
    probe_left_ = warmup_ + 1;
  }
  if (probe_left_ == 0) return prefers_alternative();
  --probe_left_;
  return probe_way_;
}

void TimedChoice::observe(bool alternative, double micros, uint64_t bytes) {
  if (bytes == 0) return;
  const uint8_t way = alternative ? 1 : 0;
  in_a_row_ = way == last_way_ ? std::min(in_a_row_ + 1, warmup_) : 0;
  last_way_ = way;
  if (in_a_row_ < warmup_) return;  // a run still warming up after a change of way
  micros_per_byte_[way][runs_[way]++ % kWindow] = micros / static_cast<double>(bytes);
}

}  // namespace weft
