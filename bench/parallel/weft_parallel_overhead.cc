// The adapter layer's cost per call over the raw collective: the same
// AllReduce and AllGather issued by weft.h directly and through the region
// operations (stream + event + ledger, and pack/unpack for a gather along
// the last dim). Rounds alternate the variants so that a loaded machine
// slows them alike; the median round is reported.
//   weftrun -n 2 weft-parallel-overhead [-b BYTES] [-r ROUNDS] [-i ITERS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "weft/parallel.hpp"

namespace {

using weft::parallel::Pass;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1 << 20;
  int rounds = 15, iterations = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "-b") == 0) bytes = strtoull(argv[i + 1], nullptr, 10);
    if (strcmp(argv[i], "-r") == 0) rounds = atoi(argv[i + 1]);
    if (strcmp(argv[i], "-i") == 0) iterations = atoi(argv[i + 1]);
  }
  try {
    weft::Comm world = weft::Comm::from_env();
    int n = world.size();
    weft::parallel::MeshShape shape;
    shape.tp = n;
    weft::parallel::Mesh mesh(world, shape);
    weft::parallel::Ledger ledger;
    weft::parallel::Axis tp(mesh, "tp", &ledger);
    weftComm_t comm = mesh.group("tp");
    weftStream_t stream = mesh.stream("tp");
    size_t count = bytes / sizeof(float), cols = 64, rows = count / cols;
    std::vector<float> in(count, 1.0f), out(count), piece(count / n), full(count);
    using weft::parallel::view;

    struct Variant {
      const char* name;
      std::function<void()> call;
      std::vector<double> us;
    };
    std::vector<Variant> variants = {
        {"raw AllReduce",
         [&] {
           weft::check(
               weftAllReduce(in.data(), out.data(), count, weftFloat32, weftSum, comm, nullptr));
         },
         {}},
        {"raw AllReduce on a stream",
         [&] {
           weft::check(
               weftAllReduce(in.data(), out.data(), count, weftFloat32, weftSum, comm, stream));
           weft::check(weftStreamSynchronize(stream));
         },
         {}},
        {"reduce_from_tp forward",
         [&] {
           weft::parallel::reduce_from_tp(tp, Pass::forward, view(in.data(), {count}),
                                          view(out.data(), {count}));
         },
         {}},
        {"raw AllGather",
         [&] {
           weft::check(
               weftAllGather(piece.data(), full.data(), piece.size(), weftFloat32, comm, nullptr));
         },
         {}},
        {"raw AllGather on a stream",
         [&] {
           weft::check(
               weftAllGather(piece.data(), full.data(), piece.size(), weftFloat32, comm, stream));
           weft::check(weftStreamSynchronize(stream));
         },
         {}},
        {"gather_from_sp forward (dim 0)",
         [&] {
           weft::parallel::gather_from_sp(tp, Pass::forward, view(piece.data(), {rows / n, cols}),
                                          view(full.data(), {rows, cols}), 0);
         },
         {}},
        {"gather_from_tp forward (dim -1)",
         [&] {
           weft::parallel::gather_from_tp(tp, Pass::forward, view(piece.data(), {rows, cols / n}),
                                          view(full.data(), {rows, cols}), -1);
         },
         {}},
    };
    for (int round = 0; round < rounds + 1; ++round)  // round 0 warms up
      for (Variant& variant : variants) {
        world.barrier();
        double start = seconds();
        for (int i = 0; i < iterations; ++i) variant.call();
        double us = (seconds() - start) / iterations * 1e6;
        if (round > 0) variant.us.push_back(us);
      }
    if (world.rank() == 0) {
      printf("# %d ranks, %zu bytes, %d rounds of %d calls, median round\n", n, bytes, rounds,
             iterations);
      double raw = 0;
      for (Variant& variant : variants) {
        std::sort(variant.us.begin(), variant.us.end());
        double median = variant.us[variant.us.size() / 2];
        if (strncmp(variant.name, "raw", 3) == 0 && strstr(variant.name, "stream") == nullptr)
          raw = median;
        printf("  %-34s %10.1f us  %+6.1f%%\n", variant.name, median, (median / raw - 1) * 100);
      }
    }
  } catch (const weft::Error& error) {
    fprintf(stderr, "weft-parallel-overhead: %s\n", error.what());
    return 1;
  }
  return 0;
}
