// Chooses the algorithm and message chunking per collective call from the
// α-β cost model (algorithms/cost_model.h): every candidate schedule is timed
// on the communicator's links, once per (collective, power-of-two size
// bucket), and the fastest wins, so a call costs a table lookup. Users can
// force algorithms per collective and size range with WEFT_ALGO or the
// config's `algorithms` field (docs/tuning.md):
//   allreduce:ring,allgather:bruck                 (every size)
//   allreduce:0-16K:oneshot,allreduce:16K-inf:ring  (lo inclusive, hi exclusive)
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/cost_model.h"
#include "algorithms/schedule.h"
#include "common/status.h"
#include "core/calibration.h"
#include "core/layout.h"
#include "topo/cluster.h"

namespace weft {

struct AlgorithmOverride {
  uint64_t lo = 0;           // bytes, inclusive
  uint64_t hi = UINT64_MAX;  // bytes, exclusive; UINT64_MAX: no upper bound
  algo::Algorithm algorithm = algo::Algorithm::Ring;
};

struct AlgorithmOverrides {
  std::array<std::vector<AlgorithmOverride>, algo::kNumCollectives> ranges;
  // The forced algorithm for a call of `bytes`, or false.
  bool find(algo::Collective collective, uint64_t bytes, algo::Algorithm* out) const;
};

// Parses "collective[:lo-hi]:algorithm[,...]". Sizes take K/M/G suffixes
// (powers of 1024); hi may be "inf". Unknown names, algorithms that do not
// implement the collective, malformed or empty ranges and ranges that
// overlap another of the same collective are errors naming the entry.
Status parse_algorithm_overrides(const std::string& spec, const char* source,
                                 AlgorithmOverrides* out);

// What the tuner knows about a communicator.
struct TuneContext {
  int nranks = 1;
  algo::Layout layout;              // empty node_of: one node, rank-order ring
  std::vector<uint8_t> pair_class;  // topo::LinkClass per [from * nranks + to]; empty: same NUMA
  std::array<topo::LinkCost, topo::kNumLinkClasses> links = topo::Cluster::default_links();
  algo::LinkTime memory;
  algo::LinkTime direct;  // direct algorithms (shared memory)
  // Direct reads in place by cross-memory attach, per collective from blocks of
  // single_copy_bytes (0: none; the communicator's DirectState::cma_floors).
  algo::LinkTime single_copy;
  std::array<uint64_t, algo::kNumCollectives> single_copy_bytes{};
  // Broadcasts and Reduces of at most lane_bytes run in the lanes (0: none), their senders
  // at most lane_window - 1 calls ahead (DirectState::lane_bytes, lane_window).
  uint64_t lane_bytes = 0;
  double lane_window = 1;
  double call_us = 0;  // added to every scheduled prediction
  // Ranks per core on the busiest node when they outnumber its cores (1:
  // not oversubscribed) and the slice latencies (Calibration::sliced).
  double share = 1;
  double slice_latency_us = 0;
  double direct_slice_latency_us = 0;
  double sliced_link_bandwidth_gb_s = 0;         // the node's links at s = 2 (0: bandwidth / s)
  double sliced_single_copy_bandwidth_gb_s = 0;  // single-copy reads at s = 2 (0: bandwidth / s)
  // The cache tier (Calibration::cache_speedup): memory and single-copy reads at
  // cache_bandwidth_gb_s; direct reads at direct_cache_bandwidth_gb_s, and, when
  // cached_links, the node's link classes (copies through shared memory) by its ratio to
  // direct's (0: the copies' factor for both).
  double cache_bytes = 0;
  double cache_bandwidth_gb_s = 0;
  double direct_cache_bandwidth_gb_s = 0;
  bool cached_links = false;
  bool shared_memory = false;  // all ranks on one real node sharing memory: direct algorithms
  AlgorithmOverrides overrides;
  uint64_t max_model_steps = uint64_t{1} << 20;  // larger schedules are not timed
};

// The context of a communicator: link classes from where its ranks sit
// (ranks on different nodes: network; GPUs of one node: NVLink; otherwise
// by NUMA node and package), costs from its topology; without a topology
// file the machine's costs and oversubscription come from `machine`.
TuneContext tune_context(const CommTopology& topology, bool shared_memory,
                         const AlgorithmOverrides& overrides,
                         const Calibration& machine = Calibration());

// The context of a cluster file's ranks (weft-sim, planning): link classes
// exactly as the file gives them (NVLink domains, NIC rails), each rank's own
// work from `machine`, as a communicator given the same file times it.
TuneContext tune_context(const topo::Cluster& cluster, bool shared_memory,
                         const Calibration& machine = Calibration());

// Bytes as WEFT_ALGO ranges write them: 512, 16K, 4M, inf (UINT64_MAX).
std::string size_text(uint64_t bytes);

struct Plan {
  algo::Algorithm algorithm = algo::Algorithm::Ring;
  uint64_t chunk_elements = 0;  // 0: no chunking
  double predicted_us = -1;     // the model's time; negative: not modelled
};

// One timed candidate.
struct Candidate {
  algo::Algorithm algorithm;
  uint64_t chunk_bytes;
  double time_us;
};

class Tuner {
 public:
  explicit Tuner(TuneContext context);

  // The plan for a call of `bytes` (the collective's count times the element size), in
  // place or not (decided apart where that changes the time: algo::timed_by_placement).
  Plan plan(algo::Collective collective, uint64_t bytes, size_t element_size,
            bool in_place = false);
  // plan()'s algorithm for `bytes`, without the lock once its bucket is decided (the
  // blocking fast path asks on every call); it counts as the last plan all the same.
  algo::Algorithm algorithm(algo::Collective collective, uint64_t bytes, size_t element_size,
                            bool in_place = false);

  // Every candidate for `bytes`, timed (untimeable ones left out), fastest
  // first. plan() decides a size bucket by its lowest size, so for powers of
  // two the first candidate is plan()'s choice (without overrides).
  std::vector<Candidate> candidates(algo::Collective collective, uint64_t bytes,
                                    bool in_place = false) const;

  // The decision per size bucket from 1 B to `max_bytes`, one line each
  // (one line in all for a barrier, which has no size).
  std::vector<std::string> decision_table(algo::Collective collective, uint64_t max_bytes) const;

  // The model's time for one schedule; negative when it cannot be timed.
  double predict_us(algo::Collective collective, algo::Algorithm algorithm, uint64_t chunk_bytes,
                    uint64_t bytes, bool in_place = false) const;

  // Name of the algorithm of the last plan, "" before the first.
  const char* last_algorithm() const;
  // The model's time for the last plan at its exact size (runs the model).
  double last_predicted_us() const;

  const TuneContext& context() const { return context_; }

 private:
  struct Decision {
    algo::Algorithm algorithm;
    uint64_t chunk_bytes;
    double time_us;
  };
  Decision decide(algo::Collective collective, uint64_t bytes, bool in_place) const;
  double predict_us(algo::Collective collective, algo::Algorithm algorithm, uint64_t chunk_bytes,
                    uint64_t bytes, bool in_place, const algo::CostNetwork& network) const;
  algo::Params model_params(algo::Collective collective, uint64_t bytes) const;
  // Decisions are kept per collective and, where it changes the time, placement.
  static constexpr int kKeys = 2 * algo::kNumCollectives;
  static int key(algo::Collective collective, bool in_place) {
    const int c = static_cast<int>(collective);
    return in_place && algo::timed_by_placement(collective) ? algo::kNumCollectives + c : c;
  }
  // How much faster a rank's own copies, its direct reads of the peers' staging and the
  // node's links run in a call of `bytes` that fits (partly) in the cache.
  struct Speedups {
    double copies = 1, direct_reads = 1, links = 1;
  };
  Speedups cache_speedups(algo::Collective collective, uint64_t bytes) const;

  TuneContext context_;
  algo::CostNetwork network_;
  mutable std::mutex mutex_;
  // By key() and size bucket (a direct index: this is looked up on every call).
  std::array<std::array<std::optional<Decision>, 65>, kKeys> cache_{};
  std::array<bool, algo::kNumCollectives> logged_{};
  struct Last {
    algo::Collective collective;
    bool in_place;
    uint64_t bytes;
    Decision decision;
  };
  std::optional<Last> last_;
  // Lock-free copies for algorithm(): per bucket the decided algorithm + 1 (0: not yet), and
  // the last call it answered, (key + 1) << kLastShift | bytes (0: plan()'s last_ is).
  std::array<std::array<std::atomic<uint8_t>, 65>, kKeys> decided_{};
  static constexpr int kLastShift = 57;  // bytes never reach 2^57 (collectives.cc)
  std::atomic<uint64_t> last_unlocked_{0};
  std::optional<Last> last() const;  // with the lock held
};

// The size bucket of `bytes`: its bit width (0 for 0, 1 for 1, 2 for 2-3, ...).
inline int size_bucket(uint64_t bytes) {
  return std::bit_width(bytes);
}

// Inline: the blocking fast path asks on every call.
inline algo::Algorithm Tuner::algorithm(algo::Collective collective, uint64_t bytes,
                                        size_t element_size, bool in_place) {
  const int k = key(collective, in_place);
  const uint8_t decided = decided_[k][size_bucket(bytes)].load(std::memory_order_acquire);
  if (decided == 0) return plan(collective, bytes, element_size, in_place).algorithm;
  last_unlocked_.store(static_cast<uint64_t>(k + 1) << kLastShift | bytes,
                       std::memory_order_relaxed);
  return static_cast<algo::Algorithm>(decided - 1);
}

}  // namespace weft
