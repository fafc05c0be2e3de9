// WEFT_CHECK (docs/reliability.md, "Mismatch detection"): off compares nothing, a bad
// value fails init naming the variable, full also checks outputs against the ranks' input
// hashes and names the ranks whose inputs differ; and AllToAllv's count matrix, whose
// inconsistency fails every rank naming both ranks and both counts, on the direct path and
// on the message path, blocking, in a group and on a stream.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

constexpr int kTimeoutMs = 60000;
constexpr int kRanks = 3;

weftComm_t init_with(const RankContext& context, const char* algorithms) {
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  config.algorithms = algorithms;
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config),
            weftSuccess)
      << weftGetLastError(nullptr);
  return comm;
}

RunOptions with_check(const char* mode) {
  RunOptions options;
  options.env = {{"WEFT_CHECK", mode}};
  return options;
}

TEST(CheckOff, MismatchedCallsAreNotCompared) {
  run_ranks(
      kRanks,
      [](const RankContext& context) {
        weftComm_t comm = init_comm(context, kTimeoutMs);
        // Same sizes, other datatype on rank 1: with checks on every rank fails (mismatch_test).
        std::vector<int32_t> data(1000, 1);
        weftDataType_t dtype = context.rank == 1 ? weftInt32 : weftFloat32;
        EXPECT_EQ(
            weftAllReduce(data.data(), data.data(), data.size(), dtype, weftSum, comm, nullptr),
            weftSuccess)
            << weftGetLastError(comm);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      with_check("off"));
}

// A rank that compares nothing while its peers compare would leave their mismatches
// undetected on it: init fails on every rank, naming the same pair.
TEST(CheckMode, DifferentValuesOnTheRanksFailInitOnEveryRank) {
  run_ranks(kRanks, [](const RankContext& context) {
    if (context.rank == 2) setenv("WEFT_CHECK", "off", 1);
    if (context.rank == 1) setenv("WEFT_CHECK", "full", 1);
    weftComm_t comm = nullptr;
    EXPECT_EQ(weftCommInitRank(&comm, context.nranks, context.id, context.rank), weftInvalidUsage);
    const std::string message = weftGetLastError(nullptr);
    EXPECT_NE(message.find("WEFT_CHECK differs between ranks: rank 1 has full while rank 0 has on"),
              std::string::npos)
        << message;
    EXPECT_EQ(comm, nullptr);
  });
}

TEST(CheckMode, BadValueFailsInitNamingTheVariable) {
  run_ranks(
      2,
      [](const RankContext& context) {
        weftComm_t comm = nullptr;
        EXPECT_EQ(weftCommInitRank(&comm, context.nranks, context.id, context.rank),
                  weftInvalidArgument);
        std::string message = weftGetLastError(nullptr);
        EXPECT_NE(message.find("WEFT_CHECK=sometimes is not"), std::string::npos) << message;
        EXPECT_NE(message.find("full"), std::string::npos) << message;
        EXPECT_EQ(comm, nullptr);
      },
      with_check("sometimes"));
}

// WEFT_CHECK=full on calls that agree: exact results (no false alarm from the hashes), on
// the tuner's path and on message schedules, blocking, in a group and on a stream.
class CheckFull : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckFull, ExactResults) {
  const char* algorithms = GetParam();
  run_ranks(
      kRanks,
      [algorithms](const RankContext& context) {
        weftComm_t comm = init_with(context, algorithms);
        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        constexpr size_t kCount = 1500;
        std::vector<float> mine(kCount), summed(kCount), gathered(kRanks * kCount),
            broadcast(kCount), grouped(kCount);
        for (size_t i = 0; i < kCount; ++i)
          mine[i] = static_cast<float>(pattern_value(context.rank, i));
        for (weftStream_t on : {static_cast<weftStream_t>(nullptr), stream}) {
          broadcast = mine;
          ASSERT_EQ(
              weftAllReduce(mine.data(), summed.data(), kCount, weftFloat32, weftSum, comm, on),
              weftSuccess)
              << weftGetLastError(comm);
          ASSERT_EQ(weftAllGather(mine.data(), gathered.data(), kCount, weftFloat32, comm, on),
                    weftSuccess)
              << weftGetLastError(comm);
          ASSERT_EQ(weftBcast(broadcast.data(), kCount, weftFloat32, 2, comm, on), weftSuccess)
              << weftGetLastError(comm);
          ASSERT_EQ(weftGroupStart(), weftSuccess);
          ASSERT_EQ(
              weftAllReduce(mine.data(), grouped.data(), kCount, weftFloat32, weftMax, comm, on),
              weftSuccess);
          ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
          if (on != nullptr) {
            ASSERT_EQ(weftStreamSynchronize(on), weftSuccess) << weftGetLastError(comm);
          }
          for (size_t i = 0; i < kCount; ++i) {
            float sum = 0, largest = 0;
            for (int q = 0; q < kRanks; ++q) {
              float value = static_cast<float>(pattern_value(q, i));
              sum += value;
              largest = std::max(largest, value);
              ASSERT_EQ(gathered[q * kCount + i], value) << "allgather block " << q << " at " << i;
            }
            ASSERT_EQ(summed[i], sum) << i;
            ASSERT_EQ(grouped[i], largest) << i;
            ASSERT_EQ(broadcast[i], static_cast<float>(pattern_value(2, i))) << i;
          }
        }
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      with_check("full"));
}

INSTANTIATE_TEST_SUITE_P(Paths, CheckFull,
                         ::testing::Values(nullptr,
                                           "allreduce:ring,allgather:ring,broadcast:binomial"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param == nullptr ? "tuner" : "messages");
                         });

// WEFT_CHECK=full names the ranks whose input differs from rank 0's (one INFO line from rank
// 0), and says nothing of a call whose inputs agree.
TEST(CheckFullReport, NamesTheRankWhoseInputDiffers) {
  char dir[] = "/tmp/weft-check-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log_file = std::string(dir) + "/%p.log";
  RunOptions options = with_check("full");
  options.env.push_back({"WEFT_DEBUG", "INFO"});
  options.env.push_back({"WEFT_DEBUG_SUBSYS", "COLL"});
  options.env.push_back({"WEFT_DEBUG_FILE", log_file.c_str()});
  const std::string directory = dir;
  run_ranks(
      kRanks,
      [&directory](const RankContext& context) {
        weftComm_t comm = init_comm(context, kTimeoutMs);
        std::vector<float> replicated(256, 1.5f), out(256);
        // Sequence 0: every rank holds the same values; sequence 1: rank 2's differ in one place.
        ASSERT_EQ(
            weftAllReduce(replicated.data(), out.data(), 256, weftFloat32, weftSum, comm, nullptr),
            weftSuccess);
        if (context.rank == 2) replicated[100] = 2.5f;
        ASSERT_EQ(
            weftAllReduce(replicated.data(), out.data(), 256, weftFloat32, weftSum, comm, nullptr),
            weftSuccess)
            << weftGetLastError(comm);
        EXPECT_EQ(out[100], 5.5f);
        if (context.rank == 0) {
          std::ifstream file(directory + "/" + std::to_string(getpid()) + ".log");
          std::stringstream text;
          text << file.rdbuf();
          EXPECT_NE(text.str().find("sequence 1: the inputs of ranks 2 differ from rank 0's"),
                    std::string::npos)
              << text.str();
          EXPECT_EQ(text.str().find("sequence 0:"), std::string::npos) << text.str();
        }
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
  std::filesystem::remove_all(directory);  // the ranks' logs
}

// Every collective kind with a direct algorithm, blocking, as the second call of a group
// and on a stream, in both checking modes: rank 1 calls it with twice the others' count,
// and every rank fails naming the other count. The others' Broadcast and Reduce (400 bytes)
// take the lanes: a rank that reads rank 1's data, or waits for it, fails in that call; one
// that only sends (rank 0, the Broadcast's root or a Reduce's non-root), or reads only a
// root that made its call (the Broadcast's rank 2), may complete it, and fails its next call,
// which waits for rank 1. Blocking or on a stream rank 0 always completes it (it waits for
// nobody); in a group it may fail at once, when a wait for the group's first call compares
// the announcements of the second.
enum class Placement { Blocking, Group, Stream };
struct KindCase {
  std::string name;
  // Calls the collective with `count` elements per block on comm and stream.
  weftResult_t (*call)(size_t count, weftComm_t comm, weftStream_t stream);
  Placement placement;
  const char* check;
  std::vector<int> may_complete = {};  // ranks whose mismatched call may complete
};

void PrintTo(const KindCase& c, std::ostream* out) {
  *out << c.name;
}

std::vector<float> kind_in(kRanks * 200, 1.0f), kind_out(kRanks * 200);
weftResult_t all_reduce(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftAllReduce(kind_in.data(), kind_out.data(), n, weftFloat32, weftSum, comm, stream);
}
weftResult_t reduce_scatter(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftReduceScatter(kind_in.data(), kind_out.data(), n, weftFloat32, weftSum, comm, stream);
}
weftResult_t all_gather(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftAllGather(kind_in.data(), kind_out.data(), n, weftFloat32, comm, stream);
}
weftResult_t broadcast(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftBroadcast(kind_in.data(), kind_out.data(), n, weftFloat32, 0, comm, stream);
}
weftResult_t reduce(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftReduce(kind_in.data(), kind_out.data(), n, weftFloat32, weftSum, 2, comm, stream);
}
weftResult_t all_to_all(size_t n, weftComm_t comm, weftStream_t stream) {
  return weftAllToAll(kind_in.data(), kind_out.data(), n, weftFloat32, comm, stream);
}

class MismatchedKind : public ::testing::TestWithParam<KindCase> {};

TEST_P(MismatchedKind, FailsEveryRankNamingBothCounts) {
  const KindCase& c = GetParam();
  // Rank 1 stays until those ranks made their next call: one that finds it gone names its
  // departure instead.
  int next_calls[2];
  ASSERT_EQ(pipe(next_calls), 0);
  run_ranks(
      kRanks,
      [&c, &next_calls](const RankContext& context) {
        weftComm_t comm = init_comm(context, kTimeoutMs);
        weftStream_t stream = nullptr;
        if (c.placement == Placement::Stream) {
          ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        }
        ASSERT_EQ(c.call(100, comm, nullptr), weftSuccess) << weftGetLastError(comm);  // sequence 0
        const size_t count = context.rank == 1 ? 200 : 100;
        weftResult_t result;
        uint64_t sequence = 1;
        if (c.placement == Placement::Group) {
          weftGroupStart();
          weftResult_t first = all_reduce(16, comm, nullptr);
          weftResult_t second = c.call(count, comm, nullptr);
          weftResult_t end = weftGroupEnd();
          result = first != weftSuccess ? first : second != weftSuccess ? second : end;
          sequence = 2;
        } else {
          result = c.call(count, comm, stream);
          if (result == weftSuccess && stream != nullptr) result = weftStreamSynchronize(stream);
        }
        if (std::count(c.may_complete.begin(), c.may_complete.end(), context.rank) != 0) {
          if (context.rank == 0 && c.placement != Placement::Group) {
            EXPECT_EQ(result, weftSuccess) << c.name << ": " << weftGetLastError(comm);
          }
          if (result == weftSuccess) result = all_reduce(16, comm, nullptr);
          EXPECT_EQ(write(next_calls[1], "x", 1), 1);
        }
        if (context.rank == 1)
          for (size_t i = 0; i < c.may_complete.size(); ++i) {
            char byte;
            EXPECT_EQ(read(next_calls[0], &byte, 1), 1);
          }
        EXPECT_EQ(result, weftInvalidUsage) << c.name << ": " << weftGetLastError(comm);
        const std::string message = weftGetLastError(comm);
        // The odd rank names a usual one's call; the usual ranks name rank 1's.
        const std::string other = context.rank == 1 ? "(count=100" : "rank 1 called ";
        EXPECT_NE(message.find("mismatched collectives: rank "), std::string::npos) << message;
        EXPECT_NE(message.find(other), std::string::npos) << message;
        EXPECT_NE(message.find("(count=200"), std::string::npos) << message;
        EXPECT_NE(message.find("sequence " + std::to_string(sequence)), std::string::npos)
            << message;
        if (stream != nullptr) weftStreamDestroy(stream);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      with_check(c.check));
  close(next_calls[0]);
  close(next_calls[1]);
}

std::vector<KindCase> kind_cases() {
  struct Kind {
    const char* name;
    weftResult_t (*call)(size_t, weftComm_t, weftStream_t);
    std::vector<int> may_complete = {};
  };
  const Kind kinds[] = {{"allreduce", all_reduce}, {"reducescatter", reduce_scatter},
                        {"allgather", all_gather}, {"broadcast", broadcast, {0, 2}},
                        {"reduce", reduce, {0}},   {"alltoall", all_to_all}};
  const std::pair<const char*, Placement> placements[] = {{"blocking", Placement::Blocking},
                                                          {"group", Placement::Group},
                                                          {"stream", Placement::Stream}};
  std::vector<KindCase> cases;
  for (const Kind& kind : kinds)
    for (const auto& [where, placement] : placements)
      cases.push_back(KindCase{std::string(kind.name) + "_" + where, kind.call, placement, "on",
                               kind.may_complete});
  // Full compares what on compares.
  cases.push_back(KindCase{"allreduce_blocking_full", all_reduce, Placement::Blocking, "full"});
  cases.push_back(KindCase{"allgather_stream_full", all_gather, Placement::Stream, "full"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kinds, MismatchedKind, ::testing::ValuesIn(kind_cases()),
                         [](const ::testing::TestParamInfo<KindCase>& info) {
                           return info.param.name;
                         });

// AllToAllv whose count matrix disagrees: rank 1 expects 5 elements from rank 0, which
// sends 3 (or rank 0 sends none of the 3 rank 1 expects). Every rank fails naming both
// ranks and both counts.
struct MatrixCase {
  const char* name;
  const char* algorithms;
  bool on_stream = false;
  bool grouped = false;  // after a matching AllReduce in the same group
  // Without shared segments (as across nodes): the bootstrap root compares the rows.
  bool no_shm = false;
  bool zero_sent = false;  // rank 0 sends 0 elements to rank 1, which expects 3
  // The receiver sees a message of the wrong size first (a schedule of messages, no shared
  // segments): it fails naming both sizes, and the others with its message.
  bool size_error = false;
};

void PrintTo(const MatrixCase& c, std::ostream* out) {
  *out << c.name;
}

class AllToAllvMatrix : public ::testing::TestWithParam<MatrixCase> {};

// Counts from rank `from` to rank `to` in the consistent matrix: uneven, every pair its own.
size_t pair_count(int from, int to) {
  return static_cast<size_t>(1 + from + 2 * to);
}

TEST_P(AllToAllvMatrix, InconsistentCountsFailEveryRankNamingBoth) {
  const MatrixCase& c = GetParam();
  RunOptions options;
  if (c.no_shm) options.env = {{"WEFT_SHM_DISABLE", "1"}};
  run_ranks(
      kRanks,
      [&c](const RankContext& context) {
        weftComm_t comm = init_with(context, c.algorithms);
        weftStream_t stream = nullptr;
        if (c.on_stream) {
          ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        }
        const int me = context.rank;
        std::vector<size_t> send_counts(kRanks), send_displs(kRanks), recv_counts(kRanks),
            recv_displs(kRanks);
        constexpr size_t kBlock = 16;  // room per peer, above every count
        for (int q = 0; q < kRanks; ++q) {
          send_counts[q] = pair_count(me, q);
          recv_counts[q] = pair_count(q, me);
          send_displs[q] = recv_displs[q] = q * kBlock;
        }
        std::vector<int32_t> input(kRanks * kBlock), output(kRanks * kBlock, -1);
        for (int q = 0; q < kRanks; ++q)
          for (size_t i = 0; i < kBlock; ++i)
            input[q * kBlock + i] = me * 1000 + q * 100 + static_cast<int32_t>(i);
        auto alltoallv = [&] {
          return weftAllToAllv(input.data(), send_counts.data(), send_displs.data(), output.data(),
                               recv_counts.data(), recv_displs.data(), weftInt32, comm, stream);
        };
        auto finish = [&](weftResult_t result) {
          return result == weftSuccess && stream != nullptr ? weftStreamSynchronize(stream)
                                                            : result;
        };
        const uint64_t sequence = c.grouped ? 2 : 1;
        const std::string expected =
            c.size_error
                ? std::string("rank 0 sent 12 bytes where rank 1's receive expects 20")
                : std::string("mismatched alltoallv counts: rank 0 sends ") +
                      (c.zero_sent ? "0" : "3") + " elements to rank 1 while rank 1 receives " +
                      (c.zero_sent ? "3" : "5") + " from rank 0, sequence " +
                      std::to_string(sequence);
        // A consistent matrix first: exact, and no false alarm. Peers may already run into the
        // inconsistent call below and fail the communicator everywhere while this rank's part
        // of this one still completes: then it fails with that cause, never with its own.
        if (const weftResult_t first = finish(alltoallv()); first != weftSuccess) {
          const std::string message = weftGetLastError(comm);
          EXPECT_NE(message.find(expected), std::string::npos)
              << "a false alarm on the consistent call: " << message;
          if (stream != nullptr) weftStreamDestroy(stream);
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          return;
        }
        for (int q = 0; q < kRanks; ++q)
          for (size_t i = 0; i < recv_counts[q]; ++i)
            ASSERT_EQ(output[q * kBlock + i], q * 1000 + me * 100 + static_cast<int32_t>(i))
                << "from rank " << q << " at " << i;

        if (c.zero_sent && me == 0) send_counts[1] = 0;   // rank 1 expects pair_count(0, 1) = 3
        if (!c.zero_sent && me == 1) recv_counts[0] = 5;  // rank 0 sends pair_count(0, 1) = 3
        weftResult_t result;
        std::vector<float> data(64, 1.0f);  // lives until the stream is synchronised below
        if (c.grouped) {
          weftGroupStart();
          weftResult_t first = weftAllReduce(data.data(), data.data(), data.size(), weftFloat32,
                                             weftSum, comm, stream);
          weftResult_t second = alltoallv();
          weftResult_t end = weftGroupEnd();
          result = first != weftSuccess ? first : second != weftSuccess ? second : end;
        } else {
          result = alltoallv();
        }
        result = finish(result);
        // Compared by the root, a rank whose part of the call completed fails at its next call.
        if (c.no_shm && result == weftSuccess)
          result = finish(weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum,
                                        comm, stream));
        EXPECT_EQ(result, c.size_error && me != 1 ? weftRemoteError : weftInvalidUsage)
            << c.name << ": " << weftGetLastError(comm);
        std::string message = weftGetLastError(comm);
        EXPECT_NE(message.find(expected), std::string::npos)
            << message << "\nexpected: " << expected;
        // The communicator failed with that cause, not with a transfer's size error.
        EXPECT_NE(weftAllToAllv(input.data(), send_counts.data(), send_displs.data(), output.data(),
                                recv_counts.data(), recv_displs.data(), weftInt32, comm, nullptr),
                  weftSuccess);
        message = weftGetLastError(comm);
        EXPECT_NE(message.find(expected), std::string::npos)
            << message << "\nexpected: " << expected;
        if (stream != nullptr) weftStreamDestroy(stream);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

// Without shared segments (ranks on several nodes; here WEFT_SHM_DISABLE on one) the calls
// are compared by the bootstrap root: a call waiting on a peer's different call reports the
// rank's latest calls, and at the first disagreement every rank fails naming both. The tags
// carry bits of each call's fingerprint, so that different calls of the same size wait
// instead of completing with garbage (the dtype case).
struct RootCase {
  const char* name;
  int odd_rank;  // the rank whose call differs
  // The call; `odd`: the differing one.
  std::function<weftResult_t(weftComm_t, bool odd, std::vector<float>&, weftStream_t)> call;
  const char* odd_call;
  const char* usual_call;
  bool on_stream = false;
};

class RootCompared : public ::testing::TestWithParam<RootCase> {};

TEST_P(RootCompared, EveryRankFailsNamingBothCalls) {
  const RootCase& c = GetParam();
  RunOptions options;
  options.env = {{"WEFT_SHM_DISABLE", "1"}};
  run_ranks(
      kRanks,
      [&c](const RankContext& context) {
        weftComm_t comm = init_comm(context, kTimeoutMs);
        weftStream_t stream = nullptr;
        if (c.on_stream) {
          ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        }
        auto finish = [&](weftResult_t result) {
          return result == weftSuccess && stream != nullptr ? weftStreamSynchronize(stream)
                                                            : result;
        };
        std::vector<float> data(3 * 2000, 1.0f);
        // The same call first: exact, and no false alarm.
        ASSERT_EQ(finish(c.call(comm, false, data, stream)), weftSuccess) << weftGetLastError(comm);
        const auto start = std::chrono::steady_clock::now();
        weftResult_t result = finish(c.call(comm, context.rank == c.odd_rank, data, stream));
        // A rank whose different call only sent completes it; its next call fails.
        if (result == weftSuccess)
          result = finish(
              weftAllReduce(data.data(), data.data(), 10, weftFloat32, weftSum, comm, stream));
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_EQ(result, weftInvalidUsage) << c.name << ": " << weftGetLastError(comm);
        // Both ranks and both calls; the other rank is the lowest whose report the root had
        // (rank 0 but under load), and it may be the one named first.
        const std::string message = weftGetLastError(comm);
        const std::string odd = "rank " + std::to_string(c.odd_rank) + " called " + c.odd_call;
        for (const std::string& part :
             {std::string("mismatched collectives: "), odd, " called " + std::string(c.usual_call),
              std::string(", sequence 1")})
          EXPECT_NE(message.find(part), std::string::npos) << message << "\nwithout: " << part;
        EXPECT_LT(seconds, kTimeoutMs / 1000.0 / 4) << "found by the timeout, not compared";
        if (stream != nullptr) weftStreamDestroy(stream);
        weftCommDestroy(comm);
      },
      options);
}

weftResult_t all_reduce_counts(weftComm_t comm, bool odd, std::vector<float>& data,
                               weftStream_t stream) {
  return weftAllReduce(data.data(), data.data(), odd ? 2000 : 1000, weftFloat32, weftSum, comm,
                       stream);
}

INSTANTIATE_TEST_SUITE_P(
    Calls, RootCompared,
    ::testing::Values(
        RootCase{"count", 1, all_reduce_counts, "allreduce(count=2000, float, sum)",
                 "allreduce(count=1000, float, sum)"},
        RootCase{"count_stream", 1, all_reduce_counts, "allreduce(count=2000, float, sum)",
                 "allreduce(count=1000, float, sum)", true},
        RootCase{"kind", 2,
                 [](weftComm_t comm, bool odd, std::vector<float>& data, weftStream_t stream) {
                   return odd ? weftAllGather(data.data(), data.data() + 1000, 1000, weftFloat32,
                                              comm, stream)
                              : weftAllReduce(data.data(), data.data(), 1000, weftFloat32, weftSum,
                                              comm, stream);
                 },
                 "allgather(count=1000, float)", "allreduce(count=1000, float, sum)"},
        RootCase{"dtype_same_bytes", 1,
                 [](weftComm_t comm, bool odd, std::vector<float>& data, weftStream_t stream) {
                   return weftAllReduce(data.data(), data.data(), 1000,
                                        odd ? weftInt32 : weftFloat32, weftSum, comm, stream);
                 },
                 "allreduce(count=1000, int32, sum)", "allreduce(count=1000, float, sum)"},
        RootCase{"root", 2,
                 [](weftComm_t comm, bool odd, std::vector<float>& data, weftStream_t stream) {
                   return weftBroadcast(data.data(), data.data(), 1000, weftFloat32, odd ? 1 : 0,
                                        comm, stream);
                 },
                 "broadcast(count=1000, float, root 1)", "broadcast(count=1000, float, root 0)"}),
    [](const ::testing::TestParamInfo<RootCase>& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(
    Paths, AllToAllvMatrix,
    ::testing::Values(
        MatrixCase{"direct", "alltoallv:oneshot"}, MatrixCase{"messages", "alltoallv:pairwise"},
        MatrixCase{"direct_stream", "alltoallv:oneshot", true},
        MatrixCase{"messages_group", "alltoallv:pairwise", false, true},
        MatrixCase{"direct_group_stream", "alltoallv:oneshot", true, true},
        MatrixCase{"no_shm", "", false, false, true},
        MatrixCase{"no_shm_stream", "", true, false, true},
        MatrixCase{"no_shm_group", "", false, true, true},
        MatrixCase{"no_shm_zero_sent", "", false, false, true, true},
        MatrixCase{"no_shm_pairwise", "alltoallv:pairwise", false, false, true, false, true},
        MatrixCase{"no_shm_pairwise_zero_sent", "alltoallv:pairwise", false, false, true, true},
        MatrixCase{"direct_zero_sent", "alltoallv:oneshot", false, false, false, true}),
    [](const ::testing::TestParamInfo<MatrixCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace weft::testing
