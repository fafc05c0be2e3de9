// Shared by the direct-algorithm tests: one collective call checked exactly
// against values computed here, the communicators that force an algorithm,
// and the check that no segment outlives its processes in /dev/shm.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/schedule.h"
#include "weft/weft.h"

namespace weft::testing {

constexpr int kPreMulSum = weftNumOps;  // marks the custom op

bool is_reduction(algo::Collective c);

struct Case {
  algo::Collective collective;
  weftDataType_t dtype;
  int op;
  size_t count;
  bool in_place;
  int root;
};

// The dtypes and ops a collective is checked with.
std::vector<std::pair<weftDataType_t, int>> dtype_ops(algo::Collective c);

// Where a case's buffers live (slot 0: the output, slot 1: a separate
// input); empty: vectors of its own.
using CaseMemory = std::function<uint8_t*(int slot, size_t bytes)>;

// Device memory for a case (GPU tests): its buffers are prepared and checked in host memory
// and copied to and from device buffers around the call, which runs on `stream` (then
// synchronised; NULL: the call itself completes).
struct DeviceBuffers {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void*)> free;
  std::function<void(void* device, const void* host, size_t bytes)> to_device;
  std::function<void(void* host, const void* device, size_t bytes)> to_host;
  weftStream_t stream = nullptr;
};

// Runs one case on `comm`; returns "" or what went wrong.
std::string run_case(weftComm_t comm, const Case& c, int rank, int n, const CaseMemory& memory = {},
                     const DeviceBuffers* device = nullptr);

// Segments Weft left in /dev/shm: "<prefix>-<pid>-..." whose pid is `pid`
// (0: any pid no longer alive, i.e. leaked by a process that is gone).
std::vector<std::string> weft_segments(pid_t pid, const char* prefix);

// Checks, around a multi-rank test, that no segment outlives its processes.
class NoLeftovers : public ::testing::Test {
 protected:
  void TearDown() override;
};

// A communicator (split from `parent`) forcing `algorithm` for every collective it implements.
weftComm_t direct_comm(weftComm_t parent, int rank, algo::Algorithm algorithm, int timeout_ms = 0);

}  // namespace weft::testing
