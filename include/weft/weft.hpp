// Weft's C++ API: RAII types, typed collectives and exceptions over the C ABI
// in weft.h. Header-only, so it adds no ABI of its own. Needs C++20 (std::span,
// concepts); the CMake target Weft::weft asks for it.
//
// Every member that calls Weft throws weft::Error (the status and the
// library's message) when the call fails. Buffers are contiguous ranges
// (std::vector, std::array, std::span, C arrays) of an element type Weft knows
// (see DataTypeOf); their sizes are checked against what the collective needs
// before anything is sent, and a mismatch names the argument. Calls take a
// Stream last: the default, Stream::none(), completes the call before it
// returns; a created Stream queues it and returns at once (the buffers must
// then stay valid until the stream has passed it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ranges>
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

// An argument the C++ layer itself refuses (sizes that do not fit the call).
[[noreturn]] inline void invalid_argument(const std::string& message) {
  throw Error(weftInvalidArgument,
              std::string(weftGetErrorString(weftInvalidArgument)) + ": " + message);
}

// Narrow floating-point element types: the bits as Weft stores them, with
// conversions from and to float done by the library's own rounding (round to
// nearest even; fp8 saturates), so values match what Weft's reductions make.
template <weftDataType_t Type, typename Bits>
struct NarrowFloat {
  Bits bits = 0;
  NarrowFloat() = default;
  explicit NarrowFloat(float value) { check(weftConvertFromFloat(Type, &value, &bits, 1)); }
  explicit operator float() const {
    float value = 0;
    check(weftConvertToFloat(Type, &bits, &value, 1));
    return value;
  }
  static NarrowFloat from_bits(Bits raw) {
    NarrowFloat value;
    value.bits = raw;
    return value;
  }
};
using float16 = NarrowFloat<weftFloat16, uint16_t>;
using bfloat16 = NarrowFloat<weftBfloat16, uint16_t>;
using float8_e4m3 = NarrowFloat<weftFloat8e4m3, uint8_t>;
using float8_e5m2 = NarrowFloat<weftFloat8e5m2, uint8_t>;

// The weftDataType_t of a C++ element type; DataTypeOf<T>::known is false for
// types Weft has no datatype for.
template <typename T>
struct DataTypeOf {
  static constexpr bool known = false;
};
template <typename T, weftDataType_t Type>
struct KnownDataType {
  static constexpr bool known = true;
  static constexpr weftDataType_t value = Type;
  static_assert(sizeof(T) == (Type == weftFloat64 || Type == weftInt64 || Type == weftUint64   ? 8
                              : Type == weftFloat32 || Type == weftInt32 || Type == weftUint32 ? 4
                              : Type == weftFloat16 || Type == weftBfloat16                    ? 2
                                                                                               : 1),
                "element size does not match its datatype");
};
template <>
struct DataTypeOf<int8_t> : KnownDataType<int8_t, weftInt8> {};
template <>
struct DataTypeOf<uint8_t> : KnownDataType<uint8_t, weftUint8> {};
template <>
struct DataTypeOf<int32_t> : KnownDataType<int32_t, weftInt32> {};
template <>
struct DataTypeOf<uint32_t> : KnownDataType<uint32_t, weftUint32> {};
template <>
struct DataTypeOf<int64_t> : KnownDataType<int64_t, weftInt64> {};
template <>
struct DataTypeOf<uint64_t> : KnownDataType<uint64_t, weftUint64> {};
template <>
struct DataTypeOf<float> : KnownDataType<float, weftFloat32> {};
template <>
struct DataTypeOf<double> : KnownDataType<double, weftFloat64> {};
template <>
struct DataTypeOf<float16> : KnownDataType<float16, weftFloat16> {};
template <>
struct DataTypeOf<bfloat16> : KnownDataType<bfloat16, weftBfloat16> {};
template <>
struct DataTypeOf<float8_e4m3> : KnownDataType<float8_e4m3, weftFloat8e4m3> {};
template <>
struct DataTypeOf<float8_e5m2> : KnownDataType<float8_e5m2, weftFloat8e5m2> {};

template <typename T>
concept Element = DataTypeOf<std::remove_cv_t<T>>::known;

template <typename T>
constexpr weftDataType_t datatype_of() {
  static_assert(Element<T>, "no weftDataType_t for this type; use the C API");
  return DataTypeOf<std::remove_cv_t<T>>::value;
}

// A contiguous range of Weft elements; a MutableBuffer can be written.
template <typename R>
concept Buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    Element<std::ranges::range_value_t<R>>;
template <typename R>
concept MutableBuffer =
    Buffer<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

template <Buffer R>
using ElementOf = std::ranges::range_value_t<R>;

namespace detail {
template <Buffer R>
const void* data_of(const R& range) {
  return std::ranges::data(range);
}
template <MutableBuffer R>
void* mutable_data_of(R&& range) {
  return std::ranges::data(range);
}
template <Buffer R>
size_t size_of(const R& range) {
  return static_cast<size_t>(std::ranges::size(range));
}
template <Buffer Send, Buffer Recv>
constexpr void same_element_type() {
  static_assert(std::is_same_v<ElementOf<Send>, ElementOf<Recv>>,
                "send and receive buffers must have the same element type");
}
inline void require(bool ok, const char* call, const std::string& what) {
  if (!ok) invalid_argument(std::string(call) + ": " + what);
}
}  // namespace detail

// Reduction operators. Values of weftRedOp_t; a PreMulSum converts to one.
enum class Op : int { sum = weftSum, prod = weftProd, max = weftMax, min = weftMin, avg = weftAvg };
inline weftRedOp_t raw(Op op) {
  return static_cast<weftRedOp_t>(static_cast<int>(op));
}

// Per-communicator settings, accepted by every constructor; unset fields take
// the environment's or the built-in default. Setters validate at once.
class Config {
 public:
  Config& timeout_ms(int ms) {
    if (ms <= 0)
      invalid_argument("Config::timeout_ms: must be positive, not " + std::to_string(ms));
    timeout_ms_ = ms;
    return *this;
  }
  // Shown in log lines.
  Config& name(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  // Forced algorithms in WEFT_ALGO's syntax (which they override).
  Config& algorithms(std::string spec) {
    algorithms_ = std::move(spec);
    return *this;
  }
  // The C struct; its strings point into this object, which must outlive its use.
  weftConfig_t raw() const {
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.timeoutMs = timeout_ms_;
    if (!name_.empty()) config.commName = name_.c_str();
    if (!algorithms_.empty()) config.algorithms = algorithms_.c_str();
    return config;
  }

 private:
  int timeout_ms_ = WEFT_CONFIG_UNDEF_INT;
  std::string name_, algorithms_;
};

class Event;

// An ordered queue of operations run by Weft's progress thread (weftStream_t).
// Destroying it drains its work first.
class Stream {
 public:
  Stream() { check(weftStreamCreate(&stream_)); }
  // The NULL stream: calls on it complete before they return.
  static const Stream& none() {
    static const Stream blocking{Null{}};
    return blocking;
  }
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  // A stream over a cudaStream_t (weftStreamCreateFromCuda; see docs/gpu.md for what
  // runs on it today). The cudaStream_t stays the caller's.
  static Stream from_cuda(void* cuda_stream) {
    Stream stream{Null{}};
    check(weftStreamCreateFromCuda(cuda_stream, &stream.stream_));
    return stream;
  }

  weftStream_t get() const { return stream_; }
  // Waits for every queued operation; throws the first failure.
  void synchronize() const { check(weftStreamSynchronize(stream_)); }
  // True once all queued work is done, false while some is pending; throws a failure.
  bool done() const {
    weftResult_t result = weftStreamQuery(stream_);
    if (result == weftInProgress) return false;
    check(result);
    return true;
  }
  // Later work on this stream waits (without blocking the caller) for the event.
  void wait(const Event& event) const;

 private:
  struct Null {};
  explicit Stream(Null) {}
  void reset() {
    if (stream_ != nullptr) weftStreamDestroy(std::exchange(stream_, nullptr));
  }
  weftStream_t stream_ = nullptr;
};

// Where a buffer lies (weftPointerGetMemoryType): host memory (also memory CUDA does
// not know), device or managed memory of CUDA device `device` (-1 for host memory).
enum class MemoryType : int {
  host = weftMemoryHost,
  device = weftMemoryDevice,
  managed = weftMemoryManaged
};
struct MemoryLocation {
  MemoryType type;
  int device;
};
inline MemoryLocation memory_location(const void* ptr) {
  weftMemoryType_t type;
  int device = -1;
  check(weftPointerGetMemoryType(ptr, &type, &device));
  return {static_cast<MemoryType>(type), device};
}

// A point in a stream's order (weftEvent_t).
class Event {
 public:
  Event() { check(weftEventCreate(&event_)); }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }

  weftEvent_t get() const { return event_; }
  // Marks the point after everything queued on stream so far (a created stream).
  void record(const Stream& stream) { check(weftEventRecord(event_, stream.get())); }
  void synchronize() const { check(weftEventSynchronize(event_)); }
  // True once the recorded point has been passed (or if never recorded).
  bool done() const {
    weftResult_t result = weftEventQuery(event_);
    if (result == weftInProgress) return false;
    check(result);
    return true;
  }

 private:
  void reset() {
    if (event_ != nullptr) weftEventDestroy(std::exchange(event_, nullptr));
  }
  weftEvent_t event_ = nullptr;
};

inline void Stream::wait(const Event& event) const {
  check(weftStreamWaitEvent(stream_, event.get()));
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

// What the tuner chose for a communicator's last collective.
struct LastAlgorithm {
  std::string name;     // "" before the first collective
  double predicted_us;  // the cost model's time at that size; negative if not modelled
};

class Registration;

// Owns a communicator: destroyed with the object (or aborted by abort()).
class Comm {
 public:
  Comm() = default;
  static Comm init(int nranks, const UniqueId& id, int rank, const Config& config = {}) {
    weftConfig_t raw = config.raw();
    Comm comm;
    check(weftCommInitRankConfig(&comm.comm_, nranks, id.raw(), rank, &raw));
    return comm;
  }
  // Rank, size and rendezvous from the environment (weftrun, mpirun, srun).
  static Comm from_env(const Config& config = {}) {
    weftConfig_t raw = config.raw();
    Comm comm;
    check(weftCommInitFromEnv(&comm.comm_, &raw));
    return comm;
  }
  // Takes ownership of a communicator made with the C API.
  static Comm adopt(weftComm_t raw) {
    Comm comm;
    comm.comm_ = raw;
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
  // Gives up ownership without destroying.
  weftComm_t release() { return std::exchange(comm_, nullptr); }

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
  // Collective: an empty Comm for WEFT_SPLIT_NOCOLOR. Unset config fields
  // take the environment's or the built-in default.
  Comm split(int color, int key, const Config& config = {}) const {
    weftConfig_t raw = config.raw();
    Comm child;
    check(weftCommSplit(comm_, color, key, &child.comm_, &raw));
    return child;
  }
  // Called by every rank but the excluded: a communicator of the others
  // (weftCommShrink; `abort` revokes this one first). An empty config inherits this one's.
  Comm shrink(std::span<const int> exclude, const Config& config = {}, bool abort = false) const {
    weftConfig_t raw = config.raw();
    Comm child;
    check(weftCommShrink(comm_, exclude.data(), static_cast<int>(exclude.size()), &child.comm_,
                         &raw, abort ? WEFT_SHRINK_ABORT : WEFT_SHRINK_DEFAULT));
    return child;
  }
  // Fails every operation in flight or to come on this communicator, on every rank.
  void revoke() const { check(weftCommRevoke(comm_)); }
  // weftSuccess while healthy; otherwise the error that failed the communicator.
  weftResult_t async_error() const {
    weftResult_t error = weftSuccess;
    check(weftCommGetAsyncError(comm_, &error));
    return error;
  }
  // Asking for the prediction runs the cost model: keep it out of timed loops.
  LastAlgorithm last_algorithm() const {
    const char* name = nullptr;
    double predicted_us = -1;
    check(weftCommLastAlgorithm(comm_, &name, &predicted_us));
    return {name != nullptr ? name : "", predicted_us};
  }
  // Completes outstanding work and tells the peers this rank leaves on
  // purpose; the object stays to be destroyed.
  void finalize() const { check(weftCommFinalize(comm_)); }
  // Abandons outstanding work and releases the communicator now.
  void abort() { check(weftCommAbort(std::exchange(comm_, nullptr))); }

  // ---- Point to point (group them with weft::Group to exchange safely) ----
  template <Buffer Data>
  void send(const Data& data, int peer, const Stream& stream = Stream::none()) const {
    check(weftSend(detail::data_of(data), detail::size_of(data), datatype_of<ElementOf<Data>>(),
                   peer, comm_, stream.get()));
  }
  template <MutableBuffer Data>
  void recv(Data&& data, int peer, const Stream& stream = Stream::none()) const {
    check(weftRecv(detail::mutable_data_of(data), detail::size_of(data),
                   datatype_of<ElementOf<Data>>(), peer, comm_, stream.get()));
  }
  void barrier(const Stream& stream = Stream::none()) const {
    check(weftBarrier(comm_, stream.get()));
  }

  // ---- Collectives. Out-of-place forms take (send, recv); in-place forms one
  // buffer laid out as NCCL's in-place calls expect. ----

  // recv = op over every rank's send; both the same size.
  template <Buffer Send, MutableBuffer Recv>
  void all_reduce(const Send& send, Recv&& recv, Op op = Op::sum,
                  const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(send);
    detail::require(detail::size_of(recv) == count, "all_reduce",
                    "recv has " + std::to_string(detail::size_of(recv)) + " elements, send " +
                        std::to_string(count));
    check(weftAllReduce(detail::data_of(send), detail::mutable_data_of(recv), count,
                        datatype_of<ElementOf<Send>>(), raw(op), comm_, stream.get()));
  }
  template <MutableBuffer Data>
  void all_reduce(Data&& data, Op op = Op::sum, const Stream& stream = Stream::none()) const {
    all_reduce(data, data, op, stream);
  }

  // send holds size() blocks; recv gets the reduction of block rank().
  template <Buffer Send, MutableBuffer Recv>
  void reduce_scatter(const Send& send, Recv&& recv, Op op = Op::sum,
                      const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(recv);
    detail::require(detail::size_of(send) == count * size(), "reduce_scatter",
                    "send has " + std::to_string(detail::size_of(send)) +
                        " elements, not size() * recv (" + std::to_string(count * size()) + ")");
    check(weftReduceScatter(detail::data_of(send), detail::mutable_data_of(recv), count,
                            datatype_of<ElementOf<Send>>(), raw(op), comm_, stream.get()));
  }
  // In place: data holds size() blocks; block rank() gets the result, which is returned.
  template <MutableBuffer Data>
  auto reduce_scatter(Data&& data, Op op = Op::sum, const Stream& stream = Stream::none()) const {
    auto block = own_block(std::span(data), "reduce_scatter");
    check(weftReduceScatter(std::ranges::data(data), block.data(), block.size(),
                            datatype_of<ElementOf<Data>>(), raw(op), comm_, stream.get()));
    return block;
  }

  // recv gets every rank's send, block r from rank r.
  template <Buffer Send, MutableBuffer Recv>
  void all_gather(const Send& send, Recv&& recv, const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(send);
    detail::require(detail::size_of(recv) == count * size(), "all_gather",
                    "recv has " + std::to_string(detail::size_of(recv)) +
                        " elements, not size() * send (" + std::to_string(count * size()) + ")");
    check(weftAllGather(detail::data_of(send), detail::mutable_data_of(recv), count,
                        datatype_of<ElementOf<Send>>(), comm_, stream.get()));
  }
  // In place: this rank's contribution already sits in block rank() of data.
  template <MutableBuffer Data>
  void all_gather(Data&& data, const Stream& stream = Stream::none()) const {
    auto block = own_block(std::span(data), "all_gather");
    check(weftAllGather(block.data(), std::ranges::data(data), block.size(),
                        datatype_of<ElementOf<Data>>(), comm_, stream.get()));
  }

  // recv on every rank gets root's send (send is read on root only and may
  // be empty elsewhere).
  template <Buffer Send, MutableBuffer Recv>
  void broadcast(const Send& send, Recv&& recv, int root,
                 const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(recv);
    if (rank() == root)
      detail::require(detail::size_of(send) == count, "broadcast",
                      "send has " + std::to_string(detail::size_of(send)) +
                          " elements on the root, recv " + std::to_string(count));
    check(weftBroadcast(detail::size_of(send) > 0 ? detail::data_of(send) : nullptr,
                        detail::mutable_data_of(recv), count, datatype_of<ElementOf<Send>>(), root,
                        comm_, stream.get()));
  }
  template <MutableBuffer Data>
  void broadcast(Data&& data, int root, const Stream& stream = Stream::none()) const {
    check(weftBcast(std::ranges::data(data), detail::size_of(data), datatype_of<ElementOf<Data>>(),
                    root, comm_, stream.get()));
  }

  // recv on root gets op over every rank's send (recv may be empty elsewhere).
  template <Buffer Send, MutableBuffer Recv>
  void reduce(const Send& send, Recv&& recv, Op op, int root,
              const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(send);
    if (rank() == root)
      detail::require(detail::size_of(recv) == count, "reduce",
                      "recv has " + std::to_string(detail::size_of(recv)) +
                          " elements on the root, send " + std::to_string(count));
    check(weftReduce(detail::data_of(send),
                     detail::size_of(recv) > 0 ? detail::mutable_data_of(recv) : nullptr, count,
                     datatype_of<ElementOf<Send>>(), raw(op), root, comm_, stream.get()));
  }
  template <MutableBuffer Data>
  void reduce(Data&& data, Op op, int root, const Stream& stream = Stream::none()) const {
    check(weftReduce(std::ranges::data(data), std::ranges::data(data), detail::size_of(data),
                     datatype_of<ElementOf<Data>>(), raw(op), root, comm_, stream.get()));
  }

  // Block p of send goes to rank p, into block rank() of its recv.
  template <Buffer Send, MutableBuffer Recv>
  void all_to_all(const Send& send, Recv&& recv, const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = blocks_of(detail::size_of(send), "all_to_all", "send");
    detail::require(detail::size_of(recv) == detail::size_of(send), "all_to_all",
                    "recv has " + std::to_string(detail::size_of(recv)) + " elements, send " +
                        std::to_string(detail::size_of(send)));
    check(weftAllToAll(detail::data_of(send), detail::mutable_data_of(recv), count,
                       datatype_of<ElementOf<Send>>(), comm_, stream.get()));
  }
  template <MutableBuffer Data>
  void all_to_all(Data&& data, const Stream& stream = Stream::none()) const {
    all_to_all(data, data, stream);
  }

  // Per-peer counts and displacements in elements, size() of each; every
  // piece must lie inside its buffer.
  template <Buffer Send, MutableBuffer Recv>
  void all_to_allv(const Send& send, std::span<const size_t> send_counts,
                   std::span<const size_t> send_displs, Recv&& recv,
                   std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                   const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    check_pieces(send_counts, send_displs, detail::size_of(send), "send");
    check_pieces(recv_counts, recv_displs, detail::size_of(recv), "recv");
    check(weftAllToAllv(detail::data_of(send), send_counts.data(), send_displs.data(),
                        detail::mutable_data_of(recv), recv_counts.data(), recv_displs.data(),
                        datatype_of<ElementOf<Send>>(), comm_, stream.get()));
  }

  // recv on root gets every rank's send, block r from rank r (recv may be
  // empty elsewhere). In place on the root: send is recv's block root.
  template <Buffer Send, MutableBuffer Recv>
  void gather(const Send& send, Recv&& recv, int root,
              const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(send);
    if (rank() == root)
      detail::require(detail::size_of(recv) == count * size(), "gather",
                      "recv has " + std::to_string(detail::size_of(recv)) +
                          " elements on the root, not size() * send (" +
                          std::to_string(count * size()) + ")");
    check(weftGather(detail::data_of(send),
                     detail::size_of(recv) > 0 ? detail::mutable_data_of(recv) : nullptr, count,
                     datatype_of<ElementOf<Send>>(), root, comm_, stream.get()));
  }

  // Block r of root's send goes to rank r's recv (send may be empty
  // elsewhere). In place on the root: recv is send's block root.
  template <Buffer Send, MutableBuffer Recv>
  void scatter(const Send& send, Recv&& recv, int root,
               const Stream& stream = Stream::none()) const {
    detail::same_element_type<Send, Recv>();
    size_t count = detail::size_of(recv);
    if (rank() == root)
      detail::require(detail::size_of(send) == count * size(), "scatter",
                      "send has " + std::to_string(detail::size_of(send)) +
                          " elements on the root, not size() * recv (" +
                          std::to_string(count * size()) + ")");
    check(weftScatter(detail::size_of(send) > 0 ? detail::data_of(send) : nullptr,
                      detail::mutable_data_of(recv), count, datatype_of<ElementOf<Send>>(), root,
                      comm_, stream.get()));
  }

 private:
  size_t blocks_of(size_t elements, const char* call, const char* name) const {
    size_t n = static_cast<size_t>(size());
    detail::require(elements % n == 0, call,
                    std::string(name) + " has " + std::to_string(elements) +
                        " elements, not a multiple of size() " + std::to_string(n));
    return elements / n;
  }
  template <typename T>
  std::span<T> own_block(std::span<T> data, const char* call) const {
    size_t count = blocks_of(data.size(), call, "data");
    return data.subspan(static_cast<size_t>(rank()) * count, count);
  }
  void check_pieces(std::span<const size_t> counts, std::span<const size_t> displs, size_t elements,
                    const char* name) const {
    size_t n = static_cast<size_t>(size());
    std::string which(name);
    detail::require(counts.size() == n && displs.size() == n, "all_to_allv",
                    which + "_counts and " + which + "_displs need size() = " + std::to_string(n) +
                        " entries, not " + std::to_string(counts.size()) + " and " +
                        std::to_string(displs.size()));
    for (size_t peer = 0; peer < n; ++peer)
      detail::require(
          displs[peer] <= elements && counts[peer] <= elements - displs[peer], "all_to_allv",
          which + " piece " + std::to_string(peer) + " (" + std::to_string(displs[peer]) + " + " +
              std::to_string(counts[peer]) + ") lies past the " + std::to_string(elements) +
              "-element " + which + " buffer");
  }
  void reset() {
    if (comm_ != nullptr) weftCommDestroy(std::exchange(comm_, nullptr));
  }
  weftComm_t comm_ = nullptr;
};

// A pre-multiplied sum created on a communicator for element type T: every
// rank's input is multiplied by the scalar before summing. Converts to Op.
template <Element T>
class PreMulSum {
 public:
  // The scalar is read now.
  PreMulSum(const Comm& comm, T scalar) : comm_(comm.get()) {
    check(
        weftRedOpCreatePreMulSum(&op_, &scalar, datatype_of<T>(), weftScalarHostImmediate, comm_));
  }
  // *scalar is read whenever the op runs, so it may change between calls.
  PreMulSum(const Comm& comm, const T* scalar) : comm_(comm.get()) {
    check(weftRedOpCreatePreMulSum(&op_, const_cast<T*>(scalar), datatype_of<T>(), weftScalarDevice,
                                   comm_));
  }
  PreMulSum(const PreMulSum&) = delete;
  PreMulSum& operator=(const PreMulSum&) = delete;
  ~PreMulSum() { weftRedOpDestroy(op_, comm_); }
  Op op() const { return static_cast<Op>(static_cast<int>(op_)); }
  operator Op() const { return op(); }

 private:
  weftComm_t comm_;
  weftRedOp_t op_ = weftSum;
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
  Registration(const Comm& comm, const SharedMemory& memory)
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
