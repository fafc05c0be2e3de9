// weft-train: trains the small transformer of model.h on a mesh (dp × tp, sequence
// parallel, ZeRO-1/2/3, HSDP) through the parallel adapters, runs the same model on one
// process on rank 0, and checks losses, gradients, parameters and the traffic ledger.
// With --checkpoint-dir it saves its sharded state every K steps, resumes from it
// (--resume) and, with --shrink-on-failure, goes on without a rank that died.
// Run: weftrun -n N weft-train [--dp N] [--tp N] [--sp] [--zero 0-3] [--hsdp R] ...

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "checkpoint.h"
#include "distributed.h"
#include "model.h"
#include "pipeline.h"
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
    "         --cp N --cp-algo ring|zigzag|passq|allgather|ulysses|hier|compressed|auto\n"
    "         (context parallel; hier: ulysses inside a node, ring across nodes; compressed:\n"
    "         the model attends over mean-compressed blocks, also with --cp 1)\n"
    "         --compress-block L --compress-stride S  (compressed: blocks of L positions\n"
    "         every S; default 4, 2)\n"
    "         --nodes N  (emulate N nodes of consecutive ranks; default: the host names)\n"
    "  moe:   --experts E --topk K --capacity F --ep N  (MoE MLP in place of the dense one;\n"
    "         EP over N of the dp ranks, experts reduced over dp/N; F 0: no capacity)\n"
    "         --ep-sync-free  (dispatch without a count exchange: worst-case buffers)\n"
    "  pipe:  --pp N --microbatches M --schedule gpipe|1f1b|interleaved|zb --virtual V\n"
    "         (layers split over N·V stages; with --zero 0 and no --sp)\n"
    "  model: --layers N --hidden N --heads N --ffn N --vocab N --seq N --batch N (global)\n"
    "  run:   --steps N --seed N --json --profile\n"
    "  ckpt:  --checkpoint-dir D --checkpoint-every K  (every K steps each rank saves its\n"
    "         shard to D/step-N/, rank 0 a manifest of mesh, model and step)\n"
    "         --resume  (start from the newest complete checkpoint in D; same model and\n"
    "         mesh but dp, which may differ: the state is re-sharded from every rank's file)\n"
    "         --shrink-on-failure  (when a rank dies the survivors shrink the world, exclude\n"
    "         it and go on from the newest checkpoint on fewer dp ranks; no --pp)\n"
    "         --bucket-kb N  (DP / ZeRO-2 gradient buckets, first included; default 1 MiB\n"
    "         first, then 25 MiB)\n";

struct Options {
  Config config;
  Parallelism par;
  bool json = false, profile = false;
  std::string checkpoint_dir;
  int checkpoint_every = 0;  // 0: no checkpoints written
  bool resume = false, shrink_on_failure = false;
  // Debug: rank kill_rank kills itself (SIGKILL) as step kill_step (1-based) begins.
  int kill_rank = -1, kill_step = 0;
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
                            {"--cp", &o.par.cp},
                            {"--nodes", &o.par.nodes},
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
                            {"--bucket-kb", &o.par.bucket_kb},
                            {"--ep", &o.par.ep},
                            {"--experts", &o.config.experts},
                            {"--topk", &o.config.topk},
                            {"--compress-block", &o.config.compress_block},
                            {"--compress-stride", &o.config.compress_stride},
                            {"--pp", &o.par.pp},
                            {"--microbatches", &o.par.microbatches},
                            {"--virtual", &o.par.virtual_stages},
                            {"--checkpoint-every", &o.checkpoint_every},
                            {"--debug-kill-rank", &o.kill_rank},  // for tests
                            {"--debug-kill-step", &o.kill_step}};
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
    } else if (arg == "--resume") {
      o.resume = true;
    } else if (arg == "--shrink-on-failure") {
      o.shrink_on_failure = true;
    } else if (arg == "--checkpoint-dir") {
      if (i + 1 >= argc || *argv[i + 1] == '\0') return arg + " needs a directory";
      o.checkpoint_dir = argv[++i];
    } else if (arg == "--schedule") {
      if (i + 1 >= argc) return arg + " needs a value";
      o.par.schedule = argv[++i];
    } else if (arg == "--cp-algo") {
      if (i + 1 >= argc) return arg + " needs a value";
      o.par.cp_algo = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      return "help";
    } else if (arg == "--ep-sync-free") {
      o.par.ep_sync_free = true;
    } else if (arg == "--capacity") {
      if (i + 1 >= argc) return arg + " needs a value";
      char* end = nullptr;
      o.config.capacity = std::strtod(argv[++i], &end);
      if (*argv[i] == '\0' || *end != '\0' || !std::isfinite(o.config.capacity))
        return arg + ": '" + argv[i] + "' is not a number";
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
  if (o.checkpoint_every < 0)
    return "--checkpoint-every " + std::to_string(o.checkpoint_every) + " must be >= 0";
  if (o.checkpoint_dir.empty()) {
    if (o.checkpoint_every > 0) return "--checkpoint-every needs --checkpoint-dir";
    if (o.resume) return "--resume needs --checkpoint-dir";
    if (o.shrink_on_failure) return "--shrink-on-failure needs --checkpoint-dir";
  }
  o.config.compressed = o.par.cp_algo == "compressed";
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

// Every rank finds the same mesh error; rank 0 says it, and the others wait for that before
// they exit (weftrun stops the job at the first failed rank, which could be before rank 0
// has written anything).
int refuse_together(const weft::Comm& world, const std::string& error) {
  if (world.rank() == 0) {
    std::fprintf(stderr, "weft-train: error: %s\n", error.c_str());
    std::fflush(stderr);
  }
  world.barrier();
  return 2;
}

// The meshes checkpoints support, or a message.
std::string checkpoint_error(const Options& o, bool pipelined) {
  if (o.checkpoint_dir.empty()) return "";
  if (pipelined && o.shrink_on_failure)
    return "--shrink-on-failure with --pp or --microbatches is not supported (the survivors "
           "rebuild a mesh without pipeline stages)";
  return "";
}

CheckpointMesh checkpoint_mesh(const Options& o, const MeshPlan& plan) {
  return {plan.dp, plan.tp, plan.cp, o.par.pp, o.par.zero, o.par.sp, o.par.ep};
}

// Every rank's shard of the state after the last step, then (once all are written) the
// manifest; no rank goes on before the checkpoint is complete, so a rank that dies in the
// next step cannot leave it incomplete.
void save_checkpoint(const Options& o, const weft::Comm& world, const Trainer& model,
                     const MeshPlan& plan) {
  const ShardState state = model.shard_state();
  save_shard(o.checkpoint_dir, world.rank(), state);
  world.barrier();
  if (world.rank() == 0)
    save_manifest(o.checkpoint_dir, state.step, world.size(), checkpoint_mesh(o, plan), o.config);
  world.barrier();
}

// Restores the newest complete checkpoint in --checkpoint-dir (re-sharded for this mesh);
// returns its step, or 0 (the initial state) when there is none and `required` is false.
int restore_newest(const Options& o, Trainer& model, const MeshPlan& plan, bool required) {
  const std::optional<int> newest = newest_checkpoint(o.checkpoint_dir);
  if (!newest) {
    if (required)
      throw CheckpointError("--resume: no complete checkpoint in " + o.checkpoint_dir +
                            " (a step-N directory with a manifest)");
    return 0;
  }
  if (*newest >= o.config.steps)
    throw CheckpointError("--resume: the newest checkpoint in " + o.checkpoint_dir +
                          " is of step " + std::to_string(*newest) + ", not before --steps " +
                          std::to_string(o.config.steps));
  model.restore(load_checkpoint(o.checkpoint_dir, *newest, o.config, checkpoint_mesh(o, plan)));
  return *newest;
}

// The world rank whose death failed a step. Any call on the world then fails with the world
// bootstrap root's verdict, "rank R (host:pid) died or lost its connection", or, when R hosted
// the root, with "lost the connection to the bootstrap root (its host, rank R (host:pid),
// died or left)".
int dead_rank(const weft::Comm& world, const std::string& step_error) {
  std::string verdict;
  try {
    world.barrier();
  } catch (const weft::Error& e) {
    verdict = e.what();
  }
  std::smatch match;
  static const std::regex died(R"(rank (\d+) \([^)]*\),? died)");
  if (!std::regex_search(verdict, match, died))
    throw std::runtime_error(
        "--shrink-on-failure: the step failed but no rank of the world died (" + step_error + ")");
  return std::stoi(match[1].str());
}

// After a rank died in `step` (1-based): the survivors shrink the world without it, build the mesh
// again on the dp they make up and restore the newest checkpoint (the initial state if
// there is none yet). Returns the step to go on from.
int go_on_without_the_dead(const Options& o, int step, const std::string& step_error,
                           weft::Comm& world, MeshPlan& plan, std::unique_ptr<Trainer>& trainer) {
  const int dead = dead_rank(world, step_error);
  weft::Comm survivors = world.shrink(std::vector<int>{dead});
  trainer.reset();  // its communicators were split from the old world
  world = std::move(survivors);
  Parallelism resized = o.par;
  resized.dp = 0;  // the world over tp
  plan = plan_mesh(o.config, resized, world.size());
  if (!plan.error.empty())
    throw std::runtime_error("--shrink-on-failure: cannot go on with " +
                             std::to_string(world.size()) + " ranks: " + plan.error);
  trainer = std::make_unique<Distributed>(o.config, resized, plan.dp, world.get());
  const int first_step = restore_newest(o, *trainer, plan, false);
  if (world.rank() == 0)
    std::printf(
        "# weft-train: rank %d died in step %d; %d survivors go on from step %d with dp %d\n", dead,
        step, world.size(), first_step, plan.dp);
  return first_step;
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
  MeshPlan plan = plan_mesh(o.config, o.par, world.size());
  if (!plan.error.empty()) return refuse_together(world, plan.error);
  o.config.capacity_groups = plan.dp;  // capacity applies per source rank
  const Config& config = o.config;
  const bool pipelined = o.par.pp > 1 || o.par.microbatches > 1 || o.par.virtual_stages > 1 ||
                         o.par.schedule != "1f1b";
  const std::string pipe_error = pipelined ? check_pipeline(config, o.par, plan.dp) : "";
  if (!pipe_error.empty()) return refuse_together(world, pipe_error);
  const std::string checkpoint_refusal = checkpoint_error(o, pipelined);
  if (!checkpoint_refusal.empty()) return refuse_together(world, checkpoint_refusal);
  std::unique_ptr<Trainer> trainer;
  PipelineModel* staged = nullptr;
  if (pipelined) {
    auto model = std::make_unique<PipelineModel>(config, o.par, plan.dp, world.get());
    staged = model.get();
    trainer = std::move(model);
  } else {
    trainer = std::make_unique<Distributed>(config, o.par, plan.dp, world.get());
  }
  int first_step = 0;  // the steps before it come from a checkpoint
  if (o.resume) {
    try {
      first_step = restore_newest(o, *trainer, plan, true);
    } catch (const CheckpointError& e) {
      return refuse_together(world, e.what());
    }
  }

  std::vector<double> losses;
  const auto start = std::chrono::steady_clock::now();
  bool shrunk = false;  // the debug victim is a rank of the world the run started with
  for (int step = first_step; step < config.steps; ++step) {
    if (!shrunk && step + 1 == o.kill_step && world.rank() == o.kill_rank) raise(SIGKILL);
    try {
      losses.push_back(trainer->step(make_batch(config, step)));
      if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0)
        save_checkpoint(o, world, *trainer, plan);
    } catch (const weft::Error& e) {
      // Every survivor fails in this step: each step's DP reduction spans the world.
      if (!o.shrink_on_failure) throw;
      first_step = go_on_without_the_dead(o, step + 1, e.what(), world, plan, trainer);
      shrunk = true;
      losses.clear();
      step = first_step - 1;
    }
  }
  Trainer& model = *trainer;
  const int rank = world.rank();
  const int steps_run = config.steps - first_step;
  const double step_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps_run;
  // The ledger of the training steps only: what follows (parameter gathers) is the check's.
  const par::Ledger ledger = model.ledger();
  Config run_config = config;  // the steps this trainer ran, which its ledger counts
  run_config.steps = steps_run;
  par::ModelConfig described =
      staged ? pipeline_ledger_model(run_config, o.par, plan.dp, staged->pp_coord())
             : ledger_model(run_config, o.par, plan.dp);
  described.cp_node_ranks = model.cp_node_ranks();  // hier: from the mesh's hosts
  described.cp_rank = model.cp_coord();
  const par::Ledger expected = par::Ledger::expected(described);
  const std::vector<std::string> deviations = ledger.compare(expected);
  const bool coverage = model.coverage_ok();
  const std::vector<float> reduced = model.reduced_grads();
  const std::vector<float> params = model.params();

  std::vector<double> header{double(model.replica_coord()), deviations.empty() ? 1.0 : 0.0,
                             coverage ? 1.0 : 0.0};
  header.insert(header.end(), losses.begin(), losses.end());
  std::vector<float> arrays = model.local_grads();
  arrays.insert(arrays.end(), reduced.begin(), reduced.end());
  arrays.insert(arrays.end(), params.begin(), params.end());
  const std::vector<double> headers = gather(world, header);
  std::vector<double> stages;  // per rank: pp coord, wall, compute, simulated, formula bubble
  if (staged && o.profile) {
    const StageProfile p = staged->profile();
    stages = gather(world, std::vector<double>{double(staged->pp_coord()), p.wall_s, p.compute_s,
                                               p.simulated, p.formula});
  }
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
    ranks[r].losses.assign(h + 3, h + 3 + steps_run);
    ranks[r].grads.assign(a, a + g);
    ranks[r].reduced.assign(a + g, a + 2 * g);
    ranks[r].params.assign(a + 2 * g, a + 3 * g);
  }
  // Every dp × cp rank is a replica of the data-parallel mean (equal shards of the tokens).
  ref_losses.erase(ref_losses.begin(), ref_losses.begin() + first_step);
  const Verdict v =
      verify(reference.specs(), ranks, plan.dp * plan.cp, ref_losses, ref_grads, ref_params);
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
        "{\"world\":%d,\"dp\":%d,\"tp\":%d,\"cp\":%d,\"sp\":%s,\"zero\":%d,\"hsdp\":%d,\"layers\":%"
        "d,"
        "\"hidden\":%d,\"heads\":%d,\"ffn\":%d,\"vocab\":%d,\"seq\":%d,\"batch\":%d,"
        "\"steps\":%d,\"first_step\":%d,\"seed\":%llu,\"losses\":%s,\"reference_losses\":%s,"
        "\"max_rel\":{\"loss\":%.3e,\"grads\":%.3e,\"reduced_grads\":%.3e,\"params\":%.3e},"
        "\"step_s\":%.6f,\"ledger\":%s,\"expected\":%s,\"pass\":%s}\n",
        world.size(), plan.dp, plan.tp, plan.cp, o.par.sp ? "true" : "false", o.par.zero,
        o.par.hsdp, config.layers, config.hidden, config.heads, config.ffn, config.vocab,
        config.seq, config.batch, config.steps, first_step, (unsigned long long)config.seed,
        json_list(v.losses).c_str(), json_list(ref_losses).c_str(), v.loss.value, v.grads.value,
        v.reduced.value, v.params.value, step_s, json_ledger(ledger).c_str(),
        json_ledger(expected).c_str(), failures.empty() ? "true" : "false");
  } else {
    std::printf(
        "# mesh: world %d = dp %d x tp %d x cp %d (%s) x pp %d, sp %s, zero %d, hsdp %d; model: "
        "layers %d hidden %d heads %d ffn %d vocab %d seq %d batch %d, seed %llu\n",
        world.size(), plan.dp, plan.tp, plan.cp, o.par.cp_algo.c_str(), o.par.pp,
        o.par.sp ? "on" : "off", o.par.zero, o.par.hsdp, config.layers, config.hidden, config.heads,
        config.ffn, config.vocab, config.seq, config.batch, (unsigned long long)config.seed);
    if (config.experts > 0)
      std::printf("# moe: experts %d topk %d capacity %g, ep %d x expert-dp %d\n", config.experts,
                  config.topk, config.capacity, o.par.ep, plan.dp / o.par.ep);
    for (int s = 0; s < steps_run; ++s)
      std::printf("step %d: loss %.9f reference %.9f\n", first_step + s + 1, v.losses[s],
                  ref_losses[s]);
    std::printf("max relative difference: loss %.3e (%s), gradients %.3e (%s), ", v.loss.value,
                v.loss.where.c_str(), v.grads.value, v.grads.where.c_str());
    if (v.has_reduced)
      std::printf("reduced gradients %.3e (%s), ", v.reduced.value, v.reduced.where.c_str());
    std::printf("parameters %.3e (%s)\n", v.params.value, v.params.where.c_str());
    std::fputs(ledger.table(&expected).c_str(), stdout);
    for (const std::string& d : deviations) std::printf("ledger: %s\n", d.c_str());
    if (config.experts > 0) {
      // The dispatcher's load notes, summed over layers and steps (the EP group of rank 0).
      std::printf("# moe load: tokens per expert");
      for (int g = 0; g < config.experts; ++g)
        std::printf(" %g", ledger.noted("ep.load.expert." + std::to_string(g)));
      std::printf("; dropped by rank 0 %g; worst imbalance (max/mean) %.3f\n",
                  ledger.noted("ep.load.dropped"), ledger.noted("ep.load.imbalance"));
    }
    if (o.profile) print_profile(ledger, step_s);
  }
  for (size_t r = 0; r * 5 < stages.size(); ++r) {
    const double* p = stages.data() + r * 5;
    std::printf(
        "# rank %zu (pp %d, %s): pipeline bubble measured %.1f%% (compute %.3f of %.3f ms, "
        "last step), simulated %.1f%%, formula %.1f%%\n",
        r, int(p[0]), o.par.schedule.c_str(), 100 * (1 - p[2] / p[1]), p[2] * 1e3, p[1] * 1e3,
        100 * p[3], 100 * p[4]);
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
  } catch (const weft::train::CheckpointError& e) {  // a bad directory, met while training
    std::fprintf(stderr, "weft-train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::printf("# weft-train: FAIL: %s\n", e.what());
    return 1;
  }
}
