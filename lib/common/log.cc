#include "common/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"

namespace weft {

namespace {

thread_local int t_log_rank = -1;

struct SubsysName {
  const char* name;
  uint32_t bit;
};
constexpr SubsysName kSubsysNames[] = {
    {"INIT", kLogINIT},
    {"BOOTSTRAP", kLogBOOTSTRAP},
    {"TRANSPORT", kLogTRANSPORT},
    {"P2P", kLogP2P},
    {"COLL", kLogCOLL},
    {"ALGO", kLogALGO},
    {"TUNE", kLogTUNE},
    {"ENV", kLogENV},
    {"ALL", kLogALL},
};

// Warnings about the logging variables themselves, written once the logger
// that would print them exists (a WEFT_LOG inside its own set-up would recurse).
std::vector<std::string>& pending_warnings() {
  static std::vector<std::string> pending;
  return pending;
}

// The parsed value, or the default's with a pending warning.
uint64_t log_env_value(const char* name) {
  const EnvVar& var = env_var(name);
  std::string expected;
  std::optional<uint64_t> fallback = parse_env_value(var, var.default_value, &expected);
  std::optional<std::string> text = env_string(name);
  if (!text) return *fallback;
  std::optional<uint64_t> value = parse_env_value(var, *text, &expected);
  if (value) return *value;
  if (first_report(name, *text))
    pending_warnings().push_back(env_warning(var, *text, expected, var.default_value));
  return *fallback;
}

LogConfig read_log_config() {
  // Choice i of WEFT_DEBUG_SUBSYS is bit i of the mask; the ninth, ALL, is all of them.
  static_assert(kLogENV == 1u << 7);
  const auto subsys = static_cast<uint32_t>(log_env_value("WEFT_DEBUG_SUBSYS") & 0xff);
  return {static_cast<int>(log_env_value("WEFT_DEBUG")), subsys == 0xff ? kLogALL : subsys};
}

std::string log_file_path(const char* pattern) {
  std::string path;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      path += host;
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      path += std::to_string(getpid());
      ++p;
    } else {
      path += *p;
    }
  }
  return path;
}

FILE* open_log_file() {
  std::optional<std::string> pattern = env_string("WEFT_DEBUG_FILE");
  if (!pattern) return stderr;
  std::string path = log_file_path(pattern->c_str());
  FILE* file = fopen(path.c_str(), "a");
  if (file != nullptr) return file;
  pending_warnings().push_back("WEFT_DEBUG_FILE=" + *pattern + ": cannot open " + path + " (" +
                               strerror(errno) + "); using stderr");
  return stderr;
}

FILE* log_sink() {
  static FILE* const sink = open_log_file();
  return sink;
}

const char* subsys_label(uint32_t subsys) {
  for (const SubsysName& entry : kSubsysNames)
    if (entry.bit == subsys) return entry.name;
  return "";
}

}  // namespace

const LogConfig& log_config() {
  static const LogConfig config = [] {
    const LogConfig read = read_log_config();
    // log_write reads no configuration, so the warnings about it can go out now.
    log_sink();
    if (read.level >= static_cast<int>(LogLevel::WARN) && (read.subsys_mask & kLogENV) != 0)
      for (const std::string& warning : pending_warnings())
        log_write(LogLevel::WARN, kLogENV, "%s", warning.c_str());
    return read;
  }();
  return config;
}

void set_log_rank(int rank) {
  t_log_rank = rank;
}

void log_write(LogLevel level, uint32_t subsys, const char* format, ...) {
  FILE* const sink = log_sink();
  static const std::string host = [] {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    return std::string(name);
  }();
  static const char* const kLevelNames[] = {"", "WARN", "INFO", "TRACE"};
  char message[2048];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  fprintf(sink, "%s:%d:%d weft %s %s %s\n", host.c_str(), static_cast<int>(getpid()), t_log_rank,
          kLevelNames[static_cast<int>(level)], subsys_label(subsys), message);
  fflush(sink);
}

}  // namespace weft
