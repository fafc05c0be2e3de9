// weft-overlap: how much of a collective hides behind compute. Times compute
// alone, an AllReduce alone (on a stream), and both together (the AllReduce
// queued on a stream while the calling thread computes), and reports
//   overlap efficiency = (t_compute + t_comm - t_both) / min(t_compute, t_comm).
// Run under weftrun: weftrun -n 2 weft-overlap [-b BYTES] [-r REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weft/weft.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    weftResult_t result_ = (call);                                                         \
    if (result_ != weftSuccess) {                                                          \
      fprintf(stderr, "weft-overlap: %s failed: %s\n", #call, weftGetLastError(nullptr)); \
      exit(3);                                                                             \
    }                                                                                      \
  } while (0)

// A fixed loop of vector work on data that fits in cache, so it competes
// for cores rather than for memory bandwidth.
float compute(std::vector<float>& data, long iterations) {
  float acc = 0;
  for (long it = 0; it < iterations; ++it) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = data[i] * 0.999f + 0.001f;
    acc += data[it % data.size()];
  }
  return acc;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

size_t parse_size(const char* text) {
  char* end = nullptr;
  double value = strtod(text, &end);
  if (*end == 'K' || *end == 'k') value *= 1 << 10;
  if (*end == 'M' || *end == 'm') value *= 1 << 20;
  if (*end == 'G' || *end == 'g') value *= 1 << 30;
  return static_cast<size_t>(value);
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 16 << 20;
  int repeats = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "-b") == 0) bytes = parse_size(argv[i + 1]);
    else if (strcmp(argv[i], "-r") == 0) repeats = std::max(1, atoi(argv[i + 1]));
    else {
      fprintf(stderr, "usage: weft-overlap [-b BYTES] [-r REPEATS]\n");
      return 2;
    }
  }
  weftComm_t comm;
  CHECK(weftCommInitFromEnv(&comm, nullptr));
  int rank, nranks;
  CHECK(weftCommUserRank(comm, &rank));
  CHECK(weftCommCount(comm, &nranks));
  weftStream_t stream;
  CHECK(weftStreamCreate(&stream));
  const size_t count = bytes / sizeof(float);
  std::vector<float> buffer(count, 1.0f), work(16384, 1.0f);

  auto time_comm = [&] {
    CHECK(weftBarrier(comm, nullptr));
    auto start = Clock::now();
    CHECK(weftAllReduce(buffer.data(), buffer.data(), count, weftFloat32, weftSum, comm, stream));
    CHECK(weftStreamSynchronize(stream));
    return seconds_since(start);
  };
  // Calibrate the compute so that alone it takes about as long as the AllReduce.
  time_comm();
  double comm_estimate = time_comm();
  long iterations = 16;
  for (double t = 0; t < comm_estimate / 2; iterations *= 2) {
    auto start = Clock::now();
    compute(work, iterations);
    t = seconds_since(start);
    if (t >= comm_estimate / 2) {
      iterations = static_cast<long>(iterations * comm_estimate / t);
      break;
    }
  }
  // Every rank computes the same amount: rank 0's calibration decides.
  CHECK(weftBroadcast(&iterations, &iterations, 1, weftInt64, 0, comm, nullptr));

  std::vector<double> t_compute, t_comm, t_both;
  volatile float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    CHECK(weftBarrier(comm, nullptr));
    auto start = Clock::now();
    sink = sink + compute(work, iterations);
    t_compute.push_back(seconds_since(start));
    t_comm.push_back(time_comm());
    CHECK(weftBarrier(comm, nullptr));
    start = Clock::now();
    CHECK(weftAllReduce(buffer.data(), buffer.data(), count, weftFloat32, weftSum, comm, stream));
    sink = sink + compute(work, iterations);
    CHECK(weftStreamSynchronize(stream));
    t_both.push_back(seconds_since(start));
  }
  double tc = median(t_compute), tm = median(t_comm), tb = median(t_both);
  double efficiency = (tc + tm - tb) / std::min(tc, tm);
  // Rank 0 reports the slowest rank's view: overlap is only as good as the worst rank's.
  double mine[4] = {tc, tm, tb, efficiency}, all[64 * 4];
  if (nranks <= 64) {
    CHECK(weftAllGather(mine, all, 4, weftFloat64, comm, nullptr));
    if (rank == 0) {
      printf("# weft-overlap: %d ranks, AllReduce of %zu bytes float sum, %d repeats (medians)\n",
             nranks, bytes, repeats);
      printf("# %4s %14s %14s %14s %12s\n", "rank", "compute(ms)", "comm(ms)", "both(ms)",
             "efficiency");
      double worst = 1e9;
      for (int q = 0; q < nranks; ++q) {
        printf("  %4d %14.3f %14.3f %14.3f %11.1f%%\n", q, all[4 * q] * 1e3, all[4 * q + 1] * 1e3,
               all[4 * q + 2] * 1e3, all[4 * q + 3] * 100);
        worst = std::min(worst, all[4 * q + 3]);
      }
      printf("overlap efficiency: %.1f%%\n", worst * 100);
    }
  }
  CHECK(weftStreamDestroy(stream));
  CHECK(weftCommDestroy(comm));
  return 0;
}
