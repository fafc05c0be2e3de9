// The fault matrix: a victim (the rank hosting the bootstrap root, or another)
// is killed (SIGKILL) or stopped (SIGSTOP) just before a phase; every survivor
// must get an error from that phase within the timeout plus a small constant,
// naming the victim, and no shared-memory name of the ranks may be left. Two
// victims at once (the root's host and another, or two others, of 4 ranks):
// every survivor names one of them.
//
// Each survivor prints one line per cell ("fault-matrix: ..."), which
// docs/reliability.md's table is collected from (scripts/fault-matrix.sh).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 1500;
constexpr const char* kTimeoutText = "1500";
// What a survivor may take beyond the timeout: noticing, reporting, oversubscribed cores.
constexpr double kSlackSeconds = 2.0;

enum class Phase { Init, Split, Blocking, Stream, Group, Direct, Registered };

struct Cell {
  std::vector<int> victims;  // ascending
  int signal;
  Phase phase;
  // One victim among 3 ranks, two among 4.
  int ranks() const { return victims.size() == 1 ? 3 : 4; }
  bool is_victim(int rank) const {
    return std::find(victims.begin(), victims.end(), rank) != victims.end();
  }
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

std::string victims_name(const std::vector<int>& victims) {
  if (victims.size() == 1) return victims[0] == 0 ? "root" : "nonroot";
  return victims[0] == 0 ? "root_and_nonroot" : "two_nonroots";
}

std::string cell_name(const Cell& cell) {
  return victims_name(cell.victims) + "_" + (cell.signal == SIGKILL ? "kill" : "stop") + "_" +
         phase_name(cell.phase);
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

// Every survivor sends each victim a token; a victim returns once it has them all, and once
// every other victim has them too (they exchange tokens then), so every survivor is past its
// warm-up when the first fault comes.
void meet_victims(weftComm_t comm, int rank, const Cell& cell) {
  int token = rank;
  if (!cell.is_victim(rank)) {
    for (int victim : cell.victims)
      ASSERT_EQ(weftSend(&token, 1, weftInt32, victim, comm, nullptr), weftSuccess)
          << weftGetLastError(comm);
    return;
  }
  for (int peer = 0; peer < cell.ranks(); ++peer) {
    if (!cell.is_victim(peer)) {
      ASSERT_EQ(weftRecv(&token, 1, weftInt32, peer, comm, nullptr), weftSuccess)
          << weftGetLastError(comm);
    }
  }
  std::vector<int> tokens(cell.victims.size());
  weftGroupStart();
  for (size_t v = 0; v < cell.victims.size(); ++v) {
    if (cell.victims[v] == rank) continue;
    weftSend(&token, 1, weftInt32, cell.victims[v], comm, nullptr);
    weftRecv(&tokens[v], 1, weftInt32, cell.victims[v], comm, nullptr);
  }
  // Once a victim has its tokens, another victim's fault may fail this exchange: no matter.
  (void)weftGroupEnd();
}

// Whether `error` names one of the cell's victims: "rank 2", or in a list, "ranks 2, 3".
bool names_a_victim(const std::string& error, const Cell& cell) {
  static const std::regex kRanks(R"(\branks? ((?:\d+, )*\d+))");
  for (std::sregex_iterator it(error.begin(), error.end(), kRanks), end; it != end; ++it) {
    std::istringstream list((*it)[1].str());
    std::string number;
    while (std::getline(list, number, ','))
      if (cell.is_victim(std::stoi(number))) return true;
  }
  return false;
}

// Runs the phase on a survivor; returns its status (the error message is left in `error`).
weftResult_t run_phase(Phase phase, weftComm_t comm, int rank, int nranks, std::string* error) {
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
      std::vector<int> in(nranks, -1);
      int mine = rank;
      weftGroupStart();
      for (int peer = 0; peer < nranks; ++peer) {
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
  const int nranks = cell.ranks();
  RunOptions options;
  options.expected.assign(nranks, ExpectedEnd{});
  for (int victim : cell.victims) options.expected[victim].signal = SIGKILL;
  if (cell.signal == SIGSTOP) options.kill_after_others = cell.victims;
  options.env = {{"WEFT_TIMEOUT_MS", kTimeoutText}};
  options.timeout_s = 60;
  std::vector<std::string> victim_prefixes;
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
    for (int victim : cell.victims)
      victim_prefixes.push_back("weft-mem-" + std::to_string(pids[victim]) + "-");
  };
  run_ranks(
      nranks,
      [&cell, &name, nranks](const RankContext& context) {
        weftConfig_t config = WEFT_CONFIG_INITIALIZER;
        config.timeoutMs = kTimeoutMs;
        if (const char* algorithms = algorithms_of(cell.phase)) config.algorithms = algorithms;
        const bool victim = cell.is_victim(context.rank);
        if (cell.phase == Phase::Init && victim) raise(cell.signal);
        weftComm_t comm = nullptr;
        weftResult_t result = weftSuccess;
        std::string error;
        auto start = Clock::now();
        if (cell.phase == Phase::Init) {
          result = weftCommInitRankConfig(&comm, nranks, context.id, context.rank, &config);
          error = weftGetLastError(nullptr);
        } else {
          ASSERT_EQ(weftCommInitRankConfig(&comm, nranks, context.id, context.rank, &config),
                    weftSuccess)
              << weftGetLastError(nullptr);
          std::optional<Registered> registered;
          if (cell.phase == Phase::Registered) registered.emplace(comm);
          meet_victims(comm, context.rank, cell);
          if (victim) raise(cell.signal);
          start = Clock::now();
          result = registered ? registered->all_reduce(&error)
                              : run_phase(cell.phase, comm, context.rank, nranks, &error);
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        printf("fault-matrix: %s rank=%d seconds=%.3f result=%s error=%s\n", name.c_str(),
               context.rank, seconds, weftGetErrorString(result), error.c_str());
        EXPECT_NE(result, weftSuccess) << name;
        EXPECT_LT(seconds, kTimeoutMs / 1000.0 + kSlackSeconds) << name << ": " << error;
        EXPECT_TRUE(names_a_victim(error, cell)) << name << ": no victim is named: " << error;
        if (comm != nullptr) {
          EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        }
      },
      options);
  for (const std::string& entry : left) {
    bool victims_own = false;
    for (const std::string& prefix : victim_prefixes)
      victims_own = victims_own || entry.rfind(prefix, 0) == 0;
    EXPECT_TRUE(victims_own) << name << ": left in /dev/shm: " << entry;
  }
  EXPECT_TRUE(left_after_sweep.empty())
      << name << ": left in /dev/shm after a sweep: " << *left_after_sweep.begin();
}

std::vector<Cell> all_cells() {
  std::vector<Cell> cells;
  const std::vector<std::vector<int>> victim_sets = {{0}, {2}, {0, 3}, {2, 3}};
  for (const std::vector<int>& victims : victim_sets)
    for (int signal : {SIGKILL, SIGSTOP})
      for (Phase phase : {Phase::Init, Phase::Split, Phase::Blocking, Phase::Stream, Phase::Group,
                          Phase::Direct, Phase::Registered})
        cells.push_back({victims, signal, phase});
  return cells;
}

INSTANTIATE_TEST_SUITE_P(Cells, FaultMatrix, ::testing::ValuesIn(all_cells()),
                         [](const ::testing::TestParamInfo<Cell>& info) {
                           return cell_name(info.param);
                         });

}  // namespace
}  // namespace weft::testing
