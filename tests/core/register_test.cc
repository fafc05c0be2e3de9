// weftMemAlloc/weftMemFree and weftCommRegister/weftCommDeregister: argument
// errors; direct collectives whose peers read registered weftMemAlloc
// buffers in place (zero copy), blocking and on a stream, checked exactly
// and proven to be taken (the peers' segments are mapped); mixed
// registrations staged, still exact; the user's buffer rewritten the moment
// a call returns; and no weft-mem segment left in /dev/shm, after a normal
// exit or a killed process.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "support/direct_cases.h"
#include "support/multirank.h"
#include "weft/weft.h"
#include "weft/weft.hpp"

namespace weft::testing {
namespace {

using algo::Collective;

constexpr const char* kSmallStaging = "4096";
constexpr size_t kStagingBytes = 4096;
constexpr const char* kMemPrefix = "weft-mem";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The pids of the other processes whose weftMemAlloc segments this process maps.
std::set<int> mapped_peer_pids() {
  std::set<int> pids;
  std::ifstream maps("/proc/self/maps");
  const std::string marker = std::string("/dev/shm/") + kMemPrefix + "-";
  for (std::string line; std::getline(maps, line);) {
    size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    int pid = atoi(line.c_str() + at + marker.size());
    if (pid != getpid()) pids.insert(pid);
  }
  return pids;
}

// weftMemAlloc memory registered with a communicator, freed with the object.
class SharedBuffer {
 public:
  SharedBuffer(weftComm_t comm, size_t bytes, bool do_register = true) : comm_(comm) {
    EXPECT_EQ(weftMemAlloc(&data_, bytes), weftSuccess) << weftGetLastError(nullptr);
    if (do_register) {
      EXPECT_EQ(weftCommRegister(comm, data_, bytes, &handle_), weftSuccess)
          << weftGetLastError(comm);
    }
  }
  ~SharedBuffer() {
    if (handle_ != nullptr) {
      EXPECT_EQ(weftCommDeregister(comm_, handle_), weftSuccess);
    }
    EXPECT_EQ(weftMemFree(data_), weftSuccess);
  }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(data_);
  }

 private:
  weftComm_t comm_;
  void* data_ = nullptr;
  void* handle_ = nullptr;
};

// Case memory from two shared buffers (output, separate input).
CaseMemory memory_of(const SharedBuffer& out, const SharedBuffer& in, size_t capacity) {
  return [&out, &in, capacity](int slot, size_t bytes) {
    EXPECT_LE(bytes, capacity);
    return slot == 0 ? out.get() : in.get();
  };
}

// The collectives that read registered buffers in place.
const Collective kZeroCopy[] = {Collective::AllReduce, Collective::Reduce, Collective::AllGather,
                                Collective::Broadcast};

// Runs every dtype/op of `collectives` on `comm`; reports up to 5 failures.
void run_cases(weftComm_t comm, const RankContext& context, std::span<const Collective> collectives,
               std::span<const size_t> counts, std::span<const bool> places,
               const CaseMemory& memory) {
  int failures = 0;
  for (Collective collective : collectives)
    for (size_t count : counts)
      for (bool in_place : places)
        for (const auto& [dtype, op] : dtype_ops(collective)) {
          Case c{collective, dtype, op, count, in_place, static_cast<int>(count % context.nranks)};
          std::string error = run_case(comm, c, context.rank, context.nranks, memory);
          if (!error.empty() && ++failures <= 5)
            ADD_FAILURE() << "rank " << context.rank << " " << algo::collective_name(collective)
                          << " count " << count << " dtype " << dtype << " op " << op
                          << (in_place ? " in-place: " : ": ") << error;
        }
}

TEST(MemAlloc, ErrorsAndReuse) {
  void* p = nullptr;
  EXPECT_EQ(weftMemAlloc(nullptr, 64), weftInvalidArgument);
  EXPECT_TRUE(contains(weftGetLastError(nullptr), "ptr")) << weftGetLastError(nullptr);
  EXPECT_EQ(weftMemAlloc(&p, 0), weftInvalidArgument);
  EXPECT_TRUE(contains(weftGetLastError(nullptr), "size")) << weftGetLastError(nullptr);
  EXPECT_EQ(weftMemFree(nullptr), weftInvalidArgument);
  EXPECT_TRUE(contains(weftGetLastError(nullptr), "ptr")) << weftGetLastError(nullptr);
  int on_stack = 0;
  EXPECT_EQ(weftMemFree(&on_stack), weftInvalidArgument);
  EXPECT_TRUE(contains(weftGetLastError(nullptr), "weftMemAlloc")) << weftGetLastError(nullptr);

  // More than /dev/shm holds: an error naming it, and nothing left behind.
  EXPECT_EQ(weftMemAlloc(&p, size_t{1} << 50), weftSystemError);
  EXPECT_TRUE(contains(weftGetLastError(nullptr), "/dev/shm")) << weftGetLastError(nullptr);
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(weft_segments(getpid(), kMemPrefix).empty());

  const long page = sysconf(_SC_PAGESIZE);
  for (int round = 0; round < 3; ++round) {
    void* a = nullptr;
    void* b = nullptr;
    ASSERT_EQ(weftMemAlloc(&a, 10), weftSuccess) << weftGetLastError(nullptr);
    ASSERT_EQ(weftMemAlloc(&b, 3 * page + 1), weftSuccess) << weftGetLastError(nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % page, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % page, 0u);
    memset(a, 1, 10);
    memset(b, 2, 3 * page + 1);
    EXPECT_EQ(static_cast<uint8_t*>(a)[9], 1);
    // Linked while allocated (peers open them by name).
    EXPECT_EQ(weft_segments(getpid(), kMemPrefix).size(), 2u);
    EXPECT_EQ(weftMemFree(static_cast<uint8_t*>(b) + 1), weftInvalidArgument);
    EXPECT_EQ(weftMemFree(b), weftSuccess) << weftGetLastError(nullptr);
    EXPECT_EQ(weftMemFree(b), weftInvalidArgument) << "double free";
    EXPECT_EQ(weftMemFree(a), weftSuccess) << weftGetLastError(nullptr);
    EXPECT_TRUE(weft_segments(getpid(), kMemPrefix).empty());
  }
}

TEST_F(NoLeftovers, RegisterErrors) {
  run_ranks(1, [](const RankContext& context) {
    weftComm_t comm = init_comm(context);
    weftComm_t other = nullptr;
    ASSERT_EQ(weftCommSplit(comm, 0, 0, &other, nullptr), weftSuccess);
    std::vector<uint8_t> host(100);
    void* handle = nullptr;
    EXPECT_NE(weftCommRegister(nullptr, host.data(), host.size(), &handle), weftSuccess);
    EXPECT_EQ(weftCommRegister(comm, nullptr, host.size(), &handle), weftInvalidArgument);
    EXPECT_TRUE(contains(weftGetLastError(comm), "buff")) << weftGetLastError(comm);
    EXPECT_EQ(weftCommRegister(comm, host.data(), 0, &handle), weftInvalidArgument);
    EXPECT_TRUE(contains(weftGetLastError(comm), "size")) << weftGetLastError(comm);
    EXPECT_EQ(weftCommRegister(comm, host.data(), host.size(), nullptr), weftInvalidArgument);
    EXPECT_TRUE(contains(weftGetLastError(comm), "handle")) << weftGetLastError(comm);

    // Any host memory may be registered.
    ASSERT_EQ(weftCommRegister(comm, host.data(), host.size(), &handle), weftSuccess)
        << weftGetLastError(comm);
    EXPECT_NE(handle, nullptr);
    EXPECT_EQ(weftCommDeregister(other, handle), weftInvalidArgument) << "another comm's handle";
    EXPECT_EQ(weftCommDeregister(comm, nullptr), weftInvalidArgument);
    EXPECT_EQ(weftCommDeregister(comm, handle), weftSuccess) << weftGetLastError(comm);
    EXPECT_EQ(weftCommDeregister(comm, handle), weftInvalidArgument);
    EXPECT_TRUE(contains(weftGetLastError(comm), "not registered")) << weftGetLastError(comm);
    EXPECT_EQ(weftCommDestroy(other), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_NE(weftCommRegister(comm, host.data(), host.size(), &handle), weftSuccess);
  });
}

class ZeroCopyMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

// Counts 0, 1, 7 and past the (4 KiB) staging; in and out of place (in-place
// reductions are staged, the rest read in place).
TEST_P(ZeroCopyMatrix, ExactInAndOutOfPlace) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}, {"WEFT_SHM_ZERO_COPY_BYTES", "0"}};
  run_ranks(
      GetParam(),
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const size_t counts[] = {0, 1, 7, kStagingBytes + 5};
        const bool places[] = {false, true};
        const size_t capacity = context.nranks * (kStagingBytes + 5) * sizeof(double) + 1;
        {
          SharedBuffer out(comm, capacity), in(comm, capacity);
          run_cases(comm, context, kZeroCopy, counts, places, memory_of(out, in, capacity));
        }
        // Every peer's input was read in place from its own segment.
        EXPECT_EQ(mapped_peer_pids().size(), static_cast<size_t>(context.nranks - 1));
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        EXPECT_TRUE(mapped_peer_pids().empty()) << "peer segments stay mapped after destroy";
      },
      options);
}
INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopyMatrix, ::testing::Values(2, 3, 4));

// A small message is staged; one 4096 times the staging is read in place in
// one step: the peers' segments are mapped (a staged op never maps them) and
// the sums are exact.
TEST_F(NoLeftovers, LargeMessageIsReadInPlace) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}};
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const size_t count = kStagingBytes * 1024;  // int32: 16 MiB
        {
          SharedBuffer in(comm, count * sizeof(int32_t)), out(comm, count * sizeof(int32_t));
          for (size_t i = 0; i < count; ++i)
            in.get<int32_t>()[i] = static_cast<int32_t>(pattern_value(context.rank, i));
          // Below WEFT_SHM_ZERO_COPY_BYTES (default 8 KiB), staged.
          ASSERT_EQ(weftAllReduce(in.get(), out.get(), 7, weftInt32, weftSum, comm, nullptr),
                    weftSuccess);
          EXPECT_TRUE(mapped_peer_pids().empty());
          ASSERT_EQ(weftAllReduce(in.get(), out.get(), count, weftInt32, weftSum, comm, nullptr),
                    weftSuccess)
              << weftGetLastError(comm);
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < context.nranks; ++q) want += pattern_value(q, i);
            wrong += out.get<int32_t>()[i] != want;
          }
          EXPECT_EQ(wrong, 0u);
          EXPECT_EQ(mapped_peer_pids().size(), static_cast<size_t>(context.nranks - 1));
        }
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Ranks that read each other's registered inputs in place but pass different counts: each
// sees a peer's offer of the wrong size, and every rank returns an error (none reads past a
// peer's input, crashes or waits for the timeout), the first call of a wait and the polls
// after it alike.
TEST_F(NoLeftovers, MismatchedCountsReadInPlaceFailEveryRank) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}, {"WEFT_SHM_ZERO_COPY_BYTES", "0"}};
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot, 20000);
        const size_t count = 1024 * static_cast<size_t>(context.rank + 1);
        {
          SharedBuffer in(comm, count * sizeof(int32_t)), out(comm, count * sizeof(int32_t));
          for (size_t i = 0; i < count; ++i) in.get<int32_t>()[i] = 1;
          const auto start = std::chrono::steady_clock::now();
          EXPECT_NE(weftAllReduce(in.get(), out.get(), count, weftInt32, weftSum, comm, nullptr),
                    weftSuccess);
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
              << "the mismatch waited for the timeout";
          EXPECT_NE(std::string(weftGetLastError(comm)), "");
        }
        weftCommAbort(comm);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Rank 1's input is ordinary memory, rank 2's is weftMemAlloc memory it did
// not register: every op is staged (nobody maps a peer), still exact.
TEST_F(NoLeftovers, MixedRegistrationsAreStaged) {
  RunOptions options;
  options.env = {{"WEFT_SHM_BYTES", kSmallStaging}, {"WEFT_SHM_ZERO_COPY_BYTES", "0"}};
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const size_t counts[] = {7, kStagingBytes + 5};
        const bool places[] = {false};
        const size_t capacity = context.nranks * (kStagingBytes + 5) * sizeof(double) + 1;
        {
          bool registered = context.rank != 2;
          SharedBuffer out(comm, capacity, registered), in(comm, capacity, registered);
          CaseMemory memory = context.rank == 1 ? CaseMemory{} : memory_of(out, in, capacity);
          // (Broadcast is left out: it needs only the root's buffer registered.)
          const Collective collectives[] = {Collective::AllReduce, Collective::Reduce,
                                            Collective::AllGather};
          run_cases(comm, context, collectives, counts, places, memory);
        }
        EXPECT_TRUE(mapped_peer_pids().empty()) << "an op was read in place";
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Queued on a stream (run by the progress thread), one after the other.
TEST_F(NoLeftovers, StreamQueuedOpsReadInPlace) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t world = init_comm(context);
    weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
    const size_t count = 8192, ops = 8;
    {
      SharedBuffer in(comm, ops * count * sizeof(int32_t)),
          out(comm, ops * count * sizeof(int32_t));
      int32_t* input = in.get<int32_t>();
      int32_t* output = out.get<int32_t>();
      for (size_t i = 0; i < ops * count; ++i)
        input[i] = static_cast<int32_t>(pattern_value(context.rank, i));
      weftStream_t stream = nullptr;
      ASSERT_EQ(weftStreamCreate(&stream), weftSuccess);
      for (size_t op = 0; op < ops; ++op)
        ASSERT_EQ(weftAllReduce(input + op * count, output + op * count, count, weftInt32, weftMax,
                                comm, stream),
                  weftSuccess);
      ASSERT_EQ(weftStreamSynchronize(stream), weftSuccess) << weftGetLastError(comm);
      EXPECT_EQ(weftStreamDestroy(stream), weftSuccess);
      size_t wrong = 0;
      for (size_t i = 0; i < ops * count; ++i) {
        int64_t want = pattern_value(0, i);
        for (int q = 1; q < context.nranks; ++q) want = std::max(want, pattern_value(q, i));
        wrong += output[i] != want;
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(mapped_peer_pids().size(), static_cast<size_t>(context.nranks - 1));
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(world), weftSuccess);
  });
}

// Each rank rewrites its input the moment a call returns: had a rank returned
// while a peer still read its input, that peer would see the next values.
TEST_F(NoLeftovers, InputRewrittenRightAfterReturn) {
  run_ranks(3, [](const RankContext& context) {
    weftComm_t world = init_comm(context);
    weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
    const int n = context.nranks;
    const size_t count = 1 << 16;
    auto value = [](int q, int iteration, size_t i) {
      return static_cast<int32_t>(pattern_value(q, i) + 1000 * iteration);
    };
    {
      SharedBuffer in(comm, count * sizeof(int32_t)), out(comm, n * count * sizeof(int32_t));
      int32_t* input = in.get<int32_t>();
      int32_t* output = out.get<int32_t>();
      for (size_t i = 0; i < count; ++i) input[i] = value(context.rank, 0, i);
      size_t wrong = 0;
      for (int iteration = 0; iteration < 30; ++iteration) {
        Collective collective = kZeroCopy[iteration % 4];
        int root = iteration % n;
        weftResult_t result = weftInternalError;
        switch (collective) {
          case Collective::AllReduce:
            result = weftAllReduce(input, output, count, weftInt32, weftSum, comm, nullptr);
            break;
          case Collective::Reduce:
            result = weftReduce(input, output, count, weftInt32, weftSum, root, comm, nullptr);
            break;
          case Collective::AllGather:
            result = weftAllGather(input, output, count, weftInt32, comm, nullptr);
            break;
          default:
            result = weftBroadcast(input, output, count, weftInt32, root, comm, nullptr);
            break;
        }
        ASSERT_EQ(result, weftSuccess) << weftGetLastError(comm);
        for (size_t i = 0; i < count; ++i) input[i] = value(context.rank, iteration + 1, i);
        for (size_t i = 0; i < count; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < n; ++q) sum += value(q, iteration, i);
          switch (collective) {
            case Collective::AllReduce:
              wrong += output[i] != sum;
              break;
            case Collective::Reduce:
              wrong += context.rank == root && output[i] != sum;
              break;
            case Collective::AllGather:
              for (int q = 0; q < n; ++q) wrong += output[q * count + i] != value(q, iteration, i);
              break;
            default:
              wrong += output[i] != value(root, iteration, i);
              break;
          }
        }
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(mapped_peer_pids().size(), static_cast<size_t>(n - 1));
    }
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
    EXPECT_EQ(weftCommDestroy(world), weftSuccess);
  });
}

// The C++ wrappers: memory and registration released with their objects.
TEST_F(NoLeftovers, CppWrappers) {
  RunOptions options;
  options.env = {{"WEFT_ALGO", "allreduce:oneshot"}};
  run_ranks(
      2,
      [](const RankContext& context) {
        weft::Comm comm =
            weft::Comm::init(context.nranks, weft::UniqueId::from_bytes(context.id), context.rank);
        const size_t count = 4096;
        {
          weft::SharedMemory in(count * sizeof(float)), out(count * sizeof(float));
          weft::Registration in_registered(comm, in), out_registered(comm, out);
          EXPECT_EQ(weft_segments(getpid(), kMemPrefix).size(), 2u);
          std::span<float> x = in.as<float>(), y = out.as<float>();
          ASSERT_EQ(x.size(), count);
          for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(context.rank + i);
          ASSERT_EQ(
              weftAllReduce(x.data(), y.data(), count, weftFloat32, weftSum, comm.get(), nullptr),
              weftSuccess);
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) wrong += y[i] != static_cast<float>(1 + 2 * i);
          EXPECT_EQ(wrong, 0u);
          EXPECT_EQ(mapped_peer_pids().size(), 1u);
        }
        EXPECT_TRUE(weft_segments(getpid(), kMemPrefix).empty());
        EXPECT_THROW(weft::SharedMemory(0), weft::Error);
      },
      options);
}

// Names still allocated at exit are removed then; a killed process's names
// stay until the next process's first weftMemAlloc removes them.
TEST_F(NoLeftovers, ExitAndKilledProcessLeaveNothing) {
  RunOptions plain;
  plain.make_unique_id = false;
  run_ranks(
      1,
      [](const RankContext&) {
        void* kept[2];
        for (void*& p : kept) ASSERT_EQ(weftMemAlloc(&p, 4096), weftSuccess);
        EXPECT_EQ(weft_segments(getpid(), kMemPrefix).size(), 2u);
      },
      plain);
  EXPECT_TRUE(weft_segments(0, kMemPrefix).empty()) << "not removed at exit";

  RunOptions killed = plain;
  killed.expected = {ExpectedEnd{0, SIGKILL}};
  run_ranks(
      1,
      [](const RankContext&) {
        void* p = nullptr;
        ASSERT_EQ(weftMemAlloc(&p, 4096), weftSuccess);
        raise(SIGKILL);
      },
      killed);
  EXPECT_EQ(weft_segments(0, kMemPrefix).size(), 1u) << "the killed process left its segment";
  run_ranks(
      1,
      [](const RankContext&) {
        void* p = nullptr;
        ASSERT_EQ(weftMemAlloc(&p, 4096), weftSuccess);
        EXPECT_TRUE(weft_segments(0, kMemPrefix).empty()) << "not swept by the first alloc";
        EXPECT_EQ(weftMemFree(p), weftSuccess);
      },
      plain);
}

}  // namespace
}  // namespace weft::testing
