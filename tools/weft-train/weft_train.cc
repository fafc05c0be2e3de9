// weft-train: trains the small transformer of model.h on a mesh (dp × tp, sequence
// parallel, ZeRO-1/2/3, HSDP) through the parallel adapters, runs the same model on one
// process on rank 0, and checks losses, gradients, parameters and the traffic ledger.
// Run: weftrun -n N weft-train [--dp N] [--tp N] [--sp] [--zero 0-3] [--hsdp R] ...

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "distributed.h"
#include "model.h"
#include "weft/parallel.hpp"
#include "weft/weft.hpp"

namespace weft::train {
namespace {

namespace par = weft::parallel;

constexpr double kTolerance = 1e-5;  // relative, per tensor

constexpr const char* kUsage =
    "usage: weftrun -n N weft-train [options]\n"
    "  mesh:  --dp N --tp N --sp --zero 0|1|2|3 --hsdp R  (dims not given are 1; dp is the\n"
    "         world size over the others; --hsdp: R replicas sharding over dp/R, --zero 3)\n"
    "  model: --layers N --hidden N --heads N --ffn N --vocab N --seq N --batch N (global)\n"
    "  run:   --steps N --seed N --json --profile\n"
    "         --bucket-kb N  (DP / ZeRO-2 gradient buckets, first included; default 1 MiB\n"
    "         first, then 25 MiB)\n";

struct Options {
  Config config;
  Parallelism par;
  bool json = false, profile = false;
};

// Parses argv; returns an error message naming the argument, or "".
std::string parse(int argc, char** argv, Options& o) {
  struct IntOption {
    const char* name;
    int* value;
  };
  int seed = int(o.config.seed);
  const IntOption ints[] = {{"--dp", &o.par.dp},
                            {"--tp", &o.par.tp},
                            {"--zero", &o.par.zero},
                            {"--hsdp", &o.par.hsdp},
                            {"--layers", &o.config.layers},
                            {"--hidden", &o.config.hidden},
                            {"--heads", &o.config.heads},
                            {"--ffn", &o.config.ffn},
                            {"--vocab", &o.config.vocab},
                            {"--seq", &o.config.seq},
                            {"--batch", &o.config.batch},
                            {"--steps", &o.config.steps},
                            {"--seed", &seed},
                            {"--bucket-kb", &o.par.bucket_kb}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sp") {
      o.par.sp = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--profile") {
      o.profile = true;
    } else if (arg == "--debug-perturb-grad") {  // undocumented: the verdict can FAIL
      o.par.perturb_grad = true;
    } else if (arg == "--debug-extra-call") {  // undocumented: the ledger check can FAIL
      o.par.extra_call = true;
    } else if (arg == "-h" || arg == "--help") {
      return "help";
    } else {
      const IntOption* match = nullptr;
      for (const IntOption& opt : ints)
        if (arg == opt.name) match = &opt;
      if (match == nullptr) return "unknown option " + arg;
      if (i + 1 >= argc) return arg + " needs a value";
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (*argv[i] == '\0' || *end != '\0' || value < std::numeric_limits<int>::min() ||
          value > std::numeric_limits<int>::max())
        return arg + ": '" + argv[i] + "' is not an integer";
      *match->value = int(value);
    }
  }
  if (seed < 0) return "--seed " + std::to_string(seed) + " must be >= 0";
  o.config.seed = uint64_t(seed);
  return "";
}

// Rank 0 receives every rank's count elements of data (rank order).
template <typename T>
std::vector<T> gather(const weft::Comm& world, const std::vector<T>& data) {
  std::vector<T> all(world.rank() == 0 ? data.size() * world.size() : 0);
  weft::check(weftGather(data.data(), all.data(), data.size(), weft::datatype_of<T>(), 0,
                         world.get(), nullptr));
  return all;
}

std::string json_ledger(const par::Ledger& ledger) {
  std::ostringstream out;
  out << "[";
  const char* sep = "";
  for (const par::LedgerEntry& e : ledger.entries()) {
    out << sep << "{\"pattern\":\"" << e.pattern << "\",\"primitive\":\"" << e.primitive
        << "\",\"dim\":\"" << e.dim << "\",\"calls\":" << e.calls
        << ",\"bytes_per_call\":" << e.bytes_per_call << ",\"bytes_sent\":" << e.bytes_sent
        << ",\"algorithm\":\"" << e.algorithm << "\",\"comm_s\":" << e.comm_s
        << ",\"exposed_s\":" << e.exposed_s << "}";
    sep = ",";
  }
  out << "]";
  return out.str();
}

std::string json_list(const std::vector<double>& values) {
  std::ostringstream out;
  out.precision(17);
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  out << "]";
  return out.str();
}

// Compute, communication and exposed communication per pattern (this rank's, all steps).
void print_profile(const par::Ledger& ledger, double step_s) {
  std::printf(
      "# profile (rank 0): %.3f ms per step; compute forward %.3f ms (cpu %.3f), backward %.3f "
      "ms (cpu %.3f)\n",
      step_s * 1e3, ledger.compute_s("forward") * 1e3, ledger.compute_s("forward.cpu") * 1e3,
      ledger.compute_s("backward") * 1e3, ledger.compute_s("backward.cpu") * 1e3);
  std::printf("# %-22s %-14s %-13s %6s %10s %11s %7s\n", "pattern", "primitive", "dim", "calls",
              "comm ms", "exposed ms", "hidden");
  std::vector<par::LedgerEntry> patterns;  // the entries summed over their sizes
  for (const par::LedgerEntry& e : ledger.entries()) {
    auto same = [&](const par::LedgerEntry& p) {
      return p.pattern == e.pattern && p.primitive == e.primitive && p.dim == e.dim;
    };
    auto it = std::find_if(patterns.begin(), patterns.end(), same);
    if (it == patterns.end()) {
      patterns.push_back(e);
      continue;
    }
    it->calls += e.calls, it->comm_s += e.comm_s, it->exposed_s += e.exposed_s;
  }
  for (const par::LedgerEntry& e : patterns)
    std::printf("# %-22s %-14s %-13s %6zu %10.3f %11.3f %6.1f%%\n", e.pattern.c_str(),
                e.primitive.c_str(), e.dim.c_str(), e.calls, e.comm_s * 1e3, e.exposed_s * 1e3,
                e.comm_s > 0 ? 100.0 * (1 - e.exposed_s / e.comm_s) : 0.0);
}

int run(int argc, char** argv) {
  Options o;
  const std::string parse_error = parse(argc, argv, o);
  if (parse_error == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!parse_error.empty()) {
    std::fprintf(stderr, "weft-train: error: %s\n%s", parse_error.c_str(), kUsage);
    return 2;
  }
  weft::Comm world = weft::Comm::from_env();
  const int rank = world.rank();
  const MeshPlan plan = plan_mesh(o.config, o.par, world.size());
  if (!plan.error.empty()) {
    if (rank == 0) std::fprintf(stderr, "weft-train: error: %s\n", plan.error.c_str());
    return 2;
  }
  const Config& config = o.config;
  Distributed model(config, o.par, plan.dp, world.get());

  std::vector<double> losses;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < config.steps; ++step)
    losses.push_back(model.step(make_batch(config, step)));
  const double step_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      config.steps;
  // The ledger of the training steps only: what follows (parameter gathers) is the check's.
  const par::Ledger ledger = model.ledger();
  const par::Ledger expected = par::Ledger::expected(ledger_model(config, o.par, plan.dp));
  const std::vector<std::string> deviations = ledger.compare(expected);
  const bool coverage = model.coverage_ok();
  const std::vector<float> reduced = model.reduced_grads();
  const std::vector<float> params = model.params();

  std::vector<double> header{double(model.dp_coord()), deviations.empty() ? 1.0 : 0.0,
                             coverage ? 1.0 : 0.0};
  header.insert(header.end(), losses.begin(), losses.end());
  std::vector<float> arrays = model.local_grads();
  arrays.insert(arrays.end(), reduced.begin(), reduced.end());
  arrays.insert(arrays.end(), params.begin(), params.end());
  const std::vector<double> headers = gather(world, header);
  const std::vector<float> all_arrays = gather(world, arrays);
  if (rank != 0) return 0;

  // The single-process reference, same seed, the whole global batch.
  Reference reference(config);
  std::vector<double> ref_losses;
  std::vector<float> ref_grads, ref_params;
  for (int step = 0; step < config.steps; ++step) {
    ref_losses.push_back(reference.forward_backward(make_batch(config, step)));
    if (step + 1 == config.steps)
      for (const Tensor& t : reference.params())
        ref_grads.insert(ref_grads.end(), t.grad.begin(), t.grad.end());
    reference.adam(AdamConfig{}, step + 1);
  }
  for (const Tensor& t : reference.params())
    ref_params.insert(ref_params.end(), t.value.begin(), t.value.end());

  const size_t g = ref_grads.size();
  std::vector<RankReport> ranks(world.size());
  std::vector<std::string> failures;
  for (int r = 0; r < world.size(); ++r) {
    const double* h = headers.data() + size_t(r) * header.size();
    const float* a = all_arrays.data() + size_t(r) * arrays.size();
    ranks[r].dp = int(h[0]);
    if (h[1] == 0) failures.push_back("rank " + std::to_string(r) + "'s ledger deviates");
    if (h[2] == 0) failures.push_back("rank " + std::to_string(r) + ": ZeRO shard coverage");
    ranks[r].losses.assign(h + 3, h + 3 + config.steps);
    ranks[r].grads.assign(a, a + g);
    ranks[r].reduced.assign(a + g, a + 2 * g);
    ranks[r].params.assign(a + 2 * g, a + 3 * g);
  }
  const Verdict v = verify(reference.specs(), ranks, plan.dp, ref_losses, ref_grads, ref_params);
  failures.insert(failures.end(), v.failures.begin(), v.failures.end());
  auto check = [&](const Worst& w, const char* what) {
    if (w.value > kTolerance)
      failures.push_back(std::string(what) + " differ by " + std::to_string(w.value) + " in " +
                         w.where);
  };
  check(v.loss, "losses");
  check(v.grads, "gradients");
  if (v.has_reduced) check(v.reduced, "reduced gradients");
  check(v.params, "parameters");

  if (o.json) {
    std::printf(
        "{\"world\":%d,\"dp\":%d,\"tp\":%d,\"sp\":%s,\"zero\":%d,\"hsdp\":%d,\"layers\":%d,"
        "\"hidden\":%d,\"heads\":%d,\"ffn\":%d,\"vocab\":%d,\"seq\":%d,\"batch\":%d,"
        "\"steps\":%d,\"seed\":%llu,\"losses\":%s,\"reference_losses\":%s,"
        "\"max_rel\":{\"loss\":%.3e,\"grads\":%.3e,\"reduced_grads\":%.3e,\"params\":%.3e},"
        "\"step_s\":%.6f,\"ledger\":%s,\"expected\":%s,\"pass\":%s}\n",
        world.size(), plan.dp, plan.tp, o.par.sp ? "true" : "false", o.par.zero, o.par.hsdp,
        config.layers, config.hidden, config.heads, config.ffn, config.vocab, config.seq,
        config.batch, config.steps, (unsigned long long)config.seed, json_list(v.losses).c_str(),
        json_list(ref_losses).c_str(), v.loss.value, v.grads.value, v.reduced.value, v.params.value,
        step_s, json_ledger(ledger).c_str(), json_ledger(expected).c_str(),
        failures.empty() ? "true" : "false");
  } else {
    std::printf(
        "# mesh: world %d = dp %d x tp %d, sp %s, zero %d, hsdp %d; model: layers %d "
        "hidden %d heads %d ffn %d vocab %d seq %d batch %d, seed %llu\n",
        world.size(), plan.dp, plan.tp, o.par.sp ? "on" : "off", o.par.zero, o.par.hsdp,
        config.layers, config.hidden, config.heads, config.ffn, config.vocab, config.seq,
        config.batch, (unsigned long long)config.seed);
    for (int s = 0; s < config.steps; ++s)
      std::printf("step %d: loss %.9f reference %.9f\n", s + 1, v.losses[s], ref_losses[s]);
    std::printf("max relative difference: loss %.3e (%s), gradients %.3e (%s), ", v.loss.value,
                v.loss.where.c_str(), v.grads.value, v.grads.where.c_str());
    if (v.has_reduced)
      std::printf("reduced gradients %.3e (%s), ", v.reduced.value, v.reduced.where.c_str());
    std::printf("parameters %.3e (%s)\n", v.params.value, v.params.where.c_str());
    std::fputs(ledger.table(&expected).c_str(), stdout);
    for (const std::string& d : deviations) std::printf("ledger: %s\n", d.c_str());
    if (o.profile) print_profile(ledger, step_s);
  }
  if (failures.empty()) {
    std::printf("# weft-train: PASS\n");
    return 0;
  }
  std::string reason = failures.front();
  if (failures.size() > 1) reason += " (and " + std::to_string(failures.size() - 1) + " more)";
  std::printf("# weft-train: FAIL: %s\n", reason.c_str());
  return 1;
}

}  // namespace
}  // namespace weft::train

int main(int argc, char** argv) {
  try {
    return weft::train::run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("# weft-train: FAIL: %s\n", e.what());
    return 1;
  }
}
