#include "algorithms/schedule.h"

#include <algorithm>
#include <limits>

#include "algorithms/families.h"

namespace weft::algo {

namespace {

constexpr const char* kAlgorithmNames[kNumAlgorithms] = {
    "ring",  "tree",          "rhd",  "rd",     "bruck",   "pairwise", "binomial",
    "chain", "dissemination", "hier", "leader", "oneshot", "twoshot",
};

using Builder = void (*)(const Params&, detail::Emitter&);

struct Entry {
  Algorithm algorithm;
  Collective collective;
  Builder builder;
};

// The one list of implemented (algorithm, collective) pairs.
constexpr Entry kEntries[] = {
    {Algorithm::Ring, Collective::AllReduce, detail::ring_allreduce},
    {Algorithm::Tree, Collective::AllReduce, detail::tree_allreduce},
    {Algorithm::Rhd, Collective::AllReduce, detail::rhd_allreduce},
    {Algorithm::Rd, Collective::AllReduce, detail::rd_allreduce},
    {Algorithm::Ring, Collective::ReduceScatter, detail::ring_reduce_scatter},
    {Algorithm::Rhd, Collective::ReduceScatter, detail::rhd_reduce_scatter},
    {Algorithm::Pairwise, Collective::ReduceScatter, detail::pairwise_reduce_scatter},
    {Algorithm::Ring, Collective::AllGather, detail::ring_allgather},
    {Algorithm::Bruck, Collective::AllGather, detail::bruck_allgather},
    {Algorithm::Rd, Collective::AllGather, detail::rd_allgather},
    {Algorithm::Binomial, Collective::Broadcast, detail::binomial_broadcast},
    {Algorithm::Chain, Collective::Broadcast, detail::chain_broadcast},
    {Algorithm::Binomial, Collective::Reduce, detail::binomial_reduce},
    {Algorithm::Chain, Collective::Reduce, detail::chain_reduce},
    {Algorithm::Pairwise, Collective::AllToAll, detail::pairwise_alltoall},
    {Algorithm::Bruck, Collective::AllToAll, detail::bruck_alltoall},
    {Algorithm::Pairwise, Collective::AllToAllv, detail::pairwise_alltoall},
    {Algorithm::Binomial, Collective::Gather, detail::binomial_gather},
    {Algorithm::Binomial, Collective::Scatter, detail::binomial_scatter},
    {Algorithm::Dissemination, Collective::Barrier, detail::dissemination_barrier},
    {Algorithm::Hierarchical, Collective::AllReduce, detail::hier_allreduce},
    {Algorithm::Hierarchical, Collective::ReduceScatter, detail::hier_reduce_scatter},
    {Algorithm::Hierarchical, Collective::AllGather, detail::hier_allgather},
    {Algorithm::Hierarchical, Collective::Broadcast, detail::hier_broadcast},
    {Algorithm::Hierarchical, Collective::Reduce, detail::hier_reduce},
    {Algorithm::Hierarchical, Collective::AllToAll, detail::hier_alltoall},
    {Algorithm::Hierarchical, Collective::AllToAllv, detail::hier_alltoallv},
    {Algorithm::NodeLeader, Collective::AllReduce, detail::leader_allreduce},
    {Algorithm::NodeLeader, Collective::Broadcast, detail::leader_broadcast},
    {Algorithm::NodeLeader, Collective::Reduce, detail::leader_reduce},
};

const Entry* find_entry(Algorithm algorithm, Collective collective) {
  for (const Entry& entry : kEntries) {
    if (entry.algorithm == algorithm && entry.collective == collective) return &entry;
  }
  return nullptr;
}

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

bool valid_layout(const Layout& layout, int nranks) {
  if (layout.node_of.size() != static_cast<size_t>(nranks)) return false;
  for (int node : layout.node_of) {
    if (node < 0 || node >= nranks) return false;
  }
  if (layout.ring.empty()) return true;
  if (layout.ring.size() != static_cast<size_t>(nranks)) return false;
  std::vector<bool> seen(nranks, false);
  for (int rank : layout.ring) {
    if (rank < 0 || rank >= nranks || seen[rank]) return false;
    seen[rank] = true;
  }
  return true;
}

bool validate(const Params& p, std::string* error) {
  if (static_cast<int>(p.collective) >= kNumCollectives) return fail(error, "unknown collective");
  if (static_cast<int>(p.algorithm) >= kNumAlgorithms) return fail(error, "unknown algorithm");
  if (p.nranks < 1) return fail(error, "nranks must be at least 1");
  if (p.rank < 0 || p.rank >= p.nranks) return fail(error, "rank out of range");
  if (rooted(p.collective) && (p.root < 0 || p.root >= p.nranks)) {
    return fail(error, "root out of range");
  }
  if (p.count > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(p.nranks)) {
    return fail(error, "count * nranks overflows");
  }
  if (p.collective == Collective::AllToAllv) {
    if (!p.send_counts || !p.send_displs || !p.recv_counts || !p.recv_displs) {
      return fail(error, "alltoallv needs send/recv counts and displacements");
    }
    if (p.in_place) return fail(error, "alltoallv has no in-place form");
    if (p.send_counts[p.rank] != p.recv_counts[p.rank]) {
      return fail(error, "alltoallv: this rank's send and receive counts to itself differ");
    }
  }
  if (p.layout != nullptr && !valid_layout(*p.layout, p.nranks)) {
    return fail(error, "layout: node_of needs one node per rank, ring a permutation of the ranks");
  }
  if (is_direct(p.algorithm)) {
    return fail(error, std::string(algorithm_name(p.algorithm)) +
                           " runs directly over shared memory and has no schedule");
  }
  if (!find_entry(p.algorithm, p.collective)) {
    return fail(error, std::string(algorithm_name(p.algorithm)) + " does not implement " +
                           collective_name(p.collective));
  }
  return true;
}

}  // namespace

uint64_t detail::furthest_end(const uint64_t* displs, const uint64_t* counts, int n) {
  uint64_t end = 0;
  for (int q = 0; q < n; ++q) {
    if (counts[q] > 0) end = std::max(end, displs[q] + counts[q]);
  }
  return end;
}

const char* algorithm_name(Algorithm a) {
  const int i = static_cast<int>(a);
  return i < kNumAlgorithms ? kAlgorithmNames[i] : "unknown";
}

bool parse_collective(std::string_view name, Collective* out) {
  for (int i = 0; i < kNumCollectives; ++i) {
    if (name == kCollectiveNames[i]) {
      *out = static_cast<Collective>(i);
      return true;
    }
  }
  return false;
}

bool parse_algorithm(std::string_view name, Algorithm* out) {
  for (int i = 0; i < kNumAlgorithms; ++i) {
    if (name == kAlgorithmNames[i]) {
      *out = static_cast<Algorithm>(i);
      return true;
    }
  }
  return false;
}

uint32_t Program::add(const Step& step, std::initializer_list<uint32_t> after) {
  return add(step, std::vector<uint32_t>(after));
}

uint32_t Program::add(const Step& step, const std::vector<uint32_t>& after) {
  Step out = step;
  out.first_dep = static_cast<uint32_t>(deps.size());
  out.num_deps = static_cast<uint32_t>(after.size());
  deps.insert(deps.end(), after.begin(), after.end());
  steps.push_back(out);
  return static_cast<uint32_t>(steps.size() - 1);
}

bool has_schedule(Algorithm algorithm, Collective collective) {
  return find_entry(algorithm, collective) != nullptr;
}

bool applicable(const Params& params, std::string* why) {
  return validate(params, why) && detail::hier_applicable(params, why);
}

bool build(const Params& params, Program* program, std::string* error) {
  *program = Program{};
  if (!applicable(params, error)) return false;
  detail::Emitter emitter(program);
  const Collective c = params.collective;
  if (c != Collective::AllToAllv && c != Collective::Barrier && params.count == 0) return true;
  if (params.nranks == 1) {
    // A single rank only moves its own data, if at all.
    const bool v = c == Collective::AllToAllv;
    const uint64_t count = c == Collective::Barrier ? 0 : v ? params.send_counts[0] : params.count;
    const uint64_t from = v ? params.send_displs[0] : 0;
    const uint64_t to = v ? params.recv_displs[0] : 0;
    if (!params.in_place && count > 0) {
      emitter.copy(detail::at(Buf::Output, to, count), detail::at(Buf::Input, from, count));
    }
    return true;
  }
  find_entry(params.algorithm, params.collective)->builder(params, emitter);
  return true;
}

}  // namespace weft::algo
