// Environment configuration. Every variable Weft reads is declared once in
// the table in env.cc: the README's table and WEFT_DEBUG=INFO print it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace weft {

struct EnvVar {
  const char* name;
  const char* default_value;  // "" when unset means "not used"
  const char* description;
};

// All variables Weft reads, in documentation order.
std::span<const EnvVar> env_table();

// The variable's value; unset or empty gives nullopt.
std::optional<std::string> env_string(const char* name);
// Integer value; unset gives fallback; unparsable gives fallback and a warning.
int64_t env_int(const char* name, int64_t fallback);

// The default bound on every wait, from WEFT_TIMEOUT_MS.
int64_t default_timeout_ms();

}  // namespace weft
