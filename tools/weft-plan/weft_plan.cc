// weft-plan: a training or inference step's communication counted (the ledger's
// closed forms), timed (the tuner's cost model on a cluster file), overlapped,
// and set against compute, pipeline bubble and memory, before anything runs.
//   weft-plan --model llama3-70b --train 1024,1,8192 --tp 8 --pp 4 --sp --zero 1
//             --cluster cluster.json [--json] [--search]
// Bad input: one line naming the argument, exit status 2. See docs/planning.md.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "planner.h"
#include "topo/cluster_file.h"
#include "topo/json.h"

namespace weft::plan {
namespace {

constexpr const char* kUsage =
    "usage: weft-plan --cluster FILE (--model NAME | --layers N --hidden N --heads N ...)\n"
    "                 (--train GLOBAL,MICRO,SEQ | --prefill BATCH,CONTEXT | --decode "
    "BATCH,CONTEXT)\n"
    "                 [mesh] [--json] [--search [--top N]]\n"
    "  model:  --model llama3-8b|llama3-70b|mixtral-8x7b|deepseek-v3, or --arch "
    "llama|mla|reference\n"
    "          --layers --hidden --heads --kv-heads --ffn --vocab --experts --topk --moe-ffn\n"
    "          --shared-experts --dense-layers (given after --model they override it)\n"
    "  dtypes: --weights-dtype --grads-dtype --comm-dtype --moments-dtype fp32|bf16|fp16|fp8\n"
    "          (bf16, fp32, bf16, fp32; moments: Adam's two states)\n"
    "  mesh:   --dp N (0: the cluster over the others) --tp N --pp N --cp N --ep N --sp\n"
    "          --zero 0-3 --hsdp R --schedule gpipe|1f1b|interleaved|zb --microbatches N\n"
    "          --virtual V --cp-algo ring|zigzag|passq|allgather|ulysses|hier|auto (zigzag),\n"
    "          or in place of softmax attention affine|compressed (--cp-block 32 --cp-stride 16)\n"
    "          --ep-sync-free --ep-dispatch flat|hier --recompute none|selective|full\n"
    "          --bucket-kb N --hot-expert SHARE (MoE routing skew: share of slots on one expert)\n"
    "  device: --tflops T --memory-gb G --memory-gbps B (override the cluster file's device)\n"
    "          --reserve-gb R (memory per device kept free of the plan; default 0)\n";

bool parse_int(const std::string& text, int* out) {
  char* end = nullptr;
  const long value = strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < -1000000000 || value > 1000000000) return false;
  *out = static_cast<int>(value);
  return true;
}

bool parse_double(const std::string& text, double* out) {
  char* end = nullptr;
  *out = strtod(text.c_str(), &end);
  return !text.empty() && *end == '\0';
}

bool parse_ints(const std::string& text, std::vector<int*> outs) {
  std::stringstream in(text);
  std::string part;
  size_t i = 0;
  while (std::getline(in, part, ',')) {
    if (i >= outs.size() || !parse_int(part, outs[i])) return false;
    ++i;
  }
  return i == outs.size();
}

bool parse_dtype(const std::string& name, weftDataType_t* out) {
  if (name == "fp32")
    *out = weftFloat32;
  else if (name == "bf16")
    *out = weftBfloat16;
  else if (name == "fp16")
    *out = weftFloat16;
  else if (name == "fp8")
    *out = weftFloat8e4m3;
  else
    return false;
  return true;
}

struct Cli {
  Options options;
  std::string cluster_file;
  bool json = false, search = false, have_work = false, have_model = false;
  int top = 10;
  double tflops = 0, memory_gb = 0, memory_gbps = 0;
};

// "" or the error naming the argument.
std::string parse(int argc, char** argv, Cli& cli) {
  Options& o = cli.options;
  ModelSpec& m = o.model;
  const std::pair<const char*, int*> ints[] = {{"--layers", &m.layers},
                                               {"--hidden", &m.hidden},
                                               {"--heads", &m.heads},
                                               {"--kv-heads", &m.kv_heads},
                                               {"--ffn", &m.ffn},
                                               {"--vocab", &m.vocab},
                                               {"--experts", &m.experts},
                                               {"--topk", &m.topk},
                                               {"--moe-ffn", &m.moe_ffn},
                                               {"--shared-experts", &m.shared_experts},
                                               {"--dense-layers", &m.dense_layers},
                                               {"--dp", &o.dp},
                                               {"--tp", &o.tp},
                                               {"--pp", &o.pp},
                                               {"--cp", &o.cp},
                                               {"--ep", &o.ep},
                                               {"--zero", &o.zero},
                                               {"--hsdp", &o.hsdp},
                                               {"--microbatches", &o.microbatches},
                                               {"--virtual", &o.virtual_stages},
                                               {"--cp-block", &o.cp_block},
                                               {"--cp-stride", &o.cp_stride},
                                               {"--top", &cli.top}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return "help";
    if (arg == "--sp") {
      o.sp = true;
      continue;
    }
    if (arg == "--ep-sync-free") {
      o.ep_sync_free = true;
      continue;
    }
    if (arg == "--json") {
      cli.json = true;
      continue;
    }
    if (arg == "--search") {
      cli.search = true;
      continue;
    }
    if (i + 1 >= argc) return arg + ": missing value";
    const std::string value = argv[++i];
    bool matched = false;
    for (const auto& [name, target] : ints)
      if (arg == name) {
        if (!parse_int(value, target)) return arg + "=" + value + ": expected an integer";
        if (arg == "--layers" || arg == "--hidden" || arg == "--heads" || arg == "--ffn" ||
            arg == "--vocab")
          cli.have_model = true;
        matched = true;
      }
    if (matched) continue;
    if (arg == "--model") {
      if (!preset(value, &m))
        return "--model=" + value + ": unknown preset (" + preset_names() + ")";
      cli.have_model = true;
    } else if (arg == "--arch") {
      if (value != "llama" && value != "mla" && value != "reference")
        return "--arch=" + value + ": expected llama, mla or reference";
      m.arch = value;
    } else if (arg == "--train") {
      if (!parse_ints(value, {&o.global_batch, &o.micro_batch, &o.seq}))
        return "--train=" + value + ": expected GLOBAL_BATCH,MICRO_BATCH,SEQ";
      o.work = Work::train, cli.have_work = true;
    } else if (arg == "--prefill" || arg == "--decode") {
      if (!parse_ints(value, {&o.batch, &o.context}))
        return arg + "=" + value + ": expected BATCH,CONTEXT";
      o.work = arg == "--prefill" ? Work::prefill : Work::decode, cli.have_work = true;
    } else if (arg == "--weights-dtype" || arg == "--grads-dtype" || arg == "--comm-dtype" ||
               arg == "--moments-dtype") {
      weftDataType_t* target = arg == "--weights-dtype"   ? &o.weights
                               : arg == "--grads-dtype"   ? &o.grads
                               : arg == "--moments-dtype" ? &o.moments
                                                          : &o.comm;
      if (!parse_dtype(value, target))
        return arg + "=" + value + ": expected fp32, bf16, fp16 or fp8";
    } else if (arg == "--schedule") {
      o.schedule = value;
    } else if (arg == "--cp-algo") {
      o.cp_algo = value;
    } else if (arg == "--ep-dispatch") {
      o.ep_dispatch = value;
    } else if (arg == "--recompute") {
      o.recompute = value;
    } else if (arg == "--cluster") {
      cli.cluster_file = value;
    } else if (arg == "--bucket-kb") {
      int kb = 0;
      if (!parse_int(value, &kb) || kb <= 0)
        return "--bucket-kb=" + value + ": expected a positive integer";
      o.bucket_bytes = o.first_bucket_bytes = size_t(kb) << 10;
    } else if (arg == "--hot-expert" || arg == "--tflops" || arg == "--memory-gb" ||
               arg == "--memory-gbps" || arg == "--reserve-gb") {
      double* target = arg == "--hot-expert"   ? &o.hot_expert_share
                       : arg == "--tflops"     ? &cli.tflops
                       : arg == "--memory-gb"  ? &cli.memory_gb
                       : arg == "--reserve-gb" ? &o.reserve_gb
                                               : &cli.memory_gbps;
      if (!parse_double(value, target) || !(*target >= 0))
        return arg + "=" + value + ": expected a number >= 0";
    } else {
      return "unknown option " + arg;
    }
  }
  if (cli.cluster_file.empty())
    return "--cluster: a cluster file (WEFT_TOPO_FILE format) is required";
  if (!cli.have_model) return "--model or --layers/--hidden/--heads/--ffn/--vocab: no model given";
  if (!cli.have_work) return "--train, --prefill or --decode: no work given";
  if (m.experts > 0 && m.moe_ffn == 0) m.moe_ffn = m.ffn;
  if (cli.top <= 0) return "--top=" + std::to_string(cli.top) + " must be positive";
  return "";
}

// Every link class the cluster's ranks use must be given in the file's
// "links": a default figure would silently decide the plan.
std::string check_links(const std::string& path, const topo::Cluster& cluster) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  topo::json::Value root;
  std::set<std::string> given;
  if (topo::json::parse(text.str(), &root).ok())
    if (const topo::json::Value* links = root.find("links"))
      for (const auto& [key, value] : links->members) given.insert(key);
  const int n = static_cast<int>(cluster.ranks.size());
  std::vector<bool> seen(topo::kNumLinkClasses, false);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      const topo::LinkClass link = topo::link_between(cluster, a, b);
      if (seen[static_cast<int>(link)]) continue;
      seen[static_cast<int>(link)] = true;
      if (!given.count(topo::link_class_name(link)))
        return "--cluster " + path + ": link class \"" + topo::link_class_name(link) +
               "\" (between ranks " + std::to_string(a) + " and " + std::to_string(b) +
               ") is not given in its \"links\"";
    }
  return "";
}

// "tp=4 cp=1 ep=1 dp=8 pp=4 sp zero=2 [hsdp=2] [recompute=full] schedule=zb v=1"; dp < 0 (a
// rejected mesh, never planned): without it.
std::string mesh_text(const Options& o, int dp) {
  char text[256];
  snprintf(text, sizeof(text), "tp=%d cp=%d ep=%d%s pp=%d%s zero=%d%s%s schedule=%s v=%d", o.tp,
           o.cp, o.ep, dp >= 0 ? (" dp=" + std::to_string(dp)).c_str() : "", o.pp,
           o.sp ? " sp" : "", o.zero, o.hsdp > 1 ? (" hsdp=" + std::to_string(o.hsdp)).c_str() : "",
           o.recompute != "selective" ? (" recompute=" + o.recompute).c_str() : "",
           o.schedule.c_str(), o.virtual_stages);
  return text;
}

std::string json_string(const std::string& s) {
  return topo::json::quote(s);
}

std::string json_result(const Options& o, const Result& r) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"mesh\":{\"tp\":" << o.tp << ",\"cp\":" << o.cp << ",\"ep\":" << o.ep
      << ",\"dp\":" << r.dp << ",\"pp\":" << o.pp << ",\"sp\":" << (o.sp ? "true" : "false")
      << ",\"zero\":" << o.zero << ",\"hsdp\":" << o.hsdp
      << ",\"schedule\":" << json_string(o.schedule) << ",\"virtual\":" << o.virtual_stages
      << ",\"recompute\":" << json_string(o.recompute) << "},\"world\":" << r.world
      << ",\"microbatches\":" << r.microbatches << ",\"params\":" << r.params
      << ",\"active_params\":" << r.active_params << ",\"rank_params\":" << r.stage_params
      << ",\"entries\":[";
  const char* sep = "";
  for (const Entry& e : r.entries) {
    out << sep << "{\"pattern\":" << json_string(e.ledger.pattern)
        << ",\"primitive\":" << json_string(e.ledger.primitive)
        << ",\"dim\":" << json_string(e.ledger.dim) << ",\"group\":" << e.group
        << ",\"calls\":" << e.ledger.calls << ",\"calls_per_layer\":" << e.calls_per_layer
        << ",\"per_microbatch\":" << (e.per_microbatch ? "true" : "false")
        << ",\"bytes_per_call\":" << e.ledger.bytes_per_call
        << ",\"bytes_sent\":" << e.ledger.bytes_sent
        << ",\"algorithm\":" << json_string(e.algorithm) << ",\"predicted_us\":" << e.call_us
        << ",\"total_s\":" << e.total_s << ",\"window\":" << json_string(e.window)
        << ",\"exposed_s\":" << e.exposed_s << "}";
    sep = ",";
  }
  out << "],\"notes\":[";
  sep = "";
  for (const std::string& n : r.notes) out << sep << json_string(n), sep = ",";
  auto memory = [&](const Memory& m) {
    std::ostringstream mem;
    mem.precision(9);
    mem << "{\"weights\":" << m.weights << ",\"grads\":" << m.grads
        << ",\"optimizer\":" << m.optimizer << ",\"activations\":" << m.activations
        << ",\"kv_cache\":" << m.kv_cache << ",\"total\":" << m.total() << "}";
    return mem.str();
  };
  out << "],\"memory\":" << memory(r.memory)
      << ",\"memory_no_sp_no_recompute\":" << memory(r.memory_no_sp_recompute)
      << ",\"compute_s\":" << r.compute_s << ",\"comm_s\":" << r.comm_s
      << ",\"exposed_s\":" << r.exposed_s << ",\"bubble_fraction\":" << r.bubble_fraction
      << ",\"bubble_s\":" << r.bubble_s << ",\"step_s\":" << r.step_s << ",\"mfu\":" << r.mfu
      << ",\"imbalance\":" << r.imbalance << "}";
  return out.str();
}

std::string human_bytes(double bytes) {
  char text[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  snprintf(text, sizeof(text), "%.4g %s", bytes, units[u]);
  return text;
}

void print_result(const Options& o, const Result& r, double usable) {
  printf("# weft-plan: %s (%.4g B params, %.4g B active), %s on %d ranks: %s\n",
         o.model.name.c_str(), r.params / 1e9, r.active_params / 1e9,
         o.work == Work::train     ? "train"
         : o.work == Work::prefill ? "prefill"
                                   : "decode",
         r.world, mesh_text(o, r.dp).c_str());
  printf("# micro-batches %d, layers per stage %d, parameters per rank %.4g B\n", r.microbatches,
         r.layers_per_stage, r.stage_params / 1e9);
  printf("# %-21s %-13s %-13s %5s %8s %7s %11s %11s %-9s %11s %10s %-5s %10s\n", "pattern",
         "primitive", "dim", "group", "calls", "/layer", "bytes/call", "sent/step", "algorithm",
         "us/call", "ms/step", "hides", "exposed ms");
  for (const Entry& e : r.entries)
    printf("  %-21s %-13s %-13s %5d %8zu %7.3g %11s %11s %-9s %11.1f %10.3f %-5s %10.3f\n",
           e.ledger.pattern.c_str(), e.ledger.primitive.c_str(), e.ledger.dim.c_str(), e.group,
           e.ledger.calls, e.calls_per_layer, human_bytes(double(e.ledger.bytes_per_call)).c_str(),
           human_bytes(double(e.ledger.bytes_sent)).c_str(),
           e.algorithm.empty() ? "-" : e.algorithm.c_str(), e.call_us, e.total_s * 1e3,
           e.window.c_str(), e.exposed_s * 1e3);
  for (const std::string& n : r.notes) printf("# note: %s\n", n.c_str());
  auto memory = [](const char* label, const Memory& m) {
    printf(
        "# memory per rank%s: weights %s, grads %s, optimizer %s, activations %s%s%s, total %s\n",
        label, human_bytes(m.weights).c_str(), human_bytes(m.grads).c_str(),
        human_bytes(m.optimizer).c_str(), human_bytes(m.activations).c_str(),
        m.kv_cache > 0 ? ", kv cache " : "", m.kv_cache > 0 ? human_bytes(m.kv_cache).c_str() : "",
        human_bytes(m.total()).c_str());
  };
  int untimed = 0;
  for (const Entry& e : r.entries) untimed += e.call_us < 0;
  if (untimed > 0)
    printf("# warning: %d entries not timed by the cost model: the step below leaves them out\n",
           untimed);
  memory("", r.memory);
  memory(" (no SP, no recomputation)", r.memory_no_sp_recompute);
  if (usable > 0 && r.memory.total() > usable)
    printf("# warning: %.4g GB per rank does not fit in the %.4g GB a device offers%s\n",
           r.memory.total() / 1e9, usable / 1e9, o.reserve_gb > 0 ? " (less --reserve-gb)" : "");
  printf(
      "# step: compute %.3f ms, communication %.3f ms (exposed %.3f ms), bubble %.3f ms "
      "(%.1f%%), step %.3f ms, MFU upper bound %.1f%%\n",
      r.compute_s * 1e3, r.comm_s * 1e3, r.exposed_s * 1e3, r.bubble_s * 1e3,
      100 * r.bubble_fraction, r.step_s * 1e3, 100 * r.mfu);
}

int run(int argc, char** argv) {
  Cli cli;
  const std::string error = parse(argc, argv, cli);
  if (error == "help") {
    fputs(kUsage, stdout);
    return 0;
  }
  if (!error.empty()) {
    fprintf(stderr, "weft-plan: error: %s\n", error.c_str());
    return 2;
  }
  topo::Cluster cluster;
  if (Status status = topo::load_cluster_file(cli.cluster_file, &cluster); !status.ok()) {
    fprintf(stderr, "weft-plan: error: --cluster: %s\n", status.message().c_str());
    return 2;
  }
  if (cli.tflops > 0) cluster.device.tflops = cli.tflops;
  if (cli.memory_gb > 0) cluster.device.memory_gb = cli.memory_gb;
  if (cli.memory_gbps > 0) cluster.device.memory_gb_s = cli.memory_gbps;
  if (const std::string bad = check_links(cli.cluster_file, cluster); !bad.empty()) {
    fprintf(stderr, "weft-plan: error: %s\n", bad.c_str());
    return 2;
  }
  if (!cli.search) {
    if (const std::string bad = validate(cli.options, cluster); !bad.empty()) {
      fprintf(stderr, "weft-plan: error: %s\n", bad.c_str());
      return 2;
    }
    const Result r = plan(cli.options, cluster);
    Options shown = cli.options;
    if (cli.json)
      printf("%s\n", json_result(shown, r).c_str());
    else
      print_result(shown, r, usable_memory(cli.options, cluster));
    return 0;
  }
  if (const std::string bad = check_reserve(cli.options, cluster); !bad.empty()) {
    fprintf(stderr, "weft-plan: error: %s\n", bad.c_str());
    return 2;
  }
  const std::vector<Candidate> all = search(cli.options, cluster);
  size_t fitting = 0;
  for (const Candidate& c : all) fitting += c.rejected.empty();
  if (cli.json) {
    printf("{\"candidates\":[");
    const char* sep = "";
    for (const Candidate& c : all) {
      if (c.rejected.empty())
        printf("%s%s", sep, json_result(c.options, c.result).c_str());
      else
        printf(
            "%s{\"mesh\":{\"tp\":%d,\"cp\":%d,\"ep\":%d,\"pp\":%d,\"sp\":%s,\"zero\":%d,"
            "\"hsdp\":%d,\"schedule\":%s,\"virtual\":%d,\"recompute\":%s},\"rejected\":%s}",
            sep, c.options.tp, c.options.cp, c.options.ep, c.options.pp,
            c.options.sp ? "true" : "false", c.options.zero, c.options.hsdp,
            json_string(c.options.schedule).c_str(), c.options.virtual_stages,
            json_string(c.options.recompute).c_str(), json_string(c.rejected).c_str());
      sep = ",";
    }
    printf("]}\n");
    return 0;
  }
  printf("# weft-plan --search: %zu meshes, %zu fit; fastest first (top %d)\n", all.size(), fitting,
         cli.top);
  printf("# %4s %-72s %10s %10s %10s %8s %6s\n", "rank", "mesh", "step ms", "exposed ms",
         "bubble ms", "MFU", "GB/rank");
  int shown = 0;
  for (const Candidate& c : all) {
    if (!c.rejected.empty() || shown >= cli.top) continue;
    ++shown;
    printf("  %4d %-72s %10.1f %10.1f %10.1f %7.1f%% %7.1f\n", shown,
           mesh_text(c.options, c.result.dp).c_str(), c.result.step_s * 1e3,
           c.result.exposed_s * 1e3, c.result.bubble_s * 1e3, 100 * c.result.mfu,
           c.result.memory.total() / 1e9);
  }
  printf("# rejected:\n");
  for (const Candidate& c : all)
    if (!c.rejected.empty())
      printf("  %s: %s\n", mesh_text(c.options, -1).c_str(), c.rejected.c_str());
  return 0;
}

}  // namespace
}  // namespace weft::plan

int main(int argc, char** argv) {
  return weft::plan::run(argc, argv);
}
