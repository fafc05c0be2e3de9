#include "core/env_launch.h"

#include <arpa/inet.h>

#include <cstring>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/log.h"

namespace weft {

namespace {

std::optional<int> env_rank_value(const char* name) {
  std::optional<std::string> value = env_string(name);
  if (!value) return std::nullopt;
  char* end = nullptr;
  long parsed = strtol(value->c_str(), &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > kMaxRanks) return -1;
  return static_cast<int>(parsed);
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// A job identifier every rank of one launch sees alike, or "".
std::string job_id() {
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}) {
    if (std::optional<std::string> value = env_string(name)) {
      std::string step = env_string("SLURM_STEP_ID").value_or("");
      return std::string(name) + "=" + *value + "." + step;
    }
  }
  return "";
}

Status parse_secret(const std::string& hex, Secret* out) {
  if (hex.size() != 2 * out->size())
    return Error(weftInvalidArgument, "WEFT_SECRET must be %zu hex digits", 2 * out->size());
  for (size_t i = 0; i < out->size(); ++i) {
    unsigned value = 0;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1)
      return Error(weftInvalidArgument, "WEFT_SECRET has a non-hex digit");
    (*out)[i] = static_cast<uint8_t>(value);
  }
  return Status::Ok();
}

}  // namespace

Status read_launch_env(LaunchInfo* out) {
  struct Source {
    const char* name;
    const char* rank;
    const char* size;
  };
  constexpr Source kSources[] = {
      {"weft", "WEFT_RANK", "WEFT_NRANKS"},
      // Before the MPI and Slurm ones: torchrun under srun or mpirun gives each
      // process its own RANK while they share one task's variables.
      {"torchrun", "RANK", "WORLD_SIZE"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMIx", "PMIX_RANK", "PMIX_SIZE"},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
  };
  for (const Source& source : kSources) {
    std::optional<int> rank = env_rank_value(source.rank);
    std::optional<int> size = env_rank_value(source.size);
    if (!rank || !size) continue;
    if (*size < 1 || *rank < 0 || *rank >= *size)
      return Error(weftInvalidArgument, "%s=%s and %s=%s are not a valid rank and size",
                   source.rank, env_string(source.rank)->c_str(), source.size,
                   env_string(source.size)->c_str());
    out->rank = *rank;
    out->nranks = *size;
    out->source = source.name;
    break;
  }
  if (out->rank < 0)
    return Error(weftInvalidArgument,
                 "no rank in the environment: set WEFT_RANK and WEFT_NRANKS (weftrun does), or "
                 "launch with mpirun or srun");

  std::string root_text;
  const char* root_source = "WEFT_ROOT";
  if (std::optional<std::string> root = env_string("WEFT_ROOT")) {
    root_text = *root;
  } else if (env_string("MASTER_ADDR") && env_string("MASTER_PORT")) {
    std::string port = *env_string("MASTER_PORT");
    // Under torchrun (or torch's env:// rendezvous) torch's TCPStore owns
    // MASTER_PORT, so rank 0 listens on the next port.
    if (strcmp(out->source, "torchrun") == 0) {
      char* end = nullptr;
      long value = strtol(port.c_str(), &end, 10);
      if (port.empty() || *end != '\0' || value < 1 || value >= 65535)
        return Error(weftInvalidArgument, "MASTER_PORT=%s is not a port number below 65535",
                     port.c_str());
      port = std::to_string(value + 1);
    }
    root_text = *env_string("MASTER_ADDR") + ":" + port;
    root_source = "MASTER_ADDR:MASTER_PORT";
  } else if (out->nranks == 1) {
    // One rank agrees with nobody: its own listener on loopback picks the port.
    WEFT_RETURN_IF_ERROR(parse_socket_address("127.0.0.1:1", &out->root.address));
    out->root.address.set_port(0);
    root_text = "127.0.0.1 (one rank)";
  } else if (!job_id().empty() && env_string("OMPI_COMM_WORLD_LOCAL_SIZE") &&
             env_string("OMPI_COMM_WORLD_LOCAL_SIZE") == env_string("OMPI_COMM_WORLD_SIZE")) {
    // Single-node mpirun with nothing set: a port derived from the job id.
    root_text = "127.0.0.1:" + std::to_string(20000 + fnv1a(job_id()) % 40000);
  } else {
    return Error(weftInvalidArgument,
                 "no rendezvous address: set WEFT_ROOT=host:port (reachable from every rank, "
                 "rank 0 listens there) or MASTER_ADDR and MASTER_PORT");
  }
  if (out->root.address.length == 0) {
    Status parsed = parse_socket_address(root_text, &out->root.address);
    if (!parsed.ok())
      return Status(parsed.code(),
                    std::string(root_source) + "=" + root_text + ": " + parsed.message());
  }

  if (std::optional<std::string> secret = env_string("WEFT_SECRET")) {
    WEFT_RETURN_IF_ERROR(parse_secret(*secret, &out->root.secret));
  } else {
    // Without a shared secret the ranks can only agree on one derived from
    // what they all see; that keeps strays out, not attackers.
    uint64_t a = fnv1a("weft:" + job_id() + ":" + root_text);
    uint64_t b = fnv1a(root_text + ":" + job_id() + ":weft");
    memcpy(out->root.secret.data(), &a, 8);
    memcpy(out->root.secret.data() + 8, &b, 8);
  }
  WEFT_LOG(INFO, INIT, "launch from %s variables: rank %d of %d, root %s", out->source, out->rank,
           out->nranks, root_text.c_str());
  return Status::Ok();
}

Status listen_address_for(const SocketAddress& root, SocketAddress* out) {
  *out = SocketAddress{};
  out->storage.ss_family = root.storage.ss_family;
  if (root.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out->storage)->sin_addr.s_addr = htonl(INADDR_ANY);
    out->length = sizeof(sockaddr_in);
  } else {
    reinterpret_cast<sockaddr_in6*>(&out->storage)->sin6_addr = in6addr_any;
    out->length = sizeof(sockaddr_in6);
  }
  out->set_port(root.port());
  return Status::Ok();
}

}  // namespace weft
