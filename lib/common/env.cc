#include "common/env.h"

#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/log.h"

namespace weft {

namespace {
constexpr EnvVar kEnvTable[] = {
    {"WEFT_DEBUG", "WARN", "Log level: NONE, WARN, INFO or TRACE.", EnvKind::kChoice, 0, UINT64_MAX,
     "NONE|WARN|INFO|TRACE"},
    {"WEFT_DEBUG_SUBSYS", "ALL",
     "Comma-separated subsystems to log: INIT, BOOTSTRAP, TRANSPORT, P2P, COLL, ALGO, TUNE, ENV, "
     "ALL; a leading ^ excludes the listed ones.",
     EnvKind::kChoiceList, 0, UINT64_MAX, "INIT|BOOTSTRAP|TRANSPORT|P2P|COLL|ALGO|TUNE|ENV|ALL"},
    {"WEFT_DEBUG_FILE", "", "Write log lines to this file instead of stderr (%h host, %p pid).",
     EnvKind::kPath},
    {"WEFT_TIMEOUT_MS", "300000",
     "Bound on every wait (bootstrap, transfers, barrier); a stalled or dead peer becomes an "
     "error within it.",
     EnvKind::kInt, 1, INT32_MAX},
    {"WEFT_CHECK", "",
     "Mismatch detection between ranks (through shared memory on a node, else the bootstrap "
     "root): off, on (unset: each collective's kind, "
     "count, datatype, op, root and AllToAllv's count matrix) or full (also a hash of each rank's "
     "input, docs/reliability.md). Another value fails the communicator's init, as do different "
     "values on ranks that share a node.",
     EnvKind::kChoice, 0, UINT64_MAX, "off|on|full"},
    {"WEFT_SOCKET_IFNAME", "",
     "Interfaces for the bootstrap: comma-separated name prefixes, ^ to exclude, = for exact "
     "names. Default: the first non-loopback IPv4 interface that is up, else loopback."},
    {"WEFT_RANK", "", "This process's rank for weftCommInitFromEnv."},
    {"WEFT_NRANKS", "", "Number of ranks for weftCommInitFromEnv."},
    {"WEFT_ROOT", "",
     "host:port of the rendezvous that rank 0 opens, for weftCommInitFromEnv. Falls back to "
     "MASTER_ADDR/MASTER_PORT."},
    {"WEFT_SECRET", "",
     "32 hex digits: the 128-bit secret every rank presents to the rendezvous in "
     "weftCommInitFromEnv (weftrun sets a random one)."},
    {"WEFT_LOCAL_RANK", "", "Rank within this node, set by weftrun (informational).",
     EnvKind::kInt},
    {"WEFT_LOCAL_SIZE", "", "Number of ranks on this node, set by weftrun (informational).",
     EnvKind::kInt, 1},
    {"WEFT_ALGO", "",
     "Force algorithms per collective and optionally per size range, e.g. "
     "allreduce:0-16K:rd,allreduce:16K-inf:ring,allgather:bruck (names: ring, tree, rhd, rd, "
     "bruck, pairwise, binomial, chain, dissemination, hier, leader, oneshot, twoshot)."},
    {"WEFT_TOPO_FILE", "",
     "A cluster description (JSON, docs/topology.md) to use instead of discovering the "
     "topology: for tests, planning and weft-topo.",
     EnvKind::kPath},
    {"WEFT_TUNER_FILE", "",
     "The cost model's machine figures (per-call overhead, UCX and direct-path latency and "
     "bandwidth, copy/reduce throughput, cores, oversubscription slice latency) as written by "
     "bench/perf/calibrate.py (docs/tuning.md); unset: the built-in defaults.",
     EnvKind::kPath},
    {"WEFT_HOST_SPEED", "",
     "The host's speed, in percent of the one the cost model's figures (WEFT_TUNER_FILE or the "
     "built-in defaults) were measured on: their throughputs scale by it, the latencies of the "
     "ranks' own work by its inverse (docs/tuning.md, \"Host speed\"). Unset: each rank "
     "times a 64 KiB copy from its cache at its first communicator against the figures' "
     "cache_bandwidth_gb_s; a communicator takes the median of its ranks' figures. 100: the "
     "figures as given; a communicator on a cluster file (WEFT_TOPO_FILE) takes them as given.",
     EnvKind::kInt, 5, 2000, nullptr, "the measured speed"},
    {"WEFT_REDUCE_ISA", "",
     "Force the reduction kernels' instruction set: scalar, avx2 or avx512 (clamped to what the "
     "CPU has).",
     EnvKind::kChoice, 0, UINT64_MAX, "scalar|avx2|avx512"},
    {"WEFT_SHM_BYTES", "4194304",
     "Shared-memory staging per rank (bytes, at least 4096) for the direct algorithms when every "
     "rank of a communicator is on one node; each such communicator reserves it in /dev/shm at "
     "init. Unset, a communicator takes less where the last-level cache is small for its ranks "
     "(WEFT_CACHE_BYTES / (2 * ranks), at least 512K) or /dev/shm is short (at most 1/64 of "
     "the free space, one WARN); set, it is taken as asked. Without room: the message path, "
     "one WARN.",
     EnvKind::kBytes},
    {"WEFT_SHM_DISABLE", "0",
     "1: no shared memory; communicators on one node run only the message-based algorithms.",
     EnvKind::kBool},
    {"WEFT_FAST_PATH", "1",
     "0: blocking calls that a direct algorithm serves take the general path (batch, job "
     "runner) instead of the blocking fast path; for comparisons.",
     EnvKind::kBool},
    {"WEFT_SHM_ZERO_COPY_BYTES", "8192",
     "Smallest message (bytes per rank) that direct collectives read in place from registered "
     "weftMemAlloc buffers; smaller ones are staged (one synchronisation instead of two).",
     EnvKind::kBytes},
    {"WEFT_CUDA_SLOT_BYTES", "4194304",
     "GPU communicators: bytes of one receive slot (a message travels between ranks in chunks of "
     "this size); each rank's region holds WEFT_CUDA_SLOTS of them per rank of the communicator. "
     "Every rank must set the same value.",
     EnvKind::kBytes, 64},
    {"WEFT_CUDA_SLOTS", "2",
     "GPU communicators: receive slots per peer (chunks in flight on each channel). Every rank "
     "must set the same value.",
     EnvKind::kInt, 1, 64},
    {"WEFT_CUDA_IPC", "auto",
     "GPU communicators: how ranks in different processes map each other's memory: auto "
     "(POSIX-fd handles where every rank's GPU offers them, else legacy CUDA IPC), posix-fd, or "
     "legacy. Ranks that are threads of one process use plain pointers.",
     EnvKind::kChoice, 0, UINT64_MAX, "auto|posix-fd|legacy"},
    {"WEFT_CACHE_BYTES", "",
     "The last-level cache (bytes) the direct path sizes against: unless WEFT_SHM_BYTES is "
     "set, each rank's staging is at most cache / (2 * ranks); and a staged AllGather, "
     "Broadcast or AllToAll(v) whose buffers over the node's ranks reach it writes its output "
     "with streaming stores; an AllReduce some rank offers by cross-memory attach whose "
     "inputs over the node's ranks reach half of it runs in two phases (reduce a slice, then "
     "gather); where ranks outnumber cores, an AllToAll whose buffers exceed it is staged. "
     "Unset: "
     "the CPU's last-level data or unified cache as sysfs lists it; none there, none of these.",
     EnvKind::kBytes},
    {"WEFT_SHM_STREAM_BYTES", "1M",
     "Smallest direct-path round (bytes a rank writes to its staging in an op's first round) "
     "from which a rank times its rounds and writes them with streaming stores while those "
     "are clearly faster; also the smallest block whose copy from mapped memory in an op read "
     "in place (a rank's own block, a peer's registered input) is so chosen. 0 never streams, "
     "not even the outputs WEFT_CACHE_BYTES decides; ranks that outnumber the cores never "
     "time their stores.",
     EnvKind::kBytes},
    {"WEFT_SHM_CMA_BYTES", "",
     "Smallest block (bytes per rank) that direct AllGather, Broadcast and AllToAll read "
     "straight out of a peer's unregistered buffer by cross-memory attach (process_vm_readv, one "
     "copy), and AllReduce reads to reduce (in place, in two phases); smaller ones are staged. "
     "0: this rank offers nothing so, and its ops whose input is unregistered are staged (with a "
     "registered input it may still read its peers so). Unset: 16K while the "
     "node has a core per rank, each rank then timing both ways; when its ranks outnumber "
     "its cores only AllToAll, untimed, from 32K blocks while its buffers over the node fit "
     "WEFT_CACHE_BYTES (elsewhere staging was faster there).",
     EnvKind::kBytes},
};
}  // namespace

std::span<const EnvVar> env_table() {
  return kEnvTable;
}

const EnvVar& env_var(const char* name) {
  for (const EnvVar& var : kEnvTable)
    if (strcmp(var.name, name) == 0) return var;
  fprintf(stderr, "weft: internal error: %s is not in the environment table\n", name);
  abort();
}

std::optional<std::string> env_string(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  return std::string(value);
}

bool parse_bytes(std::string_view text, uint64_t* out) {
  if (text == "inf") {
    *out = UINT64_MAX;
    return true;
  }
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > UINT64_MAX / 10 || value * 10 > UINT64_MAX - (text[i] - '0')) return false;
    value = value * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (i == 0) return false;
  int shift = 0;
  if (i + 1 == text.size()) {
    const char unit = text[i];
    shift = unit == 'K' || unit == 'k'   ? 10
            : unit == 'M' || unit == 'm' ? 20
            : unit == 'G' || unit == 'g' ? 30
                                         : -1;
    if (shift < 0) return false;
  } else if (i != text.size()) {
    return false;
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

namespace {

bool equal_nocase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// The index of `item` among var.choices, or -1.
int choice_index(const EnvVar& var, std::string_view item) {
  std::string_view rest(var.choices);
  for (int index = 0;; ++index) {
    size_t bar = rest.find('|');
    if (equal_nocase(rest.substr(0, bar), item)) return index;
    if (bar == std::string_view::npos) return -1;
    rest.remove_prefix(bar + 1);
  }
}

int choice_count(const EnvVar& var) {
  return 1 + static_cast<int>(std::count(var.choices, var.choices + strlen(var.choices), '|'));
}

std::string choice_text(const EnvVar& var) {
  std::string text(var.choices);
  for (char& c : text)
    if (c == '|') c = ',';
  return text;
}

std::string range_text(const EnvVar& var) {
  if (var.max == UINT64_MAX) return "of at least " + std::to_string(var.min);
  return "from " + std::to_string(var.min) + " to " + std::to_string(var.max);
}

}  // namespace

std::optional<uint64_t> parse_env_value(const EnvVar& var, std::string_view text,
                                        std::string* expected) {
  uint64_t value = 0;
  switch (var.kind) {
    case EnvKind::kText:
    case EnvKind::kPath:
      return 0;
    case EnvKind::kInt: {
      bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (digits && parse_bytes(text, &value) && value >= var.min && value <= var.max) return value;
      *expected = "an integer " + range_text(var);
      return std::nullopt;
    }
    case EnvKind::kBytes:
      if (text != "inf" && parse_bytes(text, &value) && value >= var.min && value <= var.max)
        return value;
      *expected = std::string("a byte count") +
                  (var.min == 0 && var.max == UINT64_MAX ? "" : " " + range_text(var)) +
                  " (K, M, G suffixes allowed)";
      return std::nullopt;
    case EnvKind::kBool:
      for (std::string_view no : {"0", "no", "off", "false"})
        if (equal_nocase(text, no)) return 0;
      for (std::string_view yes : {"1", "yes", "on", "true"})
        if (equal_nocase(text, yes)) return 1;
      *expected = "0 or 1";
      return std::nullopt;
    case EnvKind::kChoice: {
      int index = choice_index(var, text);
      if (index >= 0) return static_cast<uint64_t>(index);
      *expected = "one of " + choice_text(var);
      return std::nullopt;
    }
    case EnvKind::kChoiceList: {
      const bool exclude = !text.empty() && text.front() == '^';
      if (exclude) text.remove_prefix(1);
      bool any = false;
      const uint64_t all = (uint64_t{1} << choice_count(var)) - 1;
      while (!text.empty()) {
        size_t comma = text.find(',');
        std::string_view item = text.substr(0, comma);
        int index = choice_index(var, item);
        if (!item.empty() && index < 0) break;
        // A choice named ALL stands for every choice.
        if (index >= 0) value |= equal_nocase(item, "ALL") ? all : uint64_t{1} << index;
        any = any || index >= 0;
        text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
      }
      if (any && text.empty()) return exclude ? all & ~value : value;
      *expected = "a comma-separated list of " + choice_text(var) + ", ^ first to exclude";
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string env_warning(const EnvVar& var, std::string_view text, const std::string& expected,
                        std::string_view used) {
  return std::string(var.name) + "=" + std::string(text) + " is not " + expected + "; using " +
         std::string(used);
}

bool first_report(const char* name, std::string_view text) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mutex);
  return reported.insert(std::string(name) + "=" + std::string(text)).second;
}

namespace {

void warn_once(const EnvVar& var, const std::string& text, const std::string& expected,
               std::string_view used) {
  if (first_report(var.name, text))
    WEFT_LOG(WARN, ENV, "%s", env_warning(var, text, expected, used).c_str());
}

std::optional<uint64_t> checked_value(const EnvVar& var, const char* used_instead) {
  std::optional<std::string> text = env_string(var.name);
  if (!text) return std::nullopt;
  std::string expected;
  std::optional<uint64_t> value = parse_env_value(var, *text, &expected);
  if (!value) warn_once(var, *text, expected, used_instead);
  return value;
}

}  // namespace

uint64_t env_value(const char* name) {
  const EnvVar& var = env_var(name);
  std::string unused;
  std::optional<uint64_t> fallback = parse_env_value(var, var.default_value, &unused);
  if (!fallback) {
    fprintf(stderr, "weft: internal error: %s has no valid default\n", name);
    abort();
  }
  return checked_value(var, var.default_value).value_or(*fallback);
}

std::optional<uint64_t> env_value_if_set(const char* name, const char* used_instead) {
  return checked_value(env_var(name), used_instead);
}

void check_environment() {
  for (const EnvVar& var : kEnvTable) {
    if (var.default_value[0] != '\0') {
      env_value(var.name);
    } else if (var.kind == EnvKind::kInt) {
      env_value_if_set(var.name, var.when_bad ? var.when_bad : "nothing (it is informational)");
    } else if (var.kind == EnvKind::kBytes) {
      env_value_if_set(var.name, "the default");
    }
    // Text and paths are checked where they are used; WEFT_REDUCE_ISA where the
    // kernels are chosen, which knows what it falls back to.
  }
}

int64_t default_timeout_ms() {
  return static_cast<int64_t>(env_value("WEFT_TIMEOUT_MS"));
}

}  // namespace weft
