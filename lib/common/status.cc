#include "common/status.h"

#include <cstdarg>
#include <cstdio>

namespace weft {

Status Error(weftResult_t code, const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return Status(code, buffer);
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return message_ ? *message_ : kEmpty;
}

const char* result_string(weftResult_t code) {
  switch (code) {
    case weftSuccess:
      return "no error";
    case weftUnhandledCudaError:
      return "unhandled cuda error";
    case weftSystemError:
      return "unhandled system error";
    case weftInternalError:
      return "internal error";
    case weftInvalidArgument:
      return "invalid argument";
    case weftInvalidUsage:
      return "invalid usage";
    case weftRemoteError:
      return "remote process exited or there was a network error";
    case weftInProgress:
      return "operation in progress";
    case weftTimeout:
      return "timeout";
    default:
      return "unknown result code";
  }
}

namespace {
thread_local std::string t_last_error;
}

void set_last_error(const std::string& message) {
  t_last_error = message;
}
const char* last_error() {
  return t_last_error.c_str();
}

}  // namespace weft
