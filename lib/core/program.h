// Programs prepared for execution, and the per-communicator cache of them:
// building a schedule is done once per (collective, algorithm, shape).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"
#include "common/status.h"

namespace weft {

// Message k of a collective with a peer carries tag sequence (c << 20) + k,
// for the collective's sequence number c.
inline constexpr uint32_t kMaxMessagesPerPeer = 1u << 20;
// A job that runs a second program (executor.h, JobStage) numbers that
// one's messages from here: the first stays below, the second above.
inline constexpr uint32_t kSecondStageMessages = kMaxMessagesPerPeer / 2;

// A program plus what the executor needs to run it: who waits on whom, and
// which message between a pair of ranks each Send/Recv is (its tag).
struct CompiledProgram {
  algo::Program program;
  std::vector<uint32_t> dependents_begin;  // CSR: steps unlocked by step i
  std::vector<uint32_t> dependents;
  std::vector<uint32_t> message_index;  // k-th message to/from that peer, per step
  uint32_t max_messages_per_peer = 0;
};

Status compile_program(algo::Program program, CompiledProgram* out);
// Builds and compiles the program for `params`.
Status build_program(const algo::Params& params, std::shared_ptr<const CompiledProgram>* out);

class ProgramCache {
 public:
  // The cached program for `params` (all but AllToAllv, whose counts vary),
  // building and compiling it on first use. Shared: a queued stream
  // operation keeps its program alive even if the cache lets it go.
  Status get(const algo::Params& params, std::shared_ptr<const CompiledProgram>* out);

 private:
  using Key = std::tuple<int, int, int, uint64_t, uint64_t, bool>;
  static constexpr size_t kMaxEntries = 512;
  std::map<Key, std::shared_ptr<const CompiledProgram>> entries_;
};

}  // namespace weft
