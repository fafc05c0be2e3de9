// weft-sim: runs a collective's schedule for any rank count in one process
// and prints what each rank does (steps, messages, bytes) and the critical
// path in rounds, after checking the programs and their exact result.
//
//   weft-sim allreduce --algo ring -n 1024 --bytes 256M [--dtype-size 4]
//            [--chunk 1M] [--root R] [--in-place] [--algo all]
//
// With -G 1 it lowers every rank's program to the GPU executor's stream
// operations instead (device memory, as weft-perf -G 1 runs it) and prints
// what each rank's list does and the device cost model's time:
//   weft-sim allreduce --algo all -n 4 --bytes 256M -G 1 [--slot-bytes 4M] [--slots 2]
//
// With --topo it predicts times on a modelled cluster instead (predict.h):
//   weft-sim --topo cluster.json --coll allreduce --bytes 1K:4G
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/lowering.h"
#include "algorithms/simulator.h"
#include "predict.h"

namespace {

using weft::algo::Algorithm;
using weft::algo::Collective;
using weft::algo::Params;
using weft::algo::SimOptions;
using weft::algo::SimResult;
using weft::sim::busbw_factor;
using weft::sim::parse_size;
using weft::sim::per_rank_count;
using weft::sim::run_predict;

// Simulated element values cost 8 bytes each; above this many in all, the
// exact-result check runs on a proportionally smaller vector.
constexpr uint64_t kValueBudget = uint64_t{48} << 20;

void usage() {
  fprintf(
      stderr,
      "usage: weft-sim <collective> --algo <name|all> -n <ranks> --bytes <size>\n"
      "                [--dtype-size <bytes>] [--chunk <bytes>] [--root <rank>] [--in-place]\n"
      "                [-G 1 [--slot-bytes <bytes>] [--slots <n>]]\n"
      "       weft-sim --topo <cluster.json> --coll <collective> --bytes <lo>:<hi> [--factor F]\n"
      "sizes take K/M/G suffixes (powers of 1024); --bytes is the collective's buffer\n"
      "size as nccl-tests counts it (per-rank total for gather-like collectives);\n"
      "alltoallv sends every peer the same count\n");
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char text[32];
  snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return text;
}

// Above this many steps in all the joint run would need several GiB; the
// per-rank counts then come from each program alone.
constexpr uint64_t kStepBudget = 30'000'000;

SimResult run(const Params& params, bool values, uint64_t dtype) {
  SimOptions options;
  options.check_values = values;
  options.element_size = dtype;
  options.hazard_step_limit = 8192;
  if (params.collective == Collective::AllToAllv) {
    options.alltoallv_counts.assign(static_cast<size_t>(params.nranks) * params.nranks,
                                    params.count);
  }
  return simulate(params, options);
}

uint64_t steps_of(Params params, int rank) {
  params.rank = rank;
  weft::algo::Program program;
  std::string error;
  std::vector<uint64_t> counts, displs;
  if (params.collective == Collective::AllToAllv) {
    counts.assign(params.nranks, params.count);
    for (int q = 0; q < params.nranks; ++q) displs.push_back(q * params.count);
    params.send_counts = params.recv_counts = counts.data();
    params.send_displs = params.recv_displs = displs.data();
  }
  return weft::algo::build(params, &program, &error) ? program.steps.size() : 0;
}

void print_row(Algorithm algorithm, uint64_t dtype, const std::vector<weft::algo::RankStats>& stats,
               const std::string& rounds, const char* check, const std::string& note) {
  uint64_t max_steps = 0, max_msgs = 0, max_bytes = 0, max_scratch = 0;
  double sum_steps = 0, sum_msgs = 0, sum_bytes = 0;
  for (const auto& r : stats) {
    max_steps = std::max(max_steps, r.steps);
    max_msgs = std::max(max_msgs, r.messages);
    max_bytes = std::max(max_bytes, r.bytes_sent);
    max_scratch = std::max(max_scratch, r.scratch);
    sum_steps += static_cast<double>(r.steps);
    sum_msgs += static_cast<double>(r.messages);
    sum_bytes += static_cast<double>(r.bytes_sent);
  }
  const double ranks = static_cast<double>(std::max<size_t>(stats.size(), 1));
  printf("%-14s %9" PRIu64 " %11.1f %9" PRIu64 " %10.1f %12s %12s %12s %7s  %-4s %s\n",
         weft::algo::algorithm_name(algorithm), max_steps, sum_steps / ranks, max_msgs,
         sum_msgs / ranks, human(static_cast<double>(max_bytes)).c_str(),
         human(sum_bytes / ranks).c_str(), human(static_cast<double>(max_scratch * dtype)).c_str(),
         rounds.c_str(), check, note.c_str());
}

// One table row; returns whether every check passed.
bool report(const Params& full, uint64_t dtype) {
  const int n = full.nranks;
  const uint64_t biggest =
      std::max({steps_of(full, 0), steps_of(full, n / 2), steps_of(full, n - 1)});
  if (biggest * static_cast<uint64_t>(n) > kStepBudget) {
    std::vector<weft::algo::RankStats> stats;
    for (int r = 0; r < n; ++r) {
      Params p = full;
      p.rank = r;
      weft::algo::Program program;
      std::string error;
      std::vector<uint64_t> counts(n, full.count), displs;
      for (int q = 0; q < n; ++q) displs.push_back(q * full.count);
      p.send_counts = p.recv_counts = counts.data();
      p.send_displs = p.recv_displs = displs.data();
      if (!weft::algo::build(p, &program, &error)) return false;
      stats.push_back(weft::algo::count_program(program, dtype));
    }
    print_row(full.algorithm, dtype, stats, "-", "-",
              "not simulated (about " + std::to_string(biggest * n) +
                  " steps in all); counts from each rank's program");
    return true;
  }
  // Generous estimate of value memory: input, output and scratch per rank.
  const uint64_t per_rank = full.count * (per_rank_count(full.collective) ? n : 1);
  const uint64_t estimate = 4 * static_cast<uint64_t>(n) * std::max<uint64_t>(per_rank, 1);
  const bool full_values = estimate <= kValueBudget;
  const SimResult result = run(full, full_values, dtype);
  std::string note;
  bool ok = result.ok();
  if (!result.ok()) fprintf(stderr, "%s", result.message().c_str());
  if (!full_values && ok) {
    // Same shape, smaller vector: count and chunk shrink by the same factor.
    const uint64_t factor = (estimate + kValueBudget - 1) / kValueBudget;
    Params small = full;
    small.count = std::max<uint64_t>(1, full.count / factor);
    small.chunk = full.chunk == 0 ? 0 : std::max<uint64_t>(1, full.chunk / factor);
    const SimResult check = run(small, true, dtype);
    ok = check.ok();
    note = "values checked at count " + std::to_string(small.count) + " chunk " +
           std::to_string(small.chunk) + " (1/" + std::to_string(factor) + " scale)";
    if (!ok) fprintf(stderr, "%s", check.message().c_str());
  } else if (full_values) {
    note = "values checked at full size";
  }
  if (!result.hazards_checked) note += "; hazards checked only on ranks with <= 8192 steps";
  print_row(full.algorithm, dtype, result.ranks, std::to_string(result.rounds), ok ? "ok" : "FAIL",
            note);
  return ok;
}

// One table row of device memory (-G 1): every rank's lowered list, its largest counts and
// the slowest rank's predicted time (as the GPU executor times a candidate); returns whether
// the lists could be built.
bool report_device(const Params& full, uint64_t dtype, uint64_t bytes,
                   const weft::algo::LowerConfig& config) {
  Params params = full;
  std::vector<uint64_t> counts, displs, all;
  if (params.collective == Collective::AllToAllv) {
    counts.assign(params.nranks, params.count);
    for (int q = 0; q < params.nranks; ++q) displs.push_back(q * params.count);
    all.assign(static_cast<size_t>(params.nranks) * params.nranks, params.count);
    params.send_counts = params.recv_counts = counts.data();
    params.send_displs = params.recv_displs = displs.data();
    params.all_send_counts = all.data();
  }
  std::vector<weft::algo::LoweredProgram> lowered;
  std::string error;
  const char* name = weft::algo::algorithm_name(full.algorithm);
  if (!weft::algo::lower_all(params, config, &lowered, &error)) {
    printf("%-14s %s\n", name, ("not lowered: " + error).c_str());
    return false;
  }
  weft::algo::LoweredStats most;
  uint64_t scratch = 0;
  double us = 0;
  for (const weft::algo::LoweredProgram& list : lowered) {
    const weft::algo::LoweredStats s = weft::algo::count_lowered(list, dtype);
    most.ops = std::max(most.ops, s.ops);
    most.copies = std::max(most.copies, s.copies);
    most.bytes_copied = std::max(most.bytes_copied, s.bytes_copied);
    most.bytes_to_peers = std::max(most.bytes_to_peers, s.bytes_to_peers);
    most.reductions = std::max(most.reductions, s.reductions);
    most.flag_writes = std::max(most.flag_writes, s.flag_writes + s.flag_waits);
    scratch = std::max(scratch, list.scratch_bytes);
    us = std::max(us, weft::algo::predict_device_us(list, dtype));
  }
  const double busbw =
      us > 0 ? static_cast<double>(bytes) / (us * 1e3) * busbw_factor(full.collective, full.nranks)
             : 0;
  printf("%-14s %8" PRIu64 " %8" PRIu64 " %12s %12s %8" PRIu64 " %8" PRIu64 " %12s %12.1f %9.1f\n",
         name, most.ops, most.copies, human(static_cast<double>(most.bytes_copied)).c_str(),
         human(static_cast<double>(most.bytes_to_peers)).c_str(), most.reductions, most.flag_writes,
         human(static_cast<double>(scratch)).c_str(), us, busbw);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], "--topo") == 0) return run_predict(argc, argv);
  if (argc < 2) {
    usage();
    return 2;
  }
  Params params;
  if (!weft::algo::parse_collective(argv[1], &params.collective)) {
    fprintf(stderr, "unknown collective '%s'\n", argv[1]);
    return 2;
  }
  std::string algo = "all";
  uint64_t bytes = 0, dtype = 4, chunk_bytes = 0, device = 0;
  weft::algo::LowerConfig lower_config;
  lower_config.slot_bytes = uint64_t{4} << 20;  // the GPU path's defaults (WEFT_CUDA_SLOT_BYTES)
  lower_config.slots = 2;                       // WEFT_CUDA_SLOTS
  for (int i = 2; i < argc; ++i) {
    const char* flag = argv[i];
    if (strcmp(flag, "--in-place") == 0) {
      params.in_place = true;
      continue;
    }
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    const char* value = argv[++i];
    uint64_t number = 0;
    const bool sized = parse_size(value, &number);
    if (strcmp(flag, "--algo") == 0) {
      algo = value;
    } else if (strcmp(flag, "-n") == 0 && sized && number >= 1 && number <= (1u << 20)) {
      params.nranks = static_cast<int>(number);
    } else if (strcmp(flag, "--bytes") == 0 && sized) {
      bytes = number;
    } else if (strcmp(flag, "--dtype-size") == 0 && sized && number >= 1) {
      dtype = number;
    } else if (strcmp(flag, "--chunk") == 0 && sized) {
      chunk_bytes = number;
    } else if (strcmp(flag, "--root") == 0 && sized) {
      params.root = static_cast<int>(number);
    } else if (strcmp(flag, "-G") == 0 && sized && number <= 1) {
      device = number;
    } else if (strcmp(flag, "--slot-bytes") == 0 && sized && number >= 1) {
      lower_config.slot_bytes = number;
    } else if (strcmp(flag, "--slots") == 0 && sized && number >= 1 && number <= 64) {
      lower_config.slots = static_cast<uint32_t>(number);
    } else {
      fprintf(stderr, "bad option %s %s\n", flag, value);
      usage();
      return 2;
    }
  }
  const uint64_t n = static_cast<uint64_t>(params.nranks);
  params.count = bytes / dtype / (per_rank_count(params.collective) ? n : 1);
  params.chunk = chunk_bytes / dtype;
  if (chunk_bytes > 0 && params.chunk == 0) params.chunk = 1;
  if (params.root >= params.nranks) {
    fprintf(stderr, "root %d out of range\n", params.root);
    return 2;
  }

  std::vector<Algorithm> algorithms;
  for (int a = 0; a < weft::algo::kNumAlgorithms; ++a) {
    const Algorithm candidate = static_cast<Algorithm>(a);
    if (!weft::algo::supports(candidate, params.collective) || weft::algo::is_direct(candidate))
      continue;
    if (algo == "all" || algo == weft::algo::algorithm_name(candidate))
      algorithms.push_back(candidate);
  }
  if (algorithms.empty()) {
    fprintf(stderr, "no algorithm '%s' for %s\n", algo.c_str(), argv[1]);
    return 2;
  }
  printf("# weft-sim %s: %d ranks, count %" PRIu64 " x %" PRIu64 " B, chunk %" PRIu64
         " elements, root %d, %s\n",
         argv[1], params.nranks, params.count, dtype, params.chunk, params.root,
         params.in_place ? "in place" : "out of place");
  if (device != 0) {
    lower_config.element_size = dtype;
    printf(
        "# device memory (-G 1): every rank's program lowered to stream operations, %u slots of "
        "%s per peer; per rank (max): operations, copies, bytes copied and of those into peers' "
        "slots, reduction kernels, counter writes and waits, scratch; time: the slowest rank's "
        "list by the device cost model (uncalibrated), busbw from it\n",
        lower_config.slots, human(static_cast<double>(lower_config.slot_bytes)).c_str());
    printf("%-14s %8s %8s %12s %12s %8s %8s %12s %12s %9s\n", "algo", "ops", "copies", "copied",
           "to.peers", "kernels", "flags", "scratch", "time.us", "busbw");
    bool any = false;
    for (Algorithm a : algorithms) {
      params.algorithm = a;
      any = report_device(params, dtype, bytes, lower_config) || any;
    }
    return any ? 0 : 1;
  }
  printf(
      "# steps, messages, bytes sent and scratch are per rank (max, avg) at full size;\n"
      "# rounds = critical path: the longest chain of dependent messages\n");
  printf("%-14s %9s %11s %9s %10s %12s %12s %12s %7s  %s\n", "algo", "steps.max", "steps.avg",
         "msgs.max", "msgs.avg", "sent.max", "sent.avg", "scratch.max", "rounds", "check");
  bool ok = true;
  for (Algorithm a : algorithms) {
    params.algorithm = a;
    ok = report(params, dtype) && ok;
  }
  return ok ? 0 : 1;
}
