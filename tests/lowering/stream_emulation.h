// Host emulation of lowered stream-operation lists (algorithms/lowering.h):
// one thread per rank plays its stream, std::atomic<uint64_t> counters play
// the flags, memcpy the copies and Weft's host reduction kernels the
// reduction kernels. It checks orchestration only (ordering, flow control,
// deadlock freedom), not CUDA: every wait has a timeout, every access is
// bounds-checked, and a copy into a peer's slot that still holds an
// unconsumed chunk fails the run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/lowering.h"
#include "core/reduce/reduce.h"

namespace weft::test {

// One operation's buffers on one rank. Input and output may alias (in place).
struct OpBuffers {
  std::byte* input = nullptr;
  uint64_t input_bytes = 0;
  std::byte* output = nullptr;
  uint64_t output_bytes = 0;
  std::vector<std::byte> scratch;
};

// One operation of the emulated communicator: every rank's list and buffers.
struct EmulatedOp {
  std::vector<algo::LoweredProgram> lists;  // per rank
  std::vector<OpBuffers> buffers;           // per rank
  weftDataType_t dtype = weftUint64;
  reduce::Op op = reduce::Op::Sum;
};

class StreamEmulation {
 public:
  // `first_sequence` numbers the first operation; each further one is the next.
  StreamEmulation(int nranks, const algo::LowerConfig& config, uint64_t first_sequence,
                  int64_t wait_timeout_ms);

  // Runs `ops` in order on every rank's stream (no barrier between
  // operations: a rank may start the next while its peers finish this one).
  // False with the first failure in *error, naming the rank and the op.
  bool run(std::vector<EmulatedOp>& ops, std::string* error);

  // Chunks copied into peers' slots over all runs (instrumentation).
  uint64_t slot_writes() const { return slot_writes_.load(); }

 private:
  struct Rank {
    // A waiter sleeps on its own rank's condition; writers of its flags wake it.
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::byte> inbound;                     // [sender][slot][byte]
    std::unique_ptr<std::atomic<uint64_t>[]> flags;     // [Flag][peer]
    std::unique_ptr<std::atomic<uint8_t>[]> slot_full;  // [sender][slot]
  };

  bool run_rank(int r, std::vector<EmulatedOp>& ops);
  bool execute(int r, size_t op_index, uint64_t sequence, size_t step, const algo::StreamOp& op,
               EmulatedOp& emulated);
  std::byte* address(int r, EmulatedOp& emulated, const algo::Loc& loc, uint64_t bytes,
                     const std::string& where);
  std::atomic<uint64_t>& flag(int owner, algo::Flag which, int peer) {
    return ranks_[owner].flags[static_cast<int>(which) * nranks_ + peer];
  }
  void fail(const std::string& message);

  const int nranks_;
  const algo::LowerConfig config_;
  uint64_t next_sequence_;
  const int64_t wait_timeout_ms_;
  std::vector<Rank> ranks_;
  std::mutex error_mutex_;  // guards error_
  std::atomic<bool> failed_{false};
  std::string error_;
  std::atomic<uint64_t> slot_writes_{0};
};

}  // namespace weft::test
