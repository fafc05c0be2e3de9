// The (algorithm, collective) pairs build() implements, for parameterised
// tests, with readable names.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/schedule.h"

namespace weft::algo {

inline void PrintTo(Algorithm a, std::ostream* os) {
  *os << algorithm_name(a);
}
inline void PrintTo(Collective c, std::ostream* os) {
  *os << collective_name(c);
}

using Pair = std::pair<Algorithm, Collective>;

inline std::vector<Pair> supported_pairs() {
  std::vector<Pair> pairs;
  for (int c = 0; c < kNumCollectives; ++c) {
    for (int a = 0; a < kNumAlgorithms; ++a) {
      if (supports(Algorithm(a), Collective(c)) && !is_direct(Algorithm(a)))
        pairs.push_back({Algorithm(a), Collective(c)});
    }
  }
  return pairs;
}

inline std::string pair_name(const ::testing::TestParamInfo<Pair>& info) {
  return std::string(algorithm_name(info.param.first)) + "_" + collective_name(info.param.second);
}

}  // namespace weft::algo
