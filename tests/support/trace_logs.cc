#include "support/trace_logs.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace weft::testing {

TraceLogs::TraceLogs(std::initializer_list<Env::value_type> base) : base_(base) {
  char pattern[] = "/tmp/weft-trace-test-XXXXXX";
  EXPECT_NE(mkdtemp(pattern), nullptr);
  dir_ = pattern;
  file_ = dir_ + "/rank-%p.log";
}

TraceLogs::~TraceLogs() {
  std::filesystem::remove_all(dir_);
}

RunOptions TraceLogs::options(const Env& extra) const {
  RunOptions options;
  options.env = {
      {"WEFT_DEBUG", "TRACE"}, {"WEFT_DEBUG_SUBSYS", "COLL"}, {"WEFT_DEBUG_FILE", file_.c_str()}};
  options.env.insert(options.env.end(), base_.begin(), base_.end());
  options.env.insert(options.env.end(), extra.begin(), extra.end());
  return options;
}

std::vector<std::string> own_log() {
  std::string path = getenv("WEFT_DEBUG_FILE");
  path.replace(path.find("%p"), 2, std::to_string(getpid()));
  std::ifstream log(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(line);
  return lines;
}

long logged_sum(const std::string& marker) {
  long sum = 0;
  for (const std::string& line : own_log()) {
    size_t at = line.find(marker);
    if (at != std::string::npos) sum += atol(line.c_str() + at + marker.size());
  }
  return sum;
}

long logged_lines(const std::string& marker) {
  long lines = 0;
  for (const std::string& line : own_log()) lines += line.find(marker) != std::string::npos;
  return lines;
}

}  // namespace weft::testing
