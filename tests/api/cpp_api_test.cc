// The C++ API: RAII communicators, streams, events and groups; every collective
// typed (dtype deduced, narrow float wrappers included), in and out of place;
// sizes checked by the wrapper; Config, PreMulSum, last_algorithm, exceptions.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "weft/weft.hpp"

namespace weft::testing {
namespace {

static_assert(datatype_of<float>() == weftFloat32 && datatype_of<int8_t>() == weftInt8);
static_assert(datatype_of<bfloat16>() == weftBfloat16 && datatype_of<float16>() == weftFloat16);
static_assert(datatype_of<float8_e4m3>() == weftFloat8e4m3);
static_assert(datatype_of<const float8_e5m2>() == weftFloat8e5m2);
static_assert(Buffer<std::vector<double>> && MutableBuffer<std::span<uint64_t>>);
static_assert(Buffer<const std::vector<float>&> && !MutableBuffer<const std::vector<float>&>);
static_assert(!Element<char> && !Element<std::string>);

Comm init(const RankContext& context, const Config& config = {}) {
  return Comm::init(context.nranks, UniqueId::from_bytes(context.id), context.rank, config);
}

template <typename T>
T make(double value) {
  if constexpr (std::is_arithmetic_v<T>)
    return static_cast<T>(value);
  else
    return T(static_cast<float>(value));
}

template <typename T>
double value_of(T element) {
  if constexpr (std::is_arithmetic_v<T>)
    return static_cast<double>(element);
  else
    return static_cast<float>(element);
}

// Small values whose sums, products and extremes over 3 ranks are exact in
// every type (fp8 e5m2 included).
double small(int rank, size_t index) {
  return static_cast<double>((rank + index) % 3);
}
// Values that tell blocks apart, for collectives that only move data.
double pattern(int rank, size_t index) {
  return static_cast<double>((rank * 31 + index * 7 + 1) % 100);
}

template <typename T>
std::vector<T> filled(size_t length, const std::function<double(size_t)>& value) {
  std::vector<T> out(length);
  for (size_t i = 0; i < length; ++i) out[i] = make<T>(value(i));
  return out;
}

// got[i] equals make<T>(expected(i)) as a value, for every i.
template <typename T>
void expect_values(std::span<const T> got, const std::function<double(size_t)>& expected,
                   const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(value_of(got[i]), value_of(make<T>(expected(i)))) << what << " element " << i;
}

template <typename T>
void every_collective(const Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  const size_t count = 7;
  auto over_ranks = [n](size_t i, double start, double (*combine)(double, double)) {
    double acc = start;
    for (int p = 0; p < n; ++p) acc = combine(acc, small(p, i));
    return acc;
  };
  auto sum = [&](size_t i) { return over_ranks(i, 0, [](double a, double b) { return a + b; }); };

  // AllReduce, out of place (sum) and in place (max, prod).
  std::vector<T> send = filled<T>(count, [&](size_t i) { return small(r, i); }), recv(count);
  comm.all_reduce(send, recv);
  expect_values<T>(recv, sum, "all_reduce sum");
  std::vector<T> data = send;
  comm.all_reduce(data, Op::max);
  expect_values<T>(
      data,
      [&](size_t i) {
        return over_ranks(i, -1, [](double a, double b) { return std::max(a, b); });
      },
      "all_reduce max in place");
  data = send;
  comm.all_reduce(std::span<T>(data), Op::prod);
  expect_values<T>(
      data, [&](size_t i) { return over_ranks(i, 1, [](double a, double b) { return a * b; }); },
      "all_reduce prod in place");

  // ReduceScatter: block p of the input goes to rank p.
  std::vector<T> blocks = filled<T>(count * n, [&](size_t j) { return small(r, j); });
  std::vector<T> mine(count);
  comm.reduce_scatter(blocks, mine, Op::sum);
  expect_values<T>(
      mine, [&](size_t i) { return sum(r * count + i); }, "reduce_scatter");
  std::vector<T> in_place = blocks;
  std::span<T> result = comm.reduce_scatter(in_place, Op::min);
  ASSERT_EQ(result.data(), in_place.data() + r * count);
  ASSERT_EQ(result.size(), count);
  expect_values<T>(
      result,
      [&](size_t i) {
        return over_ranks(r * count + i, 9, [](double a, double b) { return std::min(a, b); });
      },
      "reduce_scatter min in place");

  // AllGather, both layouts.
  std::vector<T> own = filled<T>(count, [&](size_t i) { return pattern(r, i); });
  std::vector<T> gathered(count * n);
  comm.all_gather(own, gathered);
  auto gathered_value = [&](size_t j) { return pattern(static_cast<int>(j / count), j % count); };
  expect_values<T>(gathered, gathered_value, "all_gather");
  std::vector<T> gathered_in_place(count * n);
  std::copy(own.begin(), own.end(), gathered_in_place.begin() + r * count);
  comm.all_gather(gathered_in_place);
  expect_values<T>(gathered_in_place, gathered_value, "all_gather in place");

  // Broadcast from root 1 (or 0 alone): the root's send; others pass none.
  const int root = 1 % n;
  std::vector<T> from_root =
      r == root ? filled<T>(count, [&](size_t i) { return pattern(root, i); }) : std::vector<T>{};
  std::vector<T> copy(count);
  comm.broadcast(from_root, copy, root);
  expect_values<T>(
      copy, [&](size_t i) { return pattern(root, i); }, "broadcast");
  std::vector<T> bcast = filled<T>(count, [&](size_t i) { return pattern(r, i); });
  comm.broadcast(bcast, root);
  expect_values<T>(
      bcast, [&](size_t i) { return pattern(root, i); }, "broadcast in place");

  // Reduce to the last rank; recv only there.
  const int last = n - 1;
  std::vector<T> reduced(r == last ? count : 0);
  comm.reduce(send, reduced, Op::sum, last);
  if (r == last) expect_values<T>(reduced, sum, "reduce");
  std::vector<T> reduced_in_place = send;
  comm.reduce(reduced_in_place, Op::sum, last);
  if (r == last) expect_values<T>(reduced_in_place, sum, "reduce in place");

  // AllToAll: block p of rank q's input lands in block q of rank p's output.
  std::vector<T> outgoing = filled<T>(count * n, [&](size_t j) { return pattern(r, j); });
  std::vector<T> incoming(count * n);
  auto exchanged = [&](size_t j) {
    return pattern(static_cast<int>(j / count), r * count + j % count);
  };
  comm.all_to_all(outgoing, incoming);
  expect_values<T>(incoming, exchanged, "all_to_all");
  comm.all_to_all(outgoing);
  expect_values<T>(outgoing, exchanged, "all_to_all in place");

  // AllToAllv: rank q sends q + p + 1 elements to rank p, with a one-element gap.
  std::vector<size_t> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < n; ++p) {
    send_counts[p] = recv_counts[p] = static_cast<size_t>(r + p + 1);
    send_displs[p] = send_total;
    recv_displs[p] = recv_total;
    send_total += send_counts[p] + 1;
    recv_total += recv_counts[p] + 1;
  }
  std::vector<T> v_send = filled<T>(send_total, [&](size_t j) { return pattern(r, j); });
  std::vector<T> v_recv(recv_total, make<T>(0));
  comm.all_to_allv(v_send, send_counts, send_displs, v_recv, recv_counts, recv_displs);
  for (int p = 0; p < n; ++p) {
    // Rank p placed its piece for r at its own send displacement for r.
    size_t their_displ = 0;
    for (int q = 0; q < r; ++q) their_displ += static_cast<size_t>(p + q + 1) + 1;
    expect_values<T>(
        std::span<const T>(v_recv).subspan(recv_displs[p], recv_counts[p]),
        [&](size_t i) { return pattern(p, their_displ + i); }, "all_to_allv");
  }

  // Gather to and Scatter from the last rank.
  std::vector<T> at_root(r == last ? count * n : 0);
  comm.gather(own, at_root, last);
  if (r == last) expect_values<T>(at_root, gathered_value, "gather");
  std::vector<T> to_scatter = r == last
                                  ? filled<T>(count * n, [&](size_t j) { return pattern(last, j); })
                                  : std::vector<T>{};
  std::vector<T> piece(count);
  comm.scatter(to_scatter, piece, last);
  expect_values<T>(
      piece, [&](size_t i) { return pattern(last, r * count + i); }, "scatter");
}

template <typename T>
class CppCollectives : public ::testing::Test {};
using ElementTypes = ::testing::Types<int8_t, uint8_t, int32_t, uint32_t, int64_t, uint64_t, float,
                                      double, float16, bfloat16, float8_e4m3, float8_e5m2>;
TYPED_TEST_SUITE(CppCollectives, ElementTypes);

TYPED_TEST(CppCollectives, EveryCollectiveInAndOutOfPlace) {
  run_ranks(3, [](const RankContext& context) { every_collective<TypeParam>(init(context)); });
}

TEST(CppApi, OneRankAndFourRanks) {
  for (int nranks : {1, 4})
    run_ranks(nranks, [](const RankContext& context) { every_collective<float>(init(context)); });
}

template <typename Call>
void expect_invalid(Call call, const std::string& mentions) {
  try {
    call();
    ADD_FAILURE() << "no weft::Error; expected one mentioning " << mentions;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), weftInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(mentions), std::string::npos) << error.what();
  }
}

TEST(CppApi, BufferSizesAreCheckedAndNamed) {
  run_ranks(2, [](const RankContext& context) {
    Comm comm = init(context);
    std::vector<float> four(4), five(5), eight(8);
    std::vector<size_t> two_counts{1, 1}, one_count{1};
    // Every rank makes the same mistakes: the wrapper refuses before any rank sends.
    expect_invalid([&] { comm.all_reduce(four, five); }, "all_reduce: recv has 5 elements");
    expect_invalid([&] { comm.all_gather(four, five); }, "all_gather: recv has 5");
    expect_invalid([&] { comm.reduce_scatter(five, four); }, "reduce_scatter: send has 5");
    expect_invalid([&] { comm.reduce_scatter(five); }, "not a multiple of size() 2");
    expect_invalid([&] { comm.all_to_all(five, five); }, "all_to_all: send has 5");
    expect_invalid(
        [&] { comm.all_to_allv(four, one_count, one_count, four, two_counts, two_counts); },
        "send_counts and send_displs need size() = 2");
    std::vector<size_t> too_far{2, 3}, displs{0, 2};
    expect_invalid([&] { comm.all_to_allv(four, too_far, displs, eight, two_counts, two_counts); },
                   "send piece 1 (2 + 3) lies past the 4-element send buffer");
    // The library's own checks come through with its message.
    expect_invalid([&] { comm.send(four, 7); }, "peer 7");
    expect_invalid([&] { comm.broadcast(four, 5); }, "root 5");
    // Nothing above reached the wire: the communicator still works.
    EXPECT_EQ(comm.async_error(), weftSuccess);
    comm.all_reduce(four);
  });
}

TEST(CppApi, GroupedRingSplitAndRawHandles) {
  run_ranks(3, [](const RankContext& context) {
    Comm comm = init(context);
    ASSERT_EQ(comm.rank(), context.rank);
    ASSERT_EQ(comm.size(), 3);
    std::vector<double> outgoing(1000, context.rank + 0.5), incoming(1000, -1);
    int left = (context.rank + 2) % 3;
    {
      Group group;
      comm.send(outgoing, (context.rank + 1) % 3);
      comm.recv(incoming, left);
      group.end();
    }
    EXPECT_EQ(incoming, std::vector<double>(1000, left + 0.5));

    Comm pair = comm.split(context.rank == 2 ? WEFT_SPLIT_NOCOLOR : 0, -context.rank);
    EXPECT_EQ(static_cast<bool>(pair), context.rank != 2);
    if (pair) {
      EXPECT_EQ(pair.size(), 2);
      EXPECT_EQ(pair.rank(), 1 - context.rank);  // keys reverse the order
      pair.barrier();
      // release/adopt hand the same communicator over.
      Comm adopted = Comm::adopt(pair.release());
      EXPECT_FALSE(pair);
      std::array<int32_t, 3> ones{1, 1, 1};
      adopted.all_reduce(ones);
      EXPECT_EQ(ones, (std::array<int32_t, 3>{2, 2, 2}));
      adopted.finalize();
    }
    comm.barrier();
  });
}

TEST(CppApi, StreamsAndEventsOrderWork) {
  run_ranks(2, [](const RankContext& context) {
    Comm comm = init(context);
    Stream first, second;
    Event first_done;
    std::vector<int64_t> data(4096, context.rank + 1);
    // sum = 3 after the first; the second (ordered by the event) doubles it to 6.
    comm.all_reduce(data, Op::sum, first);
    first_done.record(first);
    second.wait(first_done);
    comm.all_reduce(data, Op::sum, second);
    second.synchronize();
    EXPECT_TRUE(second.done());
    EXPECT_TRUE(first_done.done());
    first_done.synchronize();
    EXPECT_EQ(data, std::vector<int64_t>(4096, 6));
    // A moved stream keeps its queue; the moved-from one is the NULL stream.
    Stream moved = std::move(first);
    EXPECT_EQ(first.get(), nullptr);
    comm.barrier(moved);
    moved.synchronize();
  });
}

TEST(CppApi, ConfigReachesEveryConstructor) {
  expect_invalid([] { Config().timeout_ms(0); }, "Config::timeout_ms");
  expect_invalid([] { Config().timeout_ms(-5); }, "not -5");
  run_ranks(2, [](const RankContext& context) {
    Comm comm =
        init(context, Config().name("cpp-test").algorithms("allreduce:ring").timeout_ms(20000));
    EXPECT_EQ(comm.last_algorithm().name, "");
    std::vector<float> data(100, 1);
    comm.all_reduce(data);
    LastAlgorithm last = comm.last_algorithm();
    EXPECT_EQ(last.name, "ring");
    Comm child = comm.split(0, context.rank, Config().algorithms("allreduce:rd"));
    child.all_reduce(data);
    EXPECT_EQ(child.last_algorithm().name, "rd");
    EXPECT_EQ(data, std::vector<float>(100, 4));
    // An algorithm that does not exist is refused by the library, naming it.
    try {
      init(context, Config().algorithms("allreduce:nosuch"));
      ADD_FAILURE() << "an unknown algorithm was accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("nosuch"), std::string::npos) << error.what();
    }
  });
}

TEST(CppApi, FromEnvTakesAConfig) {
  std::string root = "127.0.0.1:" + std::to_string(free_loopback_port());
  RunOptions options;
  options.make_unique_id = false;
  options.env = {{"WEFT_ROOT", root.c_str()}, {"WEFT_SECRET", "0123456789abcdef0123456789abcdef"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        setenv("WEFT_RANK", std::to_string(context.rank).c_str(), 1);
        setenv("WEFT_NRANKS", "2", 1);
        Comm comm = Comm::from_env(Config().algorithms("allreduce:rd"));
        std::vector<double> data(8, context.rank);
        comm.all_reduce(data);
        EXPECT_EQ(data, std::vector<double>(8, 1));
        EXPECT_EQ(comm.last_algorithm().name, "rd");
      },
      options);
}

TEST(CppApi, PreMulSumWithBothResidences) {
  run_ranks(3, [](const RankContext& context) {
    Comm comm = init(context);
    std::vector<double> data(5, context.rank + 1);  // sum over ranks 6
    {
      PreMulSum<double> twice(comm, 2.0);
      comm.all_reduce(data, twice);
      EXPECT_EQ(data, std::vector<double>(5, 12));
    }
    double scalar = 0.5;
    PreMulSum<double> read_each_call(comm, &scalar);
    comm.all_reduce(data, read_each_call);  // 3 * 12 * 0.5
    EXPECT_EQ(data, std::vector<double>(5, 18));
    scalar = 2;
    comm.all_reduce(data, read_each_call.op());
    EXPECT_EQ(data, std::vector<double>(5, 108));
    // The op was made for double: float data is refused by the library.
    std::vector<float> floats(5, 1);
    expect_invalid([&] { comm.all_reduce(floats, read_each_call); }, "was created for double");
  });
}

TEST(CppApi, AbortReleasesAndAsyncErrorReports) {
  run_ranks(2, [](const RankContext& context) {
    Comm comm = init(context);
    EXPECT_EQ(comm.async_error(), weftSuccess);
    comm.barrier();
    comm.abort();
    EXPECT_FALSE(comm);
  });
}

// Every finite narrow value survives float and back; NaNs stay NaN.
template <typename Narrow, typename Bits>
void round_trips(uint32_t patterns, bool saturates = false) {
  for (uint32_t b = 0; b < patterns; ++b) {
    Narrow x = Narrow::from_bits(static_cast<Bits>(b));
    float widened = static_cast<float>(x);
    if (std::isnan(widened)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(Narrow(widened)))) << b;
      continue;
    }
    if (std::isinf(widened) && saturates) {  // fp8 conversions clamp to the largest finite
      float back = static_cast<float>(Narrow(widened));
      EXPECT_TRUE(std::isfinite(back) && std::signbit(back) == std::signbit(widened)) << b;
      continue;
    }
    ASSERT_EQ(Narrow(widened).bits, static_cast<Bits>(b)) << "pattern " << b << " = " << widened;
  }
}

TEST(CppApi, NarrowFloatsConvertLikeTheLibrary) {
  round_trips<float16, uint16_t>(1u << 16);
  round_trips<bfloat16, uint16_t>(1u << 16);
  round_trips<float8_e4m3, uint8_t>(1u << 8, true);
  round_trips<float8_e5m2, uint8_t>(1u << 8, true);
  // Rounding to nearest even and fp8 saturation.
  EXPECT_EQ(static_cast<float>(float16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(static_cast<float>(float8_e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(static_cast<float>(bfloat16(3.0f)), 3.0f);
  // The C entry points refuse non-float types and NULL buffers, naming them.
  float in = 1;
  int32_t out = 0;
  EXPECT_EQ(weftConvertFromFloat(weftInt32, &in, &out, 1), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("int32"), std::string::npos);
  EXPECT_EQ(weftConvertToFloat(weftFloat16, nullptr, &in, 1), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("in is NULL"), std::string::npos);
  EXPECT_EQ(weftConvertToFloat(weftFloat16, nullptr, nullptr, 0), weftSuccess);
  double wide = 0;
  EXPECT_EQ(weftConvertFromFloat(weftFloat64, &in, &wide, 1), weftSuccess);
  EXPECT_EQ(wide, 1.0);
}

// The size query agrees with the C++ element types the dtype is deduced from.
template <typename T>
void expect_size_of_deduced_dtype() {
  size_t size = 0;
  ASSERT_EQ(weftDataTypeSize(datatype_of<T>(), &size), weftSuccess);
  EXPECT_EQ(size, sizeof(T)) << datatype_of<T>();
}

TEST(CppApi, DataTypeSizeMatchesTheElementTypes) {
  expect_size_of_deduced_dtype<int8_t>();
  expect_size_of_deduced_dtype<uint32_t>();
  expect_size_of_deduced_dtype<int64_t>();
  expect_size_of_deduced_dtype<double>();
  expect_size_of_deduced_dtype<float16>();
  expect_size_of_deduced_dtype<bfloat16>();
  expect_size_of_deduced_dtype<float8_e5m2>();
  size_t size = 7;
  EXPECT_EQ(weftDataTypeSize(static_cast<weftDataType_t>(weftNumTypes), &size),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("datatype"), std::string::npos);
  EXPECT_EQ(size, 7u);
  EXPECT_EQ(weftDataTypeSize(weftFloat32, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("size"), std::string::npos);
}

}  // namespace
}  // namespace weft::testing
