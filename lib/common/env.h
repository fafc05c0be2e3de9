// Environment configuration. Every variable Weft reads is declared once in
// the table in env.cc, with how its value is parsed: the README's table and
// WEFT_DEBUG=INFO print it, and one routine checks every value against it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace weft {

enum class EnvKind {
  kText,        // checked where it is used; a bad value is an init error there
  kPath,        // a file, checked where it is opened
  kInt,         // decimal integer in [min, max]
  kBytes,       // byte count in [min, max], optional K/M/G suffix (powers of 1024)
  kBool,        // 0/1, no/yes, off/on, false/true
  kChoice,      // one of `choices` ('|'-separated, case-insensitive): its index
  kChoiceList,  // comma-separated `choices`, a leading ^ excluding: a bit per index
};

struct EnvVar {
  const char* name;
  const char* default_value;  // "" when unset means "not used"
  const char* description;
  EnvKind kind = EnvKind::kText;
  uint64_t min = 0;
  uint64_t max = UINT64_MAX;
  const char* choices = nullptr;
  // What a bad value of a variable without a default gives, for its warning; nullptr:
  // nothing (the variable is informational).
  const char* when_bad = nullptr;
};

// All variables Weft reads, in documentation order.
std::span<const EnvVar> env_table();
// The table's entry for `name`; a name missing from the table is a bug and aborts.
const EnvVar& env_var(const char* name);

// The variable's raw value; unset or empty gives nullopt.
std::optional<std::string> env_string(const char* name);

// Parses `text` as `var`'s kind: the number, the choice's index or the mask of
// choices (kChoiceList, ^ already applied), 0 for kText and kPath. A bad value
// gives nullopt and says in *expected what would have been accepted.
std::optional<uint64_t> parse_env_value(const EnvVar& var, std::string_view text,
                                        std::string* expected);
// The one warning for a bad value: names the variable, the value, what was
// expected and what is used instead.
std::string env_warning(const EnvVar& var, std::string_view text, const std::string& expected,
                        std::string_view used);

// True the first time a bad `text` of `name` is reported in this process: each
// bad value warns once, however often it is read.
bool first_report(const char* name, std::string_view text);

// The parsed value of a variable with a default: unset gives the default; a bad
// value gives the default and one WARN (once per process for each bad value).
uint64_t env_value(const char* name);
// For a variable without a default: nullopt when unset, or when bad (one WARN
// saying that `used_instead` is used).
std::optional<uint64_t> env_value_if_set(const char* name, const char* used_instead);

// Checks every set variable of the table that env_value reads; bad ones WARN as
// above. Called once at the first communicator, so that a bad variable is named
// even when the code path that reads it never runs.
void check_environment();

// "16K", "2M", "0", "inf" (UINT64_MAX): sizes as WEFT_ALGO ranges and every size
// variable write them.
bool parse_bytes(std::string_view text, uint64_t* out);

// The default bound on every wait, from WEFT_TIMEOUT_MS.
int64_t default_timeout_ms();

}  // namespace weft
