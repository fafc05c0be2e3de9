// The α-β cost model: a collective's predicted completion time on a given
// network, computed from the schedules themselves. Every rank's program is
// built and timed together, event by event: a step starts once its
// dependencies are done (a Recv also once its message has arrived); a
// message occupies the sender's and the receiver's port for bytes / β of the
// link class between them and arrives α later; Reduce and Copy steps occupy
// the rank's compute for bytes / (memory bandwidth). Direct algorithms
// (is_direct) have no program and get a closed form instead. Pure: no I/O.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/schedule.h"

namespace weft::algo {

// α (latency) and β (bandwidth) of one class of link, or of local memory.
struct LinkTime {
  double latency_us = 0;
  double bandwidth_gb_s = 1;  // 1e9 bytes/s
  // Microseconds to move `bytes` over this link, latency included.
  double time_us(double bytes) const { return latency_us + transfer_us(bytes); }
  double transfer_us(double bytes) const { return bytes / (bandwidth_gb_s * 1e3); }
};

// Whether a call's placement changes its modelled time: an in-place AllToAll is never read
// in place (a rank would overwrite blocks its peers still read), so it is always staged.
inline bool timed_by_placement(Collective collective) {
  return collective == Collective::AllToAll;
}

struct CostNetwork {
  int nranks = 1;
  std::vector<LinkTime> classes;    // indexed by the values of pair_class
  std::vector<uint8_t> pair_class;  // [from * nranks + to]; empty: class 0 between all pairs
  LinkTime memory{0.05, 10};        // Reduce and Copy steps: per-step overhead, throughput
  // Direct algorithms: one synchronisation through the node's shared memory
  // (latency) and the reads of the peers' staging (throughput); the copy into
  // a rank's own staging is timed at `memory`.
  LinkTime direct{0.2, 20};
  // Direct one-shot AllGather, Broadcast and AllToAll blocks of at least
  // single_copy_bytes[collective] (0: never) are read straight out of the peers' buffers
  // (cross-memory attach): no staging copy, a second synchronisation (the
  // readers tell the owner they are done), each peer's block one read.
  LinkTime single_copy{1.0, 12};
  std::array<uint64_t, kNumCollectives> single_copy_bytes{};
  // Direct one-shot Broadcast and Reduce of at most lane_bytes (0: none) run in the lanes:
  // the ranks that only send run calls ahead of their peers, so a stream of them waits for
  // no synchronisation. Each costs lane_us (a rank's own part of the call, with its share of
  // the switches between time-sliced ranks) plus its copies.
  uint64_t lane_bytes = 0;
  double lane_us = 0;
  // Throughput of reading a staging no rank writes while it is read (a Broadcast's root's:
  // in the exchanges every rank's lines are read while it reads its peers'); 0: memory's.
  double quiet_read_gb_s = 0;
  uint64_t max_steps = uint64_t{4} << 20;  // programs larger in all are refused (memory)
  // Link classes (a bit per class) whose transfers are copies made by the ranks' own cores
  // (UCX through shared memory): a send there takes the sender's compute port, so it does
  // not overlap that rank's reductions and copies.
  uint32_t cpu_copied_classes = 0;

  int link_class(int from, int to) const {
    return pair_class.empty() ? 0 : pair_class[static_cast<size_t>(from) * nranks + to];
  }
  const LinkTime& link(int from, int to) const { return classes[link_class(from, to)]; }
  bool copied_by_cpu(int from, int to) const {
    return (cpu_copied_classes >> link_class(from, to)) & 1;
  }
  // Every pair on one link class.
  static CostNetwork uniform(int nranks, LinkTime link, LinkTime memory);
};

struct CostResult {
  double time_us = 0;  // predicted completion of the last rank
  uint64_t steps = 0;  // steps timed, all ranks together (0 for direct algorithms)
  uint64_t messages = 0;
};

// Predicted time of the collective in `params` (its rank is ignored: all
// ranks are timed) with `element_size`-byte elements on `network`. False and
// *error when the schedule cannot be built, deadlocks, or has more than
// network.max_steps steps in all.
bool predict(const Params& params, uint64_t element_size, const CostNetwork& network,
             CostResult* out, std::string* error);

}  // namespace weft::algo
