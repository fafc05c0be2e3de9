// Configuration that says when it is wrong: every variable of the environment
// table, given a bad value, is named in exactly one WARN that says what is used
// instead, or (where guessing would be dangerous) refused at init with an error
// naming it. A variable added to the table without bad-value cases here fails.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/log.h"
#include "weft/weft.h"

namespace {

struct BadValues {
  const char* name;
  std::vector<const char*> values;
};

const std::vector<BadValues>& bad_values() {
  static const std::vector<BadValues> cases = {
      {"WEFT_DEBUG", {"LOUD", "3"}},
      {"WEFT_DEBUG_SUBSYS", {"BOGUS", "INIT,BOGUS", "^"}},
      {"WEFT_DEBUG_FILE", {"/nonexistent-weft-dir/log"}},
      {"WEFT_TIMEOUT_MS", {"0", "-5", "10s", "99999999999"}},
      {"WEFT_CHECK", {"sometimes", "fullest", "1"}},
      {"WEFT_SOCKET_IFNAME", {"nosuch", "=lo-nosuch"}},
      {"WEFT_RANK", {"-1", "one", "1"}},
      {"WEFT_NRANKS", {"0", "two"}},
      {"WEFT_ROOT", {"nohost", "127.0.0.1:99999"}},
      {"WEFT_SECRET", {"xyz", "0123"}},
      {"WEFT_LOCAL_RANK", {"-1", "x"}},
      {"WEFT_LOCAL_SIZE", {"0", "x"}},
      {"WEFT_ALGO", {"allreduce:bogus", "nosuch:ring"}},
      {"WEFT_TOPO_FILE", {"/nonexistent-weft-dir/topo.json"}},
      {"WEFT_TUNER_FILE", {"/nonexistent-weft-dir/tuner.txt"}},
      {"WEFT_HOST_SPEED", {"0", "4", "2001", "fast", "1.5"}},
      {"WEFT_REDUCE_ISA", {"sse9", "avx"}},
      {"WEFT_SHM_BYTES", {"4X", "-1", "1T"}},
      {"WEFT_SHM_DISABLE", {"2", "maybe"}},
      {"WEFT_FAST_PATH", {"2", "fast"}},
      {"WEFT_SHM_ZERO_COPY_BYTES", {"-1", "8KB", "inf"}},
      {"WEFT_SHM_CMA_BYTES", {"-1", "1.5K"}},
      {"WEFT_CACHE_BYTES", {"-1", "8MiB", "big"}},
      {"WEFT_SHM_STREAM_BYTES", {"-1", "1MiB", "all"}},
      {"WEFT_CUDA_SLOT_BYTES", {"32", "4X"}},
      {"WEFT_CUDA_SLOTS", {"0", "65", "two"}},
      {"WEFT_CUDA_IPC", {"nvlink", "fd"}},
  };
  return cases;
}

// Read by the logger when it starts, so checked in a fresh process.
bool read_by_logger(const weft::EnvVar& var) {
  return std::string(var.name).starts_with("WEFT_DEBUG");
}

bool parsed_here(const weft::EnvVar& var) {
  return var.kind != weft::EnvKind::kText && var.kind != weft::EnvKind::kPath;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(EnvConfig, EveryVariableHasBadValueCases) {
  for (const weft::EnvVar& var : weft::env_table()) {
    bool found = false;
    for (const BadValues& c : bad_values()) found = found || std::string(c.name) == var.name;
    EXPECT_TRUE(found) << var.name << " has no bad-value cases in env_config_test.cc";
  }
}

// The shared parser rejects each bad value of a parsed variable, and the warning names
// the variable, the value, what was expected and what is used instead.
TEST(EnvConfig, ParserRejectsBadValues) {
  for (const BadValues& c : bad_values()) {
    const weft::EnvVar& var = weft::env_var(c.name);
    if (!parsed_here(var)) continue;
    for (const char* value : c.values) {
      std::string expected;
      EXPECT_FALSE(weft::parse_env_value(var, value, &expected)) << c.name << "=" << value;
      EXPECT_FALSE(expected.empty()) << c.name;
      const std::string warning = weft::env_warning(var, value, expected, "X");
      EXPECT_TRUE(warning.starts_with(std::string(c.name) + "=" + value + " is not ")) << warning;
      EXPECT_TRUE(warning.ends_with("; using X")) << warning;
    }
  }
}

// The check at the first communicator names what a bad WEFT_HOST_SPEED gives: the measured
// speed (it has no default, and is not informational).
TEST(EnvConfig, BadHostSpeedWarnsThatTheMeasuredSpeedIsUsed) {
  ASSERT_EQ(setenv("WEFT_HOST_SPEED", "quick", 1), 0);
  ::testing::internal::CaptureStderr();
  weft::check_environment();
  const std::string err = ::testing::internal::GetCapturedStderr();
  unsetenv("WEFT_HOST_SPEED");
  EXPECT_EQ(count_of(err, "WEFT_HOST_SPEED=quick is not "), 1u) << err;
  EXPECT_EQ(count_of(err, "; using the measured speed"), 1u) << err;
}

TEST(EnvConfig, GoodValuesParse) {
  struct Good {
    const char* name;
    const char* text;
    uint64_t value;
  };
  for (const Good& g : {Good{"WEFT_TIMEOUT_MS", "250", 250},
                        Good{"WEFT_SHM_BYTES", "64K", 64 << 10},
                        Good{"WEFT_SHM_ZERO_COPY_BYTES", "16k", 16 << 10},
                        Good{"WEFT_SHM_CMA_BYTES", "2M", 2 << 20},
                        Good{"WEFT_SHM_BYTES", "1G", 1u << 30},
                        Good{"WEFT_SHM_STREAM_BYTES", "512K", 512 << 10},
                        Good{"WEFT_CACHE_BYTES", "8M", 8 << 20},
                        Good{"WEFT_HOST_SPEED", "35", 35},
                        Good{"WEFT_SHM_STREAM_BYTES", "0", 0},
                        Good{"WEFT_SHM_DISABLE", "yes", 1},
                        Good{"WEFT_SHM_DISABLE", "0", 0},
                        Good{"WEFT_DEBUG", "info", 2},
                        Good{"WEFT_REDUCE_ISA", "AVX2", 1},
                        Good{"WEFT_DEBUG_SUBSYS", "init,Coll", weft::kLogINIT | weft::kLogCOLL},
                        Good{"WEFT_LOCAL_RANK", "0", 0},
                        Good{"WEFT_CHECK", "off", 0},
                        Good{"WEFT_CHECK", "FULL", 2},
                        Good{"WEFT_CUDA_SLOT_BYTES", "1M", 1 << 20},
                        Good{"WEFT_CUDA_SLOTS", "4", 4},
                        Good{"WEFT_CUDA_IPC", "Legacy", 2}}) {
    std::string expected;
    EXPECT_EQ(weft::parse_env_value(weft::env_var(g.name), g.text, &expected), g.value)
        << g.name << "=" << g.text << ": " << expected;
  }
  std::string expected;
  const uint64_t all_but_env =
      *weft::parse_env_value(weft::env_var("WEFT_DEBUG_SUBSYS"), "^ENV", &expected);
  EXPECT_EQ(all_but_env & weft::kLogENV, 0u);
  EXPECT_NE(all_but_env & weft::kLogINIT, 0u);
  EXPECT_EQ(weft::parse_env_value(weft::env_var("WEFT_DEBUG_SUBSYS"), "^all", &expected), 0u);
}

// Read through env_value, a bad value gives the default and one WARN however often
// it is read; sizes take K/M/G there as in WEFT_ALGO.
TEST(EnvConfig, ReadersWarnOnceAndUseTheDefault) {
  for (const BadValues& c : bad_values()) {
    const weft::EnvVar& var = weft::env_var(c.name);
    if (!parsed_here(var) || read_by_logger(var)) continue;
    const bool has_default = var.default_value[0] != '\0';
    for (const char* value : c.values) {
      ASSERT_EQ(setenv(c.name, value, 1), 0);
      ::testing::internal::CaptureStderr();
      for (int read = 0; read < 3; ++read) {
        if (has_default) {
          std::string unused;
          EXPECT_EQ(weft::env_value(c.name),
                    weft::parse_env_value(var, var.default_value, &unused));
        } else {
          EXPECT_FALSE(weft::env_value_if_set(c.name, "Y"));
        }
      }
      weft::check_environment();
      const std::string err = ::testing::internal::GetCapturedStderr();
      const std::string named = std::string(c.name) + "=" + value + " is not ";
      EXPECT_EQ(count_of(err, named), 1u) << err;
      EXPECT_EQ(count_of(err, "WARN ENV"), 1u) << err;
      EXPECT_NE(err.find(std::string("; using ") + (has_default ? var.default_value : "Y")),
                std::string::npos)
          << err;
    }
    unsetenv(c.name);
  }
  ASSERT_EQ(setenv("WEFT_SHM_ZERO_COPY_BYTES", "16K", 1), 0);
  EXPECT_EQ(weft::env_value("WEFT_SHM_ZERO_COPY_BYTES"), 16u << 10);
  unsetenv("WEFT_SHM_ZERO_COPY_BYTES");
}

// In a fresh process: sets name=value, starts the logger and checks the whole
// environment; exits 0 when `expected` was the one warning (nullptr: there was none)
// and `in_force()` holds.
[[noreturn]] void start_logger_with(const char* name, const char* value, const char* expected,
                                    bool (*in_force)()) {
  setenv(name, value, 1);
  ::testing::internal::CaptureStderr();
  bool ok = in_force();
  weft::check_environment();
  const std::string err = ::testing::internal::GetCapturedStderr();
  const size_t warnings = expected == nullptr ? 0 : 1;
  if (count_of(err, " WARN ") != warnings || (expected && count_of(err, expected) != 1)) ok = false;
  fprintf(stderr, "%s", err.c_str());
  std::exit(ok ? 0 : 1);
}

bool level_is_warn() {
  return weft::log_config().level == static_cast<int>(weft::LogLevel::WARN);
}
bool every_subsystem() {
  return weft::log_config().subsys_mask == weft::kLogALL;
}

// The logger's own variables: one WARN when it starts, and the default in force.
TEST(EnvConfigDeathTest, LoggerVariablesWarnOnceAndFallBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  struct Case {
    const char* name;
    const char* value;
    const char* warning;
    bool (*in_force)();
  };
  for (const Case& c : {
           Case{"WEFT_DEBUG", "LOUD",
                "WARN ENV WEFT_DEBUG=LOUD is not one of NONE,WARN,INFO,TRACE; using WARN\n",
                level_is_warn},
           Case{"WEFT_DEBUG_SUBSYS", "INIT,BOGUS",
                "WARN ENV WEFT_DEBUG_SUBSYS=INIT,BOGUS is not a comma-separated list of "
                "INIT,BOOTSTRAP,TRANSPORT,P2P,COLL,ALGO,TUNE,ENV,ALL, ^ first to exclude; using "
                "ALL\n",
                every_subsystem},
           Case{"WEFT_DEBUG_FILE", "/nonexistent-weft-dir/log",
                "WARN ENV WEFT_DEBUG_FILE=/nonexistent-weft-dir/log: cannot open "
                "/nonexistent-weft-dir/log (No such file or directory); using stderr\n",
                level_is_warn},
       }) {
    EXPECT_EXIT(start_logger_with(c.name, c.value, c.warning, c.in_force),
                ::testing::ExitedWithCode(0), "")
        << c.name;
  }
  // Excluding ENV silences the warning about WEFT_DEBUG itself.
  EXPECT_EXIT(
      {
        setenv("WEFT_DEBUG_SUBSYS", "^ENV", 1);
        start_logger_with("WEFT_DEBUG", "LOUD", nullptr, level_is_warn);
      },
      ::testing::ExitedWithCode(0), "");
}

// A one-rank communicator from the environment, with WEFT_DEBUG=INFO, in a fresh process.
[[noreturn]] void init_one_rank_verbosely() {
  setenv("WEFT_DEBUG", "INFO", 1);
  setenv("WEFT_RANK", "0", 1);
  setenv("WEFT_NRANKS", "1", 1);
  weftComm_t comm = nullptr;
  const bool ok =
      weftCommInitFromEnv(&comm, nullptr) == weftSuccess && weftCommDestroy(comm) == weftSuccess;
  std::exit(ok ? 0 : 1);
}

// The init log names an unnamed communicator without a stray space, and counts in
// the singular where there is one.
TEST(EnvConfigDeathTest, InitLogLinesReadWell) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(init_one_rank_verbosely(), ::testing::ExitedWithCode(0),
              "INFO INIT communicator: rank 0 of 1 ready");
  EXPECT_EXIT(init_one_rank_verbosely(), ::testing::ExitedWithCode(0),
              "INFO INIT 1 rank on 1 node \\(");
}

// Variables whose bad values cannot be guessed around stop weftCommInitFromEnv with an
// error naming them (here for a one-rank launch that otherwise works).
TEST(EnvConfig, UnguessableValuesAreInitErrors) {
  ASSERT_EQ(setenv("WEFT_TIMEOUT_MS", "5000", 1), 0);
  for (const BadValues& c : bad_values()) {
    const weft::EnvVar& var = weft::env_var(c.name);
    if (parsed_here(var) || read_by_logger(var)) continue;
    for (const char* value : c.values) {
      ASSERT_EQ(setenv("WEFT_RANK", "0", 1), 0);
      ASSERT_EQ(setenv("WEFT_NRANKS", "1", 1), 0);
      ASSERT_EQ(setenv(c.name, value, 1), 0);
      weftComm_t comm = nullptr;
      EXPECT_NE(weftCommInitFromEnv(&comm, nullptr), weftSuccess) << c.name << "=" << value;
      EXPECT_EQ(comm, nullptr);
      if (comm != nullptr) weftCommDestroy(comm);
      const std::string error = weftGetLastError(nullptr);
      EXPECT_NE(error.find(c.name), std::string::npos) << c.name << "=" << value << ": " << error;
      unsetenv(c.name);
    }
  }
  // And the same launch without the bad values works.
  weftComm_t comm = nullptr;
  ASSERT_EQ(weftCommInitFromEnv(&comm, nullptr), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  unsetenv("WEFT_RANK");
  unsetenv("WEFT_NRANKS");
  unsetenv("WEFT_TIMEOUT_MS");
}

}  // namespace
