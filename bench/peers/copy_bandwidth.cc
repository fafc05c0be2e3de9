// weft-copybw: the machine's copy bandwidth with one thread per core, the memory ceiling
// that bench-compare turns into a per-collective busbw bound (docs/performance.md).
// Each thread copies its own slice of a source buffer to a destination buffer (memcpy),
// all slices at once, several times; prints bytes copied per second (each byte is read once
// and written once).
//   weft-copybw [-t THREADS] [-s TOTAL_BYTES] [-r REPEATS] [--json]
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "options.h"
#include "peer_driver.h"

namespace {

struct Settings {
  int threads = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  size_t bytes = size_t{256} << 20;  // far beyond the last-level cache
  int repeats = 10;
  bool json = false;
};

constexpr const char* kUsage =
    "usage: weft-copybw [-t THREADS] [-s BYTES] [-r REPEATS] [--json]\n"
    "  -t  copying threads (default: online cores)\n"
    "  -s  bytes copied per repeat, split over the threads (default 256M; K/M/G)\n"
    "  -r  timed repeats after one untimed pass (default 10)\n";

bool parse(int argc, char** argv, Settings* s) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--json") {
      s->json = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const std::string value = argv[++i];
    if (arg == "-t") {
      s->threads = std::atoi(value.c_str());
    } else if (arg == "-r") {
      s->repeats = std::atoi(value.c_str());
    } else if (arg == "-s") {
      const std::optional<size_t> bytes = weft::perf::parse_size(value);
      if (!bytes) return false;
      s->bytes = *bytes;
    } else {
      return false;
    }
  }
  return s->threads >= 1 && s->repeats >= 1 && s->bytes >= static_cast<size_t>(s->threads);
}

struct Slice {
  std::unique_ptr<char[]> source;
  std::unique_ptr<char[]> destination;
  size_t bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!parse(argc, argv, &s)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const size_t slice_bytes = s.bytes / static_cast<size_t>(s.threads);
  std::vector<Slice> slices(static_cast<size_t>(s.threads));
  std::vector<double> seconds(static_cast<size_t>(s.repeats));
  // Two meetings per repeat: all start together, then the first thread reads the clock
  // once all have finished. Pass 0 is untimed: it faults the pages in.
  std::barrier meeting(s.threads);
  Clock::time_point start;
  auto work = [&](int t) {
    Slice& slice = slices[static_cast<size_t>(t)];
    // Allocated and first touched by the thread that copies it (its NUMA node).
    slice.bytes = slice_bytes;
    slice.source.reset(new char[slice_bytes]);
    slice.destination.reset(new char[slice_bytes]);
    std::memset(slice.source.get(), t + 1, slice_bytes);
    std::memset(slice.destination.get(), 0, slice_bytes);
    for (int pass = 0; pass <= s.repeats; ++pass) {
      meeting.arrive_and_wait();
      if (t == 0) start = Clock::now();
      meeting.arrive_and_wait();
      std::memcpy(slice.destination.get(), slice.source.get(), slice.bytes);
      meeting.arrive_and_wait();
      if (t == 0 && pass > 0)
        seconds[static_cast<size_t>(pass - 1)] =
            std::chrono::duration<double>(Clock::now() - start).count();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < s.threads; ++t) threads.emplace_back(work, t);
  work(0);
  for (std::thread& thread : threads) thread.join();

  const double copied = static_cast<double>(slice_bytes) * s.threads;
  const double best = copied / *std::min_element(seconds.begin(), seconds.end()) / 1e9;
  const double median = copied / weft::peers::quantile(seconds, 0.5) / 1e9;
  const double worst = copied / *std::max_element(seconds.begin(), seconds.end()) / 1e9;
  if (s.json) {
    std::printf(
        "{\"threads\":%d,\"bytes\":%.0f,\"repeats\":%d,\"copy_gbps_best\":%.6g,"
        "\"copy_gbps_median\":%.6g,\"copy_gbps_worst\":%.6g}\n",
        s.threads, copied, s.repeats, best, median, worst);
  } else {
    std::printf(
        "# weft-copybw: %d threads, %.0f bytes per repeat, %d repeats\n"
        "copy bandwidth (GB/s): best %.3f  median %.3f  worst %.3f\n",
        s.threads, copied, s.repeats, best, median, worst);
  }
  return 0;
}
