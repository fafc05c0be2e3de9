// One error type for the whole library: a weftResult_t code plus a message
// naming the cause. The C entry points turn a failed Status into their return
// code and the calling thread's last-error string.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "weft/weft.h"

namespace weft {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(weftResult_t code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& other)
      : code_(other.code_),
        message_(other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr) {}
  Status(Status&&) noexcept = default;
  Status& operator=(const Status& other) {
    code_ = other.code_;
    message_ = other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr;
    return *this;
  }
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == weftSuccess; }
  weftResult_t code() const { return code_; }
  const std::string& message() const;

 private:
  weftResult_t code_ = weftSuccess;
  // Null for an empty message (every success): the per-call paths then build, move and
  // drop a Status without a string to construct or destroy.
  std::unique_ptr<std::string> message_;
};

// printf-style constructor for failures.
Status Error(weftResult_t code, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Human-readable name of a result code ("invalid argument", ...).
const char* result_string(weftResult_t code);

// The calling thread's last error, as weftGetLastError reports it.
void set_last_error(const std::string& message);
const char* last_error();

}  // namespace weft

// Propagates a failed Status to the caller.
#define WEFT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::weft::Status weft_status_ = (expr);        \
    if (!weft_status_.ok()) return weft_status_; \
  } while (0)
