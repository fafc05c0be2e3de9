// The fault matrix: a victim (the rank hosting the bootstrap root, or another)
// is killed (SIGKILL) or stopped (SIGSTOP) just before a phase; every survivor
// must get an error from that phase within the timeout plus a small constant,
// naming the victim, and no shared-memory name of the ranks may be left.
//
// Each survivor prints one line per cell ("fault-matrix: ..."), which
// docs/reliability.md's table is collected from (scripts/fault-matrix.sh).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRanks = 3;
constexpr int kTimeoutMs = 1500;
constexpr const char* kTimeoutText = "1500";
// What a survivor may take beyond the timeout: noticing, reporting, oversubscribed cores.
constexpr double kSlackSeconds = 2.0;

enum class Phase { Init, Split, Blocking, Stream, Group, Direct, Registered };

struct Cell {
  int victim;
  int signal;
  Phase phase;
};

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Init:
      return "init";
    case Phase::Split:
      return "split";
    case Phase::Blocking:
      return "blocking_allreduce";
    case Phase::Stream:
      return "stream_allreduce";
    case Phase::Group:
      return "group_sendrecv";
    case Phase::Direct:
      return "direct_path";
    case Phase::Registered:
      return "registered_zero_copy";
  }
  return "?";
}

std::string cell_name(const Cell& cell) {
  return std::string(cell.victim == 0 ? "root" : "nonroot") + "_" +
         (cell.signal == SIGKILL ? "kill" : "stop") + "_" + phase_name(cell.phase);
}

// For gtest's test names and messages (ctest shows them).
void PrintTo(const Cell& cell, std::ostream* out) {
  *out << cell_name(cell);
}

// The forced algorithms of each phase: the message path, or the direct path.
const char* algorithms_of(Phase phase) {
  switch (phase) {
    case Phase::Blocking:
      return "allreduce:ring";
    case Phase::Direct:
    case Phase::Registered:
      return "allreduce:oneshot";
    default:
      return nullptr;
  }
}

// Every rank but the victim sends it a token; the victim returns once it has them all, so
// every survivor is past its warm-up when the fault comes.
void meet_victim(weftComm_t comm, int rank, int victim) {
  int token = rank;
  if (rank != victim) {
    ASSERT_EQ(weftSend(&token, 1, weftInt32, victim, comm, nullptr), weftSuccess)
        << weftGetLastError(comm);
    return;
  }
  for (int peer = 0; peer < kRanks; ++peer) {
    if (peer != victim) {
      ASSERT_EQ(weftRecv(&token, 1, weftInt32, peer, comm, nullptr), weftSuccess)
          << weftGetLastError(comm);
    }
  }
}

// Runs the phase on a survivor; returns its status (the error message is left in `error`).
weftResult_t run_phase(Phase phase, weftComm_t comm, int rank, std::string* error) {
  std::vector<float> data(1024, 1.0f);
  weftResult_t result = weftSuccess;
  switch (phase) {
    case Phase::Init:
      return weftInternalError;  // run by the caller
    case Phase::Split: {
      weftComm_t half = nullptr;
      result = weftCommSplit(comm, 0, rank, &half, nullptr);
      if (result == weftSuccess) weftCommDestroy(half);
      break;
    }
    case Phase::Blocking:
    case Phase::Direct:
      result =
          weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm, nullptr);
      break;
    case Phase::Stream: {
      weftStream_t stream = nullptr;
      if (weftStreamCreate(&stream) != weftSuccess) return weftInternalError;
      result =
          weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm, stream);
      if (result == weftSuccess) result = weftStreamSynchronize(stream);
      *error = weftGetLastError(comm);
      weftStreamDestroy(stream);  // returns the stream's error again
      return result;
    }
    case Phase::Group: {
      // Every pair exchanges, so every survivor has a receive from the victim.
      std::vector<int> in(kRanks, -1);
      int mine = rank;
      weftGroupStart();
      for (int peer = 0; peer < kRanks; ++peer) {
        if (peer == rank) continue;
        weftSend(&mine, 1, weftInt32, peer, comm, nullptr);
        weftRecv(&in[peer], 1, weftInt32, peer, comm, nullptr);
      }
      result = weftGroupEnd();
      break;
    }
    case Phase::Registered:
      return weftInternalError;  // Registered::all_reduce
  }
  *error = weftGetLastError(comm);
  return result;
}

// Zero-copy needs every input in registered weftMemAlloc memory, above the staging limit; every
// rank (the victim too) registers before the fault.
class Registered {
 public:
  static constexpr size_t kCount = 64 << 10;
  explicit Registered(weftComm_t comm) : comm_(comm) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(weftMemAlloc(&buffers_[i], kCount * sizeof(float)), weftSuccess);
      EXPECT_EQ(weftCommRegister(comm, buffers_[i], kCount * sizeof(float), &handles_[i]),
                weftSuccess)
          << weftGetLastError(comm);
    }
  }
  ~Registered() {
    for (int i = 0; i < 2; ++i) {
      weftCommDeregister(comm_, handles_[i]);
      weftMemFree(buffers_[i]);
    }
  }
  weftResult_t all_reduce(std::string* error) {
    weftResult_t result =
        weftAllReduce(buffers_[0], buffers_[1], kCount, weftFloat32, weftSum, comm_, nullptr);
    *error = weftGetLastError(comm_);
    return result;
  }

 private:
  weftComm_t comm_;
  void* buffers_[2] = {nullptr, nullptr};
  void* handles_[2] = {nullptr, nullptr};
};

// /dev/shm names Weft made for these processes (every name carries its creator's pid) that
// were not there before (a name a dead process of another test left may carry a reused pid).
std::set<std::string> shm_names_of(const std::vector<pid_t>& pids,
                                   const std::set<std::string>& before = {}) {
  std::set<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name.rfind("weft", 0) != 0 || before.count(name) > 0) continue;
    bool ours = pids.empty();  // no pids: every name
    for (pid_t pid : pids)
      ours = ours || name.find("-" + std::to_string(pid) + "-") != std::string::npos;
    if (ours) names.insert(name);
  }
  closedir(dir);
  return names;
}

class FaultMatrix : public ::testing::TestWithParam<Cell> {};

TEST_P(FaultMatrix, SurvivorsFailWithinTheBoundNamingTheVictim) {
  const Cell cell = GetParam();
  const std::string name = cell_name(cell);
  RunOptions options;
  options.expected.assign(kRanks, ExpectedEnd{});
  options.expected[cell.victim].signal = SIGKILL;
  if (cell.signal == SIGSTOP) options.kill_after_others = {cell.victim};
  options.env = {{"WEFT_TIMEOUT_MS", kTimeoutText}};
  options.timeout_s = 60;
  std::string victim_prefix;
  // A killed process cannot remove its own names; the next process's first weftMemAlloc on
  // the node does. Anything else left behind is a leak.
  const std::set<std::string> before = shm_names_of({});
  std::set<std::string> left, left_after_sweep;
  options.on_end = [&](const std::vector<pid_t>& pids) {
    left = shm_names_of(pids, before);
    pid_t sweeper = fork();
    if (sweeper == 0) {
      void* probe = nullptr;
      _exit(weftMemAlloc(&probe, 1) == weftSuccess && weftMemFree(probe) == weftSuccess ? 0 : 1);
    }
    int status = -1;
    waitpid(sweeper, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    left_after_sweep = shm_names_of(pids, before);
    victim_prefix = "weft-mem-" + std::to_string(pids[cell.victim]) + "-";
  };
  run_ranks(
      kRanks,
      [&cell, &name](const RankContext& context) {
        weftConfig_t config = WEFT_CONFIG_INITIALIZER;
        config.timeoutMs = kTimeoutMs;
        if (const char* algorithms = algorithms_of(cell.phase)) config.algorithms = algorithms;
        const bool victim = context.rank == cell.victim;
        if (cell.phase == Phase::Init && victim) raise(cell.signal);
        weftComm_t comm = nullptr;
        weftResult_t result = weftSuccess;
        std::string error;
        auto start = Clock::now();
        if (cell.phase == Phase::Init) {
          result = weftCommInitRankConfig(&comm, kRanks, context.id, context.rank, &config);
          error = weftGetLastError(nullptr);
        } else {
          ASSERT_EQ(weftCommInitRankConfig(&comm, kRanks, context.id, context.rank, &config),
                    weftSuccess)
              << weftGetLastError(nullptr);
          std::optional<Registered> registered;
          if (cell.phase == Phase::Registered) registered.emplace(comm);
          meet_victim(comm, context.rank, cell.victim);
          if (victim) raise(cell.signal);
          start = Clock::now();
          result = registered ? registered->all_reduce(&error)
                              : run_phase(cell.phase, comm, context.rank, &error);
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        printf("fault-matrix: %s rank=%d seconds=%.3f result=%s error=%s\n", name.c_str(),
               context.rank, seconds, weftGetErrorString(result), error.c_str());
        EXPECT_NE(result, weftSuccess) << name;
        EXPECT_LT(seconds, kTimeoutMs / 1000.0 + kSlackSeconds) << name << ": " << error;
        EXPECT_NE(error.find("rank " + std::to_string(cell.victim)), std::string::npos)
            << name << ": the victim is not named: " << error;
        if (comm != nullptr) {
          EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        }
      },
      options);
  for (const std::string& entry : left)
    EXPECT_EQ(entry.rfind(victim_prefix, 0), 0u) << name << ": left in /dev/shm: " << entry;
  EXPECT_TRUE(left_after_sweep.empty())
      << name << ": left in /dev/shm after a sweep: " << *left_after_sweep.begin();
}

std::vector<Cell> all_cells() {
  std::vector<Cell> cells;
  for (int victim : {0, kRanks - 1})
    for (int signal : {SIGKILL, SIGSTOP})
      for (Phase phase : {Phase::Init, Phase::Split, Phase::Blocking, Phase::Stream, Phase::Group,
                          Phase::Direct, Phase::Registered})
        cells.push_back({victim, signal, phase});
  return cells;
}

INSTANTIATE_TEST_SUITE_P(Cells, FaultMatrix, ::testing::ValuesIn(all_cells()),
                         [](const ::testing::TestParamInfo<Cell>& info) {
                           return cell_name(info.param);
                         });

}  // namespace
}  // namespace weft::testing
