#include "core/tuner.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string_view>

#include "common/env.h"
#include "common/log.h"
#include "core/direct.h"
#include "topo/cluster_view.h"
#include "topo/shapes.h"

namespace weft {

namespace {

std::string valid_algorithms(algo::Collective collective) {
  std::string names;
  for (int a = 0; a < algo::kNumAlgorithms; ++a) {
    auto algorithm = static_cast<algo::Algorithm>(a);
    if (!algo::supports(algorithm, collective)) continue;
    names += (names.empty() ? "" : ", ") + std::string(algo::algorithm_name(algorithm));
  }
  return names;
}

std::string valid_collectives() {
  std::string names;
  for (int c = 0; c < algo::kNumCollectives; ++c)
    names +=
        (c == 0 ? "" : ", ") + std::string(algo::collective_name(static_cast<algo::Collective>(c)));
  return names;
}

// The link classes between ranks of one node, which the machine's calibration times.
constexpr topo::LinkClass kNodeLinks[] = {topo::LinkClass::SameNuma, topo::LinkClass::SameSocket,
                                          topo::LinkClass::CrossSocket};

// Chunk sizes tried for pipelined schedules: big enough to amortise a
// message's latency, small enough that several are in flight.
constexpr uint64_t kChunkCandidates[] = {128 << 10, 512 << 10, 2 << 20};

// The size the model is evaluated at for a bucket: its lowest, a power of
// two, so that tables over powers of two show the decisions exactly.
uint64_t bucket_size(int bucket) {
  return bucket == 0 ? 0 : uint64_t{1} << (bucket - 1);
}

// Size thresholds, for calls no candidate schedule could be timed for
// (schedules over the model's step budget).
algo::Algorithm fallback_algorithm(algo::Collective collective, uint64_t bytes, int nranks) {
  using algo::Algorithm;
  using algo::Collective;
  const uint64_t n = static_cast<uint64_t>(nranks);
  switch (collective) {
    case Collective::AllReduce:
      return bytes <= (16 << 10) ? Algorithm::Rd : Algorithm::Ring;
    case Collective::ReduceScatter:
      return bytes * n <= (512 << 10) ? Algorithm::Rhd : Algorithm::Ring;
    case Collective::AllGather:
      return bytes * n <= (64 << 10) ? Algorithm::Bruck : Algorithm::Ring;
    case Collective::Broadcast:
    case Collective::Reduce:
      return bytes <= (256 << 10) ? Algorithm::Binomial : Algorithm::Chain;
    case Collective::AllToAll:
      return bytes <= 1024 ? Algorithm::Bruck : Algorithm::Pairwise;
    case Collective::AllToAllv:
      return Algorithm::Pairwise;
    case Collective::Gather:
    case Collective::Scatter:
      return Algorithm::Binomial;
    case Collective::Barrier:
      return Algorithm::Dissemination;
  }
  return Algorithm::Ring;
}

topo::LinkClass place_link(const topo::RankPlace& a, const topo::RankPlace& b) {
  using topo::LinkClass;
  if (a.node_key != b.node_key) return LinkClass::Network;
  if (a.gpu >= 0 && b.gpu >= 0 && a.gpu != b.gpu) return LinkClass::NvLink;
  if (a.numa >= 0 && a.numa == b.numa) return LinkClass::SameNuma;
  if (a.package >= 0 && a.package == b.package) return LinkClass::SameSocket;
  return LinkClass::CrossSocket;
}

}  // namespace

std::string size_text(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "inf";
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + units[u];
}

bool AlgorithmOverrides::find(algo::Collective collective, uint64_t bytes,
                              algo::Algorithm* out) const {
  for (const AlgorithmOverride& range : ranges[static_cast<int>(collective)]) {
    if (bytes >= range.lo && (bytes < range.hi || range.hi == UINT64_MAX)) {
      *out = range.algorithm;
      return true;
    }
  }
  return false;
}

Status parse_algorithm_overrides(const std::string& spec, const char* source,
                                 AlgorithmOverrides* out) {
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (entry.empty()) continue;
    const int length = static_cast<int>(entry.size());
    const size_t colon = entry.find(':');
    const size_t last_colon = entry.rfind(':');
    if (colon == std::string_view::npos)
      return Error(weftInvalidArgument,
                   "%s entry '%.*s' is not collective:algorithm or collective:lo-hi:algorithm",
                   source, length, entry.data());
    algo::Collective collective;
    algo::Algorithm algorithm;
    const std::string_view collective_name = entry.substr(0, colon);
    const std::string_view algorithm_name = entry.substr(last_colon + 1);
    if (!algo::parse_collective(collective_name, &collective))
      return Error(weftInvalidArgument, "%s: unknown collective '%.*s' (valid: %s)", source,
                   static_cast<int>(collective_name.size()), collective_name.data(),
                   valid_collectives().c_str());
    if (!algo::parse_algorithm(algorithm_name, &algorithm) ||
        !algo::supports(algorithm, collective))
      return Error(weftInvalidArgument, "%s: '%.*s' is not an algorithm for %s (valid: %s)", source,
                   static_cast<int>(algorithm_name.size()), algorithm_name.data(),
                   algo::collective_name(collective), valid_algorithms(collective).c_str());
    AlgorithmOverride range;
    range.algorithm = algorithm;
    if (last_colon != colon) {
      const std::string_view sizes = entry.substr(colon + 1, last_colon - colon - 1);
      const size_t dash = sizes.find('-');
      if (dash == std::string_view::npos || !parse_bytes(sizes.substr(0, dash), &range.lo) ||
          !parse_bytes(sizes.substr(dash + 1), &range.hi) || range.lo == UINT64_MAX)
        return Error(weftInvalidArgument,
                     "%s entry '%.*s': the size range must be lo-hi in bytes with K/M/G suffixes "
                     "or 'inf' (e.g. 0-16K, 16K-inf)",
                     source, length, entry.data());
      if (range.lo >= range.hi)
        return Error(weftInvalidArgument, "%s entry '%.*s': the size range is empty (lo >= hi)",
                     source, length, entry.data());
    }
    for (const AlgorithmOverride& other : out->ranges[static_cast<int>(collective)]) {
      if (range.lo < other.hi && other.lo < range.hi)
        return Error(weftInvalidArgument,
                     "%s entry '%.*s' overlaps the earlier %s range %s-%s (ranges are lo "
                     "inclusive, hi exclusive)",
                     source, length, entry.data(), algo::collective_name(collective),
                     size_text(other.lo).c_str(), size_text(other.hi).c_str());
    }
    out->ranges[static_cast<int>(collective)].push_back(range);
  }
  return Status::Ok();
}

namespace {

// What a rank's own work costs (copies, reductions, the call, the cache tier):
// from the machine, whatever the links between ranks are.
void set_local_costs(const Calibration& machine, TuneContext* context) {
  context->memory = machine.memory;
  context->direct = machine.direct;
  context->single_copy = machine.single_copy;
  context->call_us = machine.call_us;
  context->cache_bytes = machine.cache_bytes;
  context->cache_bandwidth_gb_s = machine.cache_bandwidth_gb_s;
  context->direct_cache_bandwidth_gb_s = machine.direct_cache_bandwidth_gb_s;
}

}  // namespace

TuneContext tune_context(const CommTopology& topology, bool shared_memory,
                         const AlgorithmOverrides& overrides, const Calibration& machine) {
  TuneContext context;
  const int n = static_cast<int>(topology.places.size());
  context.nranks = n;
  context.layout = topology.layout;
  context.links = topology.links;
  set_local_costs(machine, &context);
  if (!topology.injected) {
    for (topo::LinkClass link : kNodeLinks) context.links[static_cast<int>(link)] = machine.link;
    // Every rank sees the same places, so all compute the same share.
    std::map<uint64_t, int> per_node;
    int busiest = 0;
    for (const topo::RankPlace& place : topology.places)
      busiest = std::max(busiest, ++per_node[place.node_key]);
    const int cores =
        machine.cores > 0 ? machine.cores : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    context.share = Calibration::share(busiest, cores);
    context.slice_latency_us = machine.slice_latency_us;
    context.direct_slice_latency_us = machine.direct_slice_latency_us;
    context.sliced_link_bandwidth_gb_s = machine.sliced_link_bandwidth_gb_s;
    context.sliced_single_copy_bandwidth_gb_s = machine.sliced_single_copy_bandwidth_gb_s;
    context.cached_links = true;
  }
  context.pair_class.resize(static_cast<size_t>(n) * n);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      context.pair_class[static_cast<size_t>(a) * n + b] =
          static_cast<uint8_t>(place_link(topology.places[a], topology.places[b]));
  context.shared_memory = shared_memory;
  context.overrides = overrides;
  return context;
}

TuneContext tune_context(const topo::Cluster& cluster, bool shared_memory,
                         const Calibration& machine) {
  TuneContext context;
  const int n = static_cast<int>(cluster.ranks.size());
  context.nranks = n;
  set_local_costs(machine, &context);
  const topo::ClusterView view(topo::places_of(cluster));
  for (int rank = 0; rank < n; ++rank) context.layout.node_of.push_back(view.node_of(rank));
  context.layout.ring = topo::ring_order(view);
  context.links = cluster.links;
  if (shared_memory) {
    context.lane_bytes = kLaneBytes;
    context.lane_window = static_cast<double>(DirectState::lane_window_for(n));
  }
  context.pair_class.resize(static_cast<size_t>(n) * n);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      context.pair_class[static_cast<size_t>(a) * n + b] =
          static_cast<uint8_t>(topo::link_between(cluster, a, b));
  context.shared_memory = shared_memory;
  return context;
}

Tuner::Tuner(TuneContext context) : context_(std::move(context)) {
  network_.nranks = context_.nranks;
  const double share = context_.share;
  for (const topo::LinkCost& cost : context_.links)
    network_.classes.push_back(Calibration::sliced({cost.latency_us, cost.bandwidth_gb_s}, share,
                                                   context_.slice_latency_us));
  // UCX moves a node's messages through shared memory with the ranks' own cores.
  if (context_.cached_links)
    for (topo::LinkClass link : kNodeLinks)
      network_.cpu_copied_classes |= 1u << static_cast<int>(link);
  if (context_.cached_links && share > 1)
    for (topo::LinkClass link : kNodeLinks) {
      const topo::LinkCost& cost = context_.links[static_cast<int>(link)];
      network_.classes[static_cast<int>(link)].bandwidth_gb_s = Calibration::sliced_link_bandwidth(
          cost.bandwidth_gb_s, share, context_.sliced_link_bandwidth_gb_s);
    }
  network_.pair_class = context_.pair_class;
  if (network_.pair_class.empty())
    network_.pair_class.assign(static_cast<size_t>(context_.nranks) * context_.nranks,
                               static_cast<uint8_t>(topo::LinkClass::SameNuma));
  network_.memory = Calibration::sliced(context_.memory, share, 0);
  network_.direct = Calibration::sliced(context_.direct, share, context_.direct_slice_latency_us);
  network_.single_copy =
      Calibration::sliced(context_.single_copy, share, context_.direct_slice_latency_us);
  network_.single_copy.bandwidth_gb_s = Calibration::sliced_single_copy_bandwidth(
      context_.single_copy.bandwidth_gb_s, share, context_.sliced_single_copy_bandwidth_gb_s);
  network_.single_copy_bytes = context_.single_copy_bytes;
  // A lane call is a rank's own work, a synchronisation's worth on its share of the core;
  // a rank waits for the others' slices once per window of calls instead of once per call.
  network_.lane_bytes = context_.lane_bytes;
  network_.lane_us =
      share * (context_.direct.latency_us +
               (share - 1) * context_.direct_slice_latency_us / context_.lane_window);
  network_.max_steps = context_.max_model_steps;
}

algo::Params Tuner::model_params(algo::Collective collective, uint64_t bytes) const {
  algo::Params params;
  params.collective = collective;
  params.nranks = context_.nranks;
  params.count = bytes;  // timed in bytes: one-byte elements
  params.layout = context_.layout.node_of.empty() ? nullptr : &context_.layout;
  return params;
}

double Tuner::predict_us(algo::Collective collective, algo::Algorithm algorithm,
                         uint64_t chunk_bytes, uint64_t bytes, bool in_place) const {
  return predict_us(collective, algorithm, chunk_bytes, bytes, in_place, network_);
}

Tuner::Speedups Tuner::cache_speedups(algo::Collective collective, uint64_t bytes) const {
  const int n = context_.nranks;
  const uint64_t input = algo::input_count(collective, n, true, bytes);
  const uint64_t largest = std::max(input, algo::output_count(collective, n, true, bytes));
  const auto speedup = [&](uint64_t buffer_bytes, double cache_gb_s, double gb_s) {
    return Calibration::cache_speedup(static_cast<double>(buffer_bytes), context_.cache_bytes,
                                      cache_gb_s, gb_s);
  };
  Speedups out;
  out.copies = speedup(largest, context_.cache_bandwidth_gb_s, context_.memory.bandwidth_gb_s);
  if (context_.direct_cache_bandwidth_gb_s <= 0) {
    out.direct_reads = out.links = out.copies;
    return out;
  }
  // A direct read takes what a peer just staged: its input. A message may carry any part
  // of the call's buffers.
  const double direct_gb_s = context_.direct.bandwidth_gb_s;
  out.direct_reads = speedup(input, context_.direct_cache_bandwidth_gb_s, direct_gb_s);
  out.links = speedup(largest, context_.direct_cache_bandwidth_gb_s, direct_gb_s);
  return out;
}

double Tuner::predict_us(algo::Collective collective, algo::Algorithm algorithm,
                         uint64_t chunk_bytes, uint64_t bytes, bool in_place,
                         const algo::CostNetwork& network) const {
  algo::Params params = model_params(collective, bytes);
  params.algorithm = algorithm;
  params.chunk = chunk_bytes;
  params.in_place = in_place;
  algo::CostResult result;
  std::string error;
  const Speedups speedup = cache_speedups(collective, bytes);
  const bool cached = speedup.copies != 1 || speedup.direct_reads != 1 || speedup.links != 1;
  algo::CostNetwork faster;
  if (cached) {
    faster = network;
    faster.memory.bandwidth_gb_s *= speedup.copies;
    faster.single_copy.bandwidth_gb_s *= speedup.copies;
    faster.direct.bandwidth_gb_s *= speedup.direct_reads;
    // Out of the cache a Broadcast's readers read at the copy throughput; in it they move
    // lines between cores as the direct reads do, never faster than the rank's own copy.
    faster.quiet_read_gb_s = std::min(network.memory.bandwidth_gb_s * speedup.direct_reads,
                                      faster.memory.bandwidth_gb_s);
    if (context_.cached_links)
      for (topo::LinkClass link : kNodeLinks)
        faster.classes[static_cast<int>(link)].bandwidth_gb_s *= speedup.links;
  }
  if (!algo::predict(params, 1, cached ? faster : network, &result, &error)) return -1;
  // The host-side cost of a call, time-sliced like the rest of the rank's work.
  return result.time_us + (algo::is_direct(algorithm) ? 0 : context_.call_us * context_.share);
}

std::vector<Candidate> Tuner::candidates(algo::Collective collective, uint64_t bytes,
                                         bool in_place) const {
  std::vector<Candidate> out;
  for (int a = 0; a < algo::kNumAlgorithms; ++a) {
    const auto algorithm = static_cast<algo::Algorithm>(a);
    if (!algo::supports(algorithm, collective)) continue;
    const bool direct = algo::is_direct(algorithm);
    if (direct && !context_.shared_memory) continue;
    const size_t before = out.size();
    for (uint64_t chunk : kChunkCandidates) {
      // Chunks at least as large as the call all mean "unchunked": time one.
      if (chunk != kChunkCandidates[0] && chunk >= bytes) break;
      const double time = predict_us(collective, algorithm, chunk, bytes, in_place);
      if (time >= 0) out.push_back({algorithm, chunk, time});
      if (direct) break;  // direct algorithms do not chunk
    }
    // Too many steps to time at every candidate chunk (large calls on many
    // ranks): coarser chunks, which the executor then uses too.
    for (uint64_t chunk = kChunkCandidates[std::size(kChunkCandidates) - 1] * 2;
         !direct && out.size() == before && chunk / 2 < bytes; chunk *= 2) {
      const double time = predict_us(collective, algorithm, chunk, bytes, in_place);
      if (time >= 0) out.push_back({algorithm, chunk, time});
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Candidate& x, const Candidate& y) { return x.time_us < y.time_us; });
  return out;
}

Tuner::Decision Tuner::decide(algo::Collective collective, uint64_t bytes, bool in_place) const {
  algo::Algorithm forced;
  const bool is_forced = context_.overrides.find(collective, bytes, &forced);
  for (const Candidate& candidate : candidates(collective, bytes, in_place)) {
    if (!is_forced || candidate.algorithm == forced)
      return {candidate.algorithm, candidate.chunk_bytes, candidate.time_us};
  }
  return {is_forced ? forced : fallback_algorithm(collective, bytes, context_.nranks),
          kChunkCandidates[1], -1};
}

std::vector<std::string> Tuner::decision_table(algo::Collective collective,
                                               uint64_t max_bytes) const {
  std::vector<std::string> table;
  const bool sized = collective != algo::Collective::Barrier;
  for (int bucket = sized ? 1 : 0; bucket <= (sized ? size_bucket(max_bytes) : 0); ++bucket) {
    const uint64_t lo = bucket_size(bucket);
    const Decision d = decide(collective, lo, false);
    // Chunks no smaller than the bucket's sizes do not split anything.
    const std::string chunk = d.chunk_bytes < lo * 2 ? size_text(d.chunk_bytes) : "none";
    const std::string range = sized ? size_text(lo) + "-" + size_text(lo * 2) : "any size";
    char line[160];
    snprintf(line, sizeof(line), "%s %-11s %-13s chunk %-4s predicted %.1f us",
             algo::collective_name(collective), range.c_str(), algo::algorithm_name(d.algorithm),
             chunk.c_str(), d.time_us);
    table.push_back(line);
  }
  return table;
}

Plan Tuner::plan(algo::Collective collective, uint64_t bytes, size_t element_size, bool in_place) {
  const int c = static_cast<int>(collective);
  const int k = key(collective, in_place);
  in_place = k != c;  // the placement only where it changes the time
  Decision decision;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int bucket = size_bucket(bytes);
    std::optional<Decision>& cached = cache_[k][bucket];
    if (!cached) {
      cached = decide(collective, bucket_size(bucket), in_place);
      decided_[k][bucket].store(static_cast<uint8_t>(static_cast<int>(cached->algorithm) + 1),
                                std::memory_order_release);
    }
    decision = *cached;
    if (!logged_[c] && log_enabled(LogLevel::INFO, kLogTUNE)) {
      logged_[c] = true;
      WEFT_LOG(INFO, TUNE, "%s on %d ranks: size range (B), algorithm, chunk, predicted time",
               algo::collective_name(collective), context_.nranks);
      for (const std::string& line : decision_table(collective, uint64_t{1} << 30))
        WEFT_LOG(INFO, TUNE, "  %s", line.c_str());
    }
    last_ = Last{collective, in_place, bytes, decision};
    last_unlocked_.store(0, std::memory_order_relaxed);
  }
  Plan plan;
  plan.algorithm = decision.algorithm;
  plan.chunk_elements = std::max<uint64_t>(1, decision.chunk_bytes / element_size);
  plan.predicted_us = decision.time_us;
  return plan;
}

std::optional<Tuner::Last> Tuner::last() const {
  const uint64_t unlocked = last_unlocked_.load(std::memory_order_relaxed);
  if (unlocked == 0) return last_;
  const int k = static_cast<int>(unlocked >> kLastShift) - 1;
  const auto collective = static_cast<algo::Collective>(k % algo::kNumCollectives);
  const uint64_t bytes = unlocked & ((uint64_t{1} << kLastShift) - 1);
  return Last{collective, k >= algo::kNumCollectives, bytes, *cache_[k][size_bucket(bytes)]};
}

const char* Tuner::last_algorithm() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<Last> recent = last();
  return recent ? algo::algorithm_name(recent->decision.algorithm) : "";
}

double Tuner::last_predicted_us() const {
  std::optional<Last> last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = this->last();
  }
  if (!last) return -1;
  const double us = predict_us(last->collective, last->decision.algorithm,
                               last->decision.chunk_bytes, last->bytes, last->in_place);
  if (us >= 0 || last->decision.time_us < 0) return us;
  // The decision was timed at its bucket's lowest size, the coarsest chunks within the step
  // budget there; the call, up to twice that size, makes up to twice the steps with the same
  // chunk (a 64 GiB ZeRO bucket over 128 ranks did): time it with the budget doubled.
  algo::CostNetwork wider = network_;
  wider.max_steps *= 2;
  return predict_us(last->collective, last->decision.algorithm, last->decision.chunk_bytes,
                    last->bytes, last->in_place, wider);
}

}  // namespace weft
