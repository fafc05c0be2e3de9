#include "common/log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

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

int parse_level(const char* text) {
  if (text == nullptr) return static_cast<int>(LogLevel::WARN);
  if (strcasecmp(text, "NONE") == 0) return static_cast<int>(LogLevel::NONE);
  if (strcasecmp(text, "INFO") == 0) return static_cast<int>(LogLevel::INFO);
  if (strcasecmp(text, "TRACE") == 0) return static_cast<int>(LogLevel::TRACE);
  return static_cast<int>(LogLevel::WARN);
}

uint32_t parse_subsys(const char* text) {
  if (text == nullptr || text[0] == '\0') return kLogALL;
  bool exclude = text[0] == '^';
  if (exclude) ++text;
  uint32_t mask = 0;
  std::string_view rest(text);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    for (const SubsysName& subsys : kSubsysNames) {
      if (item.size() == strlen(subsys.name) &&
          strncasecmp(item.data(), subsys.name, item.size()) == 0)
        mask |= subsys.bit;
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return exclude ? ~mask : mask;
}

FILE* open_log_file() {
  const char* pattern = getenv("WEFT_DEBUG_FILE");
  if (pattern == nullptr || pattern[0] == '\0') return stderr;
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
  FILE* file = fopen(path.c_str(), "a");
  return file != nullptr ? file : stderr;
}

const char* subsys_label(uint32_t subsys) {
  for (const SubsysName& entry : kSubsysNames)
    if (entry.bit == subsys) return entry.name;
  return "";
}

}  // namespace

const LogConfig& log_config() {
  static const LogConfig config = {parse_level(getenv("WEFT_DEBUG")),
                                   parse_subsys(getenv("WEFT_DEBUG_SUBSYS"))};
  return config;
}

void set_log_rank(int rank) {
  t_log_rank = rank;
}

void log_write(LogLevel level, uint32_t subsys, const char* format, ...) {
  static FILE* const sink = open_log_file();
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
