// NCCL's environment variables that users set out of habit, mapped onto
// Weft's (a WEFT_ variable the user set wins). Runs at the first NCCL call,
// before any Weft call, because Weft reads its variables once.
#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/schedule.h"
#include "api/nccl/shim.h"

namespace weft::nccl {

namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (!text.empty()) {
    size_t at = text.find(separator);
    std::string_view part = text.substr(0, at);
    if (!part.empty()) parts.push_back(part);
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return parts;
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return out;
}

// Messages go to stderr in Weft's format unless WEFT_DEBUG (as mapped) silences them.
void say(const char* level, const std::string& message) {
  const char* debug = getenv("WEFT_DEBUG");
  bool info =
      debug != nullptr && (strcasecmp(debug, "INFO") == 0 || strcasecmp(debug, "TRACE") == 0);
  bool none = debug != nullptr && strcasecmp(debug, "NONE") == 0;
  if (none || (level[0] == 'I' && !info)) return;
  fprintf(stderr, "%d weft %s ENV nccl-shim: %s\n", static_cast<int>(getpid()), level,
          message.c_str());
}

std::string map_debug(const std::string& value) {
  std::string v = lower(value);
  if (v == "info" || v == "trace" || v == "warn") return v;
  if (v == "version" || v == "abort") return "warn";
  return "";
}

// NCCL's subsystems that have a Weft counterpart; the others have no Weft log lines.
std::string map_subsys(const std::string& value) {
  static constexpr std::pair<const char*, const char*> kMap[] = {
      {"init", "INIT"},     {"bootstrap", "BOOTSTRAP"},
      {"net", "TRANSPORT"}, {"shm", "TRANSPORT"},
      {"p2p", "P2P"},       {"coll", "COLL"},
      {"tuning", "TUNE"},   {"graph", "ALGO"},
      {"env", "ENV"},       {"all", "ALL"}};
  std::string_view text(value);
  bool exclude = !text.empty() && text[0] == '^';
  if (exclude) text.remove_prefix(1);
  std::string out;
  for (std::string_view item : split(text, ',')) {
    for (const auto& [nccl_name, weft_name] : kMap) {
      if (lower(item) == nccl_name && out.find(weft_name) == std::string::npos)
        out += (out.empty() ? "" : ",") + std::string(weft_name);
    }
  }
  if (out.empty()) return exclude ? "ALL" : "NONE";
  return (exclude ? "^" : "") + out;
}

// NCCL_ALGO: "ring,tree" (every collective) or "allreduce:tree;allgather:ring"
// (per collective). Each collective takes the first listed algorithm Weft
// implements for it; NCCL's hardware algorithms (CollNet, NVLS, PAT) and
// exclusions ("^tree") have no Weft equivalent and are reported.
std::string map_algo(const std::string& value) {
  static constexpr algo::Collective kTuned[] = {
      algo::Collective::AllReduce, algo::Collective::ReduceScatter, algo::Collective::AllGather,
      algo::Collective::Broadcast, algo::Collective::Reduce};
  std::string out;
  for (std::string_view entry : split(value, ';')) {
    std::vector<algo::Collective> collectives(std::begin(kTuned), std::end(kTuned));
    size_t colon = entry.find(':');
    if (colon != std::string_view::npos) {
      algo::Collective one;
      if (!algo::parse_collective(lower(entry.substr(0, colon)), &one)) {
        say("WARN", "NCCL_ALGO: Weft has no collective '" + std::string(entry.substr(0, colon)) +
                        "'; entry ignored");
        continue;
      }
      collectives = {one};
      entry.remove_prefix(colon + 1);
    }
    if (!entry.empty() && entry[0] == '^') {
      say("WARN", "NCCL_ALGO: exclusions ('" + std::string(entry) +
                      "') have no Weft equivalent; Weft's tuner chooses");
      continue;
    }
    for (algo::Collective collective : collectives) {
      for (std::string_view name : split(entry, ',')) {
        algo::Algorithm algorithm;
        if (algo::parse_algorithm(lower(name), &algorithm) &&
            algo::supports(algorithm, collective)) {
          out += (out.empty() ? "" : ",") + std::string(algo::collective_name(collective)) + ":" +
                 algo::algorithm_name(algorithm);
          break;
        }
      }
    }
  }
  if (out.empty()) say("WARN", "NCCL_ALGO=" + value + " names no algorithm Weft implements");
  return out;
}

void map_one(const char* nccl_name, const char* weft_name,
             std::string (*translate)(const std::string&)) {
  const char* value = getenv(nccl_name);
  if (value == nullptr || value[0] == '\0') return;
  const char* existing = getenv(weft_name);
  if (existing != nullptr && existing[0] != '\0') return;
  std::string mapped = translate(value);
  if (mapped.empty()) {
    say("WARN", std::string(nccl_name) + "=" + value + " has no Weft equivalent; ignored");
    return;
  }
  setenv(weft_name, mapped.c_str(), 0);
  say("INFO", std::string(nccl_name) + "=" + value + " -> " + weft_name + "=" + mapped);
}

}  // namespace

void apply_nccl_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    map_one("NCCL_DEBUG", "WEFT_DEBUG", map_debug);
    map_one("NCCL_DEBUG_SUBSYS", "WEFT_DEBUG_SUBSYS", map_subsys);
    map_one("NCCL_ALGO", "WEFT_ALGO", map_algo);
    map_one("NCCL_SOCKET_IFNAME", "WEFT_SOCKET_IFNAME",
            [](const std::string& value) { return value; });  // the same syntax
  });
}

}  // namespace weft::nccl
