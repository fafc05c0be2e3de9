#include "predict.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/tuner.h"
#include "topo/cluster_file.h"

namespace weft::sim {

bool parse_size(const char* text, uint64_t* out) {
  char* end = nullptr;
  const unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return false;
  uint64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = uint64_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = uint64_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = uint64_t{1} << 30;
  if (scale != 1) ++end;
  if (*end != '\0') return false;
  *out = value * scale;
  return true;
}

bool per_rank_count(algo::Collective c) {
  using algo::Collective;
  return c == Collective::ReduceScatter || c == Collective::AllGather ||
         c == Collective::AllToAll || c == Collective::AllToAllv || c == Collective::Gather ||
         c == Collective::Scatter;
}

double busbw_factor(algo::Collective c, int nranks) {
  using algo::Collective;
  const double n = nranks;
  switch (c) {
    case Collective::AllReduce:
      return 2 * (n - 1) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll:
    case Collective::AllToAllv:
    case Collective::Gather:
    case Collective::Scatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

namespace {

int usage() {
  fprintf(stderr,
          "usage: weft-sim --topo <cluster.json> --coll <collective> --bytes <lo>:<hi>\n"
          "                [--factor <F>] [--shm] [--memory-gbps <B>] [--max-steps <N>]\n"
          "sizes as nccl-tests counts them (K/M/G = powers of 1024), from lo to hi times F\n"
          "(default 2); --shm allows the direct algorithms (one node sharing memory);\n"
          "--memory-gbps sets the reduction/copy throughput (default: the host executor's,\n"
          "one CPU core; use the GPU's for GPU clusters);\n"
          "schedules with more than --max-steps steps in all (default 8M) are timed at\n"
          "coarser chunks\n");
  return 2;
}

}  // namespace

int run_predict(int argc, char** argv) {
  std::string file, coll = "allreduce";
  uint64_t lo = 1024, hi = uint64_t{1} << 30, factor = 2, max_steps = uint64_t{8} << 20;
  bool shm = false;
  double memory_gbps = 0;  // 0: the host executor's figure
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (strcmp(flag, "--shm") == 0) {
      shm = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const char* value = argv[++i];
    if (strcmp(flag, "--topo") == 0) {
      file = value;
    } else if (strcmp(flag, "--coll") == 0) {
      coll = value;
    } else if (strcmp(flag, "--bytes") == 0) {
      const char* colon = strchr(value, ':');
      if (colon == nullptr) return usage();
      const std::string first(value, colon);
      if (!parse_size(first.c_str(), &lo) || !parse_size(colon + 1, &hi) || hi < lo) return usage();
    } else if (strcmp(flag, "--factor") == 0) {
      if (!parse_size(value, &factor) || factor < 2) return usage();
    } else if (strcmp(flag, "--memory-gbps") == 0) {
      char* end = nullptr;
      memory_gbps = strtod(value, &end);
      if (end == value || *end != '\0' || !(memory_gbps > 0)) return usage();
    } else if (strcmp(flag, "--max-steps") == 0) {
      if (!parse_size(value, &max_steps) || max_steps == 0) return usage();
    } else {
      fprintf(stderr, "bad option %s\n", flag);
      return usage();
    }
  }
  algo::Collective collective;
  if (!algo::parse_collective(coll, &collective)) {
    fprintf(stderr, "unknown collective '%s'\n", coll.c_str());
    return 2;
  }
  topo::Cluster cluster;
  if (Status status = topo::load_cluster_file(file, &cluster); !status.ok()) {
    fprintf(stderr, "%s\n", status.message().c_str());
    return 1;
  }
  for (const topo::RankSpec& rank : cluster.ranks) {
    if (shm && rank.node != cluster.ranks.front().node) {
      fprintf(stderr, "--shm needs every rank on one node; %s places ranks on several\n",
              file.c_str());
      return 2;
    }
  }
  TuneContext context = tune_context(cluster, shm);
  context.max_model_steps = max_steps;
  if (memory_gbps > 0) context.memory.bandwidth_gb_s = memory_gbps;
  const int n = context.nranks;
  Tuner tuner(std::move(context));

  std::vector<algo::Algorithm> algorithms;
  for (int a = 0; a < algo::kNumAlgorithms; ++a) {
    const auto algorithm = static_cast<algo::Algorithm>(a);
    if (algo::supports(algorithm, collective) && (shm || !algo::is_direct(algorithm)))
      algorithms.push_back(algorithm);
  }
  printf("# weft-sim --topo %s: %d ranks on %zu nodes, %s, direct algorithms %s\n", file.c_str(), n,
         cluster.nodes.size(), algo::collective_name(collective), shm ? "on" : "off");
  std::vector<bool> used(topo::kNumLinkClasses, false);
  for (uint8_t c : tuner.context().pair_class) used[c] = true;
  printf("# links:");
  for (int c = 0; c < topo::kNumLinkClasses; ++c)
    if (used[c])
      printf(" %s %.4g GB/s %.4g us;", topo::link_class_name(static_cast<topo::LinkClass>(c)),
             cluster.links[c].bandwidth_gb_s, cluster.links[c].latency_us);
  printf(" memory %.4g GB/s %.4g us\n", tuner.context().memory.bandwidth_gb_s,
         tuner.context().memory.latency_us);
  printf(
      "# per algorithm: predicted time (us) and busbw (GB/s) at its best chunk; '-': not\n"
      "# timeable within --max-steps; * marks the tuner's choice (the fastest)\n");
  printf("%10s", "size");
  for (algo::Algorithm a : algorithms)
    printf(" %12s.us %9s.bw", algo::algorithm_name(a), algo::algorithm_name(a));
  printf("  %s\n", "choice");
  const uint64_t divisor = per_rank_count(collective) ? static_cast<uint64_t>(n) : 1;
  for (uint64_t bytes = lo; bytes <= hi; bytes *= factor) {
    const std::vector<Candidate> all = tuner.candidates(collective, bytes / divisor);
    printf("%10s", size_text(bytes).c_str());
    for (algo::Algorithm a : algorithms) {
      const Candidate* best = nullptr;
      for (const Candidate& c : all)
        if (c.algorithm == a && (best == nullptr || c.time_us < best->time_us)) best = &c;
      if (best == nullptr) {
        printf(" %15s %12s", "-", "-");
        continue;
      }
      const double algbw = static_cast<double>(bytes) / (best->time_us * 1e3);
      printf(" %14.1f%s %12.2f", best->time_us, best == &all.front() ? "*" : " ",
             algbw * busbw_factor(collective, n));
    }
    if (all.empty())
      printf("  -\n");
    else
      printf("  %s chunk %s\n", algo::algorithm_name(all.front().algorithm),
             size_text(all.front().chunk_bytes).c_str());
    fflush(stdout);
    if (bytes > UINT64_MAX / factor) break;
  }
  return 0;
}

}  // namespace weft::sim
