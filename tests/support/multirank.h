// Multi-rank tests with real processes: the body runs in N forked children,
// rank 0 makes the unique id and hands it to the others through pipes, and
// the parent checks how every child ended. A child reports its gtest
// failures through its exit status.
#pragma once

#include <functional>
#include <vector>

#include "weft/weft.h"

namespace weft::testing {

struct RankContext {
  int rank;
  int nranks;
  weftUniqueId id;
};

// How a child is expected to end: exit code, or a signal.
struct ExpectedEnd {
  int exit_code = 0;
  int signal = 0;
};

struct RunOptions {
  // Per-rank expectations; empty means every rank exits 0.
  std::vector<ExpectedEnd> expected;
  // The parent kills every child and fails the test after this long.
  int timeout_s = 90;
  // Rank 0 makes a unique id for the others (off for tests that init from env).
  bool make_unique_id = true;
  // Environment set in every child before the body runs.
  std::vector<std::pair<const char*, const char*>> env;
};

void run_ranks(int nranks, const std::function<void(const RankContext&)>& body,
               const RunOptions& options = {});

// Initialises a communicator for the context (asserting success).
weftComm_t init_comm(const RankContext& context, int timeout_ms = 0);

// A TCP port on 127.0.0.1 that was free a moment ago (for WEFT_ROOT in tests).
int free_loopback_port();

// A unique value per (rank, index) that fits every dtype exactly after truncation.
inline int64_t pattern_value(int rank, size_t index) {
  return static_cast<int64_t>((rank * 131 + index * 7 + 3) % 113);
}

}  // namespace weft::testing
