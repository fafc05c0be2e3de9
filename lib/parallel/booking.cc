// Errors, the ledger bookings of collectives (with the bytes the algorithm
// that ran sends), the host exchange, and the small fp32 helpers the layers
// share.
#include <unistd.h>

#include <bit>

#include "parallel/internal.h"

namespace weft::parallel::detail {

void fail(const std::string& message, weftResult_t code) {
  throw Error(code, std::string(weftGetErrorString(code)) + ": " + message);
}

size_t bytes_sent(std::string_view primitive, std::string_view algorithm, int nranks,
                  size_t bytes) {
  if (nranks <= 1) return 0;
  auto n = static_cast<size_t>(nranks);
  size_t share = bytes / n;  // one rank's block
  auto log2n = static_cast<size_t>(std::bit_width(n) - 1);
  if (primitive == "allreduce") {
    // Recursive doubling exchanges the whole vector every round; a tree
    // sends it up once and down once; a one-shot rank publishes its input
    // once and reads the others in place.
    if (algorithm == "rd") return log2n * bytes;
    if (algorithm == "tree") return 2 * bytes;
    if (algorithm == "oneshot") return bytes;
    return 2 * (n - 1) * share;  // ring, rhd, twoshot, hier: RS + AG
  }
  if (primitive == "reducescatter" || primitive == "allgather") {
    if (algorithm == "oneshot") return primitive == "allgather" ? share : bytes;
    return (n - 1) * share;
  }
  return bytes;
}

std::string last_algorithm(weftComm_t comm) {
  const char* name = nullptr;
  if (weftCommLastAlgorithm(comm, &name, nullptr) != weftSuccess || name == nullptr) return "";
  return name;
}

void Inflight::launch(const Axis& axis, std::string_view pattern, std::string_view primitive,
                      size_t bytes, const Enqueue& enqueue, size_t sent) {
  require(axis_ == nullptr, "a collective is already in flight on this handle");
  start_ = now_s();
  check(enqueue(axis.comm(), axis.stream()));
  // The algorithm is the tuner's choice, made when the call was enqueued
  // (point-to-point calls have none: the last collective's would be stale).
  algorithm_ = primitive == "sendrecv" ? "p2p" : last_algorithm(axis.comm());
  check(weftEventRecord(event_.get(), axis.stream()));
  axis_ = &axis;
  pattern_ = pattern;
  primitive_ = primitive;
  bytes_ = bytes;
  sent_ = sent;
}

void Inflight::join() {
  if (axis_ == nullptr) return;
  const Axis* axis = std::exchange(axis_, nullptr);
  double wait_start = now_s();
  check(weftEventSynchronize(event_.get()));
  double end = now_s();
  if (axis->ledger() == nullptr) return;
  size_t sent = sent_ != 0 ? sent_ : bytes_sent(primitive_, algorithm_, axis->size(), bytes_);
  axis->ledger()->record(pattern_, primitive_, axis->name(), bytes_, sent, algorithm_, end - start_,
                         end - wait_start);
}

// An exception unwinding past a launched collective still waits for it: the
// stream may not keep reading buffers that are about to be freed.
Inflight::~Inflight() {
  if (axis_ != nullptr) weftEventSynchronize(event_.get());
}

void blocking(const Axis& axis, std::string_view pattern, std::string_view primitive, size_t bytes,
              const Inflight::Enqueue& enqueue, size_t sent) {
  // The stream runs in order, so waiting for all of it is waiting for this
  // call (and needs no event).
  double start = now_s();
  check(enqueue(axis.comm(), axis.stream()));
  std::string algorithm = last_algorithm(axis.comm());
  check(weftStreamSynchronize(axis.stream()));
  double elapsed = now_s() - start;
  if (axis.ledger() == nullptr) return;
  if (sent == 0) sent = bytes_sent(primitive, algorithm, axis.size(), bytes);
  axis.ledger()->record(pattern, primitive, axis.name(), bytes, sent, algorithm, elapsed, elapsed);
}

std::vector<std::string> exchange_hosts(weftComm_t comm, int size, weftStream_t stream) {
  constexpr size_t kHostBytes = 256;
  std::vector<char> mine(kHostBytes, 0), all(kHostBytes * size, 0);
  if (gethostname(mine.data(), kHostBytes - 1) != 0) fail("gethostname failed", weftSystemError);
  check(weftAllGather(mine.data(), all.data(), kHostBytes, weftUint8, comm, stream));
  if (stream != nullptr) check(weftStreamSynchronize(stream));
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.emplace_back(all.data() + r * kHostBytes);
  return hosts;
}

void add_bias(std::span<float> y, std::span<const float> bias, size_t rows) {
  size_t cols = bias.size();
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}

void accumulate_column_sums(std::span<const float> dy, size_t rows, std::span<float> sums) {
  size_t cols = sums.size();
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) sums[c] += dy[r * cols + c];
}

}  // namespace weft::parallel::detail
