#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "weft/weft.h"

namespace weft::perf {

namespace {

// printf into a std::string.
[[gnu::format(printf, 1, 2)]] std::string format(const char* pattern, ...) {
  va_list args;
  va_start(args, pattern);
  va_list copy;
  va_copy(copy, args);
  const int length = std::vsnprintf(nullptr, 0, pattern, copy);
  va_end(copy);
  std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
  std::vsnprintf(text.data(), text.size() + 1, pattern, args);
  va_end(args);
  return text;
}

// Column layout shared by the titles and the rows, so they line up by construction:
// size count type redop root, then per placement time algbw busbw #wrong.
struct Cells {
  std::string time, algbw, busbw, wrong;
};

std::string row_columns(const std::string& size, const std::string& count, const std::string& type,
                        const std::string& redop, const std::string& root) {
  return format("%12s  %12s  %8s  %6s  %6s", size.c_str(), count.c_str(), type.c_str(),
                redop.c_str(), root.c_str());
}

std::string placement_columns(const Cells& cells) {
  return format("  %7s  %6s  %6s  %6s", cells.time.c_str(), cells.algbw.c_str(),
                cells.busbw.c_str(), cells.wrong.c_str());
}

// Keeps about four significant digits for any duration.
std::string format_time(double us) {
  if (us >= 10000) return format("%7.0f", us);
  if (us >= 100) return format("%7.1f", us);
  return format("%7.2f", us);
}

std::string format_wrong(const std::optional<int64_t>& wrong) {
  return wrong ? format("%lld", static_cast<long long>(*wrong)) : "N/A";
}

Cells cells(const Measurement& m) {
  return {format_time(m.time_us), format("%6.2f", m.algbw), format("%6.2f", m.busbw),
          format_wrong(m.wrong)};
}

// Pads text to width, centred.
std::string centered(const std::string& text, size_t width) {
  const size_t left = text.size() < width ? (width - text.size()) / 2 : 0;
  std::string line(left, ' ');
  line += text;
  if (line.size() < width) line.append(width - line.size(), ' ');
  return line;
}

// A title line: '#' in the first column, no trailing blanks.
std::string title_line(std::string line) {
  line[0] = '#';
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line + "\n";
}

std::string json_measurement(const Measurement& m) {
  const std::string wrong = m.wrong ? format_wrong(m.wrong) : "null";
  return format("{\"time_us\":%.6g,\"algbw_gbps\":%.6g,\"busbw_gbps\":%.6g,\"wrong\":%s}",
                m.time_us, m.algbw, m.busbw, wrong.c_str());
}

}  // namespace

std::string format_header(const Options& options, int nranks, int library_version,
                          const std::vector<RankLine>& ranks, const std::string& note) {
  std::string text = format("# weft-perf version %d.%d.%d weft-headers=%d weft-library=%d\n",
                            WEFT_MAJOR, WEFT_MINOR, WEFT_PATCH, WEFT_VERSION, library_version);
  text += format("# Collective test starting: %s\n", options.collective.c_str());
  const bool by_factor = options.step_factor > 1;
  text += format(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: 1 validation: %d graph: 0\n",
      options.min_bytes, options.max_bytes, by_factor ? options.step_factor : options.step_bytes,
      by_factor ? "factor" : "bytes", options.warmup_iters, options.iters, options.check ? 1 : 0);
  const std::string forced = forced_algorithm(options);
  const std::string algorithm = forced.empty() ? "default" : "WEFT_ALGO=" + forced;
  text += format("# nRanks %d average: %d blocking: %d timeout: %d algorithm: %s\n", nranks,
                 static_cast<int>(options.average), options.blocking, options.timeout_s,
                 algorithm.c_str());
  text += "#\n# Using devices\n";
  for (const RankLine& rank : ranks)
    text += format("#  Rank %2d Group  0 Pid %6d on %10s device %3d [%s]\n", rank.rank, rank.pid,
                   rank.host.c_str(), rank.device, rank.device < 0 ? "cpu" : "gpu");
  text += "#\n" + note;
  const size_t prefix_width = row_columns("", "", "", "", "").size();
  const size_t placement_width = placement_columns({}).size();
  text += title_line(std::string(prefix_width, ' ') + centered("out-of-place", placement_width) +
                     centered("in-place", placement_width));
  text += title_line(row_columns("size", "count", "type", "redop", "root") +
                     placement_columns({"time", "algbw", "busbw", "#wrong"}) +
                     placement_columns({"time", "algbw", "busbw", "#wrong"}));
  text += title_line(row_columns("(B)", "(elements)", "", "", "") +
                     placement_columns({"(us)", "(GB/s)", "(GB/s)", ""}) +
                     placement_columns({"(us)", "(GB/s)", "(GB/s)", ""}));
  return text;
}

std::string format_row(const Row& row) {
  std::string text = row_columns(std::to_string(row.bytes), std::to_string(row.count), row.type,
                                 row.redop, std::to_string(row.root)) +
                     placement_columns(cells(row.out_of_place)) +
                     placement_columns(cells(row.in_place)) + "\n";
  if (row.algorithm.empty()) return text;
  text += format("#  ^ algorithm %s", row.algorithm.c_str());
  if (row.predicted_us > 0)
    text += format(", predicted %.4g us, measured/predicted %.2f", row.predicted_us,
                   row.out_of_place.time_us / row.predicted_us);
  return text + "\n";
}

std::string format_json_row(const Row& row, const std::string& collective, int nranks) {
  return format(
      "{\"collective\":\"%s\",\"nranks\":%d,\"size_bytes\":%zu,\"count\":%zu,\"type\":\"%s\","
      "\"redop\":\"%s\",\"root\":%d,\"out_of_place\":%s,\"in_place\":%s,\"algorithm\":\"%s\","
      "\"predicted_us\":%.6g}\n",
      collective.c_str(), nranks, row.bytes, row.count, row.type, row.redop, row.root,
      json_measurement(row.out_of_place).c_str(), json_measurement(row.in_place).c_str(),
      row.algorithm.c_str(), row.predicted_us);
}

std::string format_footer(int64_t wrong_total, double avg_busbw) {
  return format("# Out of bounds values : %lld %s\n# Avg bus bandwidth    : %g \n#\n",
                static_cast<long long>(wrong_total), wrong_total == 0 ? "OK" : "FAILED", avg_busbw);
}

}  // namespace weft::perf
