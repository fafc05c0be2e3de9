// weft-perf's command line: nccl-tests' flags, plus the collective's name.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "weft/weft.h"

namespace weft::perf {

// Which rank's time a row reports (nccl-tests' -a).
enum class AverageMode { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

struct Options {
  std::string collective;
  size_t min_bytes = size_t{32} << 20;
  size_t max_bytes = size_t{32} << 20;
  size_t step_bytes = size_t{1} << 20;  // additive step, used while step_factor is 1
  size_t step_factor = 1;
  int iters = 20;
  int warmup_iters = 5;
  bool check = true;
  std::vector<weftRedOp_t> ops{weftSum};
  std::vector<weftDataType_t> dtypes{weftFloat32};
  int root = 0;
  AverageMode average = AverageMode::kMean;
  int blocking = 0;       // accepted and echoed: with no stream every call already blocks
  int timeout_s = 0;      // > 0: the communicator's bound on every wait
  std::string algorithm;  // -A: forced through WEFT_ALGO
  // -R 1: buffers from weftMemAlloc, registered with the communicator.
  bool register_buffers = false;
  // -G: 1 device memory on a GPU communicator (calls on a CUDA stream, as nccl-tests), 0 host
  // memory; -1 (the default): device memory when a CUDA driver and a GPU are there.
  int gpu = -1;
  bool json = false;
  bool help = false;
};

extern const char* const kUsage;

// Parses argv[1..argc); returns the error message on failure.
std::optional<std::string> parse_options(int argc, const char* const* argv, Options* options);

// "8", "64K", "1M", "2G" (binary multiples); nullopt if malformed.
std::optional<size_t> parse_size(const std::string& text);

// The row sizes: min, then times the factor (factor > 1) or plus the step, up to max.
std::vector<size_t> benchmark_sizes(const Options& options);

// The value WEFT_ALGO gets for -A: "collective:algo", unless algo already names one.
std::string forced_algorithm(const Options& options);

const char* op_name(weftRedOp_t op);

}  // namespace weft::perf
