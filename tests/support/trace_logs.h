// The ranks' TRACE logs of the direct ops, each process's in a file of its own, for tests
// that prove which path an op took from what the ranks logged.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "support/multirank.h"

namespace weft::testing {

// A directory for the logs, removed with the object.
class TraceLogs {
 public:
  using Env = std::vector<std::pair<const char*, const char*>>;
  // `base`: environment every options() call sets too.
  explicit TraceLogs(std::initializer_list<Env::value_type> base = {});
  ~TraceLogs();
  TraceLogs(const TraceLogs&) = delete;
  TraceLogs& operator=(const TraceLogs&) = delete;
  // Run options that log the COLL subsystem at TRACE into the directory, with `base` and
  // `extra` set as well.
  RunOptions options(const Env& extra) const;

 private:
  Env base_;
  std::string dir_, file_;
};

// This process's log, line by line (in a rank that runs under TraceLogs::options).
std::vector<std::string> own_log();

// The numbers that follow `marker` on this process's log lines, added up.
long logged_sum(const std::string& marker);

// This process's log lines that contain `marker`.
long logged_lines(const std::string& marker);

}  // namespace weft::testing
