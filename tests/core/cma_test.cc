// Direct collectives reading peers' ordinary (unregistered) buffers by
// cross-memory attach: exact results at several rank counts, counts, dtypes,
// in and out of place; proof that the path was taken (each rank counts the
// peer inputs it read by CMA in its TRACE log and compares that with the
// number the cases call for); the WEFT_SHM_CMA_BYTES threshold; CMA and
// mapped offers in one op; inputs rewritten the moment a call returns; a
// killed peer; a rank that may not use CMA turns it off for all.
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "core/direct.h"
#include "support/direct_cases.h"
#include "support/multirank.h"
#include "support/trace_logs.h"
#include "support/typed_values.h"
#include "weft/weft.h"

namespace weft::testing {
namespace {

using algo::Collective;

constexpr const char* kSmallStaging = "4096";
constexpr size_t kStagingBytes = 4096;

// Logs of ranks whose staging is small (kSmallStaging).
class CmaLogs : public TraceLogs {
 public:
  CmaLogs() : TraceLogs({{"WEFT_SHM_BYTES", kSmallStaging}}) {}
};

// Peer inputs this process read by CMA so far, from its own log.
int cma_reads_logged() {
  return static_cast<int>(logged_sum("read in place, cma="));
}

// AllReduces this process read in two phases so far, from its own log.
int two_phase_ops_logged() {
  return static_cast<int>(logged_lines(", in two phases"));
}

// A cache so large that no out-of-place AllReduce here outgrows half of it (one-shot reads).
const TraceLogs::Env::value_type kLargeCache{"WEFT_CACHE_BYTES", "1G"};

// Ops this process timed to choose between CMA and staging (WEFT_SHM_CMA_BYTES unset), by
// the way they went, from its own log.
int chosen_ops_logged(bool read_in_place) {
  return static_cast<int>(
      logged_lines(read_in_place ? "bytes read in place took" : "bytes staged took"));
}

// From now on process_vm_readv fails with EPERM in this process, as it does
// under Yama's ptrace_scope 1 or in a container without the capability.
void refuse_cross_memory_attach() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  ASSERT_EQ(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
  ASSERT_EQ(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program), 0);
}

// Peer inputs a rank reads by CMA in case `c` when every input is ordinary memory.
int cma_reads_expected(const Case& c, int rank, int n) {
  if (c.count == 0) return 0;
  switch (c.collective) {
    case Collective::AllGather:
      return n - 1;
    case Collective::Broadcast:
      return rank == c.root ? 0 : 1;
    case Collective::AllToAll:  // in place a rank would overwrite blocks peers still read
      return c.in_place ? 0 : n - 1;
    case Collective::AllReduce:  // in place in two phases
      return n - 1;
    default:  // a Reduce is staged
      return 0;
  }
}

// The thresholds WEFT_SHM_CMA_BYTES=`bytes` sets: the same for every collective that takes it.
CmaThresholds uniform(size_t bytes) {
  CmaThresholds thresholds{};
  for (Collective collective :
       {Collective::AllGather, Collective::Broadcast, Collective::AllToAll, Collective::AllReduce})
    thresholds[static_cast<size_t>(collective)] = bytes;
  return thresholds;
}

// Runs every case of `collectives` on `comm`; returns the CMA reads they call
// for under the per-collective thresholds `cma_bytes`, reporting up to 5 wrong results.
// `reading_ops`: where given, the number of those cases in which this rank reads by CMA;
// `two_phase_ops`: of those, the AllReduces in two phases under a kLargeCache (every one
// with `two_shot`, else those in place). `buffer_bound`: an AllToAll whose buffers over the
// ranks exceed it is staged.
int run_cases(weftComm_t comm, const RankContext& context, std::span<const Collective> collectives,
              std::span<const size_t> counts, const CmaThresholds& cma_bytes,
              int* reading_ops = nullptr, int* two_phase_ops = nullptr, bool two_shot = false,
              uint64_t buffer_bound = UINT64_MAX) {
  int failures = 0, expected = 0;
  for (Collective collective : collectives)
    for (size_t count : counts)
      for (bool in_place : {false, true})
        for (const auto& [dtype, op] : dtype_ops(collective)) {
          Case c{collective, dtype, op, count, in_place, static_cast<int>(count % context.nranks)};
          std::string error = run_case(comm, c, context.rank, context.nranks);
          if (!error.empty() && ++failures <= 5)
            ADD_FAILURE() << "rank " << context.rank << " " << algo::collective_name(collective)
                          << " count " << count << " dtype " << dtype << " op " << op
                          << (in_place ? " in-place: " : ": ") << error;
          const size_t threshold = cma_bytes[static_cast<size_t>(collective)];
          const uint64_t n = context.nranks, block = count * dtype_size(dtype);
          const bool bounded =
              collective == Collective::AllToAll && 2 * n * n * block > buffer_bound;
          if (threshold != 0 && block >= threshold && !bounded) {
            const int reads = cma_reads_expected(c, context.rank, context.nranks);
            expected += reads;
            if (reading_ops != nullptr && reads > 0) ++*reading_ops;
            // A PreMulSum's input is a scaled copy: out of place.
            if (two_phase_ops != nullptr && reads > 0 && collective == Collective::AllReduce &&
                (two_shot || (in_place && op != kPreMulSum)))
              ++*two_phase_ops;
          }
        }
  return expected;
}

const Collective kAll[] = {Collective::AllGather, Collective::Broadcast, Collective::AllToAll,
                           Collective::AllReduce, Collective::Reduce};

// Runs every case of `collectives` at `counts` on a communicator of `algorithm` over
// `nranks` ranks, every block offered by CMA: exact, every peer read by CMA, and the
// AllReduces in two phases that should be (TwoShot, or in place).
void cma_matrix(int nranks, algo::Algorithm algorithm, std::span<const Collective> collectives,
                std::span<const size_t> counts) {
  CmaLogs logs;
  run_ranks(
      nranks,
      [&](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algorithm);
        int two_phase = 0;
        int expected = run_cases(comm, context, collectives, counts, uniform(1), nullptr,
                                 &two_phase, algorithm == algo::Algorithm::TwoShot);
        EXPECT_GT(expected, 0);
        EXPECT_EQ(cma_reads_logged(), expected);
        EXPECT_GT(two_phase, 0);
        EXPECT_EQ(two_phase_ops_logged(), two_phase);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({{"WEFT_SHM_CMA_BYTES", "1"}, kLargeCache}));
}

class CmaMatrix : public NoLeftovers, public ::testing::WithParamInterface<int> {};

// Counts 0, 1, 7, past the (4 KiB) staging, and past an AllReduce's pieces read by CMA
// (64 KiB: several pieces and a short one for every type): every block read by CMA, an
// in-place AllReduce in two phases (from rank 2 on, its own pieces reduced from a copy).
TEST_P(CmaMatrix, ExactAndReadByCma) {
  const size_t counts[] = {0, 1, 7, kStagingBytes + 5, 5 * 16384 + 3};
  cma_matrix(GetParam(), algo::Algorithm::OneShot, kAll, counts);
}

// TwoShot AllReduces read by CMA run in two phases in and out of place, slices uneven
// (counts under the ranks, odd ones), exact for every dtype and op.
TEST_P(CmaMatrix, TwoShotAllReduceInTwoPhases) {
  const Collective collectives[] = {Collective::AllReduce};
  const size_t counts[] = {0, 1, 3, 7, kStagingBytes + 5, 5 * 16384 + 3};
  cma_matrix(GetParam(), algo::Algorithm::TwoShot, collectives, counts);
}
INSTANTIATE_TEST_SUITE_P(Ranks, CmaMatrix, ::testing::Values(2, 3, 4));

// An AllReduce some of whose ranks are in place runs in two phases on all of them, the
// out-of-place ranks' outputs read by CMA, one rank's buffers registered (mapped offers, in
// place too; its output is still read by CMA in the second phase);
// each rank rewrites its buffers the moment a call returns (a peer still reading them
// would see the next values). Out of place, AllReduces whose inputs over the ranks reach
// half of WEFT_CACHE_BYTES run in two phases too, smaller ones one-shot.
TEST_F(NoLeftovers, AllReduceInTwoPhasesWhenAnyRankIsInPlaceOrLarge) {
  CmaLogs logs;
  constexpr size_t kCache = 256 << 10;  // WEFT_CACHE_BYTES: two phases from 128 KiB in all
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks, me = context.rank;
        const size_t largest = 30000;  // int32: 360 KiB over the ranks
        // Rank 1's buffers are registered: its offers are mapped, in place too.
        void* shared[2] = {};
        void* handles[2] = {};
        std::vector<int32_t> plain_input(largest), plain_output(largest);
        int32_t* input = plain_input.data();
        int32_t* output = plain_output.data();
        for (int b = 0; b < 2 && me == 1; ++b) {
          ASSERT_EQ(weftMemAlloc(&shared[b], largest * sizeof(int32_t)), weftSuccess)
              << weftGetLastError(nullptr);
          ASSERT_EQ(weftCommRegister(comm, shared[b], largest * sizeof(int32_t), &handles[b]),
                    weftSuccess);
        }
        if (me == 1) {
          input = static_cast<int32_t*>(shared[0]);
          output = static_cast<int32_t*>(shared[1]);
        }
        auto value = [](int q, int op, size_t i) {
          return static_cast<int32_t>(pattern_value(q, i) + 1000 * op);
        };
        // Ranks in place by turns (none, rank 0, ranks 1 and 2, all).
        auto in_place_at = [](int q, int op) {
          const int placement = op % 4;
          return placement == 3 || (placement == 1 ? q == 0 : placement == 2 && q > 0);
        };
        size_t wrong = 0;
        int two_phase = 0, cma_reads = 0;
        for (int op = 0; op < 24; ++op) {
          const bool in_place = in_place_at(me, op);
          const size_t count = op % 8 < 4 ? 9001 : largest;  // 108 KiB or 360 KiB in all
          int32_t* send = in_place ? output : input;
          for (size_t i = 0; i < count; ++i) send[i] = value(me, op, i);
          ASSERT_EQ(weftAllReduce(send, output, count, weftInt32, weftSum, comm, nullptr),
                    weftSuccess)
              << weftGetLastError(comm);
          two_phase += op % 4 != 0 || count * n * sizeof(int32_t) >= kCache / 2;
          // Every peer's input is read by CMA but rank 1's registered ones.
          cma_reads += n - 1 - (me != 1);
          std::vector<int32_t> result(output, output + count);
          for (size_t i = 0; i < count; ++i) output[i] = input[i] = value(me, op + 1, i);
          for (size_t i = 0; i < count; ++i) {
            int64_t sum = 0;
            for (int q = 0; q < n; ++q) sum += value(q, op, i);
            wrong += result[i] != static_cast<int32_t>(sum);
          }
        }
        EXPECT_EQ(wrong, 0u);
        EXPECT_EQ(two_phase_ops_logged(), two_phase);
        EXPECT_EQ(cma_reads_logged(), cma_reads);
        for (int b = 0; b < 2 && me == 1; ++b) {
          EXPECT_EQ(weftCommDeregister(comm, handles[b]), weftSuccess);
          EXPECT_EQ(weftMemFree(shared[b]), weftSuccess);
        }
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({{"WEFT_SHM_CMA_BYTES", "1"},
                    {"WEFT_SHM_ZERO_COPY_BYTES", "0"},
                    {"WEFT_CACHE_BYTES", "262144"}}));
}

// Blocks under WEFT_SHM_CMA_BYTES are staged, larger ones read by CMA, untimed (a threshold
// set is kept); 0 turns it off whatever the size. Exact either way.
TEST_F(NoLeftovers, ThresholdSwitchesCmaOff) {
  CmaLogs logs;
  for (const char* threshold : {"4096", "0"}) {
    SCOPED_TRACE(threshold);
    run_ranks(
        3,
        [threshold](const RankContext& context) {
          weftComm_t world = init_comm(context);
          weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
          const Collective collectives[] = {Collective::AllGather, Collective::AllToAll};
          // int8, float16 and float64 blocks on both sides of 4096 bytes.
          const size_t counts[] = {7, 512, 2047, 2048, 4095, 4096, 20000};
          int expected = run_cases(comm, context, collectives, counts, uniform(atoi(threshold)));
          EXPECT_EQ(cma_reads_logged(), expected);
          EXPECT_TRUE(atoi(threshold) == 0 || expected > 0);
          EXPECT_EQ(chosen_ops_logged(true) + chosen_ops_logged(false), 0);
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        logs.options({{"WEFT_SHM_CMA_BYTES", threshold}}));
  }
}

// Unset, the threshold is kAutoCmaBytes while the node has a core per rank, and from there
// each op is timed and read by CMA or staged as the timings choose (all its ranks alike);
// once the ranks outnumber the cores, untimed, only AllToAll blocks from
// kOversubscribedAllToAllCmaBytes whose buffers over the ranks fit WEFT_CACHE_BYTES are read
// by CMA (a read would wait for the peer's time slice twice; staging an AllToAll copies
// each block twice).
TEST_F(NoLeftovers, UnsetThresholdFollowsTheCores) {
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  CmaLogs logs;
  constexpr uint64_t kCache = 4 << 20;
  // Under TSan this test took 80-84 s alone on a 2-core machine (release: 6.6 s), and its
  // oversubscribed run passed 90 s beside other tests.
  RunOptions options = logs.options({{"WEFT_CACHE_BYTES", "4194304"}});
  options.timeout_s = 300;
  int cases = 0;
  for (int nranks : {2, cores + 1}) {
    if (nranks > 8) continue;  // a large machine: the oversubscribed case would take long
    const bool oversubscribed = nranks > cores;
    CmaThresholds thresholds{};
    thresholds[static_cast<size_t>(Collective::AllGather)] = oversubscribed ? 0 : kAutoCmaBytes;
    thresholds[static_cast<size_t>(Collective::AllToAll)] =
        oversubscribed ? kOversubscribedAllToAllCmaBytes : kAutoCmaBytes;
    SCOPED_TRACE("ranks " + std::to_string(nranks));
    ++cases;
    run_ranks(
        nranks,
        [&thresholds, oversubscribed](const RankContext& context) {
          weftComm_t world = init_comm(context);
          weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
          const Collective collectives[] = {Collective::AllGather, Collective::AllToAll};
          // int8, float16 and float64 blocks on both sides of the threshold; oversubscribed,
          // AllToAll blocks within the cache (4096 float64, 65536 int8 and float16) and from
          // 3 ranks past it (65536 float64: 9 MiB of buffers).
          const size_t edge = kAutoCmaBytes;
          const std::vector<size_t> counts =
              oversubscribed
                  ? std::vector<size_t>{7, 4096, 65536}
                  : std::vector<size_t>{7, edge / 8, edge / 2 - 1, edge / 2, edge - 1, edge + 3};
          int reading_ops = 0;
          int expected = run_cases(comm, context, collectives, counts, thresholds, &reading_ops,
                                   nullptr, false, oversubscribed ? kCache : UINT64_MAX);
          EXPECT_GT(expected, 0);
          if (oversubscribed) {
            EXPECT_EQ(chosen_ops_logged(true) + chosen_ops_logged(false), 0);
            EXPECT_EQ(cma_reads_logged(), expected);
          } else {
            // Every op that could read by CMA was timed; those read in place read every peer.
            const int read_in_place = chosen_ops_logged(true);
            EXPECT_EQ(read_in_place + chosen_ops_logged(false), reading_ops);
            EXPECT_EQ(cma_reads_logged(), read_in_place * (context.nranks - 1));
            // Each size's first ops are staged (UnsetThresholdTimesBothWaysOnEveryRankAlike
            // runs enough of one size to reach CMA).
            EXPECT_GT(chosen_ops_logged(false), 0);
          }
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        options);
  }
  EXPECT_GT(cases, 0);
}

// Unset, the first ops of a size run staged, then read by CMA, kWindow counted ops each after
// kCmaWarmup uncounted ones (TimedChoice), on every rank at once: every op is read by CMA on
// all ranks or staged on all, so each rank logs as many ops of each way and reads its peer
// in each CMA op. Out-of-place AllGathers and in-place AllReduces (read in two phases) in
// turn, each with a choice of its own.
TEST_F(NoLeftovers, UnsetThresholdTimesBothWaysOnEveryRankAlike) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "2 ranks on 1 core never read by CMA";
  CmaLogs logs;
  run_ranks(
      2,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const size_t count = kAutoCmaBytes / sizeof(float),
                     per_way = TimedChoice::kWindow + kCmaWarmup;
        std::vector<float> input(count), output(2 * count);
        auto value = [](int q, size_t op, size_t i) {
          return static_cast<float>((q * 5 + op + i) % 251);
        };
        for (size_t op = 0; op < 2 * per_way; ++op) {
          for (size_t i = 0; i < count; ++i) input[i] = value(context.rank, op, i);
          ASSERT_EQ(weftAllGather(input.data(), output.data(), count, weftFloat32, comm, nullptr),
                    weftSuccess);
          for (int q = 0; q < 2; ++q)
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(output[q * count + i], value(q, op, i))
                  << "op " << op << " rank " << q << " element " << i;
          for (size_t i = 0; i < count; ++i) output[i] = value(context.rank, op, i);
          ASSERT_EQ(weftAllReduce(output.data(), output.data(), count, weftFloat32, weftSum, comm,
                                  nullptr),
                    weftSuccess);
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(output[i], value(0, op, i) + value(1, op, i))
                << "in-place AllReduce op " << op << " element " << i;
        }
        EXPECT_EQ(chosen_ops_logged(true), static_cast<int>(2 * per_way));
        EXPECT_EQ(chosen_ops_logged(false), static_cast<int>(2 * per_way));
        EXPECT_EQ(cma_reads_logged(), static_cast<int>(2 * per_way));
        EXPECT_EQ(two_phase_ops_logged(), static_cast<int>(per_way));
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({}));
}

// Each placement and each power of two of block size from the threshold has a choice of its
// own: in-place and out-of-place AllGathers of 8x and 16x the threshold, taken in turn, each
// explore both ways as if alone (kWindow + kCmaWarmup ops of each). One choice shared by
// two of them would have settled on a way after its first 2 (kWindow + kCmaWarmup) ops and
// kept it, logging more ops of that way than of the other.
TEST_F(NoLeftovers, UnsetThresholdChoosesByPlacementAndSize) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "2 ranks on 1 core never read by CMA";
  TraceLogs logs({});
  run_ranks(
      2,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int me = context.rank;
        const size_t per_way = TimedChoice::kWindow + kCmaWarmup, largest = 16 * kAutoCmaBytes;
        std::vector<std::byte> input(largest), output(2 * largest);
        int kinds = 0;
        for (size_t op = 0; op < 2 * per_way; ++op)
          for (size_t bytes : {8 * kAutoCmaBytes, largest})
            for (bool in_place : {false, true}) {
              SCOPED_TRACE("op " + std::to_string(op) + ", " + std::to_string(bytes) + " bytes" +
                           (in_place ? ", in place" : ""));
              kinds += op == 0;
              std::byte* mine = in_place ? output.data() + me * bytes : input.data();
              auto value = [&](int q, size_t i) {
                return static_cast<std::byte>((q * 31 + op * 7 + i + bytes / 1024) % 253);
              };
              for (size_t i = 0; i < bytes; ++i) mine[i] = value(me, i);
              ASSERT_EQ(weftAllGather(mine, output.data(), bytes, weftUint8, comm, nullptr),
                        weftSuccess);
              for (int q = 0; q < 2; ++q)
                for (size_t i = 0; i < bytes; ++i)
                  ASSERT_EQ(output[q * bytes + i], value(q, i)) << "rank " << q << " byte " << i;
            }
        EXPECT_EQ(chosen_ops_logged(true), static_cast<int>(kinds * per_way));
        EXPECT_EQ(chosen_ops_logged(false), static_cast<int>(kinds * per_way));
        EXPECT_EQ(cma_reads_logged(), static_cast<int>(kinds * per_way));
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({}));
}

// Copies from mapped memory in a zero-copy op (a rank's own input: out-of-place AllGather and
// AllToAll, a Broadcast root out of place; peers' registered weftMemAlloc inputs) choose their
// stores from WEFT_SHM_STREAM_BYTES: each rank times such ops, the first 2 * kWindow of a
// kind taking turns between ordinary and streaming stores, and stays exact. With `mapped`
// the inputs and outputs are registered, so peers' blocks are copied too (an in-place
// AllGather's, a Broadcast's non-root); else peers are read by CMA, which the kernel copies,
// and nothing in place is timed. With the floor above the block, or at 0, none is.
void own_copies_choose_stores(bool mapped) {
  CmaLogs logs;
  constexpr size_t kCount = 3000, kBlockBytes = kCount * sizeof(float);
  const std::string block = std::to_string(kBlockBytes), over = std::to_string(kBlockBytes + 1);
  for (const char* floor : {"64", block.c_str(), over.c_str(), "0"}) {
    SCOPED_TRACE(std::string(mapped ? "mapped, " : "CMA, ") + "WEFT_SHM_STREAM_BYTES=" + floor);
    const bool timed = std::stoul(floor) != 0 && std::stoul(floor) <= kBlockBytes;
    run_ranks(
        2,
        [timed, mapped](const RankContext& context) {
          weftComm_t world = init_comm(context);
          weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
          const int n = context.nranks, me = context.rank;
          const size_t ops = 2 * TimedChoice::kWindow, bytes = n * kBlockBytes;
          // Rank q's element i of op k (in AllToAll, i runs over all n blocks).
          auto value = [](int q, size_t k, size_t i) {
            return static_cast<float>((q * 7 + k * 3 + i) % 509);
          };
          std::vector<float> input_vector(n * kCount), output_vector(n * kCount);
          float* input = input_vector.data();
          float* output = output_vector.data();
          void* handles[2] = {};
          if (mapped) {
            float** buffers[2] = {&input, &output};
            for (int b = 0; b < 2; ++b) {
              void* memory = nullptr;
              ASSERT_EQ(weftMemAlloc(&memory, bytes), weftSuccess) << weftGetLastError(nullptr);
              ASSERT_EQ(weftCommRegister(comm, memory, bytes, &handles[b]), weftSuccess);
              *buffers[b] = static_cast<float*>(memory);
            }
          }
          for (size_t k = 0; k < ops; ++k) {
            for (size_t i = 0; i < n * kCount; ++i) input[i] = value(me, k, i);
            ASSERT_EQ(weftAllGather(input, output, kCount, weftFloat32, comm, nullptr),
                      weftSuccess);
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < kCount; ++i)
                ASSERT_EQ(output[q * kCount + i], value(q, k, i)) << "AllGather op " << k;
            // In place: this rank's block is already where it belongs.
            for (size_t i = 0; i < kCount; ++i) output[me * kCount + i] = value(me, k + 1, i);
            ASSERT_EQ(
                weftAllGather(output + me * kCount, output, kCount, weftFloat32, comm, nullptr),
                weftSuccess);
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < kCount; ++i)
                ASSERT_EQ(output[q * kCount + i], value(q, k + 1, i))
                    << "in-place AllGather op " << k;
            ASSERT_EQ(weftAllToAll(input, output, kCount, weftFloat32, comm, nullptr), weftSuccess);
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < kCount; ++i)
                ASSERT_EQ(output[q * kCount + i], value(q, k, me * kCount + i))
                    << "AllToAll op " << k;
            ASSERT_EQ(weftBroadcast(input, output, kCount, weftFloat32, 0, comm, nullptr),
                      weftSuccess);
            for (size_t i = 0; i < kCount; ++i)
              ASSERT_EQ(output[i], value(0, k, i)) << "Broadcast op " << k;
            // In place: the root copies nothing.
            ASSERT_EQ(weftBroadcast(input, input, kCount, weftFloat32, 0, comm, nullptr),
                      weftSuccess);
            for (size_t i = 0; i < kCount; ++i)
              ASSERT_EQ(input[i], value(0, k, i)) << "in-place Broadcast op " << k;
          }
          // Per op, the calls that copy from mapped memory on this rank, and the choices
          // (collectives) they fall to. CMA: rank 0 copies in AllGather, AllToAll and the
          // out-of-place Broadcast, rank 1 in the first two. Mapped: also the in-place
          // AllGather, and rank 1 in both Broadcasts.
          const long copying = mapped ? (me == 0 ? 4 : 5) : (me == 0 ? 3 : 2);
          const long choices = mapped || me == 0 ? 3 : 2;
          const long streamed = logged_lines("blocks read with streaming stores took");
          const long ordinary = logged_lines("blocks read with ordinary stores took");
          if (timed) {
            EXPECT_EQ(streamed + ordinary, copying * static_cast<long>(ops));
            // Each choice's first 2 * kWindow ops take turns.
            EXPECT_GE(streamed, choices * static_cast<long>(TimedChoice::kWindow));
            EXPECT_GE(ordinary, choices * static_cast<long>(TimedChoice::kWindow));
          } else {
            EXPECT_EQ(streamed + ordinary, 0);
          }
          // CMA: per op one AllGather, one in-place AllGather and one AllToAll block from
          // the peer, and each Broadcast's from the root.
          EXPECT_EQ(cma_reads_logged(), mapped ? 0 : static_cast<int>(ops) * (me == 0 ? 3 : 5));
          for (int b = 0; b < 2 && mapped; ++b) {
            void* memory = b == 0 ? static_cast<void*>(input) : static_cast<void*>(output);
            EXPECT_EQ(weftCommDeregister(comm, handles[b]), weftSuccess);
            EXPECT_EQ(weftMemFree(memory), weftSuccess);
          }
          EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
          EXPECT_EQ(weftCommDestroy(world), weftSuccess);
        },
        logs.options({{"WEFT_SHM_CMA_BYTES", "1"}, {"WEFT_SHM_STREAM_BYTES", floor}}));
  }
}

TEST_F(NoLeftovers, OwnBlockCopiesTryStreamingStoresAndStayExact) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "streaming stores are used on x86-64 builds only";
#endif
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "ranks that share a core never stream";
  own_copies_choose_stores(false);
}

TEST_F(NoLeftovers, MappedPeersCopiesTryStreamingStoresAndStayExact) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "streaming stores are used on x86-64 builds only";
#endif
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "ranks that share a core never stream";
  own_copies_choose_stores(true);
}

// One rank that may not read its peers (EPERM) fails the init probe for all:
// every rank says so in its log, reads nothing by CMA, and stays exact.
TEST_F(NoLeftovers, OneRefusingRankTurnsCmaOffForAll) {
  CmaLogs logs;
  RunOptions options = logs.options({{"WEFT_SHM_CMA_BYTES", "1"}});
  options.env.push_back({"WEFT_DEBUG_SUBSYS", "COLL,INIT"});
  run_ranks(
      3,
      [](const RankContext& context) {
        if (context.rank == 1) refuse_cross_memory_attach();
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const Collective collectives[] = {Collective::AllGather, Collective::AllToAll};
        const size_t counts[] = {7, kStagingBytes + 5};
        EXPECT_GT(run_cases(comm, context, collectives, counts, uniform(1)), 0);
        EXPECT_EQ(cma_reads_logged(), 0);
        int refusals = 0;
        for (const std::string& line : own_log())
          refusals += line.find("no cross-memory attach") != std::string::npos;
        EXPECT_GE(refusals, 1) << "rank " << context.rank << " did not log the refusal";
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      options);
}

// Rank 0's input is registered weftMemAlloc memory (a mapped offer), the
// others' are vectors (CMA offers): one op reads both kinds.
TEST_F(NoLeftovers, MappedAndCmaOffersMix) {
  CmaLogs logs;
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks;
        const size_t count = 50000, bytes = n * count * sizeof(int32_t);
        void* shared = nullptr;
        void* handle = nullptr;
        std::vector<int32_t> plain(n * count), output(n * count);
        int32_t* input = plain.data();
        if (context.rank == 0) {
          ASSERT_EQ(weftMemAlloc(&shared, bytes), weftSuccess) << weftGetLastError(nullptr);
          ASSERT_EQ(weftCommRegister(comm, shared, bytes, &handle), weftSuccess);
          input = static_cast<int32_t*>(shared);
        }
        for (size_t i = 0; i < n * count; ++i)
          input[i] = static_cast<int32_t>(pattern_value(context.rank, i));
        ASSERT_EQ(weftAllGather(input, output.data(), count, weftInt32, comm, nullptr), weftSuccess)
            << weftGetLastError(comm);
        size_t wrong = 0;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) wrong += output[q * count + i] != pattern_value(q, i);
        ASSERT_EQ(weftAllToAll(input, output.data(), count, weftInt32, comm, nullptr), weftSuccess)
            << weftGetLastError(comm);
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i)
            wrong += output[q * count + i] != pattern_value(q, context.rank * count + i);
        // An AllReduce reduces rank 0's mapped input with the others' read by CMA.
        ASSERT_EQ(weftAllReduce(input, output.data(), n * count, weftInt32, weftSum, comm, nullptr),
                  weftSuccess)
            << weftGetLastError(comm);
        for (size_t i = 0; i < n * count; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < n; ++q) sum += pattern_value(q, i);
          wrong += output[i] != static_cast<int32_t>(sum);
        }
        EXPECT_EQ(wrong, 0u);
        // Every peer but rank 0 was read by CMA, in the three ops.
        EXPECT_EQ(cma_reads_logged(), 3 * (context.rank == 0 ? n - 1 : n - 2));
        if (context.rank == 0) {
          EXPECT_EQ(weftCommDeregister(comm, handle), weftSuccess);
          EXPECT_EQ(weftMemFree(shared), weftSuccess);
        }
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({{"WEFT_SHM_CMA_BYTES", "1"}, {"WEFT_SHM_ZERO_COPY_BYTES", "0"}}));
}

// Each rank rewrites its input the moment a call returns: had a rank returned
// while a peer still read its input, that peer would see the next values.
TEST_F(NoLeftovers, InputRewrittenRightAfterReturn) {
  CmaLogs logs;
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot);
        const int n = context.nranks;
        const size_t count = 1 << 16;
        auto value = [](int q, int iteration, size_t i) {
          return static_cast<int32_t>(pattern_value(q, i) + 1000 * iteration);
        };
        std::vector<int32_t> input(n * count), output(n * count);
        for (size_t i = 0; i < n * count; ++i) input[i] = value(context.rank, 0, i);
        size_t wrong = 0;
        int expected = 0;
        for (int iteration = 0; iteration < 30; ++iteration) {
          const int kind = iteration % 3, root = iteration % n;
          weftResult_t result =
              kind == 0
                  ? weftAllGather(input.data(), output.data(), count, weftInt32, comm, nullptr)
              : kind == 1
                  ? weftAllToAll(input.data(), output.data(), count, weftInt32, comm, nullptr)
                  : weftBroadcast(input.data(), output.data(), count, weftInt32, root, comm,
                                  nullptr);
          ASSERT_EQ(result, weftSuccess) << weftGetLastError(comm);
          expected += kind < 2 ? n - 1 : context.rank != root;
          for (size_t i = 0; i < n * count; ++i) input[i] = value(context.rank, iteration + 1, i);
          if (kind == 2) {
            for (size_t i = 0; i < count; ++i) wrong += output[i] != value(root, iteration, i);
            continue;
          }
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              wrong += output[q * count + i] !=
                       value(q, iteration, kind == 0 ? i : context.rank * count + i);
        }
        EXPECT_EQ(wrong, 0u);
        EXPECT_EQ(cma_reads_logged(), expected);
        EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
        EXPECT_EQ(weftCommDestroy(world), weftSuccess);
      },
      logs.options({{"WEFT_SHM_CMA_BYTES", "65536"}}));
}

// A rank killed while its peers read its input by CMA: every survivor
// returns an error well within the timeout, from an AllGather or an AllReduce (out of
// place or in place).
TEST_F(NoLeftovers, KilledPeerIsAnErrorOnEverySurvivor) {
  constexpr int kTimeoutMs = 20000;
  CmaLogs logs;
  RunOptions options = logs.options({{"WEFT_SHM_CMA_BYTES", "1"}});
  options.expected.assign(3, ExpectedEnd{});
  options.expected[2].signal = SIGKILL;
  run_ranks(
      3,
      [](const RankContext& context) {
        weftComm_t world = init_comm(context, kTimeoutMs);
        weftComm_t comm = direct_comm(world, context.rank, algo::Algorithm::OneShot, kTimeoutMs);
        const size_t count = 1 << 18;
        std::vector<int32_t> input(count, context.rank), output(context.nranks * count);
        // In place, an AllReduce runs in two phases: a rank may die between them.
        auto call = [&](int op) {
          return op % 3 == 0
                     ? weftAllGather(input.data(), output.data(), count, weftInt32, comm, nullptr)
                     : weftAllReduce(op % 3 == 1 ? input.data() : output.data(), output.data(),
                                     count, weftInt32, weftMax, comm, nullptr);
        };
        for (int op = 0; op < 20; ++op) ASSERT_EQ(call(op), weftSuccess);
        if (context.rank == 2) raise(SIGKILL);
        auto start = std::chrono::steady_clock::now();
        weftResult_t result = weftSuccess;
        for (int op = 0; op < 1000 && result == weftSuccess; ++op) result = call(op);
        EXPECT_NE(result, weftSuccess);
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  kTimeoutMs / 1000.0 / 2)
            << "took too long to notice: " << weftGetLastError(comm);
        EXPECT_GE(cma_reads_logged(), 20 * (context.nranks - 1));
        EXPECT_EQ(weftCommAbort(comm), weftSuccess);
        EXPECT_EQ(weftCommAbort(world), weftSuccess);
      },
      options);
}

}  // namespace
}  // namespace weft::testing
