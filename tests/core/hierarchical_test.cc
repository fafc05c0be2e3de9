// Hierarchical, node-leader and layout-following schedules in real
// multi-process runs: WEFT_TOPO_FILE makes the local ranks look like several
// nodes (contiguous, interleaved, unequal) and WEFT_ALGO forces the
// algorithms; every collective is checked exactly over several dtypes and
// ops, in and out of place, and float AllReduce results must be bitwise
// identical on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
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

// A cluster description in a temporary file, removed at the end of the test.
class ClusterFile {
 public:
  explicit ClusterFile(const std::string& json) {
    char name[] = "/tmp/weft_hier_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, json.data(), json.size()), static_cast<ssize_t>(json.size()));
    close(fd);
    path_ = name;
  }
  ~ClusterFile() { unlink(path_.c_str()); }
  const char* path() const { return path_.c_str(); }

 private:
  std::string path_;
};

// Nodes a, b, c, ... and the node of each rank.
std::string cluster_json(int nodes, const std::vector<int>& node_of) {
  std::string json = R"({"weft_topology": 1, "nodes": [)";
  for (int k = 0; k < nodes; ++k) {
    json += std::string(k ? ", " : "") + R"({"name": ")" + char('a' + k) + R"("})";
  }
  json += R"(], "ranks": [)";
  for (size_t r = 0; r < node_of.size(); ++r) {
    json += std::string(r ? ", " : "") + R"({"node": ")" + char('a' + node_of[r]) + R"("})";
  }
  return json + "]}";
}

struct Reduction {
  weftDataType_t dtype;
  weftRedOp_t op;
};
const Reduction kReductions[] = {
    {weftInt32, weftSum}, {weftFloat32, weftMax}, {weftFloat64, weftProd}, {weftInt64, weftMin}};
const weftDataType_t kMovementTypes[] = {weftInt8, weftFloat32, weftFloat64};

// Rank q's element i: small values, so every result is exact in every dtype.
double value_of(const Reduction& r, int q, size_t i) {
  if (r.op == weftProd) return static_cast<double>((q + i) % 2 + 1);
  return static_cast<double>(pattern_value(q, i) % 20);
}

double reduced(const Reduction& r, int nranks, size_t i) {
  double acc = value_of(r, 0, i);
  for (int q = 1; q < nranks; ++q) {
    const double v = value_of(r, q, i);
    acc = r.op == weftSum    ? acc + v
          : r.op == weftProd ? acc * v
          : r.op == weftMax  ? std::max(acc, v)
                             : std::min(acc, v);
  }
  return acc;
}

// An AllToAllv every rank can predict: rank s sends rank d
// count(s, d) elements (uneven, about a third zero, `salt` varying them),
// packed with gaps of (d % 3) elements and an offset, so the receiver must
// land each piece at its own displacements. Receive gaps hold a marker that
// must survive.
class Uneven {
 public:
  Uneven(int rank, int nranks, weftDataType_t dtype, int salt)
      : rank_(rank), n_(nranks), dtype_(dtype), salt_(salt) {
    size_t send_at = 2, recv_at = 1;
    for (int q = 0; q < n_; ++q) {
      send_counts_.push_back(count(rank_, q));
      send_displs_.push_back(send_at);
      send_at += send_counts_.back() + q % 3;
      recv_counts_.push_back(count(q, rank_));
      recv_displs_.push_back(recv_at);
      recv_at += recv_counts_.back() + q % 3;
    }
    send_.assign(send_at * dtype_size(dtype_), 0);
    recv_.assign((recv_at + 1) * dtype_size(dtype_), 0);
    for (int q = 0; q < n_; ++q) {
      for (size_t i = 0; i < send_counts_[q]; ++i)
        store_value(dtype_, send_.data(), send_displs_[q] + i, value(rank_, q, i));
    }
    for (size_t i = 0; i < recv_at + 1; ++i) store_value(dtype_, recv_.data(), i, kGap);
  }

  weftResult_t run(weftComm_t comm, weftStream_t stream) {
    return weftAllToAllv(send_.data(), send_counts_.data(), send_displs_.data(), recv_.data(),
                         recv_counts_.data(), recv_displs_.data(), dtype_, comm, stream);
  }

  // Every piece at its displacement, every gap untouched.
  void check() const {
    std::vector<double> want(recv_.size() / dtype_size(dtype_), kGap);
    for (int q = 0; q < n_; ++q) {
      for (size_t i = 0; i < recv_counts_[q]; ++i) want[recv_displs_[q] + i] = value(q, rank_, i);
    }
    int errors = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double got = load_value(dtype_, recv_.data(), i);
      if (got != want[i] && errors++ < 5)
        ADD_FAILURE() << "alltoallv rank " << rank_ << " " << dtype_name(dtype_) << " salt "
                      << salt_ << " [" << i << "]: got " << got << ", want " << want[i];
    }
  }

 private:
  static constexpr double kGap = 99;
  size_t count(int s, int d) const {
    const int x = (s * 7 + d * 5 + salt_) % 11;
    return x % 3 == 0 ? 0 : static_cast<size_t>(x * (salt_ % 4 + 1));
  }
  double value(int s, int d, size_t i) const {
    return static_cast<double>((s * 5 + d * 3 + i + salt_) % 90);
  }

  int rank_, n_;
  weftDataType_t dtype_;
  int salt_;
  std::vector<size_t> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<uint8_t> send_, recv_;
};

class Checker {
 public:
  Checker(weftComm_t comm, int rank, int nranks) : comm_(comm), rank_(rank), n_(nranks) {}

  void reductions(size_t count, bool in_place, int root) {
    for (const Reduction& r : kReductions) {
      all_reduce(r, count, in_place);
      reduce_scatter(r, count, in_place);
      reduce(r, count, in_place, root);
    }
  }

  void movements(size_t count, bool in_place, int root) {
    for (weftDataType_t dtype : kMovementTypes) {
      all_gather(dtype, count, in_place);
      broadcast(dtype, count, in_place, root);
      all_to_all(dtype, count, in_place);
      all_to_allv(dtype, static_cast<int>(count + in_place));
    }
  }

  // Random floats: every rank must end with the same bits (each rank's
  // result is broadcast and compared).
  void identical_bits(size_t count) {
    std::vector<float> data(count), theirs(count);
    std::mt19937 random(77 + rank_);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (float& x : data) x = uniform(random);
    ASSERT_EQ(weftAllReduce(data.data(), data.data(), count, weftFloat32, weftSum, comm_, nullptr),
              weftSuccess);
    for (int q = 0; q < n_; ++q) {
      ASSERT_EQ(weftBroadcast(data.data(), theirs.data(), count, weftFloat32, q, comm_, nullptr),
                weftSuccess);
      EXPECT_EQ(memcmp(theirs.data(), data.data(), count * sizeof(float)), 0)
          << "rank " << q << " differs from rank " << rank_;
    }
  }

  // The collectives whose hierarchical schedules need equal nodes refuse.
  void refused(size_t count) {
    std::vector<int32_t> send(count * n_), recv(count * n_);
    EXPECT_NE(
        weftReduceScatter(send.data(), recv.data(), count, weftInt32, weftSum, comm_, nullptr),
        weftSuccess);
    EXPECT_NE(weftAllGather(send.data(), recv.data(), count, weftInt32, comm_, nullptr),
              weftSuccess);
    EXPECT_NE(weftAllToAll(send.data(), recv.data(), count, weftInt32, comm_, nullptr),
              weftSuccess);
    EXPECT_NE(std::string(weftGetLastError(comm_)).find("same number of ranks"), std::string::npos)
        << weftGetLastError(comm_);
  }

  bool enabled(Collective c) const { return enabled_[static_cast<int>(c)]; }
  void only(std::initializer_list<Collective> list) {
    for (bool& e : enabled_) e = false;
    for (Collective c : list) enabled_[static_cast<int>(c)] = true;
  }

 private:
  std::vector<uint8_t> buffer(weftDataType_t dtype, size_t count) const {
    return std::vector<uint8_t>(count * dtype_size(dtype));
  }
  void expect_value(weftDataType_t dtype, const std::vector<uint8_t>& buf, size_t index,
                    double want, const char* what, size_t count) {
    const double got = load_value(dtype, buf.data(), index);
    if (got != want && errors_++ < 5) {
      ADD_FAILURE() << what << " rank " << rank_ << " count " << count << " " << dtype_name(dtype)
                    << " [" << index << "]: got " << got << ", want " << want;
    }
  }

  void all_reduce(const Reduction& r, size_t count, bool in_place) {
    if (!enabled(Collective::AllReduce)) return;
    std::vector<uint8_t> send = buffer(r.dtype, count), recv = buffer(r.dtype, count);
    for (size_t i = 0; i < count; ++i) store_value(r.dtype, send.data(), i, value_of(r, rank_, i));
    void* out = in_place ? send.data() : recv.data();
    ASSERT_EQ(weftAllReduce(send.data(), out, count, r.dtype, r.op, comm_, nullptr), weftSuccess)
        << weftGetLastError(comm_);
    const std::vector<uint8_t>& got = in_place ? send : recv;
    for (size_t i = 0; i < count; ++i)
      expect_value(r.dtype, got, i, reduced(r, n_, i), "allreduce", count);
  }

  void reduce_scatter(const Reduction& r, size_t count, bool in_place) {
    if (!enabled(Collective::ReduceScatter)) return;
    std::vector<uint8_t> send = buffer(r.dtype, count * n_), recv = buffer(r.dtype, count);
    for (size_t i = 0; i < count * n_; ++i) {
      store_value(r.dtype, send.data(), i, value_of(r, rank_, i));
    }
    const size_t size = dtype_size(r.dtype);
    void* out = in_place ? send.data() + rank_ * count * size : recv.data();
    ASSERT_EQ(weftReduceScatter(send.data(), out, count, r.dtype, r.op, comm_, nullptr),
              weftSuccess)
        << weftGetLastError(comm_);
    if (in_place && count > 0) memcpy(recv.data(), out, count * size);
    for (size_t i = 0; i < count; ++i) {
      expect_value(r.dtype, recv, i, reduced(r, n_, rank_ * count + i), "reducescatter", count);
    }
  }

  void reduce(const Reduction& r, size_t count, bool in_place, int root) {
    if (!enabled(Collective::Reduce)) return;
    std::vector<uint8_t> send = buffer(r.dtype, count), recv = buffer(r.dtype, count);
    for (size_t i = 0; i < count; ++i) store_value(r.dtype, send.data(), i, value_of(r, rank_, i));
    void* out = in_place ? send.data() : recv.data();
    ASSERT_EQ(weftReduce(send.data(), out, count, r.dtype, r.op, root, comm_, nullptr), weftSuccess)
        << weftGetLastError(comm_);
    if (rank_ != root) return;
    const std::vector<uint8_t>& got = in_place ? send : recv;
    for (size_t i = 0; i < count; ++i)
      expect_value(r.dtype, got, i, reduced(r, n_, i), "reduce", count);
  }

  static double item(int q, size_t i) { return static_cast<double>((q * 7 + i) % 13); }

  void all_gather(weftDataType_t dtype, size_t count, bool in_place) {
    if (!enabled(Collective::AllGather)) return;
    const size_t size = dtype_size(dtype);
    std::vector<uint8_t> send = buffer(dtype, count), recv = buffer(dtype, count * n_);
    for (size_t i = 0; i < count; ++i) store_value(dtype, send.data(), i, item(rank_, i));
    const void* in = send.data();
    if (in_place) {
      if (count > 0) memcpy(recv.data() + rank_ * count * size, send.data(), count * size);
      in = recv.data() + rank_ * count * size;
    }
    ASSERT_EQ(weftAllGather(in, recv.data(), count, dtype, comm_, nullptr), weftSuccess)
        << weftGetLastError(comm_);
    for (int q = 0; q < n_; ++q) {
      for (size_t i = 0; i < count; ++i) {
        expect_value(dtype, recv, q * count + i, item(q, i), "allgather", count);
      }
    }
  }

  void broadcast(weftDataType_t dtype, size_t count, bool in_place, int root) {
    if (!enabled(Collective::Broadcast)) return;
    std::vector<uint8_t> send = buffer(dtype, count), recv = buffer(dtype, count);
    for (size_t i = 0; i < count; ++i) store_value(dtype, send.data(), i, item(rank_, i));
    void* out = in_place ? send.data() : recv.data();
    ASSERT_EQ(weftBroadcast(send.data(), out, count, dtype, root, comm_, nullptr), weftSuccess)
        << weftGetLastError(comm_);
    const std::vector<uint8_t>& got = in_place ? send : recv;
    for (size_t i = 0; i < count; ++i)
      expect_value(dtype, got, i, item(root, i), "broadcast", count);
  }

  void all_to_all(weftDataType_t dtype, size_t count, bool in_place) {
    if (!enabled(Collective::AllToAll)) return;
    std::vector<uint8_t> send = buffer(dtype, count * n_), recv = buffer(dtype, count * n_);
    // Element i of the block for rank d.
    auto piece = [&](int from, int to, size_t i) { return item(from * 3 + to, i); };
    for (int d = 0; d < n_; ++d) {
      for (size_t i = 0; i < count; ++i)
        store_value(dtype, send.data(), d * count + i, piece(rank_, d, i));
    }
    void* out = in_place ? send.data() : recv.data();
    ASSERT_EQ(weftAllToAll(send.data(), out, count, dtype, comm_, nullptr), weftSuccess)
        << weftGetLastError(comm_);
    const std::vector<uint8_t>& got = in_place ? send : recv;
    for (int q = 0; q < n_; ++q) {
      for (size_t i = 0; i < count; ++i) {
        expect_value(dtype, got, q * count + i, piece(q, rank_, i), "alltoall", count);
      }
    }
  }

  void all_to_allv(weftDataType_t dtype, int salt) {
    if (!enabled(Collective::AllToAllv)) return;
    Uneven exchange(rank_, n_, dtype, salt);
    ASSERT_EQ(exchange.run(comm_, nullptr), weftSuccess) << weftGetLastError(comm_);
    exchange.check();
  }

  weftComm_t comm_;
  int rank_;
  int n_;
  int errors_ = 0;
  bool enabled_[algo::kNumCollectives] = {true, true, true, true, true,
                                          true, true, true, true, true};
};

struct Setup {
  int nodes;
  std::vector<int> node_of;
  const char* algorithms;  // WEFT_ALGO
  bool equal_nodes;
};

constexpr const char* kHier =
    "allreduce:hier,reducescatter:hier,allgather:hier,broadcast:hier,reduce:hier,alltoall:hier,"
    "alltoallv:hier";
constexpr const char* kLeader = "allreduce:leader,broadcast:leader,reduce:leader";
constexpr const char* kRings =
    "allreduce:tree,reducescatter:ring,allgather:ring,broadcast:chain,reduce:chain";

void run_setup(const Setup& setup) {
  ClusterFile file(cluster_json(setup.nodes, setup.node_of));
  RunOptions options;
  options.env = {{"WEFT_TOPO_FILE", file.path()}, {"WEFT_ALGO", setup.algorithms}};
  const int n = static_cast<int>(setup.node_of.size());
  const bool hier = std::string(setup.algorithms) == kHier;
  const bool leader = std::string(setup.algorithms) == kLeader;
  run_ranks(
      n,
      [&](const RankContext& context) {
        weftComm_t comm = init_comm(context, 30000);
        Checker check(comm, context.rank, context.nranks);
        if (leader) check.only({Collective::AllReduce, Collective::Broadcast, Collective::Reduce});
        // Hierarchical ReduceScatter, AllGather and AllToAll refuse unequal nodes.
        if (hier && !setup.equal_nodes) {
          check.refused(7);
          check.only({Collective::AllReduce, Collective::Broadcast, Collective::Reduce,
                      Collective::AllToAllv});
        }
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          for (bool in_place : {false, true}) {
            const int root = static_cast<int>((count + in_place) % n);
            check.reductions(count, in_place, root);
            check.movements(count, in_place, root);
          }
        }
        check.identical_bits(4099);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

class Hierarchical : public ::testing::TestWithParam<const char*> {};

// Three nodes of two ranks, interleaved: ranks 0 3 on a, 1 4 on b, 2 5 on c.
TEST_P(Hierarchical, ThreeInterleavedNodesOfTwo) {
  run_setup({3, {0, 1, 2, 0, 1, 2}, GetParam(), true});
}

// Two nodes of two ranks, contiguous.
TEST_P(Hierarchical, TwoNodesOfTwo) {
  run_setup({2, {0, 0, 1, 1}, GetParam(), true});
}

// Unequal nodes: a holds ranks 0 2 3 5, b ranks 1 4 (hierarchical AllReduce
// folds a's extra ranks into two slices).
TEST_P(Hierarchical, UnequalNodes) {
  run_setup({2, {0, 1, 0, 0, 1, 0}, GetParam(), false});
}

// Hierarchical AllToAllv runs in two stages (the counts first): inside a
// group with other collectives and a second AllToAllv, and queued on a
// stream between other work, every result exact.
TEST(HierarchicalAllToAllv, InGroupsAndOnStreams) {
  ClusterFile file(cluster_json(3, {0, 1, 2, 0, 1, 2}));
  RunOptions options;
  options.env = {{"WEFT_TOPO_FILE", file.path()}, {"WEFT_ALGO", kHier}};
  run_ranks(
      6,
      [&](const RankContext& context) {
        const int rank = context.rank, n = context.nranks;
        weftComm_t comm = init_comm(context, 30000);
        const size_t count = 33;
        const auto sum_of = [&](size_t i) {
          double acc = 0;
          for (int q = 0; q < n; ++q) acc += static_cast<double>(pattern_value(q, i) % 20);
          return acc;
        };
        std::vector<int32_t> reduced(count);
        const auto fill = [&] {
          for (size_t i = 0; i < count; ++i)
            reduced[i] = static_cast<int32_t>(pattern_value(rank, i) % 20);
        };
        const auto check_reduced = [&] {
          for (size_t i = 0; i < count; ++i) EXPECT_EQ(reduced[i], sum_of(i)) << i;
        };

        // Argument errors show when the call is made, before the counts are
        // exchanged (an in-place AllToAllv does not exist).
        std::vector<size_t> ones(n, 1), displs(n);
        for (int q = 0; q < n; ++q) displs[q] = q;
        std::vector<float> both(n);
        EXPECT_EQ(weftAllToAllv(both.data(), ones.data(), displs.data(), both.data(), ones.data(),
                                displs.data(), weftFloat32, comm, nullptr),
                  weftInvalidArgument);
        EXPECT_NE(std::string(weftGetLastError(comm)).find("in-place"), std::string::npos)
            << weftGetLastError(comm);

        Uneven first(rank, n, weftFloat32, 5), second(rank, n, weftInt64, 6);
        fill();
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        EXPECT_EQ(first.run(comm, nullptr), weftSuccess);
        EXPECT_EQ(
            weftAllReduce(reduced.data(), reduced.data(), count, weftInt32, weftSum, comm, nullptr),
            weftSuccess);
        EXPECT_EQ(second.run(comm, nullptr), weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(comm);
        first.check();
        second.check();
        check_reduced();
        const char* algorithm = nullptr;
        ASSERT_EQ(weftCommLastAlgorithm(comm, &algorithm, nullptr), weftSuccess);
        EXPECT_STREQ(algorithm, "hier");

        weftStream_t stream;
        ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
        Uneven third(rank, n, weftInt8, 7), fourth(rank, n, weftFloat64, 8);
        fill();
        ASSERT_EQ(third.run(comm, stream), weftSuccess);
        ASSERT_EQ(
            weftAllReduce(reduced.data(), reduced.data(), count, weftInt32, weftSum, comm, stream),
            weftSuccess);
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        EXPECT_EQ(fourth.run(comm, stream), weftSuccess);
        EXPECT_EQ(
            weftAllReduce(reduced.data(), reduced.data(), count, weftInt32, weftSum, comm, stream),
            weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess);
        ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
        third.check();
        fourth.check();
        for (size_t i = 0; i < count; ++i) EXPECT_EQ(reduced[i], n * sum_of(i)) << i;
        EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Hierarchical, ::testing::Values(kHier, kLeader, kRings),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           const std::string name = info.param;
                           return name == kHier     ? std::string("hier")
                                  : name == kLeader ? std::string("leader")
                                                    : std::string("rings");
                         });

}  // namespace
}  // namespace weft::testing
