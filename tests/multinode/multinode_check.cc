// A Weft program for the multi-node tests: started once per rank (in network
// namespaces standing for hosts) with WEFT_RANK/WEFT_NRANKS/WEFT_ROOT, it
// checks that the ranks really sit on the expected number of hosts, then
//   check: runs every collective and grouped Send/Recv with exact integer
//          checks, exit 0 when all match, 1 on a mismatch;
//   twolevel: the same checks for the hier and leader schedules, forced;
//   mismatch: calls that differ on one rank, each failing every rank naming both;
//   fault: runs an operation in a loop until it fails (a host was killed or cut
//          off): a split, a blocking AllReduce, one on a stream, or a group of
//          Send/Recv between every pair (or, for init, expects the init to
//          fail); prints the error and exits 3; exit 4 if nothing failed.
// A failed call exits 3 in both modes. Public API only (weft/weft.h), plus the
// topology library for the cluster view.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "topo/cluster_view.h"
#include "topo/discover.h"
#include "topo/shapes.h"
#include "weft/weft.h"

namespace {

constexpr int kMismatchExit = 1;
constexpr int kCallFailedExit = 3;
constexpr int kNoFailureExit = 4;
constexpr int kUsageExit = 2;

int g_rank = -1;

[[noreturn]] void call_failed(weftComm_t comm, const char* what, weftResult_t result,
                              const std::string& context) {
  fprintf(stderr, "rank %d: %s failed%s: %s: %s\n", g_rank, what, context.c_str(),
          weftGetErrorString(result), weftGetLastError(comm));
  fflush(stderr);
  if (comm != nullptr) weftCommAbort(comm);
  _exit(kCallFailedExit);
}

void must(weftComm_t comm, weftResult_t result, const char* what) {
  if (result != weftSuccess) call_failed(comm, what, result, "");
}

// Rank q's input element i: small, so int32 sums over any rank count are exact.
int32_t value(int q, size_t i) {
  return static_cast<int32_t>((q * 37 + 11) % 101 + static_cast<int32_t>(i % 1009) * 3);
}

class Checker {
 public:
  Checker(weftComm_t comm, int rank, int nranks) : comm_(comm), rank_(rank), n_(nranks) {}
  int failures() const { return failures_; }
  int checks() const { return checks_; }

  void run_all(size_t count, int root) {
    all_reduce(count);
    reduce_scatter(count);
    all_gather(count);
    broadcast(count, root);
    reduce(count, root);
    all_to_all(count);
    all_to_allv(count);
    gather(count, root);
    scatter(count, root);
    send_recv(count);
    max_int64(count);
    must(comm_, weftBarrier(comm_, nullptr), "weftBarrier");
  }

  // The collectives the two-level schedules implement on uneven hosts.
  void run_two_level(size_t count, int root) {
    all_reduce(count);
    broadcast(count, root);
    reduce(count, root);
  }

 private:
  std::vector<int32_t> input(size_t count, size_t offset = 0) const {
    std::vector<int32_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = value(rank_, offset + i);
    return data;
  }
  int32_t sum(size_t i) const {
    int32_t total = 0;
    for (int q = 0; q < n_; ++q) total += value(q, i);
    return total;
  }
  // Compares got[i] with want(i) for every i; reports the first mismatch.
  void expect(const char* what, size_t count, const int32_t* got,
              const std::function<int32_t(size_t)>& want) {
    ++checks_;
    for (size_t i = 0; i < count; ++i) {
      if (got[i] == want(i)) continue;
      ++failures_;
      fprintf(stderr, "rank %d: %s count %zu: element %zu is %d, want %d\n", rank_, what, count, i,
              got[i], want(i));
      return;
    }
  }

  void all_reduce(size_t count) {
    std::vector<int32_t> data = input(count);
    must(comm_, weftAllReduce(data.data(), data.data(), count, weftInt32, weftSum, comm_, nullptr),
         "weftAllReduce");
    expect("allreduce", count, data.data(), [&](size_t i) { return sum(i); });
  }
  void reduce_scatter(size_t count) {
    std::vector<int32_t> in = input(count * n_), out(count);
    must(comm_, weftReduceScatter(in.data(), out.data(), count, weftInt32, weftSum, comm_, nullptr),
         "weftReduceScatter");
    expect("reducescatter", count, out.data(), [&](size_t i) { return sum(rank_ * count + i); });
  }
  void all_gather(size_t count) {
    std::vector<int32_t> in = input(count), out(count * n_);
    must(comm_, weftAllGather(in.data(), out.data(), count, weftInt32, comm_, nullptr),
         "weftAllGather");
    expect("allgather", count * n_, out.data(),
           [&](size_t i) { return value(static_cast<int>(i / count), i % count); });
  }
  void broadcast(size_t count, int root) {
    std::vector<int32_t> data = rank_ == root ? input(count) : std::vector<int32_t>(count, -1);
    must(comm_, weftBroadcast(data.data(), data.data(), count, weftInt32, root, comm_, nullptr),
         "weftBroadcast");
    expect("broadcast", count, data.data(), [&](size_t i) { return value(root, i); });
  }
  void reduce(size_t count, int root) {
    std::vector<int32_t> in = input(count), out(count, -1);
    must(comm_, weftReduce(in.data(), out.data(), count, weftInt32, weftSum, root, comm_, nullptr),
         "weftReduce");
    if (rank_ == root) expect("reduce", count, out.data(), [&](size_t i) { return sum(i); });
  }
  void all_to_all(size_t count) {
    std::vector<int32_t> in = input(count * n_), out(count * n_);
    must(comm_, weftAllToAll(in.data(), out.data(), count, weftInt32, comm_, nullptr),
         "weftAllToAll");
    expect("alltoall", count * n_, out.data(),
           [&](size_t i) { return value(static_cast<int>(i / count), rank_ * count + i % count); });
  }
  // Uneven counts, some zero, packed with a one-element gap.
  static size_t v_count(size_t base, int from, int to) {
    return (from + 2 * to) % 3 == 0 ? 0 : base + static_cast<size_t>((from * 5 + to * 3) % 7);
  }
  void all_to_allv(size_t count) {
    std::vector<size_t> scount(n_), sdispl(n_), rcount(n_), rdispl(n_);
    size_t stotal = 0, rtotal = 0;
    for (int p = 0; p < n_; ++p) {
      scount[p] = v_count(count, rank_, p);
      sdispl[p] = stotal;
      stotal += scount[p] + 1;
      rcount[p] = v_count(count, p, rank_);
      rdispl[p] = rtotal;
      rtotal += rcount[p] + 1;
    }
    std::vector<int32_t> in = input(stotal), out(rtotal, -1);
    must(comm_,
         weftAllToAllv(in.data(), scount.data(), sdispl.data(), out.data(), rcount.data(),
                       rdispl.data(), weftInt32, comm_, nullptr),
         "weftAllToAllv");
    for (int q = 0; q < n_; ++q) {
      // Where q's block for this rank starts in q's send buffer.
      size_t offset = 0;
      for (int p = 0; p < rank_; ++p) offset += v_count(count, q, p) + 1;
      expect("alltoallv", rcount[q], out.data() + rdispl[q],
             [&](size_t i) { return value(q, offset + i); });
    }
  }
  void gather(size_t count, int root) {
    std::vector<int32_t> in = input(count), out(rank_ == root ? count * n_ : 0);
    must(comm_, weftGather(in.data(), out.data(), count, weftInt32, root, comm_, nullptr),
         "weftGather");
    if (rank_ == root)
      expect("gather", count * n_, out.data(),
             [&](size_t i) { return value(static_cast<int>(i / count), i % count); });
  }
  void scatter(size_t count, int root) {
    std::vector<int32_t> in = rank_ == root ? input(count * n_) : std::vector<int32_t>(),
                         out(count);
    must(comm_, weftScatter(in.data(), out.data(), count, weftInt32, root, comm_, nullptr),
         "weftScatter");
    expect("scatter", count, out.data(), [&](size_t i) { return value(root, rank_ * count + i); });
  }
  // Both ring directions at once, grouped: needs group semantics not to deadlock.
  void send_recv(size_t count) {
    int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
    std::vector<int32_t> out_next = input(count), out_prev = input(count, 1);
    std::vector<int32_t> from_prev(count, -1), from_next(count, -1);
    must(comm_, weftGroupStart(), "weftGroupStart");
    must(comm_, weftSend(out_next.data(), count, weftInt32, next, comm_, nullptr), "weftSend");
    must(comm_, weftSend(out_prev.data(), count, weftInt32, prev, comm_, nullptr), "weftSend");
    must(comm_, weftRecv(from_prev.data(), count, weftInt32, prev, comm_, nullptr), "weftRecv");
    must(comm_, weftRecv(from_next.data(), count, weftInt32, next, comm_, nullptr), "weftRecv");
    must(comm_, weftGroupEnd(), "weftGroupEnd");
    expect("sendrecv from prev", count, from_prev.data(), [&](size_t i) { return value(prev, i); });
    expect("sendrecv from next", count, from_next.data(),
           [&](size_t i) { return value(next, 1 + i); });
  }
  void max_int64(size_t count) {
    std::vector<int64_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = (int64_t{value(rank_, i)} << 33) + rank_;
    must(comm_, weftAllReduce(data.data(), data.data(), count, weftInt64, weftMax, comm_, nullptr),
         "weftAllReduce(int64 max)");
    ++checks_;
    for (size_t i = 0; i < count; ++i) {
      int64_t want = INT64_MIN;
      for (int q = 0; q < n_; ++q) want = std::max(want, (int64_t{value(q, i)} << 33) + q);
      if (data[i] != want) {
        ++failures_;
        fprintf(stderr, "rank %d: allreduce int64 max: element %zu is %lld, want %lld\n", rank_, i,
                static_cast<long long>(data[i]), static_cast<long long>(want));
        return;
      }
    }
  }

  weftComm_t comm_;
  int rank_, n_;
  int failures_ = 0, checks_ = 0;
};

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// Every rank's host name and place; checks the host count and prints the
// cluster view, ring and tree the topology library derives from them.
bool check_hosts(weftComm_t comm, int rank, int nranks, int expected_hosts) {
  struct Entry {
    char host[64];
    weft::topo::RankPlace place;
  } mine{};
  gethostname(mine.host, sizeof(mine.host) - 1);
  weft::topo::Machine machine;
  std::vector<int> binding;
  if (weft::topo::discover_local(&machine).ok() && weft::topo::process_binding(&binding).ok())
    mine.place = weft::topo::local_place(machine, binding, fnv1a(mine.host), -1);
  else
    mine.place.node_key = fnv1a(mine.host);
  std::vector<Entry> all(nranks);
  must(comm, weftAllGather(&mine, all.data(), sizeof(Entry), weftUint8, comm, nullptr),
       "weftAllGather(hosts)");
  std::vector<weft::topo::RankPlace> places;
  for (const Entry& entry : all) places.push_back(entry.place);
  weft::topo::ClusterView view(places);
  if (rank == 0) {
    printf("rank 0: %d ranks on %d hosts:", nranks, view.nnodes());
    for (int node = 0; node < view.nnodes(); ++node) {
      printf(" %s{", all[view.node_ranks(node).front()].host);
      for (int r : view.node_ranks(node))
        printf(r == view.node_ranks(node).front() ? "%d" : ",%d", r);
      printf("}");
    }
    printf("\nrank 0: topology-aware ring:");
    for (int r : weft::topo::ring_order(view)) printf(" %d", r);
    printf("\n");
  }
  if (view.nnodes() != expected_hosts) {
    fprintf(stderr, "rank %d: the ranks sit on %d hosts, expected %d\n", rank, view.nnodes(),
            expected_hosts);
    return false;
  }
  return true;
}

// Every collective with the algorithms the tuner picks.
int check_mode(weftComm_t comm, int rank, int nranks) {
  Checker checker(comm, rank, nranks);
  // Large enough for UCX's rendezvous protocol, odd so nothing divides evenly.
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 18) + 3})
    checker.run_all(count, static_cast<int>(count % nranks));
  printf("rank %d: %d checks, %d mismatches\n", rank, checker.checks(), checker.failures());
  return checker.failures() == 0 ? 0 : kMismatchExit;
}

// The two-level schedules, forced on a split of the same ranks. The hosts
// are uneven, where hier applies to AllReduce, Broadcast and Reduce only.
int two_level_mode(weftComm_t comm, int rank, int nranks) {
  int failures = 0, checks = 0;
  for (const std::string family : {"hier", "leader"}) {
    const std::string spec = "allreduce:" + family + ",broadcast:" + family + ",reduce:" + family;
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.algorithms = spec.c_str();
    weftComm_t forced = nullptr;
    must(comm, weftCommSplit(comm, 0, rank, &forced, &config), "weftCommSplit");
    Checker two_level(forced, rank, nranks);
    for (size_t count : {size_t{1}, size_t{1000}, (size_t{1} << 18) + 3}) {
      two_level.run_two_level(count, static_cast<int>((count + 1) % nranks));
      const char* used = nullptr;
      must(forced, weftCommLastAlgorithm(forced, &used, nullptr), "weftCommLastAlgorithm");
      if (family != used) {
        fprintf(stderr, "rank %d: forced %s but the communicator ran %s\n", rank, family.c_str(),
                used);
        ++failures;
      }
    }
    failures += two_level.failures();
    checks += two_level.checks();
    must(forced, weftCommDestroy(forced), "weftCommDestroy");
  }
  printf("rank %d: %d checks, %d mismatches\n", rank, checks, failures);
  return failures == 0 ? 0 : kMismatchExit;
}

// What a fault test's ranks do when the fault comes: initialise (the fault comes first), split,
// a blocking AllReduce, an AllReduce queued on a stream, or a group in which every rank sends to
// and receives from every other.
enum class FaultPhase { Init, Split, Blocking, Stream, Group };

bool parse_fault_phase(const char* text, FaultPhase* phase) {
  if (strcmp(text, "init") == 0)
    *phase = FaultPhase::Init;
  else if (strcmp(text, "split") == 0)
    *phase = FaultPhase::Split;
  else if (strcmp(text, "blocking") == 0)
    *phase = FaultPhase::Blocking;
  else if (strcmp(text, "stream") == 0)
    *phase = FaultPhase::Stream;
  else if (strcmp(text, "group") == 0)
    *phase = FaultPhase::Group;
  else
    return false;
  return true;
}

// Runs the phase's operation in a loop until it fails (a host was killed or cut off): prints
// "rank R: OPERATION failed at iteration N: ..." and exits 3. Every result is checked exactly.
// With `healed_file` (a cut that heals within the timeout) nothing may fail: once every rank
// has seen that file (an AllReduce of the ranks' flags after each iteration, so all stop at
// the same iteration), 20 more iterations and the rank prints "rank R: N iterations, none
// failed" and returns 0.
int fault_mode(weftComm_t comm, int rank, int nranks, const char* ready_file, FaultPhase phase,
               const char* healed_file) {
  const size_t count = 1 << 14;
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  weftStream_t stream = nullptr;
  if (phase == FaultPhase::Stream) must(comm, weftStreamCreate(&stream), "weftStreamCreate");
  const char* what = phase == FaultPhase::Split    ? "weftCommSplit"
                     : phase == FaultPhase::Group  ? "grouped weftSend/weftRecv"
                     : phase == FaultPhase::Stream ? "weftAllReduce on a stream"
                                                   : "weftAllReduce";
  std::vector<int32_t> data(count);
  std::vector<std::vector<int32_t>> received(nranks, std::vector<int32_t>(count));
  long last_iteration = -1;  // set once every rank has seen the heal
  for (long iteration = 0; Clock::now() - start < std::chrono::seconds(30); ++iteration) {
    if (healed_file != nullptr && last_iteration < 0) {
      int32_t seen = access(healed_file, F_OK) == 0, all = 0;
      const weftResult_t agreed = weftAllReduce(&seen, &all, 1, weftInt32, weftMin, comm, nullptr);
      if (agreed != weftSuccess)
        call_failed(comm, "weftAllReduce of the heal flags", agreed,
                    " at iteration " + std::to_string(iteration));
      if (all == 1) last_iteration = iteration + 20;
    }
    if (iteration == last_iteration) {
      printf("rank %d: %ld iterations, none failed\n", rank, iteration);
      return 0;
    }
    for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
    weftResult_t result = weftSuccess;
    if (phase == FaultPhase::Split) {
      // Every rank in one new communicator (a split's whole work: bootstrap, transport).
      weftComm_t split = nullptr;
      int size = 0;
      result = weftCommSplit(comm, 0, rank, &split, nullptr);
      if (result == weftSuccess) {
        must(split, weftCommCount(split, &size), "weftCommCount");
        must(split, weftCommDestroy(split), "weftCommDestroy");
        if (size != nranks) {
          fprintf(stderr, "rank %d: split of %d ranks has %d\n", rank, nranks, size);
          return kMismatchExit;
        }
      }
    } else if (phase == FaultPhase::Group) {
      weftGroupStart();
      for (int peer = 0; peer < nranks; ++peer) {
        if (peer == rank) continue;
        weftSend(data.data(), count, weftInt32, peer, comm, nullptr);
        weftRecv(received[peer].data(), count, weftInt32, peer, comm, nullptr);
      }
      result = weftGroupEnd();
    } else {
      result = weftAllReduce(data.data(), data.data(), count, weftInt32, weftSum, comm, stream);
      if (result == weftSuccess && stream != nullptr) result = weftStreamSynchronize(stream);
    }
    if (result != weftSuccess)
      call_failed(comm, what, result, " at iteration " + std::to_string(iteration));
    for (int peer = 0; peer < nranks && phase != FaultPhase::Split; ++peer) {
      if (phase == FaultPhase::Group && peer == rank) continue;
      for (size_t i = 0; i < count; ++i) {
        int32_t want = 0, got = phase == FaultPhase::Group ? received[peer][i] : data[i];
        if (phase == FaultPhase::Group) {
          want = value(peer, i);
        } else {
          for (int q = 0; q < nranks; ++q) want += value(q, i);
        }
        if (got != want) {
          fprintf(stderr, "rank %d: iteration %ld: element %zu is %d, want %d\n", rank, iteration,
                  i, got, want);
          return kMismatchExit;
        }
      }
      if (phase != FaultPhase::Group) break;  // one result to check
    }
    // Splits take much longer than the operations: fewer of them warm up.
    if (iteration == (phase == FaultPhase::Split ? 2 : 20))
      std::ofstream(std::string(ready_file) + "." + std::to_string(rank)) << "\n";
  }
  fprintf(stderr, "rank %d: no failure within 30 s\n", rank);
  return kNoFailureExit;
}

// Mismatched calls across hosts (docs/reliability.md, "Across nodes"): in a fresh split per
// case, a call made alike, then one that differs on one rank (count, collective, datatype of
// the same size, root), then an AllReduce (a rank whose different call only sent finishes
// it). Every rank must fail with weftInvalidUsage naming both calls, long before the timeout.
int mismatch_mode(weftComm_t comm, int rank) {
  struct Case {
    const char* name;
    int odd_rank;
    const char *odd_call, *usual_call;
  };
  const Case cases[] = {
      {"count", 2, "allreduce(count=2000, int32, sum)", "allreduce(count=1000, int32, sum)"},
      {"collective", 4, "allgather(count=1000, int32)", "allreduce(count=1000, int32, sum)"},
      {"datatype", 1, "allreduce(count=1000, float, sum)", "allreduce(count=1000, int32, sum)"},
      {"root", 3, "broadcast(count=1000, int32, root 2)", "broadcast(count=1000, int32, root 0)"},
  };
  int failures = 0;
  std::vector<int32_t> data(8 * 2000, 1);
  for (const Case& c : cases) {
    weftComm_t split = nullptr;
    must(comm, weftCommSplit(comm, 0, rank, &split, nullptr), "weftCommSplit");
    auto call = [&](bool odd) {
      const std::string name = c.name;
      if (name == "count")
        return weftAllReduce(data.data(), data.data(), odd ? 2000 : 1000, weftInt32, weftSum, split,
                             nullptr);
      if (name == "collective")
        return odd ? weftAllGather(data.data(), data.data() + 1000, 1000, weftInt32, split, nullptr)
                   : weftAllReduce(data.data(), data.data(), 1000, weftInt32, weftSum, split,
                                   nullptr);
      if (name == "datatype")
        return weftAllReduce(data.data(), data.data(), 1000, odd ? weftFloat32 : weftInt32, weftSum,
                             split, nullptr);
      return weftBroadcast(data.data(), data.data(), 1000, weftInt32, odd ? 2 : 0, split, nullptr);
    };
    must(split, call(false), c.name);
    const auto start = std::chrono::steady_clock::now();
    weftResult_t result = call(rank == c.odd_rank);
    if (result == weftSuccess)
      result = weftAllReduce(data.data(), data.data(), 10, weftInt32, weftSum, split, nullptr);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Both ranks and both calls (the other rank: the lowest whose report the root had).
    const std::string message = weftGetLastError(split);
    const std::string odd = "rank " + std::to_string(c.odd_rank) + " called " + c.odd_call;
    const std::string usual = std::string(" called ") + c.usual_call;
    if (result != weftInvalidUsage ||
        message.find("mismatched collectives: ") == std::string::npos ||
        message.find(odd) == std::string::npos || message.find(usual) == std::string::npos ||
        message.find(", sequence 1") == std::string::npos) {
      fprintf(stderr,
              "rank %d: %s: got %s: %s\nrank %d: %s: want weftInvalidUsage naming %s and%s\n", rank,
              c.name, weftGetErrorString(result), message.c_str(), rank, c.name, odd.c_str(),
              usual.c_str());
      ++failures;
    } else {
      printf("rank %d: %s mismatch named after %.3f s\n", rank, c.name, seconds);
    }
    weftCommAbort(split);
  }
  printf("rank %d: %zu checks, %d mismatches\n", rank, std::size(cases), failures);
  return failures == 0 ? 0 : kMismatchExit;
}

}  // namespace

int main(int argc, char** argv) {
  FaultPhase phase = FaultPhase::Blocking;
  if (argc < 3 ||
      (strcmp(argv[1], "check") != 0 && strcmp(argv[1], "twolevel") != 0 &&
       strcmp(argv[1], "mismatch") != 0 && strcmp(argv[1], "fault") != 0) ||
      (strcmp(argv[1], "fault") == 0 &&
       (argc < 4 || (argc > 4 && !parse_fault_phase(argv[4], &phase))))) {
    fprintf(stderr,
            "usage: %s check HOSTS | twolevel HOSTS | mismatch HOSTS | fault HOSTS READY_FILE "
            "[init|split|blocking|stream|group [HEALED_FILE]]\n",
            argv[0]);
    return kUsageExit;
  }
  int expected_hosts = atoi(argv[2]);
  if (const char* env_rank = getenv("WEFT_RANK")) g_rank = atoi(env_rank);  // for init's error
  weftComm_t comm = nullptr;
  must(nullptr, weftCommInitFromEnv(&comm, nullptr), "weftCommInitFromEnv");
  if (strcmp(argv[1], "fault") == 0 && phase == FaultPhase::Init) {
    fprintf(stderr, "rank %d: init succeeded although the fault came first\n", g_rank);
    weftCommAbort(comm);
    return kNoFailureExit;
  }
  int rank = 0, nranks = 0;
  must(comm, weftCommUserRank(comm, &rank), "weftCommUserRank");
  must(comm, weftCommCount(comm, &nranks), "weftCommCount");
  g_rank = rank;
  if (!check_hosts(comm, rank, nranks, expected_hosts)) {
    weftCommAbort(comm);
    return kMismatchExit;
  }
  int code = strcmp(argv[1], "check") == 0      ? check_mode(comm, rank, nranks)
             : strcmp(argv[1], "twolevel") == 0 ? two_level_mode(comm, rank, nranks)
             : strcmp(argv[1], "mismatch") == 0
                 ? mismatch_mode(comm, rank)
                 : fault_mode(comm, rank, nranks, argv[3], phase, argc > 5 ? argv[5] : nullptr);
  fflush(stdout);
  if (code != 0) {
    weftCommAbort(comm);
    return code;
  }
  must(comm, weftCommDestroy(comm), "weftCommDestroy");
  return 0;
}
