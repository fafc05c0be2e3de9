// weft-comm-setup: what a communicator costs to create. Under weftrun, every
// rank splits the world communicator (all ranks, one color) `-s` times in a
// row, each split followed by its first AllReduce (checked exactly), keeping
// every communicator alive; it prints the milliseconds per split + first
// AllReduce (the slowest rank of each split) and the /dev/shm bytes the live
// communicators hold, per communicator and node-wide, then destroys them and
// checks that /dev/shm is back where it started.
//
//   weftrun -n 8 weft-comm-setup -s 50
//
// With WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=INIT every rank also logs the phases
// of each communicator's setup (bootstrap, UCX, shared memory);
// bench/perf/comm_setup.sh sums them.
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "weft/weft.h"

namespace {

// Bytes in use on the /dev/shm file system (shared by everything on the node).
double shm_used_bytes() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) return -1;
  return static_cast<double>(fs.f_blocks - fs.f_bfree) * static_cast<double>(fs.f_frsize);
}

// CPU time this process (all its threads) used so far, in ms.
double cpu_ms() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
}

bool check(weftResult_t result, weftComm_t comm, const char* what) {
  if (result == weftSuccess) return true;
  fprintf(stderr, "weft-comm-setup: %s failed: %s\n", what, weftGetLastError(comm));
  return false;
}

double max_over_ranks(weftComm_t world, double value) {
  weftAllReduce(&value, &value, 1, weftFloat64, weftMax, world, nullptr);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  int splits = 50;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
      splits = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: weft-comm-setup [-s splits]\n");
      return 2;
    }
  }
  if (splits < 1) {
    fprintf(stderr, "weft-comm-setup: -s must be at least 1\n");
    return 2;
  }
  weftComm_t world = nullptr;
  if (!check(weftCommInitFromEnv(&world, nullptr), nullptr, "init")) return 1;
  int rank = 0, nranks = 0;
  weftCommUserRank(world, &rank);
  weftCommCount(world, &nranks);

  float barrier = 0;
  weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
  const double shm_before = shm_used_bytes();
  std::vector<weftComm_t> comms;
  std::vector<double> ms;
  double cpu_total = 0;  // this rank's CPU time in the timed parts
  for (int s = 0; s < splits; ++s) {
    weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
    auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_ms();
    weftComm_t comm = nullptr;
    if (!check(weftCommSplit(world, 0, rank, &comm, nullptr), world, "split")) return 1;
    int64_t value = rank + 1;
    if (!check(weftAllReduce(&value, &value, 1, weftInt64, weftSum, comm, nullptr), comm,
               "first AllReduce"))
      return 1;
    double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    cpu_total += cpu_ms() - cpu_start;
    if (value != int64_t{nranks} * (nranks + 1) / 2) {
      fprintf(stderr, "weft-comm-setup: rank %d: AllReduce gave %lld\n", rank,
              static_cast<long long>(value));
      return 1;
    }
    comms.push_back(comm);
    ms.push_back(max_over_ranks(world, elapsed));
  }
  const double cpu_max = max_over_ranks(world, cpu_total / splits);
  weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
  const double shm_alive = shm_used_bytes();
  for (weftComm_t comm : comms)
    if (!check(weftCommDestroy(comm), comm, "destroy")) return 1;
  weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
  const double shm_after = shm_used_bytes();

  if (rank == 0) {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double v : ms) sum += v;
    printf("# ranks %d, splits %d (all alive at once), split + first AllReduce, slowest rank\n",
           nranks, splits);
    printf("setup_ms: median %.2f mean %.2f min %.2f max %.2f first %.2f\n",
           sorted[sorted.size() / 2], sum / splits, sorted.front(), sorted.back(), ms.front());
    printf("cpu_ms per communicator (busiest rank, all its threads): %.2f\n", cpu_max);
    printf(
        "dev_shm_bytes: per communicator %.0f (node-wide, all %d ranks), %d alive %.0f, "
        "after destroy %+.0f\n",
        (shm_alive - shm_before) / splits, nranks, splits, shm_alive - shm_before,
        shm_after - shm_before);
  }
  return check(weftCommDestroy(world), world, "destroy") ? 0 : 1;
}
