// Leveled, subsystem-masked logging. Disabled levels cost one load and a
// branch. Lines are prefixed host:pid:rank.
#pragma once

#include <cstdint>

namespace weft {

enum class LogLevel : int { NONE = 0, WARN = 1, INFO = 2, TRACE = 3 };

enum LogSubsys : uint32_t {
  kLogINIT = 1u << 0,
  kLogBOOTSTRAP = 1u << 1,
  kLogTRANSPORT = 1u << 2,
  kLogP2P = 1u << 3,
  kLogCOLL = 1u << 4,
  kLogALGO = 1u << 5,
  kLogTUNE = 1u << 6,
  kLogENV = 1u << 7,
  kLogALL = ~0u,
};

struct LogConfig {
  int level;
  uint32_t subsys_mask;
};
// Read once from WEFT_DEBUG / WEFT_DEBUG_SUBSYS on first use.
const LogConfig& log_config();

inline bool log_enabled(LogLevel level, uint32_t subsys) {
  const LogConfig& config = log_config();
  return static_cast<int>(level) <= config.level && (config.subsys_mask & subsys) != 0;
}

void log_write(LogLevel level, uint32_t subsys, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// The rank shown in this thread's log prefix (-1: none yet).
void set_log_rank(int rank);

}  // namespace weft

#define WEFT_LOG(level, subsys, ...)                                                 \
  do {                                                                               \
    if (::weft::log_enabled(::weft::LogLevel::level, ::weft::kLog##subsys))          \
      ::weft::log_write(::weft::LogLevel::level, ::weft::kLog##subsys, __VA_ARGS__); \
  } while (0)
