// Weft's C++ API: RAII and exceptions over the C ABI in weft.h. Header-only,
// so it adds no ABI of its own.
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "weft/weft.h"

namespace weft {

// A failed Weft call: the result code and the library's message.
class Error : public std::runtime_error {
 public:
  Error(weftResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  weftResult_t code() const { return code_; }

 private:
  weftResult_t code_;
};

inline void check(weftResult_t result) {
  if (result != weftSuccess)
    throw Error(result, std::string(weftGetErrorString(result)) + ": " + weftGetLastError(nullptr));
}

// The weftDataType_t of a C++ element type.
template <typename T>
constexpr weftDataType_t datatype_of() {
  if constexpr (std::is_same_v<T, int8_t>)
    return weftInt8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return weftUint8;
  else if constexpr (std::is_same_v<T, int32_t>)
    return weftInt32;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return weftUint32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return weftInt64;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return weftUint64;
  else if constexpr (std::is_same_v<T, float>)
    return weftFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return weftFloat64;
  else
    static_assert(sizeof(T) == 0, "no weftDataType_t for this type; use the raw overloads");
}

class UniqueId {
 public:
  static UniqueId create() {
    UniqueId id;
    check(weftGetUniqueId(&id.id_));
    return id;
  }
  static UniqueId from_bytes(const weftUniqueId& raw) {
    UniqueId id;
    id.id_ = raw;
    return id;
  }
  const weftUniqueId& raw() const { return id_; }

 private:
  weftUniqueId id_{};
};

// Owns a communicator: destroyed with the object (or aborted by abort()).
class Comm {
 public:
  Comm() = default;
  static Comm init(int nranks, const UniqueId& id, int rank, int timeout_ms = 0) {
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    if (timeout_ms > 0) config.timeoutMs = timeout_ms;
    Comm comm;
    check(weftCommInitRankConfig(&comm.comm_, nranks, id.raw(), rank, &config));
    return comm;
  }
  static Comm from_env() {
    Comm comm;
    check(weftCommInitFromEnv(&comm.comm_, nullptr));
    return comm;
  }
  Comm(Comm&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Comm& operator=(Comm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { reset(); }

  explicit operator bool() const { return comm_ != nullptr; }
  weftComm_t get() const { return comm_; }

  int rank() const {
    int rank = -1;
    check(weftCommUserRank(comm_, &rank));
    return rank;
  }
  int size() const {
    int size = -1;
    check(weftCommCount(comm_, &size));
    return size;
  }
  // An empty Comm for WEFT_SPLIT_NOCOLOR.
  Comm split(int color, int key) const {
    Comm child;
    check(weftCommSplit(comm_, color, key, &child.comm_, nullptr));
    return child;
  }
  weftResult_t async_error() const {
    weftResult_t error = weftSuccess;
    check(weftCommGetAsyncError(comm_, &error));
    return error;
  }

  template <typename T>
  void send(std::span<const T> data, int peer) const {
    check(weftSend(data.data(), data.size(), datatype_of<T>(), peer, comm_, nullptr));
  }
  template <typename T>
  void recv(std::span<T> data, int peer) const {
    check(weftRecv(data.data(), data.size(), datatype_of<T>(), peer, comm_, nullptr));
  }
  void barrier() const { check(weftBarrier(comm_, nullptr)); }

  // Abandons outstanding work and releases the communicator now.
  void abort() { check(weftCommAbort(std::exchange(comm_, nullptr))); }

 private:
  void reset() {
    if (comm_ != nullptr) weftCommDestroy(std::exchange(comm_, nullptr));
  }
  weftComm_t comm_ = nullptr;
};

// Memory from weftMemAlloc (peers on this node can map it), freed with the object.
class SharedMemory {
 public:
  SharedMemory() = default;
  explicit SharedMemory(size_t bytes) : bytes_(bytes) { check(weftMemAlloc(&data_, bytes)); }
  SharedMemory(SharedMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  SharedMemory& operator=(SharedMemory&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory() { reset(); }

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  std::span<T> as() const {
    return {static_cast<T*>(data_), bytes_ / sizeof(T)};
  }

 private:
  void reset() {
    if (data_ != nullptr) weftMemFree(std::exchange(data_, nullptr));
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A buffer registered with a communicator (weftCommRegister) for the object's
// lifetime, which must end before the communicator's.
class Registration {
 public:
  Registration(const Comm& comm, void* buff, size_t size) : comm_(comm.get()) {
    check(weftCommRegister(comm_, buff, size, &handle_));
  }
  explicit Registration(const Comm& comm, const SharedMemory& memory)
      : Registration(comm, memory.data(), memory.size()) {}
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() { weftCommDeregister(comm_, handle_); }

 private:
  weftComm_t comm_;
  void* handle_ = nullptr;
};

// weftGroupStart for the object's lifetime; end() reports the group's result.
class Group {
 public:
  Group() { check(weftGroupStart()); }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  void end() {
    open_ = false;
    check(weftGroupEnd());
  }
  // Unwinding past an open group still closes it, without throwing.
  ~Group() {
    if (open_) weftGroupEnd();
  }

 private:
  bool open_ = true;
};

}  // namespace weft
