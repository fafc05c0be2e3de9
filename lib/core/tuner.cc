#include "core/tuner.h"

#include <string_view>

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

// Messages of a pipelined schedule: big enough to amortise per-message cost,
// small enough that several are in flight.
constexpr uint64_t kChunkBytes = 512 << 10;

}  // namespace

Status parse_algorithm_overrides(const std::string& spec, const char* source,
                                 AlgorithmOverrides* out) {
  std::string_view rest(spec);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (entry.empty()) continue;
    size_t colon = entry.find(':');
    if (colon == std::string_view::npos)
      return Error(weftInvalidArgument, "%s entry '%.*s' is not collective:algorithm", source,
                   static_cast<int>(entry.size()), entry.data());
    algo::Collective collective;
    algo::Algorithm algorithm;
    std::string_view collective_name = entry.substr(0, colon);
    std::string_view algorithm_name = entry.substr(colon + 1);
    if (!algo::parse_collective(collective_name, &collective))
      return Error(weftInvalidArgument, "%s: unknown collective '%.*s' (valid: %s)", source,
                   static_cast<int>(collective_name.size()), collective_name.data(),
                   valid_collectives().c_str());
    if (!algo::parse_algorithm(algorithm_name, &algorithm) ||
        !algo::supports(algorithm, collective))
      return Error(weftInvalidArgument, "%s: '%.*s' is not an algorithm for %s (valid: %s)", source,
                   static_cast<int>(algorithm_name.size()), algorithm_name.data(),
                   algo::collective_name(collective), valid_algorithms(collective).c_str());
    out->forced[static_cast<int>(collective)] = static_cast<int>(algorithm);
  }
  return Status::Ok();
}

Plan plan_collective(algo::Collective collective, uint64_t bytes, size_t element_size, int nranks,
                     const AlgorithmOverrides& overrides) {
  using algo::Algorithm;
  using algo::Collective;
  Plan plan{Algorithm::Ring, kChunkBytes / element_size};
  int forced = overrides.forced[static_cast<int>(collective)];
  if (forced >= 0) {
    plan.algorithm = static_cast<Algorithm>(forced);
    return plan;
  }
  // Size thresholds: latency-bound algorithms for small messages, bandwidth-
  // bound ones for large. The tuner issue replaces these with a cost model.
  switch (collective) {
    case Collective::AllReduce:
      plan.algorithm = bytes <= (16 << 10)    ? Algorithm::Rd
                       : bytes <= (512 << 10) ? Algorithm::Rhd
                                              : Algorithm::Ring;
      break;
    case Collective::ReduceScatter:
      plan.algorithm = bytes * nranks <= (512 << 10) ? Algorithm::Rhd : Algorithm::Ring;
      break;
    case Collective::AllGather:
      plan.algorithm = bytes * nranks <= (64 << 10) ? Algorithm::Bruck : Algorithm::Ring;
      break;
    case Collective::Broadcast:
    case Collective::Reduce:
      plan.algorithm = bytes <= (256 << 10) ? Algorithm::Binomial : Algorithm::Chain;
      break;
    case Collective::AllToAll:
      plan.algorithm = bytes <= 1024 ? Algorithm::Bruck : Algorithm::Pairwise;
      break;
    case Collective::AllToAllv:
      plan.algorithm = Algorithm::Pairwise;
      break;
    case Collective::Gather:
    case Collective::Scatter:
      plan.algorithm = Algorithm::Binomial;
      break;
    case Collective::Barrier:
      plan.algorithm = Algorithm::Dissemination;
      break;
  }
  return plan;
}

}  // namespace weft
