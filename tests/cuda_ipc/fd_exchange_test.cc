// Descriptor passing between ranks (transports/cuda_ipc/fd_exchange.h) with
// memfd_create descriptors, the stand-in here for cuMem POSIX-fd handles:
// ranks as threads and as processes map each other's memory and read what
// the other side wrote, plus timeouts, strangers and bad arguments.
#include "transports/cuda_ipc/fd_exchange.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace weft::cuda_ipc {
namespace {

constexpr int64_t kTimeoutMs = 20000;
constexpr size_t kBytes = 4096;
// Peers write their marks from here on; the pattern below it stays.
constexpr size_t kMarks = kBytes - 64;

// A fresh id per test, so parallel test runs never share socket names.
std::array<uint8_t, 128> random_id() {
  std::array<uint8_t, 128> id{};
  std::random_device device;
  for (uint8_t& b : id) b = static_cast<uint8_t>(device());
  return id;
}

// Shared memory behind a descriptor, as an exporter would hand out.
struct SharedBlock {
  UniqueFd fd;
  std::byte* data = nullptr;
  SharedBlock() = default;
  SharedBlock(SharedBlock&& other) noexcept
      : fd(std::move(other.fd)), data(std::exchange(other.data, nullptr)) {}
  ~SharedBlock() {
    if (data != nullptr) ::munmap(data, kBytes);
  }
};

bool map_block(UniqueFd fd, SharedBlock* out) {
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return false;
  out->fd = std::move(fd);
  out->data = static_cast<std::byte*>(p);
  return true;
}

bool make_block(int rank, SharedBlock* out) {
  UniqueFd fd(::memfd_create("weft-ipc-test", MFD_CLOEXEC));
  if (fd.get() < 0 || ::ftruncate(fd.get(), kBytes) != 0) return false;
  if (!map_block(std::move(fd), out)) return false;
  for (size_t i = 0; i < kMarks; ++i) out->data[i] = std::byte(static_cast<uint8_t>(rank * 31 + i));
  return true;
}

uint64_t inode_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// The next message from `peer`, which must carry `nfds` descriptors and
// `nbytes` bytes. "" or what failed.
std::string receive(FdExchange& ex, int peer, size_t nfds, size_t nbytes, FdMessage* msg) {
  const Status st = ex.recv(peer, msg, kTimeoutMs);
  if (!st.ok()) return st.message();
  if (msg->fds.size() != nfds || msg->bytes.size() != nbytes) {
    return "a message of the wrong shape from rank " + std::to_string(peer);
  }
  return "";
}

// One rank's part: hand its block to every peer, map every peer's block and
// check its contents and identity, write a mark into it, then tell the peer
// (a second message, which orders the write before the peer's read) and
// check the marks the peers wrote into its own block. "" or what failed.
std::string exchange_rank(const std::array<uint8_t, 128>& id, int rank, int nranks) {
  FdExchange ex;
  Status st = ex.listen(id.data(), id.size(), rank, nranks);
  if (!st.ok()) return st.message();
  SharedBlock own;
  if (!make_block(rank, &own)) return "memfd";
  const uint64_t inode = inode_of(own.fd.get());
  const int fd = own.fd.get();
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    st = ex.send(peer, &fd, 1, &inode, sizeof(inode), kTimeoutMs);
    if (!st.ok()) return st.message();
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    FdMessage msg;
    if (std::string e = receive(ex, peer, 1, sizeof(uint64_t), &msg); !e.empty()) return e;
    uint64_t sent_inode = 0;
    std::memcpy(&sent_inode, msg.bytes.data(), sizeof(sent_inode));
    if (inode_of(msg.fds[0].get()) != sent_inode) return "a different file arrived";
    SharedBlock theirs;
    if (!map_block(std::move(msg.fds[0]), &theirs)) return "mmap of the received fd";
    for (size_t i = 0; i < kMarks; ++i) {
      if (theirs.data[i] != std::byte(static_cast<uint8_t>(peer * 31 + i))) {
        return "rank " + std::to_string(rank) + " read a wrong byte from rank " +
               std::to_string(peer);
      }
    }
    const uint8_t mark = static_cast<uint8_t>(0x80 + rank);
    std::memcpy(theirs.data + kMarks + rank, &mark, 1);
    st = ex.send(peer, nullptr, 0, "w", 1, kTimeoutMs);
    if (!st.ok()) return st.message();
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    FdMessage msg;
    if (std::string e = receive(ex, peer, 0, 1, &msg); !e.empty()) return e;
    if (own.data[kMarks + peer] != std::byte(static_cast<uint8_t>(0x80 + peer))) {
      return "rank " + std::to_string(rank) + " does not see the mark of rank " +
             std::to_string(peer);
    }
  }
  return "";
}

TEST(FdExchange, ThreadsMapEachOthersMemory) {
  for (int nranks : {2, 3, 5}) {
    const auto id = random_id();
    std::vector<std::string> results(nranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; ++r) {
      threads.emplace_back([&, r] { results[r] = exchange_rank(id, r, nranks); });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < nranks; ++r) EXPECT_EQ(results[r], "") << "rank " << r << " of " << nranks;
  }
}

TEST(FdExchange, ProcessesMapEachOthersMemory) {
  const auto id = random_id();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string result = exchange_rank(id, 1, 2);
    if (!result.empty()) std::fprintf(stderr, "child: %s\n", result.c_str());
    ::_exit(result.empty() ? 0 : 1);
  }
  EXPECT_EQ(exchange_rank(id, 0, 2), "");
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(FdExchange, AbsentPeerTimesOutNamingIt) {
  const auto id = random_id();
  FdExchange low, high;
  ASSERT_TRUE(low.listen(id.data(), id.size(), 0, 3).ok());
  ASSERT_TRUE(high.listen(id.data(), id.size(), 2, 3).ok());
  FdMessage msg;
  Status st = low.recv(1, &msg, 50);  // rank 1 never comes: low waits for its call
  EXPECT_EQ(st.code(), weftTimeout);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  st = high.send(1, nullptr, 0, "x", 1, 50);  // high dials rank 1, which never listens
  EXPECT_EQ(st.code(), weftTimeout);
  EXPECT_NE(st.message().find("rank 1 never listened"), std::string::npos) << st.message();
}

// A caller that does not present the id's token is dropped; the real peer
// connecting after it still gets through.
TEST(FdExchange, StrangerIsDropped) {
  const auto id = random_id();
  FdExchange low, high;
  ASSERT_TRUE(low.listen(id.data(), id.size(), 0, 2).ok());
  ASSERT_TRUE(high.listen(id.data(), id.size(), 1, 2).ok());
  UniqueFd stranger(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& name = low.name();
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::connect(stranger.get(), reinterpret_cast<sockaddr*>(&addr), length), 0);
  const char junk[24] = "not a weft hello at all";
  ASSERT_EQ(::write(stranger.get(), junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  ASSERT_TRUE(high.send(0, nullptr, 0, "ok", 2, kTimeoutMs).ok());
  FdMessage msg;
  const Status st = low.recv(1, &msg, kTimeoutMs);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(std::string(msg.bytes.begin(), msg.bytes.end()), "ok");
}

TEST(FdExchange, BadArgumentsAreNamed) {
  const auto id = random_id();
  FdExchange ex;
  EXPECT_EQ(ex.listen(id.data(), id.size(), 3, 3).code(), weftInvalidArgument);
  ASSERT_TRUE(ex.listen(id.data(), id.size(), 0, 2).ok());
  FdExchange twin;
  const Status in_use = twin.listen(id.data(), id.size(), 0, 2);
  EXPECT_FALSE(in_use.ok());
  EXPECT_NE(in_use.message().find("rank 0"), std::string::npos) << in_use.message();
  FdMessage msg;
  Status st = ex.recv(0, &msg, 10);
  EXPECT_EQ(st.code(), weftInvalidArgument);
  EXPECT_NE(st.message().find("peer 0"), std::string::npos) << st.message();
  st = ex.recv(7, &msg, 10);
  EXPECT_NE(st.message().find("peer 7"), std::string::npos) << st.message();
  std::vector<int> fds(kMaxFdsPerMessage + 1, 0);
  st = ex.send(1, fds.data(), fds.size(), nullptr, 0, 10);
  EXPECT_EQ(st.code(), weftInvalidArgument);
  EXPECT_NE(st.message().find("nfds"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace weft::cuda_ipc
