// Text of weft-perf's output: the nccl-tests table layout, or JSON lines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "options.h"

namespace weft::perf {

// One placement's figures, already combined over the ranks.
struct Measurement {
  double time_us = 0;
  double algbw = 0;              // GB/s
  double busbw = 0;              // GB/s
  std::optional<int64_t> wrong;  // nullopt when not checked
};

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  const char* type = "";
  const char* redop = "";
  int root = -1;
  Measurement out_of_place;
  Measurement in_place;
  // What the library's tuner chose for the out-of-place call ("" when not
  // known) and its cost model's predicted time (negative: none).
  std::string algorithm{};
  double predicted_us = -1;
};

struct RankLine {
  int rank;
  int pid;
  std::string host;
  int device = -1;  // the CUDA device of a GPU run, else -1 (the CPU)
};

// Everything above the first row: version, parameters, one line per rank, column titles.
// `note`: lines (each starting "# ") set before the column titles, e.g. a GPU run's ceiling.
std::string format_header(const Options& options, int nranks, int library_version,
                          const std::vector<RankLine>& ranks, const std::string& note = "");
// The table row, then (when the algorithm is known) a comment line with the
// algorithm and the model's prediction, so nccl-tests parsers see the usual columns.
std::string format_row(const Row& row);
std::string format_json_row(const Row& row, const std::string& collective, int nranks);
// avg_busbw: mean busbw over every row and both placements.
std::string format_footer(int64_t wrong_total, double avg_busbw);

}  // namespace weft::perf
