// weft-soak: many small and large operations (AllReduce, AllGather, ReduceScatter, AllToAll,
// a grouped Send/Recv ring), blocking and on streams, on communicators that are split, created
// from a new unique id and destroyed in rotation; every result is checked exactly. Prints the
// process's resident memory, open file descriptors and /dev/shm entries at the start and the
// end, and fails when the descriptors or /dev/shm entries did not return to their start values
// or resident memory grew beyond the slack.
// Run under weftrun: weftrun -n 4 weft-soak [-s SMALL] [-l LARGE] [-k OPS_PER_COMM] ...
// Exit 0: exact and nothing leaked; 1: a result differed; 3: a call failed; 4: a leak; 2: usage.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "weft/weft.h"

namespace {

constexpr int kUsageExit = 2, kMismatchExit = 1, kCallFailedExit = 3, kLeakExit = 4;
// How long descriptors may take to be released after the last weftCommDestroy.
constexpr std::chrono::seconds kReleaseBound{10};

int g_rank = -1;

void must(weftResult_t result, weftComm_t comm, const char* what) {
  if (result == weftSuccess) return;
  fprintf(stderr, "weft-soak: rank %d: %s failed: %s: %s\n", g_rank, what,
          weftGetErrorString(result), weftGetLastError(comm));
  exit(kCallFailedExit);
}

struct Options {
  long small_ops = 1000000;
  long large_ops = 10000;
  size_t small_bytes = 64;
  size_t large_bytes = 1 << 20;
  long ops_per_comm = 1000;
  double rss_slack_mib = 32;
  long progress_every = 100000;
};

int usage(const std::string& problem) {
  fprintf(
      stderr,
      "weft-soak: %s\nusage: weft-soak [-s SMALL_OPS] [-l LARGE_OPS] [-b SMALL_BYTES]\n"
      "  [-B LARGE_BYTES] [-k OPS_PER_COMMUNICATOR] [--rss-slack-mib MIB] [-p PROGRESS_EVERY]\n",
      problem.c_str());
  return kUsageExit;
}

bool parse_long(const char* text, long min, long* out) {
  char* end = nullptr;
  long value = strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min) return false;
  *out = value;
  return true;
}

// What the process holds: the figures that must come back at the end.
struct Footprint {
  long rss_kib = -1;
  int fds = 0;
  int shm_entries = 0;  // /dev/shm names this process made, has open or has mapped
  std::multiset<std::string> fd_targets;  // to name what was left
  std::set<std::string> shm;
};

long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return atol(line.c_str() + 6);
  return -1;
}

std::set<std::string> entries_of(const char* path) {
  std::set<std::string> names;
  if (DIR* dir = opendir(path)) {
    while (dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') names.insert(entry->d_name);
    closedir(dir);
  }
  return names;
}

Footprint footprint() {
  Footprint now;
  now.rss_kib = rss_kib();
  std::set<std::string> shm;
  // Weft's names carry the creator's pid ("/weft-...-<pid>-..."); UCX's are found through the
  // descriptors and mappings that hold them.
  const std::string mine = "-" + std::to_string(getpid()) + "-";
  for (const std::string& name : entries_of("/dev/shm"))
    if (name.find(mine) != std::string::npos) shm.insert("/dev/shm/" + name);
  for (const std::string& fd : entries_of("/proc/self/fd")) {
    char target[512];
    ssize_t length = readlink(("/proc/self/fd/" + fd).c_str(), target, sizeof(target) - 1);
    if (length < 0) continue;  // the listing's own descriptor, closed by now
    ++now.fds;
    target[length] = '\0';
    now.fd_targets.insert(target);
    if (strncmp(target, "/dev/shm/", 9) == 0) shm.insert(target);
  }
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    size_t at = line.find("/dev/shm/");
    if (at != std::string::npos) shm.insert(line.substr(at, line.find(" (deleted)") - at));
  }
  now.shm_entries = static_cast<int>(shm.size());
  now.shm = std::move(shm);
  return now;
}

void print_footprint(const char* when, const Footprint& at) {
  printf("weft-soak: %s: VmRSS %ld KiB, %d open fds, %d /dev/shm entries\n", when, at.rss_kib,
         at.fds, at.shm_entries);
}

// Rank q's element i of operation seq: small, so int32 sums over any rank count are exact.
int32_t value(int q, size_t i, long seq) {
  return static_cast<int32_t>((q * 131 + static_cast<long>(i % 4099) * 7 + seq * 13) % 10007);
}

enum class Kind { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv, Count };
const char* kind_name(Kind kind) {
  static const char* names[] = {"AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Send/Recv"};
  return names[static_cast<int>(kind)];
}

// The communicator operations run on, replaced every ops_per_comm operations, in turn by a
// split of the world in the same order, a split in reversed order (halves when the world has 4
// or more ranks), and a new communicator from a unique id that rank 0 makes.
class Rotation {
 public:
  explicit Rotation(weftComm_t world) : world_(world) {
    must(weftCommUserRank(world, &world_rank_), world, "weftCommUserRank");
    must(weftCommCount(world, &world_size_), world, "weftCommCount");
  }
  ~Rotation() { close(); }

  void next() {
    close();
    const int way = made_++ % 3;
    if (way == 0) {
      must(weftCommSplit(world_, 0, world_rank_, &comm_, nullptr), world_, "weftCommSplit");
    } else if (way == 1) {
      const int color = world_size_ >= 4 ? world_rank_ % 2 : 0;
      must(weftCommSplit(world_, color, world_size_ - world_rank_, &comm_, nullptr), world_,
           "weftCommSplit(reversed)");
    } else {
      weftUniqueId id{};
      if (world_rank_ == 0) must(weftGetUniqueId(&id), nullptr, "weftGetUniqueId");
      must(weftBroadcast(&id, &id, sizeof(id), weftUint8, 0, world_, nullptr), world_,
           "weftBroadcast(unique id)");
      must(weftCommInitRank(&comm_, world_size_, id, world_rank_), nullptr, "weftCommInitRank");
    }
    must(weftCommUserRank(comm_, &rank_), comm_, "weftCommUserRank");
    must(weftCommCount(comm_, &size_), comm_, "weftCommCount");
    must(weftStreamCreate(&stream_), comm_, "weftStreamCreate");
  }
  void close() {
    if (stream_ != nullptr) must(weftStreamDestroy(stream_), comm_, "weftStreamDestroy");
    if (comm_ != nullptr) must(weftCommDestroy(comm_), comm_, "weftCommDestroy");
    stream_ = nullptr;
    comm_ = nullptr;
  }
  weftComm_t comm() const { return comm_; }
  weftStream_t stream() const { return stream_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  long made() const { return made_; }

 private:
  weftComm_t world_;
  int world_rank_ = 0, world_size_ = 0;
  weftComm_t comm_ = nullptr;
  weftStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 0;
  long made_ = 0;
};

// Runs one operation of `bytes` on the rotation's communicator and checks it; false on a
// mismatch (reported).
bool run_operation(const Rotation& on, Kind kind, size_t bytes, bool on_stream, long seq) {
  const weftComm_t comm = on.comm();
  const weftStream_t stream = on_stream ? on.stream() : nullptr;
  const int rank = on.rank(), n = on.size();
  const size_t total = std::max<size_t>(1, bytes / sizeof(int32_t));
  const size_t block = std::max<size_t>(1, total / n);  // per-rank part of the gathers
  std::vector<int32_t> in, out;
  auto input = [&](size_t count) {
    in.resize(count);
    for (size_t i = 0; i < count; ++i) in[i] = value(rank, i, seq);
  };
  auto sum = [&](size_t i) {
    int32_t total_value = 0;
    for (int q = 0; q < n; ++q) total_value += value(q, i, seq);
    return total_value;
  };
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  switch (kind) {
    case Kind::AllReduce:
      input(total);
      out.assign(total, -1);
      must(weftAllReduce(in.data(), out.data(), total, weftInt32, weftSum, comm, stream), comm,
           "weftAllReduce");
      break;
    case Kind::AllGather:
      input(block);
      out.assign(block * n, -1);
      must(weftAllGather(in.data(), out.data(), block, weftInt32, comm, stream), comm,
           "weftAllGather");
      break;
    case Kind::ReduceScatter:
      input(block * n);
      out.assign(block, -1);
      must(weftReduceScatter(in.data(), out.data(), block, weftInt32, weftSum, comm, stream), comm,
           "weftReduceScatter");
      break;
    case Kind::AllToAll:
      input(block * n);
      out.assign(block * n, -1);
      must(weftAllToAll(in.data(), out.data(), block, weftInt32, comm, stream), comm,
           "weftAllToAll");
      break;
    case Kind::SendRecv:
      input(total);
      out.assign(total, -1);
      must(weftGroupStart(), comm, "weftGroupStart");
      must(weftSend(in.data(), total, weftInt32, next, comm, stream), comm, "weftSend");
      must(weftRecv(out.data(), total, weftInt32, prev, comm, stream), comm, "weftRecv");
      must(weftGroupEnd(), comm, "weftGroupEnd");
      break;
    case Kind::Count:
      return false;
  }
  if (stream != nullptr) must(weftStreamSynchronize(stream), comm, "weftStreamSynchronize");
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t want = 0;
    switch (kind) {
      case Kind::AllReduce:
        want = sum(i);
        break;
      case Kind::AllGather:
        want = value(static_cast<int>(i / block), i % block, seq);
        break;
      case Kind::ReduceScatter:
        want = sum(rank * block + i);
        break;
      case Kind::AllToAll:
        want = value(static_cast<int>(i / block), rank * block + i % block, seq);
        break;
      default:
        want = value(prev, i, seq);
    }
    if (out[i] != want) {
      fprintf(stderr,
              "weft-soak: rank %d: %s (%zu bytes, %s) operation %ld: element %zu is %d, "
              "want %d\n",
              g_rank, kind_name(kind), bytes, on_stream ? "stream" : "blocking", seq, i, out[i],
              want);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage(flag + " needs a value");
    const char* text = argv[i + 1];
    long number = 0;
    bool ok = true;
    if (flag == "-s") {
      ok = parse_long(text, 0, &options.small_ops);
    } else if (flag == "-l") {
      ok = parse_long(text, 0, &options.large_ops);
    } else if (flag == "-b" || flag == "-B") {
      ok = parse_long(text, sizeof(int32_t), &number);
      (flag == "-b" ? options.small_bytes : options.large_bytes) = static_cast<size_t>(number);
    } else if (flag == "-k") {
      ok = parse_long(text, 1, &options.ops_per_comm);
    } else if (flag == "-p") {
      ok = parse_long(text, 1, &options.progress_every);
    } else if (flag == "--rss-slack-mib") {
      ok = parse_long(text, 0, &number);
      options.rss_slack_mib = static_cast<double>(number);
    } else {
      return usage("unknown flag " + flag);
    }
    if (!ok) return usage(flag + ": '" + text + "' is not a valid value");
  }

  const Footprint start = footprint();
  const auto started = std::chrono::steady_clock::now();
  weftComm_t world = nullptr;
  must(weftCommInitFromEnv(&world, nullptr), nullptr, "weftCommInitFromEnv");
  must(weftCommUserRank(world, &g_rank), world, "weftCommUserRank");
  if (g_rank == 0) {
    printf(
        "weft-soak: %ld small (%zu bytes) and %ld large (%zu bytes) operations, a new "
        "communicator every %ld, RSS slack %.0f MiB\n",
        options.small_ops, options.small_bytes, options.large_ops, options.large_bytes,
        options.ops_per_comm, options.rss_slack_mib);
    print_footprint("start", start);
  }

  // The large operations are spread evenly among the small ones; the kinds take turns and each
  // kind alternates between blocking and stream calls.
  const long total = options.small_ops + options.large_ops;
  bool exact = true;
  long communicators = 0;
  {
    Rotation rotation(world);
    for (long op = 0; op < total && exact; ++op) {
      if (op % options.ops_per_comm == 0) rotation.next();
      const bool large = (op + 1) * options.large_ops / total > op * options.large_ops / total;
      const Kind kind = static_cast<Kind>(op % static_cast<int>(Kind::Count));
      const bool on_stream = (op / static_cast<int>(Kind::Count)) % 2 == 1;
      exact = run_operation(rotation, kind, large ? options.large_bytes : options.small_bytes,
                            on_stream, op);
      if (g_rank == 0 && (op + 1) % options.progress_every == 0) {
        const Footprint now = footprint();
        printf(
            "weft-soak: %ld operations, %ld communicators, %.0f s: VmRSS %ld KiB, %d fds, "
            "%d /dev/shm entries\n",
            op + 1, rotation.made(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
            now.rss_kib, now.fds, now.shm_entries);
        fflush(stdout);
      }
    }
    communicators = rotation.made();
  }
  if (!exact) {
    weftCommAbort(world);
    return kMismatchExit;
  }
  must(weftCommDestroy(world), world, "weftCommDestroy");
  // A bootstrap root serves until the last rank of its communicator has left, so the process
  // hosting it may hold its sockets a little after its own weftCommDestroy returned.
  const auto destroyed = std::chrono::steady_clock::now();
  Footprint end = footprint();
  while ((end.fds != start.fds || end.shm_entries != start.shm_entries) &&
         std::chrono::steady_clock::now() - destroyed < kReleaseBound) {
    usleep(10000);
    end = footprint();
  }
  const double release_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - destroyed)
          .count();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double rss_growth_mib = (end.rss_kib - start.rss_kib) / 1024.0;
  const bool leaked = end.fds != start.fds || end.shm_entries != start.shm_entries ||
                      rss_growth_mib > options.rss_slack_mib;
  if (g_rank == 0)
    printf("weft-soak: %ld operations exact on %ld communicators in %.1f s\n", total, communicators,
           seconds);
  // Every rank's own figures: a leak on any rank fails the job.
  printf(
      "weft-soak: rank %d end: VmRSS %ld KiB (%+.1f MiB), %d open fds (start %d), %d /dev/shm "
      "entries (start %d), %.0f ms after the last destroy: %s\n",
      g_rank, end.rss_kib, rss_growth_mib, end.fds, start.fds, end.shm_entries, start.shm_entries,
      release_ms, leaked ? "LEAK" : "ok");
  if (leaked) {
    for (const std::string& target :
         std::set<std::string>(end.fd_targets.begin(), end.fd_targets.end()))
      if (end.fd_targets.count(target) > start.fd_targets.count(target))
        printf("weft-soak: rank %d: left open: %zu more of %s\n", g_rank,
               end.fd_targets.count(target) - start.fd_targets.count(target), target.c_str());
    for (const std::string& name : end.shm)
      if (start.shm.count(name) == 0)
        printf("weft-soak: rank %d: left: %s\n", g_rank, name.c_str());
  }
  return leaked ? kLeakExit : 0;
}
