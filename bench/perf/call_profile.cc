// weft-call-profile: what each call of one collective costs, call by call, in
// measures the machine's load does not distort: page faults (minor, major) and
// context switches (voluntary: the wait slept; involuntary: the core was taken),
// from getrusage around every call, next to its wall time. Under weftrun every
// rank runs the same calls; rank 0 prints every rank's first call, second call
// and the median of the later ones, then, per size, a copy of that size in the
// same process (the copy ceiling).
//
//   weftrun -n 2 weft-call-profile allreduce -b 256K -e 8M -n 20
//   weftrun -n 2 weft-call-profile allgather -b 4K -e 4K -n 10000 --slow-us 3
//
// Sizes are those of weft-perf (the larger buffer; a rank's block of the split
// collectives is size / ranks). Buffers are allocated and written before the
// first call of each size, so that the faults counted are the library's own;
// --untouched-output leaves the output unwritten (a fresh receive buffer), and
// --fresh gives each size a communicator of its own (weftCommSplit), so that
// its first call is the first on that communicator; --registered takes the
// buffers from weftMemAlloc and registers them, so that direct algorithms read
// the peers' inputs in place (zero copy). Every call's result is
// checked exactly (float sums of small integers).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weft/weft.h"

namespace {

enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast };

struct Options {
  Collective collective = Collective::AllReduce;
  const char* name = "allreduce";
  size_t min_bytes = 256 << 10, max_bytes = 8 << 20;
  int calls = 20;
  bool fresh = false;
  bool untouched_output = false;
  bool registered = false;  // buffers from weftMemAlloc, registered: direct ops read them in place
  double slow_us = 0;       // > 0: also count calls slower than this, and their context switches
};

// One call's costs on this rank.
struct Sample {
  double us = 0, minflt = 0, majflt = 0, nvcsw = 0, nivcsw = 0;
};
constexpr int kFields = 5;

struct Usage {
  rusage self{};
  std::chrono::steady_clock::time_point at;
  static Usage now() {
    Usage usage;
    getrusage(RUSAGE_SELF, &usage.self);  // every thread of the process: the progress thread too
    usage.at = std::chrono::steady_clock::now();
    return usage;
  }
};

Sample between(const Usage& a, const Usage& b) {
  return {std::chrono::duration<double, std::micro>(b.at - a.at).count(),
          static_cast<double>(b.self.ru_minflt - a.self.ru_minflt),
          static_cast<double>(b.self.ru_majflt - a.self.ru_majflt),
          static_cast<double>(b.self.ru_nvcsw - a.self.ru_nvcsw),
          static_cast<double>(b.self.ru_nivcsw - a.self.ru_nivcsw)};
}

size_t parse_size(const char* text) {
  char* end = nullptr;
  double value = strtod(text, &end);
  size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = size_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = size_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = size_t{1} << 30;
  return static_cast<size_t>(value * static_cast<double>(scale));
}

[[noreturn]] void usage(const char* why) {
  fprintf(stderr,
          "weft-call-profile: %s\nusage: weft-call-profile "
          "allreduce|reducescatter|allgather|alltoall|broadcast [-b MIN] [-e MAX] [-n CALLS] "
          "[--fresh] [--untouched-output] [--registered] [--slow-us US]\n",
          why);
  exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  if (argc < 2) usage("needs a collective");
  const std::pair<const char*, Collective> names[] = {{"allreduce", Collective::AllReduce},
                                                      {"reducescatter", Collective::ReduceScatter},
                                                      {"allgather", Collective::AllGather},
                                                      {"alltoall", Collective::AllToAll},
                                                      {"broadcast", Collective::Broadcast}};
  bool known = false;
  for (const auto& [name, collective] : names)
    if (strcmp(argv[1], name) == 0) {
      options.collective = collective;
      options.name = name;
      known = true;
    }
  if (!known) usage("unknown collective");
  for (int i = 2; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (strcmp(argv[i], "-b") == 0 && has_value) {
      options.min_bytes = parse_size(argv[++i]);
    } else if (strcmp(argv[i], "-e") == 0 && has_value) {
      options.max_bytes = parse_size(argv[++i]);
    } else if (strcmp(argv[i], "-n") == 0 && has_value) {
      options.calls = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--slow-us") == 0 && has_value) {
      options.slow_us = atof(argv[++i]);
    } else if (strcmp(argv[i], "--fresh") == 0) {
      options.fresh = true;
    } else if (strcmp(argv[i], "--untouched-output") == 0) {
      options.untouched_output = true;
    } else if (strcmp(argv[i], "--registered") == 0) {
      options.registered = true;
    } else {
      usage("unknown or incomplete option");
    }
  }
  if (options.calls < 3) usage("-n must be at least 3");
  if (options.min_bytes < 4 || options.min_bytes > options.max_bytes) usage("bad -b/-e");
  return options;
}

bool check(weftResult_t result, weftComm_t comm, const char* what) {
  if (result == weftSuccess) return true;
  fprintf(stderr, "weft-call-profile: %s failed: %s\n", what, weftGetLastError(comm));
  return false;
}

// The buffers of one size, their inputs and the exact expected output.
struct Buffers {
  size_t in_count = 0, out_count = 0, block = 0;  // block: elements per rank (split ones)
  float* in = nullptr;
  float* out = nullptr;
  std::vector<float> expected;
};

float* allocate(const Options& options, size_t count) {
  const size_t bytes = std::max<size_t>(1, count) * sizeof(float);
  void* memory = nullptr;
  if (!options.registered) return static_cast<float*>(malloc(bytes));
  if (weftMemAlloc(&memory, bytes) != weftSuccess) {
    fprintf(stderr, "weft-call-profile: weftMemAlloc(%zu) failed: %s\n", bytes,
            weftGetLastError(nullptr));
    exit(1);
  }
  return static_cast<float*>(memory);
}

void release(const Options& options, float* buffer) {
  if (options.registered)
    weftMemFree(buffer);
  else
    free(buffer);
}

Buffers make_buffers(const Options& options, size_t bytes, int rank, int n) {
  Buffers b;
  const size_t count = bytes / sizeof(float);
  b.block = count / n;
  switch (options.collective) {
    case Collective::AllReduce:
    case Collective::Broadcast:
      b.in_count = b.out_count = count;
      break;
    case Collective::ReduceScatter:
      b.in_count = b.block * n;
      b.out_count = b.block;
      break;
    case Collective::AllGather:
      b.in_count = b.block;
      b.out_count = b.block * n;
      break;
    case Collective::AllToAll:
      b.in_count = b.out_count = b.block * n;
      break;
  }
  b.in = allocate(options, b.in_count);
  b.out = allocate(options, b.out_count);
  // Small integers: every sum is exact whatever the order. Element i of rank r's input: r + 1 + i
  // % 7.
  for (size_t i = 0; i < b.in_count; ++i) b.in[i] = static_cast<float>(rank + 1 + i % 7);
  if (!options.untouched_output) memset(b.out, 0, b.out_count * sizeof(float));
  b.expected.resize(b.out_count);
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < b.out_count; ++i) {
    switch (options.collective) {
      case Collective::AllReduce:
        b.expected[i] = ranks_sum + static_cast<float>(n * (i % 7));
        break;
      case Collective::Broadcast:  // root 0
        b.expected[i] = static_cast<float>(1 + i % 7);
        break;
      case Collective::ReduceScatter: {
        size_t at = rank * b.block + i;
        b.expected[i] = ranks_sum + static_cast<float>(n * (at % 7));
        break;
      }
      case Collective::AllGather:  // block q comes from rank q
        b.expected[i] = static_cast<float>(i / b.block + 1 + (i % b.block) % 7);
        break;
      case Collective::AllToAll: {  // block q comes from rank q's block `rank`
        size_t at = rank * b.block + i % b.block;
        b.expected[i] = static_cast<float>(i / b.block + 1 + at % 7);
        break;
      }
    }
  }
  return b;
}

weftResult_t call(const Options& options, const Buffers& b, weftComm_t comm) {
  switch (options.collective) {
    case Collective::AllReduce:
      return weftAllReduce(b.in, b.out, b.in_count, weftFloat32, weftSum, comm, nullptr);
    case Collective::ReduceScatter:
      return weftReduceScatter(b.in, b.out, b.block, weftFloat32, weftSum, comm, nullptr);
    case Collective::AllGather:
      return weftAllGather(b.in, b.out, b.block, weftFloat32, comm, nullptr);
    case Collective::AllToAll:
      return weftAllToAll(b.in, b.out, b.block, weftFloat32, comm, nullptr);
    case Collective::Broadcast:
      return weftBroadcast(b.in, b.out, b.in_count, weftFloat32, 0, comm, nullptr);
  }
  return weftInvalidArgument;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// What one rank reports for one size: its first and second call, the median time and
// the summed faults and switches of the later calls, its copy ceiling, and its slow calls.
struct Summary {
  Sample first, second, later_sum;
  double later_median_us = 0, later_min_us = 0, copy_median_us = 0;
  double slow_calls = 0, slow_nvcsw = 0, slow_nivcsw = 0, fast_nvcsw = 0, fast_nivcsw = 0;
};
constexpr int kSummaryDoubles = 3 * kFields + 8;

std::vector<double> flatten(const Summary& s) {
  std::vector<double> v;
  for (const Sample* sample : {&s.first, &s.second, &s.later_sum})
    v.insert(v.end(), {sample->us, sample->minflt, sample->majflt, sample->nvcsw, sample->nivcsw});
  v.insert(v.end(), {s.later_median_us, s.copy_median_us, s.later_min_us, s.slow_calls,
                     s.slow_nvcsw, s.slow_nivcsw, s.fast_nvcsw, s.fast_nivcsw});
  return v;
}

// The median time of `calls` copies of `bytes` between two written buffers.
double copy_median_us(size_t bytes, int calls) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    Usage a = Usage::now();
    memcpy(to.data(), from.data(), bytes);
    asm volatile("" : : "r"(to.data()) : "memory");  // the copy happens, here
    us.push_back(between(a, Usage::now()).us);
  }
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  weftComm_t world = nullptr;
  if (!check(weftCommInitFromEnv(&world, nullptr), nullptr, "init")) return 1;
  int rank = 0, n = 0;
  weftCommUserRank(world, &rank);
  weftCommCount(world, &n);
  double load[3] = {0, 0, 0};
  if (rank == 0) {
    getloadavg(load, 3);
    printf(
        "# weft-call-profile %s, %d ranks, float sum, %d calls per size%s%s%s, load average %.2f "
        "%.2f %.2f\n",
        options.name, n, options.calls, options.fresh ? ", fresh communicator per size" : "",
        options.untouched_output ? ", output not written before the first call" : "",
        options.registered ? ", registered weftMemAlloc buffers" : "", load[0], load[1], load[2]);
    printf(
        "# per call: us, minor faults, major faults, voluntary and involuntary context switches"
        " (getrusage, whole process)\n");
    printf("%10s %4s | %-34s | %-34s | %-30s | %9s\n", "size", "rank", "first call", "second call",
           "later calls: median us, sums", "copy us");
  }
  int failures = 0;
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    weftComm_t comm = world;
    if (options.fresh && !check(weftCommSplit(world, 0, rank, &comm, nullptr), world, "split"))
      return 1;
    Buffers b = make_buffers(options, bytes, rank, n);
    void* handles[2] = {nullptr, nullptr};
    if (options.registered &&
        !(check(weftCommRegister(comm, b.in, std::max<size_t>(1, b.in_count) * sizeof(float),
                                 &handles[0]),
                comm, "register") &&
          check(weftCommRegister(comm, b.out, std::max<size_t>(1, b.out_count) * sizeof(float),
                                 &handles[1]),
                comm, "register")))
      return 1;
    float barrier = 0;
    weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
    std::vector<Sample> samples(options.calls);
    for (int c = 0; c < options.calls; ++c) {
      Usage a = Usage::now();
      if (!check(call(options, b, comm), comm, options.name)) return 1;
      samples[c] = between(a, Usage::now());
    }
    for (size_t i = 0; i < b.out_count; ++i) failures += b.out[i] != b.expected[i];
    Summary s;
    s.first = samples[0];
    s.second = samples[1];
    std::vector<double> later_us;
    for (int c = 2; c < options.calls; ++c) {
      const Sample& x = samples[c];
      later_us.push_back(x.us);
      s.later_sum.minflt += x.minflt;
      s.later_sum.majflt += x.majflt;
      s.later_sum.nvcsw += x.nvcsw;
      s.later_sum.nivcsw += x.nivcsw;
      const bool slow = options.slow_us > 0 && x.us > options.slow_us;
      s.slow_calls += slow;
      (slow ? s.slow_nvcsw : s.fast_nvcsw) += x.nvcsw;
      (slow ? s.slow_nivcsw : s.fast_nivcsw) += x.nivcsw;
    }
    s.later_median_us = median(later_us);
    s.later_min_us = *std::min_element(later_us.begin(), later_us.end());
    weftAllReduce(&barrier, &barrier, 1, weftFloat32, weftSum, world, nullptr);
    s.copy_median_us = copy_median_us(bytes, std::min(options.calls, 50));

    std::vector<double> mine = flatten(s), all(kSummaryDoubles * n);
    if (!check(weftAllGather(mine.data(), all.data(), kSummaryDoubles, weftFloat64, world, nullptr),
               world, "gathering the results"))
      return 1;
    if (rank == 0) {
      for (int r = 0; r < n; ++r) {
        const double* v = &all[r * kSummaryDoubles];
        printf("%10zu %4d |", bytes, r);
        for (int k = 0; k < 2; ++k, v += kFields)
          printf(" %9.1f us %5.0f/%.0f flt %3.0f/%-3.0f cs |", v[0], v[1], v[2], v[3], v[4]);
        printf(" %9.1f us (min %.1f) %5.0f/%.0f flt %3.0f/%-3.0f cs | %9.1f\n", v[kFields],
               v[kFields + 2], v[1], v[2], v[3], v[4], v[kFields + 1]);
        if (options.slow_us > 0)
          printf(
              "%10s %4s   calls over %.1f us: %.0f of %d; context switches (vol/invol) in them "
              "%.0f/%.0f, in the others %.0f/%.0f\n",
              "", "", options.slow_us, v[kFields + 3], options.calls - 2, v[kFields + 4],
              v[kFields + 5], v[kFields + 6], v[kFields + 7]);
      }
    }
    for (void* handle : handles)
      if (handle != nullptr) weftCommDeregister(comm, handle);
    release(options, b.in);
    release(options, b.out);
    if (options.fresh && !check(weftCommDestroy(comm), comm, "destroy")) return 1;
  }
  if (!check(weftAllReduce(&failures, &failures, 1, weftInt32, weftSum, world, nullptr), world,
             "summing the checks"))
    return 1;
  if (rank == 0) printf("# wrong elements: %d\n", failures);
  check(weftCommDestroy(world), world, "destroy");
  return failures == 0 ? 0 : 1;
}
