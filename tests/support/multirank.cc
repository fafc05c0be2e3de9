#include "support/multirank.h"

#include "common/free_port.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace weft::testing {

namespace {

void write_all(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = write(fd, bytes, size);
    if (written <= 0) _exit(99);
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

bool read_all(int fd, void* data, size_t size) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t got = read(fd, bytes, size);
    if (got <= 0) return false;
    bytes += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

[[noreturn]] void child_main(int rank, int nranks, const std::vector<int>& id_pipes,
                             const std::function<void(const RankContext&)>& body,
                             const RunOptions& options) {
  for (const auto& [name, value] : options.env) setenv(name, value, 1);
  RankContext context{rank, nranks, {}};
  if (!options.make_unique_id) {
    // Nothing to hand over.
  } else if (rank == 0) {
    weftResult_t result = weftGetUniqueId(&context.id);
    if (result != weftSuccess) {
      fprintf(stderr, "rank 0: weftGetUniqueId failed: %s\n", weftGetLastError(nullptr));
      _exit(98);
    }
    for (int peer = 1; peer < nranks; ++peer)
      write_all(id_pipes[2 * peer + 1], &context.id, sizeof(context.id));
  } else if (!read_all(id_pipes[2 * rank], &context.id, sizeof(context.id))) {
    _exit(97);
  }
  for (int fd : id_pipes) close(fd);
  body(context);
  fflush(stdout);
  fflush(stderr);
  // exit (not _exit): a rank hosting a bootstrap root serves it until the others leave.
  exit(::testing::Test::HasFailure() ? 1 : 0);
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace

void run_ranks(int nranks, const std::function<void(const RankContext&)>& body,
               const RunOptions& options) {
  std::vector<int> id_pipes(2 * nranks, -1);
  for (int rank = 1; rank < nranks; ++rank) ASSERT_EQ(pipe(&id_pipes[2 * rank]), 0);
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks);
  for (int rank = 0; rank < nranks; ++rank) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) child_main(rank, nranks, id_pipes, body, options);
    pids[rank] = pid;
  }
  for (int fd : id_pipes)
    if (fd >= 0) close(fd);

  std::vector<int> pidfds(nranks);
  for (int rank = 0; rank < nranks; ++rank) pidfds[rank] = pidfd_open(pids[rank]);
  std::vector<bool> ended(nranks, false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options.timeout_s);
  int left = nranks;
  bool timed_out = false;
  while (left > 0) {
    if (static_cast<size_t>(left) <= options.kill_after_others.size()) {
      bool only_those = true;
      for (int rank = 0; rank < nranks; ++rank)
        only_those =
            only_those && (ended[rank] || std::count(options.kill_after_others.begin(),
                                                     options.kill_after_others.end(), rank) > 0);
      if (only_those)
        for (int rank : options.kill_after_others)
          if (!ended[rank]) kill(pids[rank], SIGKILL);
    }
    std::vector<pollfd> fds;
    for (int rank = 0; rank < nranks; ++rank)
      if (!ended[rank]) fds.push_back({pidfds[rank], POLLIN, 0});
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (remaining.count() <= 0) {
      timed_out = true;
      break;
    }
    poll(fds.data(), fds.size(), static_cast<int>(remaining.count()));
    for (int rank = 0; rank < nranks; ++rank) {
      if (ended[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      ended[rank] = true;
      --left;
      ExpectedEnd expected = options.expected.empty() ? ExpectedEnd{} : options.expected[rank];
      if (expected.signal != 0) {
        EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == expected.signal)
            << "rank " << rank << " was expected to die by signal " << expected.signal;
      } else {
        EXPECT_TRUE(WIFEXITED(status)) << "rank " << rank << " was killed by signal "
                                       << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        if (WIFEXITED(status)) {
          EXPECT_EQ(WEXITSTATUS(status), expected.exit_code)
              << "rank " << rank << " exit status (1 means a failed assertion in that rank)";
        }
      }
    }
  }
  for (int rank = 0; rank < nranks; ++rank) {
    if (!ended[rank]) {
      kill(pids[rank], SIGKILL);
      waitpid(pids[rank], nullptr, 0);
    }
    close(pidfds[rank]);
  }
  EXPECT_FALSE(timed_out) << "ranks did not finish within " << options.timeout_s << " s";
  if (options.on_end) options.on_end(pids);
}

weftComm_t init_comm(const RankContext& context, int timeout_ms) {
  weftComm_t comm = nullptr;
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (timeout_ms > 0) config.timeoutMs = timeout_ms;
  weftResult_t result =
      weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config);
  EXPECT_EQ(result, weftSuccess) << weftGetLastError(nullptr);
  return comm;
}

int free_loopback_port() {
  const int port = free_port_pair();
  if (port == 0) ADD_FAILURE() << "no free port pair below " << ephemeral_port_low();
  return port;
}

}  // namespace weft::testing
