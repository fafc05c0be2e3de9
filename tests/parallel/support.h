// Helpers shared by the adapter-layer tests: a communicator per rank, a
// deterministic random source, and closeness checks for floats.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/parallel.hpp"

namespace weft::testing {

inline weft::Comm world_of(const RankContext& context) {
  return weft::Comm::init(context.nranks, weft::UniqueId::from_bytes(context.id), context.rank,
                          weft::Config().timeout_ms(60000));
}

// A mesh with every rank on tp.
inline parallel::Mesh tp_mesh(const weft::Comm& world) {
  parallel::MeshShape shape;
  shape.tp = world.size();
  return parallel::Mesh(world, shape);
}

// Values in [-1, 1) from a seed, the same on every rank.
inline std::vector<float> random_floats(size_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& value : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    value = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return values;
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double error =
        std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(static_cast<double>(want[i])));
    if (!(error <= worst)) {
      worst = error;
      at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << at << " is " << got[at] << ", expected "
                              << want[at];
}

// f throws a weft::Error (weftInvalidArgument) whose message contains text.
inline void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error for " << text;
  } catch (const weft::Error& error) {
    EXPECT_EQ(error.code(), weftInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
  }
}

}  // namespace weft::testing
