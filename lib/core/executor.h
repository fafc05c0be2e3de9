// The host executor: runs programs (algorithms/schedule.h) on real buffers
// over the communicator's transport. Every Weft operation, a single Send as
// much as an AllReduce, is a Job; a group runs its jobs together in one
// progress loop, so they overlap and none can wait on another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "algorithms/schedule.h"
#include "common/status.h"
#include "core/communicator.h"
#include "core/program.h"
#include "core/reduce/reduce.h"

namespace weft {

// What a job computes with, beyond moving bytes.
struct JobMath {
  weftDataType_t dtype = weftUint8;
  reduce::Op op = reduce::Op::Sum;
  size_t element_size = 1;
  // Avg: divide this Output range by `divisor` once the program is done.
  uint64_t divide_offset = 0, divide_count = 0, divisor = 0;
};

struct Job {
  Communicator* comm = nullptr;
  // The program, or null for a lone Send/Recv described by `single_step`
  // (point-to-point calls, which then need no program of their own).
  const CompiledProgram* program = nullptr;
  algo::Step single_step;
  std::byte* input = nullptr;
  std::byte* output = nullptr;
  JobMath math;
  TagKind tag_kind = TagKind::Collective;
  // Tag sequence of message k with a peer: sequence_base + k.
  uint64_t sequence_base = 0;
};

// Jobs about to run together, with what they own: programs built for one
// call only (AllToAllv) and staged inputs (pre-multiplied sums).
struct JobBatch {
  std::vector<Job> jobs;
  std::vector<std::unique_ptr<CompiledProgram>> programs;
  std::vector<std::unique_ptr<std::byte[]>> staging;
  void clear() {
    jobs.clear();
    programs.clear();
    staging.clear();
  }
};

// Runs every job to completion, concurrently. Scratch comes from each
// communicator's arena. Fails when any communicator fails or nothing
// completes within a communicator's timeout.
Status run_jobs(std::span<Job> jobs);

}  // namespace weft
