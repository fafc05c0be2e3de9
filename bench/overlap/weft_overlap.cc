// weft-overlap: how much of a collective hides behind compute. Per repeat it
// times compute alone, an AllReduce alone (on a stream), and both together
// (the AllReduce queued on a stream while the calling thread computes), all
// on the calling thread's clock, and reports each time's median and range
// over the repeats and the efficiency of overlap_math.h (at most 100%).
// Run under weftrun: weftrun -n 2 weft-overlap [-b BYTES] [-r REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "overlap_math.h"
#include "weft/weft.h"

namespace {

using Clock = std::chrono::steady_clock;
using weft::overlap::Spread;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#define CHECK(call)                                                                       \
  do {                                                                                    \
    weftResult_t result_ = (call);                                                        \
    if (result_ != weftSuccess) {                                                         \
      fprintf(stderr, "weft-overlap: %s failed: %s\n", #call, weftGetLastError(nullptr)); \
      exit(3);                                                                            \
    }                                                                                     \
  } while (0)

// Bytes with an optional K/M/G suffix; false on anything else.
bool parse_size(const char* text, size_t* out) {
  char* end = nullptr;
  double value = strtod(text, &end);
  if (end == text || value <= 0) return false;
  if (*end == 'K' || *end == 'k')
    value *= 1 << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    value *= 1 << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    value *= 1 << 30, ++end;
  *out = static_cast<size_t>(value);
  return *end == '\0' && *out >= sizeof(float);
}

int usage(const char* problem) {
  fprintf(stderr, "weft-overlap: %s\nusage: weft-overlap [-b BYTES (>= 4, K/M/G)] [-r REPEATS]\n",
          problem);
  return 2;
}

constexpr int kWarmups = 3;  // first calls pay one-time costs (tuner, page faults)
constexpr int kEstimates = 5;
// Compute alone is sized to this multiple of the AllReduce, so that it can
// hide all of it (the efficiency divides by the communication time).
constexpr double kComputeOverComm = 1.5;

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 16 << 20;
  int repeats = 7;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return usage((std::string(argv[i]) + " needs a value").c_str());
    if (strcmp(argv[i], "-b") == 0) {
      if (!parse_size(argv[i + 1], &bytes))
        return usage((std::string("-b: '") + argv[i + 1] + "' is not a size").c_str());
    } else if (strcmp(argv[i], "-r") == 0) {
      repeats = atoi(argv[i + 1]);
      if (repeats < 1)
        return usage((std::string("-r: '") + argv[i + 1] + "' is not a count >= 1").c_str());
    } else {
      return usage((std::string("unknown flag ") + argv[i]).c_str());
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
  std::vector<float> buffer(count, 1.0f), work(16384);
  for (size_t i = 0; i < work.size(); ++i) work[i] = static_cast<float>(i % 97) * 0.01f;
  float checksum = 0;
  auto compute = [&](long iterations) { checksum += weft::overlap::compute(work, iterations); };

  auto time_comm = [&] {
    CHECK(weftBarrier(comm, nullptr));
    auto start = Clock::now();
    CHECK(weftAllReduce(buffer.data(), buffer.data(), count, weftFloat32, weftSum, comm, stream));
    CHECK(weftStreamSynchronize(stream));
    return seconds_since(start);
  };
  for (int w = 0; w < kWarmups; ++w) time_comm();
  std::vector<double> estimates;
  for (int e = 0; e < kEstimates; ++e) estimates.push_back(time_comm());
  const double target = kComputeOverComm * weft::overlap::spread(estimates).median;
  // Grow the compute until it takes a quarter of the target, then scale it
  // by the median of three timings.
  long iterations = 1;
  auto time_compute = [&] {
    auto start = Clock::now();
    compute(iterations);
    return seconds_since(start);
  };
  while (time_compute() < target / 4 && iterations < (1L << 40)) iterations *= 2;
  const double per = weft::overlap::spread({time_compute(), time_compute(), time_compute()}).median;
  iterations = std::max(1L, static_cast<long>(iterations * target / per));
  // Every rank computes the same amount: rank 0's calibration decides.
  CHECK(weftBroadcast(&iterations, &iterations, 1, weftInt64, 0, comm, nullptr));

  std::vector<double> t_compute, t_comm, t_both, t_eff;
  for (int r = 0; r < repeats; ++r) {
    weft::overlap::Times t;
    CHECK(weftBarrier(comm, nullptr));
    t.compute = time_compute();
    t.comm = time_comm();
    CHECK(weftBarrier(comm, nullptr));
    const auto start = Clock::now();
    CHECK(weftAllReduce(buffer.data(), buffer.data(), count, weftFloat32, weftSum, comm, stream));
    t.compute_in_both = time_compute();
    CHECK(weftStreamSynchronize(stream));
    t.both = seconds_since(start);
    t_compute.push_back(t.compute);
    t_comm.push_back(t.comm);
    t_both.push_back(t.both);
    t_eff.push_back(weft::overlap::efficiency(t));
  }
  // Per rank: median, min, max of compute, comm, both (ms) and efficiency.
  std::vector<double> mine;
  for (const auto* series : {&t_compute, &t_comm, &t_both, &t_eff}) {
    const Spread s = weft::overlap::spread(*series);
    mine.insert(mine.end(), {s.median, s.min, s.max});
  }
  const size_t per_rank = mine.size();
  std::vector<double> all(per_rank * nranks);
  CHECK(weftAllGather(mine.data(), all.data(), per_rank, weftFloat64, comm, nullptr));
  if (rank == 0) {
    printf(
        "# weft-overlap: %d ranks, AllReduce of %zu bytes float sum, %d repeats, "
        "%ld compute iterations (checksum %g)\n",
        nranks, bytes, repeats, iterations, static_cast<double>(checksum));
    printf("# times in ms and efficiency: median [min-max] over the repeats\n");
    printf("# %4s %26s %26s %26s %24s\n", "rank", "compute", "comm", "both", "efficiency");
    double worst = 1;
    for (int q = 0; q < nranks; ++q) {
      const double* v = &all[per_rank * q];
      printf("  %4d", q);
      for (int k = 0; k < 3; ++k)
        printf(" %8.3f [%7.3f-%7.3f]", v[3 * k] * 1e3, v[3 * k + 1] * 1e3, v[3 * k + 2] * 1e3);
      printf(" %6.1f%% [%5.1f-%5.1f%%]\n", v[9] * 100, v[10] * 100, v[11] * 100);
      worst = std::min(worst, v[9]);
    }
    printf("overlap efficiency: %.1f%%\n", worst * 100);
  }
  CHECK(weftStreamDestroy(stream));
  CHECK(weftCommDestroy(comm));
  return 0;
}
