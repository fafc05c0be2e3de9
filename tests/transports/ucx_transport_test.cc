// The UCX transport on its own, every rank a forked process (the test's own process opens
// no UCX, which a fork would inherit half-working): a peer that exits mid-rendezvous leaves
// this rank running (UCX's cma transport aborted the process there); peers on this node
// and on "other hosts" are reached through their own workers, and a rank asleep on its
// event fd wakes for either; and placements that disagree, or addresses that do not parse,
// are errors naming the rank.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "transports/ucx/ucx_transport.h"

namespace weft::ucx {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

// A bound on every wait here, so that a broken transport fails the test instead of hanging.
constexpr auto kWaitBound = std::chrono::seconds(20);
constexpr uint64_t kLargeTag = 1, kSmallTag = 2, kHelloTag = 3;

// False, with the reason on stderr (a rank's EXPECTs would not reach the test).
bool check(bool ok, int rank, const std::string& what) {
  if (!ok) fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return ok;
}

// N ranks in forked processes, pipes between every ordered pair. Rank 0 forks the others,
// so it can wait for them.
class Ranks {
 public:
  explicit Ranks(int nranks) : nranks_(nranks), pipes_(nranks * nranks) {
    for (auto& fds : pipes_) EXPECT_EQ(pipe(fds.data()), 0);
  }
  ~Ranks() {
    for (auto& fds : pipes_)
      for (int fd : fds) close(fd);
  }

  // Runs `body(rank)` on every rank; true when every body returned true and every rank
  // exited normally. A rank whose parent dies is killed with it.
  template <typename Body>
  bool run(Body body) {
    pid_t leader = fork();
    if (leader == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (int rank = 1; rank < nranks_; ++rank) {
        pid_t pid = fork();
        if (pid == 0) {
          prctl(PR_SET_PDEATHSIG, SIGKILL);
          _exit(body(rank) ? 0 : 1);
        }
        children_.push_back(pid);
      }
      bool ok = body(0);
      for (int status : wait_children())
        ok &= check(WIFEXITED(status) && WEXITSTATUS(status) == 0, 0,
                    "a rank failed, status " + std::to_string(status));
      _exit(ok ? 0 : 1);
    }
    int status = -1;
    waitpid(leader, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  // In rank 0: the other ranks' exit statuses, once they have exited.
  std::vector<int> wait_children() {
    std::vector<int> statuses;
    for (pid_t pid : children_) {
      int status = -1;
      waitpid(pid, &status, 0);
      statuses.push_back(status);
    }
    children_.clear();
    return statuses;
  }

  void send(int from, int to, const Bytes& bytes) {
    uint32_t length = uint32_t(bytes.size());
    int fd = pipes_[from * nranks_ + to][1];
    (void)!write(fd, &length, sizeof(length));
    (void)!write(fd, bytes.data(), length);
  }
  bool readable(int from, int to) {
    pollfd fd{pipes_[from * nranks_ + to][0], POLLIN, 0};
    return poll(&fd, 1, 0) == 1;
  }
  // Empty when nothing came within kWaitBound.
  Bytes receive(int from, int to) {
    int fd = pipes_[from * nranks_ + to][0];
    pollfd readable{fd, POLLIN, 0};
    if (poll(&readable, 1, int(std::chrono::milliseconds(kWaitBound).count())) != 1) return {};
    uint32_t length = 0;
    if (read(fd, &length, sizeof(length)) != ssize_t(sizeof(length))) return {};
    Bytes bytes(length);
    for (size_t got = 0; got < length;) {
      ssize_t n = read(fd, bytes.data() + got, length - got);
      if (n <= 0) return {};
      got += size_t(n);
    }
    return bytes;
  }

  // A transport for `rank`, its peers set from every rank's address (exchanged through the
  // pipes) and `same_host`; null on failure.
  std::unique_ptr<Transport> connect(int rank, bool one_node, const std::vector<bool>& same_host) {
    std::unique_ptr<Transport> transport;
    if (!check(Transport::create(one_node, &transport).ok(), rank, "create")) return nullptr;
    for (int to = 0; to < nranks_; ++to)
      if (to != rank) send(rank, to, transport->address());
    std::vector<Bytes> addresses(nranks_);
    for (int from = 0; from < nranks_; ++from)
      addresses[from] = from == rank ? transport->address() : receive(from, rank);
    Status status = transport->set_peers(rank, addresses, same_host);
    if (!check(status.ok(), rank, "set_peers: " + status.message())) return nullptr;
    return transport;
  }

 private:
  int nranks_;
  std::vector<std::array<int, 2>> pipes_;
  std::vector<pid_t> children_;
};

// Progresses until `request` is done, sleeping on the event fd when nothing happens; false
// also when a sleep of 5 s ends without an event though there was work to progress (the fd
// missed a worker's events).
bool wait_done(Transport& transport, const Request& request, int rank) {
  const Clock::time_point deadline = Clock::now() + kWaitBound;
  while (!request.done.load(std::memory_order_acquire)) {
    if (!check(Clock::now() < deadline, rank, "a request never completed")) return false;
    if (transport.progress() || !transport.arm()) continue;
    pollfd fd{transport.event_fd(), POLLIN, 0};
    if (poll(&fd, 1, 5000) == 0 &&
        !check(!transport.progress(), rank, "asleep on the event fd, no event came for work"))
      return false;
  }
  return check(request.status == UCS_OK, rank, ucs_status_string(request.status));
}

class PeerExit : public ::testing::TestWithParam<bool> {};

// Rank 1 sends rank 0 a message far above the rendezvous threshold and a small one after
// it, and exits once rank 0 has the small one, the large one unfinished.
// Rank 0 closes its endpoints at once, as a communicator that learnt of the failure does,
// while its caller still progresses what it posted. With UCX's cma, rank 0's next read of
// the exited process made UCX abort rank 0 (CI's multinode.kill, 1 run in 40; here every
// run with UCX_TLS=self,sysv,cma); now rank 0 runs on.
TEST_P(PeerExit, APeerThatExitsMidRendezvousLeavesThisRankRunning) {
  const bool one_node = GetParam();
  constexpr size_t kHuge = size_t(64) << 20;
  Ranks ranks(2);
  EXPECT_TRUE(ranks.run([&](int rank) {
    std::unique_ptr<Transport> transport = ranks.connect(rank, one_node, {true, true});
    if (!transport) return false;
    Bytes large(kHuge, 0x5a), small(8, 0x11);
    uint64_t greeting = 0;
    Request* hello = transport->acquire();
    if (rank == 1) {
      if (!transport->post_recv(0, kHelloTag, &greeting, sizeof(greeting), hello).ok() ||
          !wait_done(*transport, *hello, rank))
        return false;
      ranks.receive(0, 1);  // rank 0's receives are posted
      Request* sends[2] = {transport->acquire(), transport->acquire()};
      if (!transport->post_send(0, kLargeTag, large.data(), large.size(), sends[0]).ok() ||
          !transport->post_send(0, kSmallTag, small.data(), small.size(), sends[1]).ok())
        return false;
      // Progressing (UCX sends the small message from there), until rank 0 says it has it.
      const Clock::time_point deadline = Clock::now() + kWaitBound;
      while (!ranks.readable(0, 1) && Clock::now() < deadline) transport->progress();
      _exit(ranks.readable(0, 1) ? 0 : 1);  // gone, its rendezvous unfinished
    }
    // An endpoint to rank 1, as ranks that exchanged messages before have.
    bool ok = transport->post_send(1, kHelloTag, &greeting, sizeof(greeting), hello).ok() &&
              wait_done(*transport, *hello, rank);
    std::fill(small.begin(), small.end(), 0);
    Request* large_recv = transport->acquire();
    Request* small_recv = transport->acquire();
    ok &= transport->post_recv(1, kLargeTag, large.data(), large.size(), large_recv).ok();
    ok &= transport->post_recv(1, kSmallTag, small.data(), small.size(), small_recv).ok();
    ranks.send(0, 1, Bytes{1});
    ok = ok && wait_done(*transport, *small_recv, rank);
    ok &= check(small == Bytes(8, 0x11), rank, "the small message arrived wrong");
    ok &= check(!large_recv->done.load(std::memory_order_acquire), rank,
                "the large message was done before its sender left: nothing tested");
    ranks.send(0, 1, Bytes{1});
    for (int status : ranks.wait_children())
      ok &= check(WIFEXITED(status) && WEXITSTATUS(status) == 0, rank, "rank 1 failed");
    transport->close_endpoints(true, 0);
    for (int i = 0; i < 10000; ++i) transport->progress();
    // Still here. The transport stays, as a communicator's does when a peer failed: its
    // destruction would wait for flushes that never come.
    transport->abandon(large_recv);
    (void)transport.release();
    return ok;
  }));
}

INSTANTIATE_TEST_SUITE_P(Placement, PeerExit, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "OneNode" : "AnyNodes"; });

// Three ranks: 0 and 1 on "this host", 2 on "another" (as the communicator would say). Every
// rank sends a rendezvous message and a small one to every rank, itself included (through
// the shared-memory worker at ranks 0 and 1, the network one at rank 2); each arrives whole,
// and a rank asleep on its event fd is woken for the traffic of either of its workers.
TEST(UcxTransport, PeersOnThisNodeAndOthersAreReachedAndWakeTheRank) {
  constexpr int kRanks = 3;
  constexpr size_t kLarge = size_t(4) << 20;
  const std::vector<std::vector<bool>> same_host = {
      {true, true, false}, {true, true, false}, {false, false, true}};
  auto pattern = [](int from, int to, size_t i) { return uint8_t(from * 31 + to * 7 + i); };
  Ranks ranks(kRanks);
  EXPECT_TRUE(ranks.run([&](int rank) {
    std::unique_ptr<Transport> transport = ranks.connect(rank, false, same_host[rank]);
    if (!transport) return false;
    std::vector<Bytes> sent, received;
    std::vector<Request*> requests;
    bool ok = true;
    for (int peer = 0; peer < kRanks; ++peer) {
      for (size_t bytes : {kLarge, size_t(8)}) {
        // Tags name the sender, as the communicator's do: a worker may hear several peers.
        auto tag = [bytes](int from) { return (bytes == 8 ? kSmallTag : kLargeTag) + 16 * from; };
        sent.emplace_back(bytes);
        for (size_t i = 0; i < bytes; ++i) sent.back()[i] = pattern(rank, peer, i);
        received.emplace_back(bytes);
        requests.push_back(transport->acquire());
        ok &= transport->post_recv(peer, tag(peer), received.back().data(), bytes, requests.back())
                  .ok();
        requests.push_back(transport->acquire());
        ok &=
            transport->post_send(peer, tag(rank), sent.back().data(), bytes, requests.back()).ok();
      }
    }
    for (Request* request : requests) ok = ok && wait_done(*transport, *request, rank);
    size_t next = 0;
    for (int peer = 0; peer < kRanks; ++peer) {
      for (size_t bytes : {kLarge, size_t(8)}) {
        const Bytes& got = received[next++];
        bool whole = true;
        for (size_t i = 0; i < bytes && whole; ++i) whole = got[i] == pattern(peer, rank, i);
        ok &= check(whole, rank, "a message from rank " + std::to_string(peer) + " arrived wrong");
      }
    }
    // Nobody leaves before every rank has what it was sent.
    for (int peer = 0; peer < kRanks; ++peer)
      if (peer != rank) ranks.send(rank, peer, Bytes{1});
    for (int peer = 0; peer < kRanks; ++peer)
      if (peer != rank) ranks.receive(peer, rank);
    return ok;
  }));
}

// Bytes of the SysV shared memory segments this process created (/proc/sysvipc/shm).
uint64_t sysv_bytes_created_here() {
  std::ifstream table("/proc/sysvipc/shm");
  std::string line;
  std::getline(table, line);  // the header
  uint64_t bytes = 0;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string key, id, perms;
    uint64_t size = 0;
    pid_t creator = 0;
    if (fields >> key >> id >> perms >> size >> creator && creator == getpid()) bytes += size;
  }
  return bytes;
}

// A worker for peers on this node grows its receive buffers 64 at a time: UCX's default of
// 512 (8 KiB each) put 4.2 MB of SysV memory behind every worker, every page of it cleared as
// the worker was made, most of the CPU a communicator's creation took at 8 ranks.
TEST(UcxTransport, ANodeWorkerTakesLittleSysvMemory) {
  if (const char* tls = getenv("UCX_TLS"); tls != nullptr && strstr(tls, "sysv") == nullptr)
    GTEST_SKIP() << "UCX_TLS=" << tls << " leaves sysv out";
  Ranks ranks(1);
  EXPECT_TRUE(ranks.run([&](int rank) {
    const uint64_t before = sysv_bytes_created_here();
    std::unique_ptr<Transport> transport;
    if (!check(Transport::create(true, &transport).ok(), rank, "create")) return false;
    const uint64_t bytes = sysv_bytes_created_here() - before;
    return check(bytes > 0 && bytes < (uint64_t(2) << 20), rank,
                 "the worker's SysV segments take " + std::to_string(bytes) + " bytes");
  }));
}

// A rank whose transport opened only the shared-memory worker (its communicator said every
// peer shares its node) and a peer it places on another host, or in another IPC namespace:
// an error naming that rank; and an address that does not parse.
TEST(UcxTransport, PlacementThatDisagreesAndMalformedAddressesAreErrors) {
  Ranks ranks(1);
  EXPECT_TRUE(ranks.run([](int rank) {
    std::unique_ptr<Transport> node_only, any_nodes;
    if (!Transport::create(true, &node_only).ok() || !Transport::create(false, &any_nodes).ok())
      return false;
    Status status =
        node_only->set_peers(0, {node_only->address(), any_nodes->address()}, {true, false});
    bool ok = check(status.code() == weftInvalidUsage, rank, "disagreement: " + status.message());
    ok &= check(status.message().find("rank 1") != std::string::npos, rank, status.message());
    // A peer on this host by name and boot id, in another IPC namespace (the address's first
    // 8 bytes): sysv cannot reach it, so it is the network worker's, which this one lacks.
    Bytes elsewhere = node_only->address();
    elsewhere[0] ^= 1;
    status = node_only->set_peers(0, {node_only->address(), elsewhere}, {true, true});
    ok &= check(status.code() == weftInvalidUsage, rank, "IPC namespace: " + status.message());
    ok &= check(status.message().find("rank 1") != std::string::npos, rank, status.message());
    Bytes truncated(any_nodes->address().begin(), any_nodes->address().end() - 3);
    status = any_nodes->set_peers(1, {truncated, any_nodes->address()}, {true, true});
    ok &= check(status.code() == weftRemoteError, rank, "truncated: " + status.message());
    ok &= check(status.message().find("rank 0") != std::string::npos, rank, status.message());
    return ok;
  }));
}

}  // namespace
}  // namespace weft::ucx
