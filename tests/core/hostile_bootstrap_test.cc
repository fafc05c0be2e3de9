// The bootstrap root under hostile traffic. While real ranks initialise, another process
// floods the root's port: garbage bytes, half-open connections, partial headers and hellos,
// oversized length prefixes, frames before any hello, and hellos replayed from an earlier job
// (right ranks, its old secret). Every rank's init must succeed, the communicator must work,
// nothing may crash, and the root's process must close every connection it did not keep.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "core/bootstrap_protocol.h"
#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

constexpr int kRanks = 3;  // real ranks; process kRanks floods
constexpr int kTimeoutMs = 30000;

struct Flood {
  int rounds_before;  // attack rounds before ranks 1.. start (rank 0 is initialising)
  int rounds_while;   // at most this many more while they join
  int root_fd_limit;  // RLIMIT_NOFILE in the root's process; 0: unchanged
};

// /proc/self/fd, or a failure when this process is out of file descriptors.
DIR* open_fd_dir() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) ADD_FAILURE() << "cannot open /proc/self/fd: " << strerror(errno);
  return dir;
}

int open_fds() {
  int count = 0;
  DIR* dir = open_fd_dir();
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  closedir(dir);
  return count - 1;  // the directory's own
}

// This process's TCP sockets whose local port is `port`: the root's listener and its side of
// every connection it accepted.
int sockets_on_port(int port) {
  std::set<unsigned long> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* file = fopen(table, "r");
    if (file == nullptr) {
      if (errno != ENOENT) ADD_FAILURE() << "cannot read " << table << ": " << strerror(errno);
      continue;
    }
    char line[512];
    if (fgets(line, sizeof(line), file) == nullptr) line[0] = 0;  // the header
    while (fgets(line, sizeof(line), file) != nullptr) {
      char local[128];
      unsigned long inode = 0;
      if (sscanf(line, "%*d: %127s %*s %*x %*s %*s %*x %*d %*d %lu", local, &inode) != 2) continue;
      const char* colon = strrchr(local, ':');
      if (colon != nullptr && strtol(colon + 1, nullptr, 16) == port) inodes.insert(inode);
    }
    fclose(file);
  }
  int count = 0;
  DIR* dir = open_fd_dir();
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    char target[64] = {0};
    std::string path = std::string("/proc/self/fd/") + entry->d_name;
    unsigned long inode = 0;
    if (readlink(path.c_str(), target, sizeof(target) - 1) > 0 &&
        sscanf(target, "socket:[%lu]", &inode) == 1 && inodes.count(inode) > 0)
      ++count;
  }
  closedir(dir);
  return count;
}

// A connection to the root, or -1 once it no longer listens (the ranks have all joined).
int connect_to_root(const RootAddress& root) {
  int fd = socket(root.address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&root.address.storage), root.address.length) ==
      0)
    return fd;
  close(fd);
  return -1;
}

Blob frame(uint32_t type, const Blob& payload, uint64_t length) {
  FrameHeader header{kFrameMagic, type, length};
  Blob bytes(sizeof(header) + payload.size());
  memcpy(bytes.data(), &header, sizeof(header));
  if (!payload.empty()) memcpy(bytes.data() + sizeof(header), payload.data(), payload.size());
  return bytes;
}
Blob frame(uint32_t type, const Blob& payload) {
  return frame(type, payload, payload.size());
}

// Sends what the socket takes at once: a root that dropped the connection must not stall us.
void send_some(int fd, const Blob& bytes, size_t size) {
  (void)!send(fd, bytes.data(), std::min(size, bytes.size()), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// One round of every kind of bad connection. Those a root should close stay open here, so
// only the root's closing frees them. False once the root no longer listens.
bool attack_round(const RootAddress& root, std::mt19937& random, std::vector<int>* held) {
  Hello replayed{kProtocolVersion, {},         static_cast<int32_t>(random() % kRanks), kRanks,
                 "earlier-job:1",  Blob(64, 7)};
  for (uint8_t& byte : replayed.secret) byte = static_cast<uint8_t>(random());
  Blob garbage(512);
  for (uint8_t& byte : garbage) byte = static_cast<uint8_t>(random());
  const Blob allgather = encode_allgather({0, Blob(8, 1), 1000});
  const std::vector<std::pair<Blob, size_t>> attacks = {
      {garbage, garbage.size()},                                       // garbage bytes
      {{}, 0},                                                         // half-open: nothing
      {frame(kHello, {}), 7},                                          // half a header
      {frame(kHello, {}, uint64_t{1} << 40), sizeof(FrameHeader)},     // oversized length
      {frame(kHello, {}, kMaxHelloPayload + 1), sizeof(FrameHeader)},  // just over the bound
      {frame(kHello, encode_hello(replayed)), 40},                     // a hello, cut short
      {frame(kHello, encode_hello(replayed)), SIZE_MAX},               // replayed old secret
      {frame(kAllGather, allgather), SIZE_MAX},                        // a frame before a hello
      {frame(kHello, encode_hello(replayed)), SIZE_MAX},               // replayed, then closed
  };
  for (size_t i = 0; i < attacks.size(); ++i) {
    int fd = connect_to_root(root);
    if (fd < 0) return false;
    send_some(fd, attacks[i].first, attacks[i].second);
    if (i == 0 || i + 1 == attacks.size())
      close(fd);
    else
      held->push_back(fd);
  }
  return true;
}

// The processes' signals: the flooder says its first wave is in, rank 0 (having counted the
// root's sockets) lets ranks 1.. start, and says when the flooder may let go.
struct Pipes {
  int flooded[2], go[2], done[2];
};

void attacker(const RankContext& context, const Flood& flood, const Pipes& pipes) {
  RootAddress root;
  ASSERT_TRUE(decode_unique_id(context.id, &root).ok());
  rlimit limit{};  // room for every connection held
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  limit.rlim_cur = limit.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  std::mt19937 random(12345);
  std::vector<int> held;
  for (int round = 0; round < flood.rounds_before; ++round)
    ASSERT_TRUE(attack_round(root, random, &held)) << "the root stopped listening before init";
  ASSERT_EQ(write(pipes.flooded[1], "f", 1), 1);
  for (int round = 0; round < flood.rounds_while && attack_round(root, random, &held); ++round) {
  }
  // Held until the root's process has counted its sockets.
  pollfd done{pipes.done[0], POLLIN, 0};
  EXPECT_EQ(poll(&done, 1, 2 * kTimeoutMs), 1) << "rank 0 never said it was done";
  for (int fd : held) close(fd);
}

void real_rank(const RankContext& context, const Flood& flood, const Pipes& pipes) {
  RootAddress root;
  ASSERT_TRUE(decode_unique_id(context.id, &root).ok());
  const int port = root.address.port();
  const int fds_before = open_fds();  // rank 0: the root's listener among them
  if (context.rank == 0 && flood.root_fd_limit > 0) {
    rlimit limit{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
    limit.rlim_cur = static_cast<rlim_t>(flood.root_fd_limit);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  // Rank 0 initialises at once; the others once the first wave is in.
  int flooded_sockets = 0;
  std::thread counter;
  if (context.rank == 0) {
    counter = std::thread([&] {
      char byte = 0;
      if (read(pipes.flooded[0], &byte, 1) == 1) flooded_sockets = sockets_on_port(port);
      const char go[kRanks - 1] = {};
      EXPECT_EQ(write(pipes.go[1], go, sizeof(go)), static_cast<ssize_t>(sizeof(go)));
    });
  } else {
    char go = 0;
    ASSERT_EQ(read(pipes.go[0], &go, 1), 1);
  }
  RankContext real = context;
  real.nranks = kRanks;
  weftComm_t comm = init_comm(real, kTimeoutMs);
  if (counter.joinable()) counter.join();
  ASSERT_NE(comm, nullptr);
  if (context.rank == 0) {
    // During the flood: the listener, rank 0's connection and the strangers the root keeps.
    EXPECT_LE(flooded_sockets, static_cast<int>(kMaxUnjoinedConnections) + 2);
    // The table is out: the root keeps one connection per rank and nothing else, not even
    // the half-open ones still held open by the flooder.
    EXPECT_EQ(sockets_on_port(port), kRanks);
    EXPECT_EQ(write(pipes.done[1], "d", 1), 1);
  }
  std::vector<int32_t> values(1000, context.rank + 1), sums(1000, 0);
  EXPECT_EQ(
      weftAllReduce(values.data(), sums.data(), values.size(), weftInt32, weftSum, comm, nullptr),
      weftSuccess)
      << weftGetLastError(comm);
  EXPECT_EQ(sums, std::vector<int32_t>(1000, kRanks * (kRanks + 1) / 2));
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  if (context.rank != 0) return;
  // The root serves until every rank has left; then its sockets are gone.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (sockets_on_port(port) > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(sockets_on_port(port), 0) << "the root kept sockets after every rank left";
  EXPECT_LE(open_fds(), fds_before - 1) << "file descriptors leaked (the listener is closed)";
}

void run_flood(const Flood& flood) {
  Pipes pipes;
  for (int* ends : {pipes.flooded, pipes.go, pipes.done}) ASSERT_EQ(pipe(ends), 0);
  RunOptions options;
  options.timeout_s = 120;
  run_ranks(
      kRanks + 1,
      [&](const RankContext& context) {
        if (context.rank == kRanks)
          attacker(context, flood, pipes);
        else
          real_rank(context, flood, pipes);
      },
      options);
  for (int* ends : {pipes.flooded, pipes.go, pipes.done}) {
    close(ends[0]);
    close(ends[1]);
  }
}

TEST(HostileBootstrap, FloodWhileRanksInitialise) {
  run_flood({20, 20, 0});
}

// More connections than a common default file limit (1024) while the root's process is held
// to it: the root must keep room for the ranks' own descriptors (their connections, UCX).
TEST(HostileBootstrap, FloodBeyondTheFileLimit) {
  run_flood({400, 20, 1024});
}

}  // namespace
}  // namespace weft::testing
