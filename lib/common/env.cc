#include "common/env.h"

#include <cerrno>
#include <cstdlib>

#include "common/log.h"

namespace weft {

namespace {
constexpr EnvVar kEnvTable[] = {
    {"WEFT_DEBUG", "WARN", "Log level: NONE, WARN, INFO or TRACE."},
    {"WEFT_DEBUG_SUBSYS", "ALL",
     "Comma-separated subsystems to log: INIT, BOOTSTRAP, TRANSPORT, P2P, COLL, ALGO, TUNE, ENV, "
     "ALL; a leading ^ excludes the listed ones."},
    {"WEFT_DEBUG_FILE", "", "Write log lines to this file instead of stderr (%h host, %p pid)."},
    {"WEFT_TIMEOUT_MS", "300000",
     "Bound on every wait (bootstrap, transfers, barrier); a stalled or dead peer becomes an "
     "error within it."},
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
    {"WEFT_LOCAL_RANK", "", "Rank within this node, set by weftrun (informational)."},
    {"WEFT_ALGO", "",
     "Force algorithms per collective and optionally per size range, e.g. "
     "allreduce:0-16K:rd,allreduce:16K-inf:ring,allgather:bruck (names: ring, tree, rhd, rd, "
     "bruck, pairwise, binomial, chain, dissemination, hier, leader, oneshot, twoshot)."},
    {"WEFT_TOPO_FILE", "",
     "A cluster description (JSON, docs/topology.md) to use instead of discovering the "
     "topology: for tests, planning and weft-topo."},
    {"WEFT_REDUCE_ISA", "",
     "Force the reduction kernels' instruction set: scalar, avx2 or avx512 (clamped to what the "
     "CPU has)."},
    {"WEFT_SHM_BYTES", "4194304",
     "Shared-memory staging per rank (bytes, at least 4096) for the direct algorithms when every "
     "rank of a communicator is on one node; each such communicator reserves it in /dev/shm at "
     "init, which fails naming /dev/shm when it does not fit."},
    {"WEFT_SHM_DISABLE", "0",
     "1: no shared memory; communicators on one node run only the message-based algorithms."},
    {"WEFT_SHM_ZERO_COPY_BYTES", "8192",
     "Smallest message (bytes per rank) that direct collectives read in place from registered "
     "weftMemAlloc buffers; smaller ones are staged (one synchronisation instead of two)."},
    {"WEFT_SHM_CMA_BYTES", "0",
     "Smallest block (bytes per rank) that direct AllGather, Broadcast and AllToAll read "
     "straight out of a peer's unregistered buffer by cross-memory attach (process_vm_readv, one "
     "copy); smaller ones are staged. 0 (the default: slower than staging where measured) disables "
     "it."},
};
}  // namespace

std::span<const EnvVar> env_table() {
  return kEnvTable;
}

std::optional<std::string> env_string(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  return std::string(value);
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long long parsed = strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0') {
    WEFT_LOG(WARN, ENV, "%s=%s is not an integer; using %lld", name, value,
             static_cast<long long>(fallback));
    return fallback;
  }
  return parsed;
}

int64_t default_timeout_ms() {
  int64_t timeout = env_int("WEFT_TIMEOUT_MS", 300000);
  return timeout > 0 ? timeout : 300000;
}

}  // namespace weft
