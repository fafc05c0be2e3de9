// Communicator lifecycle: bootstrap at many rank counts, init from the
// environment, split (colors, keys, NOCOLOR, nesting), and a root that
// shrugs off strangers while real ranks join.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

// Every rank sends its rank to the right and checks what comes from the left.
void expect_ring_works(weftComm_t comm) {
  int rank = -1, size = -1;
  ASSERT_EQ(weftCommUserRank(comm, &rank), weftSuccess);
  ASSERT_EQ(weftCommCount(comm, &size), weftSuccess);
  int64_t outgoing = rank * 1000 + size, incoming = -1;
  int left = (rank + size - 1) % size;
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(&outgoing, 1, weftInt64, (rank + 1) % size, comm, nullptr), weftSuccess);
  ASSERT_EQ(weftRecv(&incoming, 1, weftInt64, left, comm, nullptr), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
  EXPECT_EQ(incoming, left * 1000 + size);
}

class Bootstrap : public ::testing::TestWithParam<int> {};

TEST_P(Bootstrap, RanksJoinAndTalk) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    ASSERT_NE(comm, nullptr);
    int rank = -1, size = -1;
    EXPECT_EQ(weftCommUserRank(comm, &rank), weftSuccess);
    EXPECT_EQ(weftCommCount(comm, &size), weftSuccess);
    EXPECT_EQ(rank, context.rank);
    EXPECT_EQ(size, context.nranks);
    expect_ring_works(comm);
    weftResult_t async_error = weftInternalError;
    EXPECT_EQ(weftCommGetAsyncError(comm, &async_error), weftSuccess);
    EXPECT_EQ(async_error, weftSuccess);
    EXPECT_EQ(weftCommFinalize(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}
INSTANTIATE_TEST_SUITE_P(Ranks, Bootstrap, ::testing::Range(1, 9));

void init_from_env_and_check(const RankContext& context, const char* rank_var,
                             const char* size_var) {
  setenv(rank_var, std::to_string(context.rank).c_str(), 1);
  setenv(size_var, std::to_string(context.nranks).c_str(), 1);
  weftComm_t comm = nullptr;
  ASSERT_EQ(weftCommInitFromEnv(&comm, nullptr), weftSuccess) << weftGetLastError(nullptr);
  int rank = -1;
  EXPECT_EQ(weftCommUserRank(comm, &rank), weftSuccess);
  EXPECT_EQ(rank, context.rank);
  expect_ring_works(comm);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

TEST(InitFromEnv, WeftVariables) {
  std::string root = "127.0.0.1:" + std::to_string(free_loopback_port());
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"WEFT_ROOT", root.c_str()}, {"WEFT_SECRET", "00112233445566778899aabbccddeeff"}};
  run_ranks(
      4,
      [](const RankContext& context) {
        init_from_env_and_check(context, "WEFT_RANK", "WEFT_NRANKS");
      },
      options);
}

TEST(InitFromEnv, OpenMpiVariablesWithMasterAddr) {
  std::string port = std::to_string(free_loopback_port());
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port.c_str()},
                 {"OMPI_MCA_ess_base_jobid", "4242"}};
  run_ranks(
      3,
      [](const RankContext& context) {
        init_from_env_and_check(context, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
      },
      options);
}

// A loopback listener on `port`, or -1 when the port is taken.
int listen_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(InitFromEnv, TorchrunVariablesLeaveMasterPortToTheStore) {
  // torch's store listens on MASTER_PORT; rank 0 must take the next port, which
  // free_loopback_port checked free (below the ephemeral range, so it stays free).
  const int store_port = free_loopback_port();
  const int store = listen_loopback(store_port);
  ASSERT_GE(store, 0) << "port " << store_port << " was taken";
  std::string port = std::to_string(store_port);
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port.c_str()}, {"LOCAL_RANK", "0"}};
  run_ranks(
      3, [](const RankContext& context) { init_from_env_and_check(context, "RANK", "WORLD_SIZE"); },
      options);
  close(store);
}

TEST(InitFromEnv, SlurmVariables) {
  std::string root = "127.0.0.1:" + std::to_string(free_loopback_port());
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"WEFT_ROOT", root.c_str()}, {"SLURM_JOB_ID", "77"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        init_from_env_and_check(context, "SLURM_PROCID", "SLURM_NTASKS");
      },
      options);
}

// A single-node Open MPI job needs no address: the ranks meet on loopback at a port
// derived from the job id. The same under Slurm, which may span nodes, is an error.
TEST(InitFromEnv, SingleNodeOpenMpiNeedsNoRoot) {
  const std::string job = "weft-test-" + std::to_string(getpid());
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"OMPI_MCA_ess_base_jobid", job.c_str()}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        init_from_env_and_check(context, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
      },
      options);
}

TEST(InitFromEnv, SlurmWithoutRootIsAClearError) {
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommInitFromEnv(&comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("WEFT_ROOT"), std::string::npos)
      << weftGetLastError(nullptr);
  for (const char* name : {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS"}) unsetenv(name);
}

TEST(InitFromEnv, MissingRankIsAClearError) {
  unsetenv("WEFT_RANK");
  weftComm_t comm = reinterpret_cast<weftComm_t>(0x1);
  EXPECT_EQ(weftCommInitFromEnv(&comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("WEFT_RANK"), std::string::npos);
}

TEST(Split, ColorsKeysNoColorAndNesting) {
  run_ranks(7, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    // Rank 6 opts out; the rest split by parity, ordered by descending rank.
    int color = context.rank == 6 ? WEFT_SPLIT_NOCOLOR : context.rank % 2;
    weftComm_t half = reinterpret_cast<weftComm_t>(0x1);
    ASSERT_EQ(weftCommSplit(comm, color, -context.rank, &half, nullptr), weftSuccess)
        << weftGetLastError(comm);
    if (context.rank == 6) {
      EXPECT_EQ(half, nullptr);
    } else {
      ASSERT_NE(half, nullptr);
      std::vector<int> members;
      for (int r = 5; r >= 0; --r)
        if (r % 2 == color) members.push_back(r);
      int rank = -1, size = -1;
      EXPECT_EQ(weftCommCount(half, &size), weftSuccess);
      EXPECT_EQ(weftCommUserRank(half, &rank), weftSuccess);
      EXPECT_EQ(size, static_cast<int>(members.size()));
      EXPECT_EQ(members[rank], context.rank);
      expect_ring_works(half);

      // Nested: split the half again into singletons and pairs by rank / 2.
      weftComm_t quarter = nullptr;
      ASSERT_EQ(weftCommSplit(half, rank / 2, rank, &quarter, nullptr), weftSuccess)
          << weftGetLastError(half);
      int quarter_size = -1, quarter_rank = -1;
      EXPECT_EQ(weftCommCount(quarter, &quarter_size), weftSuccess);
      EXPECT_EQ(weftCommUserRank(quarter, &quarter_rank), weftSuccess);
      EXPECT_EQ(quarter_size, std::min(2, size - (rank / 2) * 2));
      EXPECT_EQ(quarter_rank, rank % 2);
      expect_ring_works(quarter);
      EXPECT_EQ(weftCommDestroy(quarter), weftSuccess);
      EXPECT_EQ(weftCommDestroy(half), weftSuccess);
    }
    // The parent still works after its children are gone.
    expect_ring_works(comm);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Strangers that connect to the root: wrong secret, garbage, an oversized
// frame header, and one that connects and says nothing at all.
void attack_root(const weftUniqueId& id, int* silent_fd) {
  // The id layout is private; the root's address is found by trying the
  // connection the way a stranger on the network would: from the id bytes.
  uint16_t family = 0, port = 0;
  memcpy(&family, id.internal + 8, 2);
  memcpy(&port, id.internal + 10, 2);
  ASSERT_EQ(family, AF_INET);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  memcpy(&address.sin_addr, id.internal + 12, 4);
  auto connect_root = [&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  };
  *silent_fd = connect_root();
  std::vector<std::vector<uint8_t>> messages;
  // A well-formed hello frame with a wrong secret.
  std::vector<uint8_t> wrong_secret = {0x42, 0x54, 0x46, 0x57, 1, 0, 0, 0, 40, 0, 0, 0, 0, 0, 0, 0};
  for (uint8_t byte : {1, 0, 0, 0}) wrong_secret.push_back(byte);  // the protocol version
  wrong_secret.resize(16 + 40, 0xAB);
  messages.push_back(wrong_secret);
  messages.push_back(std::vector<uint8_t>(4096, 0x5A));  // garbage
  // Right magic, absurd length.
  messages.push_back(
      {0x42, 0x54, 0x46, 0x57, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0});
  messages.push_back({0x42, 0x54});  // truncated header, then close
  for (const auto& message : messages) {
    int fd = connect_root();
    EXPECT_EQ(write(fd, message.data(), message.size()), static_cast<ssize_t>(message.size()));
    close(fd);
  }
}

TEST(Bootstrap, StrangersDoNotDisturbInit) {
  run_ranks(4, [](const RankContext& context) {
    int silent_fd = -1;
    std::thread attacker;
    if (context.rank == 0) attacker = std::thread([&] { attack_root(context.id, &silent_fd); });
    weftComm_t comm = init_comm(context, 20000);
    if (attacker.joinable()) attacker.join();
    ASSERT_NE(comm, nullptr);
    expect_ring_works(comm);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    if (silent_fd >= 0) close(silent_fd);
  });
}

// The cost model runs at the host's speed (docs/tuning.md, "Host speed"), one speed for all
// of a communicator's ranks whatever each measured or was told: their median. Here each
// rank is told its own (WEFT_HOST_SPEED, read as each communicator is made); every rank's
// predictions follow the median exactly.
TEST(HostSpeed, RanksApplyTheMedianOfTheirSpeeds) {
  run_ranks(3, [](const RankContext& context) {
    setenv("WEFT_ALGO", "allreduce:oneshot", 1);  // the same algorithm at every speed
    setenv("WEFT_HOST_SPEED", "100", 1);
    weftComm_t comm = init_comm(context);
    ASSERT_NE(comm, nullptr);
    const auto predict = [](weftComm_t c) {
      double us = -1;
      EXPECT_EQ(weftCommPredictTime(c, "allreduce", 1 << 20, &us), weftSuccess);
      return us;
    };
    const auto split_at = [&](const char* percent) {
      setenv("WEFT_HOST_SPEED", percent, 1);
      weftComm_t child = nullptr;
      EXPECT_EQ(weftCommSplit(comm, 0, context.rank, &child, nullptr), weftSuccess)
          << weftGetLastError(comm);
      return child;
    };
    const double full = predict(comm);
    ASSERT_GT(full, 0);
    weftComm_t half = split_at("50");
    const char* views[] = {"400", "100", "25"};
    weftComm_t mixed = split_at(views[context.rank]);
    weftComm_t outvoted = split_at(context.rank == 0 ? "100" : "50");
    unsetenv("WEFT_HOST_SPEED");
    unsetenv("WEFT_ALGO");
    ASSERT_NE(half, nullptr);
    ASSERT_NE(mixed, nullptr);
    ASSERT_NE(outvoted, nullptr);
    EXPECT_NEAR(predict(half), 2 * full, 1e-9 * full);
    EXPECT_NEAR(predict(mixed), full, 1e-9 * full);
    EXPECT_NEAR(predict(outvoted), 2 * full, 1e-9 * full);
    for (weftComm_t c : {outvoted, mixed, half, comm}) EXPECT_EQ(weftCommDestroy(c), weftSuccess);
  });
}

}  // namespace
}  // namespace weft::testing
