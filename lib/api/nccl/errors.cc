// Result strings, the thread's last error and the version.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "api/nccl/shim.h"

namespace weft::nccl {

namespace {
thread_local std::string t_last_error;
}  // namespace

ncclResult_t record(ncclResult_t result, const std::string& message) {
  if (result != ncclSuccess && result != ncclInProgress) t_last_error = message;
  return result;
}

ncclResult_t record(ncclResult_t result, const char* function, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  return record(result, std::string(function) + ": " + text);
}

ncclResult_t from_weft(weftResult_t result, const char* function) {
  if (result == weftSuccess) return ncclSuccess;
  if (result == weftInProgress) return ncclInProgress;
  std::string message = weftGetLastError(nullptr);
  // Weft names its own entry point ("weftAllReduce: ..."); the caller knows the NCCL one.
  size_t colon = message.find(": ");
  if (message.rfind("weft", 0) == 0 && colon != std::string::npos) message.erase(0, colon + 2);
  return record(to_nccl(result), std::string(function) + ": " + message);
}

const char* last_error() {
  return t_last_error.c_str();
}

}  // namespace weft::nccl

using namespace weft::nccl;

extern "C" {

ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return record(ncclInvalidArgument, __func__, "version is NULL");
  *version = kNcclVersion;
  return ncclSuccess;
}
WEFT_NCCL_ALIAS(ncclGetVersion)

const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}
WEFT_NCCL_ALIAS(ncclGetErrorString)

// Both PyTorch and nccl-tests pass NULL: the message is the thread's, whatever comm is.
const char* pncclGetLastError(ncclComm_t) {
  return last_error();
}
WEFT_NCCL_ALIAS(ncclGetLastError)

// NCCL re-reads its debug variables here; Weft reads its own once per process.
// (The header marks it deprecated; the ABI still has it.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void pncclResetDebugInit() {}
WEFT_NCCL_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop

}  // extern "C"
