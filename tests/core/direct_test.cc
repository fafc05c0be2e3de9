// The direct (shared-memory) algorithms: every collective they implement at
// several rank counts, with staging small enough that larger messages take
// many rounds, in and out of place, checked exactly; bit-identical float
// results; groups and streams; a killed peer; /dev/shm errors; and no
// segment left in /dev/shm, whatever happened.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "support/multirank.h"
#include "support/typed_values.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using algo::Collective;
using Clock = std::chrono::steady_clock;

constexpr int kPreMulSum = weftNumOps;  // marks the custom op
constexpr const char* kSmallStaging = "4096";
constexpr size_t kStagingBytes = 4096;

// Segments Weft left in /dev/shm: "weft-<pid>-..." whose pid is `pid` (0: any
// pid no longer alive, i.e. leaked by a process that is gone).
std::vector<std::string> weft_segments(pid_t pid) {
  std::vector<std::string> found;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  while (dirent* entry = readdir(dir)) {
    int owner = 0;
    if (sscanf(entry->d_name, "weft-%d-", &owner) != 1) continue;
    bool match = pid != 0 ? owner == pid : kill(owner, 0) != 0 && errno == ESRCH;
    if (match) found.push_back(entry->d_name);
  }
  closedir(dir);
  return found;
}

// Checks, around a multi-rank test, that no segment outlives its processes.
class NoLeftovers : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(weft_segments(0), std::vector<std::string>()) << "segments left in /dev/shm";
  }
};

// A communicator (split from `parent`) forcing `algorithm` for every collective it implements.
weftComm_t direct_comm(weftComm_t parent, int rank, algo::Algorithm algorithm, int timeout_ms = 0) {
  std::string spec;
  for (int c = 0; c < algo::kNumCollectives; ++c)
    if (algo::supports(algorithm, static_cast<Collective>(c)))
      spec += (spec.empty() ? "" : ",") +
              std::string(algo::collective_name(static_cast<Collective>(c))) + ":" +
              algo::algorithm_name(algorithm);
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.algorithms = spec.c_str();
  if (timeout_ms > 0) config.timeoutMs = timeout_ms;
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommSplit(parent, 0, rank, &comm, &config), weftSuccess)
      << weftGetLastError(parent);
  // Attached everywhere: the names are gone already.
  EXPECT_EQ(weft_segments(getpid()), std::vector<std::string>());
  return comm;
}

bool is_reduction(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}

struct Case {
  Collective collective;
  weftDataType_t dtype;
  int op;
  size_t count;
  bool in_place;
  int root;
};

// Small integers: every reduction of them is exact in every dtype used here.
double input_value(const Case& c, int q, size_t i) {
  if (!is_reduction(c.collective)) return static_cast<double>((q * 5 + i) % 11);
  if (c.op == weftProd) return static_cast<double>((q + i) % 2 + 1);
  return static_cast<double>((q + 2 * i) % 3);
}

// The expected reduction of element i, as an element of c.dtype.
std::vector<uint8_t> reduced(const Case& c, int nranks, size_t i) {
  double value = c.op == weftProd ? 1 : c.op == weftMax ? -1e300 : c.op == weftMin ? 1e300 : 0;
  for (int q = 0; q < nranks; ++q) {
    double v = input_value(c, q, i) * (c.op == kPreMulSum ? 2 : 1);
    value = c.op == weftProd  ? value * v
            : c.op == weftMax ? std::max(value, v)
            : c.op == weftMin ? std::min(value, v)
                              : value + v;
  }
  // Avg: integers truncate, fp64 divides in fp64, other floats in fp32 (as Weft does).
  if (c.op == weftAvg)
    value = c.dtype == weftFloat64   ? value / nranks
            : is_float_type(c.dtype) ? static_cast<float>(value) / static_cast<float>(nranks)
                                     : std::floor(value / nranks);
  std::vector<uint8_t> bytes(dtype_size(c.dtype));
  store_value(c.dtype, bytes.data(), 0, value);
  return bytes;
}

std::vector<uint8_t> moved(const Case& c, int q, size_t i) {
  std::vector<uint8_t> bytes(dtype_size(c.dtype));
  store_value(c.dtype, bytes.data(), 0, input_value(c, q, i));
  return bytes;
}

// AllToAllv: counts from q to p, some zero, some above the staging.
size_t v_count(size_t base, int q, int p) {
  return (q + p) % 3 == 0 ? 0 : base * static_cast<size_t>(1 + (q * 3 + p) % 4);
}

// Runs one case on `comm`; returns "" or what went wrong.
std::string run_case(weftComm_t comm, const Case& c, int rank, int n) {
  const size_t e = dtype_size(c.dtype), count = c.count;
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t in_count = count, out_count = count;
  if (c.collective == Collective::ReduceScatter || c.collective == Collective::AllToAll)
    in_count = n * count;
  if (c.collective == Collective::AllGather || c.collective == Collective::AllToAll)
    out_count = n * count;
  if (c.collective == Collective::AllToAllv) {
    in_count = out_count = 0;
    for (int p = 0; p < n; ++p) {
      sc[p] = v_count(count, rank, p), sd[p] = in_count, in_count += sc[p] + 1;
      rc[p] = v_count(count, p, rank), rd[p] = out_count, out_count += rc[p] + 1;
    }
  }
  size_t total = c.in_place ? std::max(in_count, out_count) : out_count;
  std::vector<uint8_t> out(total * e + 1, 0xA5), separate(in_count * e + 1);
  uint8_t* recv = out.data();
  uint8_t* send = c.in_place ? out.data() : separate.data();
  if (c.in_place && c.collective == Collective::AllGather) send = out.data() + rank * count * e;
  if (c.in_place && c.collective == Collective::ReduceScatter) recv = out.data() + rank * count * e;
  for (size_t i = 0; i < in_count; ++i) store_value(c.dtype, send, i, input_value(c, rank, i));

  weftRedOp_t op = static_cast<weftRedOp_t>(c.op);
  if (c.op == kPreMulSum) {
    std::vector<uint8_t> two(e);
    store_value(c.dtype, two.data(), 0, 2.0);
    if (weftRedOpCreatePreMulSum(&op, two.data(), c.dtype, weftScalarHostImmediate, comm) !=
        weftSuccess)
      return weftGetLastError(comm);
  }
  weftResult_t result = weftInternalError;
  switch (c.collective) {
    case Collective::AllReduce:
      result = weftAllReduce(send, recv, count, c.dtype, op, comm, nullptr);
      break;
    case Collective::ReduceScatter:
      result = weftReduceScatter(send, recv, count, c.dtype, op, comm, nullptr);
      break;
    case Collective::Reduce:
      result = weftReduce(send, recv, count, c.dtype, op, c.root, comm, nullptr);
      break;
    case Collective::AllGather:
      result = weftAllGather(send, recv, count, c.dtype, comm, nullptr);
      break;
    case Collective::Broadcast:
      result = weftBroadcast(send, recv, count, c.dtype, c.root, comm, nullptr);
      break;
    case Collective::AllToAll:
      result = weftAllToAll(send, recv, count, c.dtype, comm, nullptr);
      break;
    case Collective::AllToAllv:
      result = weftAllToAllv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), c.dtype, comm,
                             nullptr);
      break;
    default:
      break;
  }
  if (c.op == kPreMulSum) weftRedOpDestroy(op, comm);
  if (result != weftSuccess) return std::string("call failed: ") + weftGetLastError(comm);
  if (out.back() != 0xA5) return "wrote past the end of the output";

  auto check = [&](size_t index, const std::vector<uint8_t>& want) -> std::string {
    if (memcmp(recv + index * e, want.data(), e) == 0) return "";
    return "element " + std::to_string(index) + ": got " +
           std::to_string(load_value(c.dtype, recv, index)) + ", want " +
           std::to_string(load_value(c.dtype, want.data(), 0));
  };
  std::string error;
  for (size_t i = 0; i < count && error.empty(); ++i) {
    switch (c.collective) {
      case Collective::AllReduce:
        error = check(i, reduced(c, n, i));
        break;
      case Collective::ReduceScatter:
        error = check(i, reduced(c, n, rank * count + i));
        break;
      case Collective::Reduce:
        if (rank == c.root) error = check(i, reduced(c, n, i));
        break;
      case Collective::Broadcast:
        error = check(i, moved(c, c.root, i));
        break;
      case Collective::AllGather:
      case Collective::AllToAll:
        for (int q = 0; q < n && error.empty(); ++q)
          error = check(q * count + i,
                        moved(c, q, c.collective == Collective::AllGather ? i : rank * count + i));
        break;
      default:
        break;
    }
  }
  if (c.collective == Collective::AllToAllv)
    for (int q = 0; q < n && error.empty(); ++q) {
      size_t displ = 0;  // where q's piece for this rank starts in q's input
      for (int p = 0; p < rank; ++p) displ += v_count(count, q, p) + 1;
      for (size_t i = 0; i < rc[q] && error.empty(); ++i)
        error = check(rd[q] + i, moved(c, q, displ + i));
    }
  return error;
}

struct Combo {
  algo::Algorithm algorithm;
  Collective collective;
};
const Combo kCombos[] = {
    {algo::Algorithm::OneShot, Collective::AllReduce},
    {algo::Algorithm::TwoShot, Collective::AllReduce},
    {algo::Algorithm::OneShot, Collective::ReduceScatter},
    {algo::Algorithm::OneShot, Collective::Reduce},
    {algo::Algorithm::OneShot, Collective::AllGather},
    {algo::Algorithm::OneShot, Collective::Broadcast},
    {algo::Algorithm::OneShot, Collective::AllToAll},
    {algo::Algorithm::OneShot, Collective::AllToAllv},
};

class DirectMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

// Counts 0, 1, 7, 1000 and one past the (4 KiB) staging of every dtype.
TEST_P(DirectMatrix, EveryCollectiveCountDtypeOpInAndOutOfPlace) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      GetParam(),
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t one_shot = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        weftComm_t two_shot = direct_comm(world, context.rank, algo::Algorithm::TwoShot);
        int failures = 0;
        for (const Combo& combo : kCombos) {
          weftComm_t comm = combo.algorithm == algo::Algorithm::OneShot ? one_shot : two_shot;
          for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, kStagingBytes + 5}) {
            for (bool in_place : {false, true}) {
              if (in_place && combo.collective == Collective::AllToAllv) continue;
              std::vector<std::pair<weftDataType_t, int>> combos;
              if (is_reduction(combo.collective)) {
                for (weftDataType_t t : {weftFloat32, weftInt32, weftBfloat16, weftFloat64})
                  for (int op = 0; op <= kPreMulSum; ++op) combos.push_back({t, op});
              } else {
                for (weftDataType_t t : {weftInt8, weftFloat64, weftFloat16})
                  combos.push_back({t, weftSum});
              }
              for (const auto& [dtype, op] : combos) {
                Case c{combo.collective,
                       dtype,
                       op,
                       count,
                       in_place,
                       static_cast<int>(count % context.nranks)};
                std::string error = run_case(comm, c, context.rank, context.nranks);
                if (!error.empty() && ++failures <= 5)
                  ADD_FAILURE() << "rank " << context.rank << " "
                                << algo::algorithm_name(combo.algorithm) << " "
                                << algo::collective_name(c.collective) << " count " << count << " "
                                << dtype_name(dtype) << " op " << op
                                << (in_place ? " in-place: " : ": ") << error;
                if (error.rfind("call failed", 0) == 0) return;
              }
            }
          }
        }
        EXPECT_EQ(weftCommDestroy(two_shot), weftSuccess);
        EXPECT_EQ(weftCommDestroy(one_shot), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}
INSTANTIATE_TEST_SUITE_P(Ranks, DirectMatrix, ::testing::Values(1, 2, 3, 4, 5, 8));

// Random floats (where the reduction order changes the bits): every rank of
// one-shot and two-shot holds the same bits, and both equal a reduction in
// rank order computed here.
TEST_F(NoLeftovers, FloatResultsAreBitIdenticalInRankOrder) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      3,
      [](const RankContext& context) {
        const size_t count = 3001;
        auto value = [](int q, size_t i) {
          std::mt19937 random(static_cast<unsigned>(q * 100003 + i));
          return std::uniform_real_distribution<float>(-1, 1)(random);
        };
        std::vector<float> input(count), want(count);
        for (size_t i = 0; i < count; ++i) {
          input[i] = value(context.rank, i);
          float sum = value(0, i);
          for (int q = 1; q < context.nranks; ++q) sum += value(q, i);
          want[i] = sum;
        }
        weftComm_t world = init_comm(context);
        for (algo::Algorithm algorithm : {algo::Algorithm::OneShot, algo::Algorithm::TwoShot}) {
          weftComm_t comm = direct_comm(world, context.rank, algorithm);
          std::vector<float> got(count);
          ASSERT_EQ(
              weftAllReduce(input.data(), got.data(), count, weftFloat32, weftSum, comm, nullptr),
              weftSuccess);
          EXPECT_EQ(memcmp(got.data(), want.data(), count * sizeof(float)), 0)
              << algo::algorithm_name(algorithm);
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        }
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Direct ops mixed with message-based ones in a group, and queued on a
// stream, complete in launch order.
TEST_F(NoLeftovers, GroupsAndStreams) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      4,
      [](const RankContext& context) {
        weftComm_t plain = init_comm(context);
        weftComm_t direct = direct_comm(plain, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks;
        const size_t count = 3000;
        std::vector<int32_t> a(count, context.rank + 1), b(count, 2 * context.rank), sum_a(count),
            sum_b(count), gathered(n * count);
        int32_t token = context.rank, incoming = -1;
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        ASSERT_EQ(weftAllReduce(a.data(), sum_a.data(), count, weftInt32, weftSum, direct, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftSend(&token, 1, weftInt32, (context.rank + 1) % n, plain, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftRecv(&incoming, 1, weftInt32, (context.rank + n - 1) % n, plain, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftAllReduce(b.data(), sum_b.data(), count, weftInt32, weftSum, direct, nullptr),
                  weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(direct);
        EXPECT_EQ(sum_a, std::vector<int32_t>(count, n * (n + 1) / 2));
        EXPECT_EQ(sum_b, std::vector<int32_t>(count, n * (n - 1)));
        EXPECT_EQ(incoming, (context.rank + n - 1) % n);

        weftStream_t stream = nullptr;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        for (int round = 0; round < 20; ++round) {
          std::fill(a.begin(), a.end(), context.rank + round);
          ASSERT_EQ(weftAllReduce(a.data(), a.data(), count, weftInt32, weftMax, direct, stream),
                    weftSuccess);
          ASSERT_EQ(weftAllGather(a.data(), gathered.data(), count, weftInt32, direct, stream),
                    weftSuccess);
          ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(direct);
          EXPECT_EQ(gathered, std::vector<int32_t>(n * count, n - 1 + round));
        }
        // A blocking call behind a queued one on the same communicator runs
        // after it on every rank, whichever thread gets there first.
        std::vector<int32_t> queued(count, 1), blocking(count, context.rank);
        ASSERT_EQ(
            weftAllReduce(queued.data(), queued.data(), count, weftInt32, weftSum, direct, stream),
            weftSuccess);
        ASSERT_EQ(weftAllReduce(blocking.data(), blocking.data(), count, weftInt32, weftMax, direct,
                                nullptr),
                  weftSuccess)
            << weftGetLastError(direct);
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(direct);
        EXPECT_EQ(queued, std::vector<int32_t>(count, n));
        EXPECT_EQ(blocking, std::vector<int32_t>(count, n - 1));
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(direct), weftSuccess);
        EXPECT_EQ(weftCommDestroy(plain), weftSuccess);
      },
      options);
}

// A rank killed while its peers run direct collectives: every survivor
// returns an error well within the timeout, and nothing stays in /dev/shm.
TEST_F(NoLeftovers, KilledPeerIsAnErrorOnEverySurvivor) {
  constexpr int kTimeoutMs = 20000;
  RunOptions options;
  options.expected.assign(3, ExpectedEnd{});
  options.expected[2].signal = SIGKILL;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context, kTimeoutMs);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::TwoShot, kTimeoutMs);
        std::vector<float> data(5000, 1.0f);
        // Rounds in lockstep: the victim dies in the middle of the 50th op.
        for (int op = 0; op < 50; ++op)
          ASSERT_EQ(weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftMin, comm,
                                  nullptr),
                    weftSuccess);
        if (context.rank == 2) raise(SIGKILL);
        auto start = Clock::now();
        weftResult_t result = weftSuccess;
        for (int op = 0; op < 1000 && result == weftSuccess; ++op)
          result = weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftMin, comm,
                                 nullptr);
        EXPECT_NE(result, weftSuccess);
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(),
                  kTimeoutMs / 1000.0 / 2)
            << "took too long to notice: " << weftGetLastError(comm);
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      options);
}

// Staging that cannot exist is a clear error at init on every rank.
TEST_F(NoLeftovers, ImpossibleStagingFailsInitClearly) {
  struct Want {
    const char* bytes;
    const char* message;
  };
  for (Want want : {Want{"100", "WEFT_SHM_BYTES"}, Want{"1125899906842624", "/dev/shm"}}) {
    RunOptions options;
    options.env = {{"WEFT_SHM_BYTES", want.bytes}};
    run_ranks(
        2,
        [&want](const RankContext& context) {
          weftComm_t comm = nullptr;
          EXPECT_NE(weftCommInitRank(&comm, context.nranks, context.id, context.rank), weftSuccess);
          std::string error = weftGetLastError(nullptr);
          EXPECT_NE(error.find(want.message), std::string::npos) << error;
        },
        options);
  }
}

// Without shared memory, forcing a direct algorithm is a usage error naming it.
TEST_F(NoLeftovers, DisabledSharedMemoryRefusesDirectAlgorithms) {
  RunOptions options;
  options.env = {{"WEFT_SHM_DISABLE", "1"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        weftConfig_t config = WEFT_CONFIG_INITIALIZER;
        config.algorithms = "allreduce:twoshot";
        weftComm_t comm = nullptr;
        ASSERT_EQ(weftCommInitRankConfig(&comm, context.nranks, context.id, context.rank, &config),
                  weftSuccess);
        float x = 1;
        EXPECT_EQ(weftAllReduce(&x, &x, 1, weftFloat32, weftSum, comm, nullptr), weftInvalidUsage);
        EXPECT_NE(std::string(weftGetLastError(comm)).find("twoshot"), std::string::npos)
            << weftGetLastError(comm);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

}  // namespace
}  // namespace weft::testing
