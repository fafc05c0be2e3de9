// Every collective x every algorithm x rank counts x counts x in/out-of-place
// x dtype x op, checked exactly: inputs are small integers whose results are
// exact in every dtype whatever the reduction order. Plus random floats
// against an fp64 reference, AllToAllv with uneven/zero/skewed counts, and
// mixed sequences on two communicators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "support/multirank.h"
#include "support/typed_values.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using algo::Collective;

constexpr int kPreMulSum = weftNumOps;  // marks the custom op in a Case
constexpr uint8_t kGuard = 0xA5;        // sentinel after every buffer
constexpr size_t kGuardBytes = 64;

struct Case {
  Collective collective;
  weftDataType_t dtype;
  int op;  // weftRedOp_t, or kPreMulSum
  size_t count;
  bool in_place;
  int root;
};

std::string describe(const Case& c, int nranks) {
  std::ostringstream out;
  out << algo::collective_name(c.collective) << " n=" << nranks << " count=" << c.count << " "
      << dtype_name(c.dtype) << " op=" << c.op << (c.in_place ? " in-place" : " out-of-place")
      << " root=" << c.root;
  return out.str();
}

bool is_reduction(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}

// Rank q's input element i.
double input_value(const Case& c, int q, size_t i) {
  if (!is_reduction(c.collective)) return static_cast<double>((q * 7 + i) % 13);
  if (c.op == weftProd) return static_cast<double>((q + i) % 2 + 1);
  return static_cast<double>((q + i) % 3);
}

// AllToAllv: uneven, zero and skewed counts from q to p, from the case's count.
size_t v_count(size_t base, int q, int p) {
  if ((q + 2 * p) % 3 == 0) return 0;
  return base + static_cast<size_t>((q * 5 + p * 3) % 7) * (base / 2 + 1);
}

struct VLayout {
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
  size_t send_total = 0, recv_total = 0;
};

// Packed blocks with a one-element gap between them, so displacements matter.
VLayout v_layout(size_t base, int rank, int nranks) {
  VLayout layout;
  for (int p = 0; p < nranks; ++p) {
    layout.send_counts.push_back(v_count(base, rank, p));
    layout.send_displs.push_back(layout.send_total);
    layout.send_total += layout.send_counts.back() + 1;
    layout.recv_counts.push_back(v_count(base, p, rank));
    layout.recv_displs.push_back(layout.recv_total);
    layout.recv_total += layout.recv_counts.back() + 1;
  }
  return layout;
}

// The exact result of reducing element i over all ranks, as the bytes of one element.
std::vector<uint8_t> expected_reduction(const Case& c, int nranks, size_t i) {
  size_t size = dtype_size(c.dtype);
  std::vector<uint8_t> bytes(size);
  double value = c.op == weftProd ? 1 : c.op == weftMax ? -1e300 : c.op == weftMin ? 1e300 : 0;
  uint64_t wrapped = c.op == weftProd ? 1 : 0;  // integer arithmetic wraps modulo 2^bits
  for (int q = 0; q < nranks; ++q) {
    double v = input_value(c, q, i);
    if (c.op == kPreMulSum) v *= 2;
    switch (c.op) {
      case weftProd:
        value *= v;
        wrapped *= static_cast<uint64_t>(v);
        break;
      case weftMax:
        value = std::max(value, v);
        break;
      case weftMin:
        value = std::min(value, v);
        break;
      default:
        value += v;
        wrapped += static_cast<uint64_t>(v);
        break;
    }
  }
  if (c.op == weftMax || c.op == weftMin) wrapped = static_cast<uint64_t>(value);
  if (c.op == weftAvg) {
    if (!is_float_type(c.dtype)) {
      wrapped /= static_cast<uint64_t>(nranks);
    } else if (c.dtype == weftFloat64) {
      value /= nranks;
    } else {
      value = static_cast<float>(value) / static_cast<float>(nranks);  // in fp32, as Weft does
    }
  }
  if (is_float_type(c.dtype))
    store_value(c.dtype, bytes.data(), 0, value);
  else
    memcpy(bytes.data(), &wrapped, size);  // little-endian: the low bytes
  return bytes;
}

class Runner {
 public:
  Runner(weftComm_t comm, int rank, int nranks) : comm_(comm), rank_(rank), n_(nranks) {}

  // Runs one case; returns "" or what went wrong.
  std::string run(const Case& c) {
    const size_t esize = dtype_size(c.dtype);
    const size_t n = static_cast<size_t>(n_);
    size_t in_count = c.count, out_count = c.count;
    VLayout v;
    switch (c.collective) {
      case Collective::ReduceScatter:
        in_count = n * c.count;
        break;
      case Collective::AllGather:
      case Collective::Gather:
        out_count = n * c.count;
        break;
      case Collective::Scatter:
        in_count = n * c.count;
        break;
      case Collective::AllToAll:
        in_count = out_count = n * c.count;
        break;
      case Collective::AllToAllv:
        v = v_layout(c.count, rank_, n_);
        in_count = v.send_total;
        out_count = v.recv_total;
        break;
      default:
        break;
    }
    bool in_place = c.in_place &&
                    ((c.collective != Collective::Gather && c.collective != Collective::Scatter) ||
                     rank_ == c.root);
    size_t buffer_count = in_place ? std::max(in_count, out_count) : out_count;
    std::vector<uint8_t> output(buffer_count * esize + kGuardBytes, kGuard);
    std::vector<uint8_t> separate_input(in_place ? 0 : in_count * esize + kGuardBytes, kGuard);
    uint8_t* recv = output.data();
    uint8_t* send = in_place ? output.data() : separate_input.data();
    if (in_place) {
      if (c.collective == Collective::AllGather || c.collective == Collective::Gather)
        send = output.data() +
               (c.collective == Collective::AllGather ? rank_ : c.root) * c.count * esize;
      if (c.collective == Collective::ReduceScatter || c.collective == Collective::Scatter)
        recv = output.data() +
               (c.collective == Collective::ReduceScatter ? rank_ : c.root) * c.count * esize;
    }
    bool has_input = !(c.collective == Collective::Scatter && rank_ != c.root) &&
                     !(c.collective == Collective::Broadcast && rank_ != c.root);
    if (has_input)
      for (size_t i = 0; i < in_count; ++i) store_value(c.dtype, send, i, input_value(c, rank_, i));

    weftRedOp_t op = static_cast<weftRedOp_t>(c.op);
    if (c.op == kPreMulSum) {
      std::vector<uint8_t> two(esize);
      store_value(c.dtype, two.data(), 0, 2.0);
      if (weftRedOpCreatePreMulSum(&op, two.data(), c.dtype, weftScalarHostImmediate, comm_) !=
          weftSuccess)
        return std::string("weftRedOpCreatePreMulSum: ") + weftGetLastError(comm_);
    }
    weftResult_t result = weftInternalError;
    switch (c.collective) {
      case Collective::AllReduce:
        result = weftAllReduce(send, recv, c.count, c.dtype, op, comm_, nullptr);
        break;
      case Collective::ReduceScatter:
        result = weftReduceScatter(send, recv, c.count, c.dtype, op, comm_, nullptr);
        break;
      case Collective::AllGather:
        result = weftAllGather(send, recv, c.count, c.dtype, comm_, nullptr);
        break;
      case Collective::Broadcast:
        result = weftBroadcast(send, recv, c.count, c.dtype, c.root, comm_, nullptr);
        break;
      case Collective::Reduce:
        result = weftReduce(send, recv, c.count, c.dtype, op, c.root, comm_, nullptr);
        break;
      case Collective::AllToAll:
        result = weftAllToAll(send, recv, c.count, c.dtype, comm_, nullptr);
        break;
      case Collective::AllToAllv:
        result = weftAllToAllv(send, v.send_counts.data(), v.send_displs.data(), recv,
                               v.recv_counts.data(), v.recv_displs.data(), c.dtype, comm_, nullptr);
        break;
      case Collective::Gather:
        result = weftGather(send, recv, c.count, c.dtype, c.root, comm_, nullptr);
        break;
      case Collective::Scatter:
        result = weftScatter(send, recv, c.count, c.dtype, c.root, comm_, nullptr);
        break;
      case Collective::Barrier:
        result = weftBarrier(comm_, nullptr);
        break;
    }
    if (c.op == kPreMulSum) weftRedOpDestroy(op, comm_);
    if (c.collective == Collective::AllToAllv && in_place) {
      // Like MPI's, Weft's AllToAllv takes distinct buffers: a clear refusal is right.
      if (result != weftInvalidArgument) return "in-place alltoallv was not refused";
      return "";
    }
    if (result != weftSuccess) return std::string("call failed: ") + weftGetLastError(comm_);
    for (size_t b = buffer_count * esize; b < output.size(); ++b)
      if (output[b] != kGuard) return "wrote past the end of the output buffer";
    return check_output(c, recv, v);
  }

 private:
  std::string check_output(const Case& c, const uint8_t* recv, const VLayout& v) {
    const size_t esize = dtype_size(c.dtype);
    auto mismatch = [&](size_t index, const std::vector<uint8_t>& want) -> std::string {
      if (memcmp(recv + index * esize, want.data(), esize) == 0) return "";
      std::ostringstream out;
      out << "element " << index << ": got " << load_value(c.dtype, recv, index) << ", want "
          << load_value(c.dtype, want.data(), 0);
      return out.str();
    };
    auto moved = [&](int q, size_t i) {
      std::vector<uint8_t> bytes(esize);
      store_value(c.dtype, bytes.data(), 0, input_value(c, q, i));
      return bytes;
    };
    const size_t count = c.count;
    std::string error;
    switch (c.collective) {
      case Collective::AllReduce:
        for (size_t i = 0; i < count && error.empty(); ++i)
          error = mismatch(i, expected_reduction(c, n_, i));
        break;
      case Collective::ReduceScatter:
        for (size_t i = 0; i < count && error.empty(); ++i)
          error = mismatch(i, expected_reduction(c, n_, rank_ * count + i));
        break;
      case Collective::Reduce:
        if (rank_ == c.root)
          for (size_t i = 0; i < count && error.empty(); ++i)
            error = mismatch(i, expected_reduction(c, n_, i));
        break;
      case Collective::AllGather:
      case Collective::Gather:
        if (c.collective == Collective::AllGather || rank_ == c.root)
          for (int q = 0; q < n_ && error.empty(); ++q)
            for (size_t i = 0; i < count && error.empty(); ++i)
              error = mismatch(q * count + i, moved(q, i));
        break;
      case Collective::Broadcast:
        for (size_t i = 0; i < count && error.empty(); ++i) error = mismatch(i, moved(c.root, i));
        break;
      case Collective::Scatter:
        for (size_t i = 0; i < count && error.empty(); ++i)
          error = mismatch(i, moved(c.root, rank_ * count + i));
        break;
      case Collective::AllToAll:
        for (int q = 0; q < n_ && error.empty(); ++q)
          for (size_t i = 0; i < count && error.empty(); ++i)
            error = mismatch(q * count + i, moved(q, rank_ * count + i));
        break;
      case Collective::AllToAllv:
        for (int q = 0; q < n_ && error.empty(); ++q) {
          VLayout sender = v_layout(count, q, n_);
          for (size_t i = 0; i < v.recv_counts[q] && error.empty(); ++i)
            error = mismatch(v.recv_displs[q] + i, moved(q, sender.send_displs[rank_] + i));
        }
        break;
      case Collective::Barrier:
        break;
    }
    return error;
  }

  weftComm_t comm_;
  int rank_, n_;
};

// Communicators forcing, per collective, the variant-th algorithm that
// implements it; (*algorithms)[c] is how many implement collective c (later
// variants repeat its first ones).
std::vector<weftComm_t> algorithm_variants(weftComm_t comm, int rank,
                                           std::vector<size_t>* algorithms) {
  size_t variants = 0;
  std::vector<std::vector<algo::Algorithm>> per_collective(algo::kNumCollectives);
  algorithms->assign(algo::kNumCollectives, 0);
  for (int c = 0; c < algo::kNumCollectives; ++c) {
    for (int a = 0; a < algo::kNumAlgorithms; ++a)
      if (algo::supports(static_cast<algo::Algorithm>(a), static_cast<Collective>(c)))
        per_collective[c].push_back(static_cast<algo::Algorithm>(a));
    (*algorithms)[c] = per_collective[c].size();
    variants = std::max(variants, per_collective[c].size());
  }
  std::vector<weftComm_t> comms;
  for (size_t variant = 0; variant < variants; ++variant) {
    std::string spec;
    for (int c = 0; c < algo::kNumCollectives; ++c) {
      const auto& list = per_collective[c];
      if (list.empty()) continue;
      spec += (spec.empty() ? "" : ",") +
              std::string(algo::collective_name(static_cast<Collective>(c))) + ":" +
              algo::algorithm_name(list[variant % list.size()]);
    }
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.algorithms = spec.c_str();
    weftComm_t child = nullptr;
    EXPECT_EQ(weftCommSplit(comm, 0, rank, &child, &config), weftSuccess) << weftGetLastError(comm);
    comms.push_back(child);
  }
  return comms;
}

const Collective kAll[] = {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                           Collective::Broadcast, Collective::Reduce,        Collective::AllToAll,
                           Collective::AllToAllv, Collective::Gather,        Collective::Scatter,
                           Collective::Barrier};
const weftDataType_t kMovementTypes[] = {weftInt8, weftFloat16, weftInt32, weftFloat64};

// Runs every case on every algorithm variant; counts up to `max_cases_per_variant` per variant.
void sweep(const RankContext& context, const std::vector<size_t>& counts, bool all_types) {
  weftComm_t comm = init_comm(context, 60000);  // a failure ends the sweep on every rank
  std::vector<size_t> algorithms;
  std::vector<weftComm_t> comms = algorithm_variants(comm, context.rank, &algorithms);
  int failures = 0;
  for (size_t variant = 0; variant < comms.size(); ++variant) {
    Runner runner(comms[variant], context.rank, context.nranks);
    for (Collective collective : kAll) {
      // Each algorithm once: later variants repeat a collective's first ones.
      if (variant >= algorithms[static_cast<int>(collective)]) continue;
      for (size_t count : counts) {
        for (bool in_place : {false, true}) {
          int root = static_cast<int>(count % context.nranks);
          std::vector<std::pair<weftDataType_t, int>> combos;
          if (is_reduction(collective)) {
            for (int t = 0; t < weftNumTypes; ++t) {
              if (!all_types && t != weftFloat32 && t != weftInt32) continue;
              for (int op = 0; op <= kPreMulSum; ++op) {
                if (!all_types && op != weftSum && op != weftMax) continue;
                combos.push_back({static_cast<weftDataType_t>(t), op});
              }
            }
          } else {
            for (weftDataType_t t : kMovementTypes) {
              if (!all_types && t != weftFloat32 && t != weftInt8) continue;
              combos.push_back({t, weftSum});
            }
            if (!all_types) combos.push_back({weftFloat32, weftSum});
          }
          for (const auto& [dtype, op] : combos) {
            Case c{collective, dtype, op, count, in_place, root};
            std::string error = runner.run(c);
            if (!error.empty() && ++failures <= 10)
              ADD_FAILURE() << "rank " << context.rank << ": " << describe(c, context.nranks)
                            << ": " << error;
            if (failures > 0 && !error.empty() && error.rfind("call failed", 0) == 0) return;
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
  for (weftComm_t variant : comms) EXPECT_EQ(weftCommDestroy(variant), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

class AllCollectives : public ::testing::TestWithParam<int> {};

TEST_P(AllCollectives, EveryDtypeOpAlgorithmSmallCounts) {
  run_ranks(GetParam(), [](const RankContext& context) { sweep(context, {0, 1, 7, 1000}, true); });
}
INSTANTIATE_TEST_SUITE_P(Ranks, AllCollectives, ::testing::Values(1, 2, 3, 4, 5, 8));

class LargeCollectives : public ::testing::TestWithParam<int> {};

#ifdef WEFT_SANITIZED
// Sanitizers slow large buffers tenfold: one rank count and half the count (2 MiB + 52 bytes of
// float32, still more than half a rank's 4 MiB staging) keep the chunked paths covered.
constexpr size_t kLargeCount = (size_t{1} << 19) + 13;
INSTANTIATE_TEST_SUITE_P(Ranks, LargeCollectives, ::testing::Values(2));
#else
constexpr size_t kLargeCount = (size_t{1} << 20) + 13;
INSTANTIATE_TEST_SUITE_P(Ranks, LargeCollectives, ::testing::Values(2, 3, 5));
#endif

TEST_P(LargeCollectives, EveryAlgorithmOneMebiPlusThirteen) {
  RunOptions options;
  options.timeout_s = 300;
  run_ranks(
      GetParam(), [](const RankContext& context) { sweep(context, {kLargeCount}, false); },
      options);
}

// Random floats against an fp64 reference: sums agree within rounding, and
// every rank holds bit-identical results.
TEST(CollectiveFloats, RandomAllReduceMatchesFp64Reference) {
  run_ranks(4, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    const size_t count = 65537;
    for (weftDataType_t dtype : {weftFloat32, weftFloat64, weftFloat16, weftBfloat16}) {
      for (weftRedOp_t op : {weftSum, weftAvg}) {
        std::vector<std::vector<double>> inputs(context.nranks, std::vector<double>(count));
        for (int q = 0; q < context.nranks; ++q) {
          std::mt19937_64 random(1234 + q);
          std::uniform_real_distribution<double> uniform(-1, 1);
          for (double& x : inputs[q]) {
            std::vector<uint8_t> one(dtype_size(dtype));
            store_value(dtype, one.data(), 0, uniform(random));
            x = load_value(dtype, one.data(), 0);  // the value as the dtype holds it
          }
        }
        std::vector<uint8_t> buffer(count * dtype_size(dtype));
        for (size_t i = 0; i < count; ++i)
          store_value(dtype, buffer.data(), i, inputs[context.rank][i]);
        ASSERT_EQ(weftAllReduce(buffer.data(), buffer.data(), count, dtype, op, comm, nullptr),
                  weftSuccess);
        double epsilon = dtype == weftFloat64   ? 1e-15
                         : dtype == weftFloat32 ? 1e-6
                         : dtype == weftFloat16 ? 1e-3
                                                : 8e-3;
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          double reference = 0;
          for (int q = 0; q < context.nranks; ++q) reference += inputs[q][i];
          if (op == weftAvg) reference /= context.nranks;
          double got = load_value(dtype, buffer.data(), i);
          if (std::fabs(got - reference) > epsilon * (context.nranks + 1) * 2) ++wrong;
        }
        EXPECT_EQ(wrong, 0u) << dtype_name(dtype) << " op " << op;
        // Bit-identical everywhere: gather every rank's result and compare.
        std::vector<uint8_t> all(buffer.size() * context.nranks);
        ASSERT_EQ(weftAllGather(buffer.data(), all.data(), buffer.size(), weftUint8, comm, nullptr),
                  weftSuccess);
        for (int q = 0; q < context.nranks; ++q)
          EXPECT_EQ(memcmp(all.data() + q * buffer.size(), buffer.data(), buffer.size()), 0)
              << "rank " << q << " holds a different " << dtype_name(dtype) << " result";
      }
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

// Many different collectives back to back, interleaved on a parent and a
// split communicator, must not cross.
TEST(CollectiveSequences, InterleavedOnTwoCommunicators) {
  run_ranks(4, [](const RankContext& context) {
    weftComm_t world = init_comm(context);
    weftComm_t half = nullptr;
    ASSERT_EQ(weftCommSplit(world, context.rank % 2, context.rank, &half, nullptr), weftSuccess);
    Runner on_world(world, context.rank, 4), on_half(half, context.rank / 2, 2);
    int failures = 0;
    for (int round = 0; round < 30; ++round) {
      Collective collective = kAll[round % 10];
      Case c{collective, round % 2 ? weftInt32 : weftFloat32,
             weftSum,    static_cast<size_t>(round * 37 % 500),
             false,      round % 2};
      std::string error = on_world.run(c);
      if (!error.empty() && ++failures < 5)
        ADD_FAILURE() << "world " << describe(c, 4) << ": " << error;
      c.collective = kAll[(round * 3 + 1) % 10];
      error = on_half.run(c);
      if (!error.empty() && ++failures < 5)
        ADD_FAILURE() << "half " << describe(c, 2) << ": " << error;
    }
    EXPECT_EQ(weftCommDestroy(half), weftSuccess);
    EXPECT_EQ(weftCommDestroy(world), weftSuccess);
  });
}

// Collectives and point-to-point calls fused in one group complete together.
TEST(CollectiveGroups, AllReduceAndRingExchangeInOneGroup) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    std::vector<int32_t> values(1000, context.rank + 1), sum(1000, 0);
    int32_t outgoing = context.rank * 10, incoming = -1;
    int left = (context.rank + 2) % 3;
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftAllReduce(values.data(), sum.data(), 1000, weftInt32, weftSum, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftSend(&outgoing, 1, weftInt32, (context.rank + 1) % 3, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftRecv(&incoming, 1, weftInt32, left, comm, nullptr), weftSuccess);
    ASSERT_EQ(weftBarrier(comm, nullptr), weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(sum, std::vector<int32_t>(1000, 6));
    EXPECT_EQ(incoming, left * 10);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  });
}

}  // namespace
}  // namespace weft::testing
