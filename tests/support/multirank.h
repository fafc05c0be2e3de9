// Multi-rank tests with real processes: the body runs in N forked children,
// rank 0 makes the unique id and hands it to the others through pipes, and
// the parent checks how every child ended. A child reports its gtest
// failures through its exit status.
#pragma once

#include <sys/types.h>

#include <chrono>
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
  // Ranks the parent kills (SIGKILL) once every other rank has ended: stopped ones.
  std::vector<int> kill_after_others;
  // Called with every rank's pid once all have ended (and been reaped).
  std::function<void(const std::vector<pid_t>&)> on_end;
};

void run_ranks(int nranks, const std::function<void(const RankContext&)>& body,
               const RunOptions& options = {});

// Initialises a communicator for the context (asserting success).
weftComm_t init_comm(const RankContext& context, int timeout_ms = 0);

// A TCP port that was free a moment ago, as was the next one, below the ephemeral range (for
// WEFT_ROOT and MASTER_PORT in tests).
int free_loopback_port();

// A unique value per (rank, index) that fits every dtype exactly after truncation.
inline int64_t pattern_value(int rank, size_t index) {
  return static_cast<int64_t>((rank * 131 + index * 7 + 3) % 113);
}

// Seconds from `start` to now (for tests that bound how soon an error comes).
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace weft::testing
