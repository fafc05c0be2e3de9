// Private helpers of the adapter layer: argument errors, timing, booking
// collectives in the ledger.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/parallel.hpp"

namespace weft::parallel::detail {

// A weft::Error with weftInvalidArgument (or `code`) and the message.
[[noreturn]] void fail(const std::string& message, weftResult_t code = weftInvalidArgument);
inline void require(bool ok, const std::string& message) {
  if (!ok) fail(message);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes one rank sends in a collective of logical size `bytes` over n ranks,
// from the closed form of the algorithm that ran (ring's when unknown).
size_t bytes_sent(std::string_view primitive, std::string_view algorithm, int nranks, size_t bytes);

// The algorithm of the last collective on comm ("" when it cannot be asked).
std::string last_algorithm(weftComm_t comm);

// A collective launched on the axis stream, booked when joined: the time
// from launch to the end of join() is its communication time, the time
// join() waited is the exposed part. Every adapter collective goes through
// the stream of its group, so the calls on one communicator run in the order
// they were issued on every rank, blocking or not.
class Inflight {
 public:
  using Enqueue = std::function<weftResult_t(weftComm_t, weftStream_t)>;
  Inflight() = default;
  Inflight(const Inflight&) = delete;
  Inflight& operator=(const Inflight&) = delete;
  ~Inflight();
  // bytes: the logical size booked (AllReduce buffer, RS input, AG output);
  // sent: what leaves this rank when the algorithm's closed form does not
  // apply (AllToAllv), else 0.
  void launch(const Axis& axis, std::string_view pattern, std::string_view primitive, size_t bytes,
              const Enqueue& enqueue, size_t sent = 0);
  bool pending() const { return axis_ != nullptr; }
  void join();

 private:
  weft::Event event_;
  const Axis* axis_ = nullptr;
  std::string pattern_, primitive_, algorithm_;
  size_t bytes_ = 0;
  size_t sent_ = 0;
  double start_ = 0;
};

void require_size(std::string_view what, size_t got, size_t want);
// features / axis.size(), an error naming `what` unless it divides.
size_t divided(size_t features, const Axis& axis, std::string_view what);
// Rows of this rank's sequence shard of `tokens` (SP requires an even split).
size_t shard_rows(const Axis& axis, size_t tokens);

// fp32 collectives on dim 0 of contiguous rows, launched on the axis stream
// (counts: the shard's elements for AllGather and ReduceScatter).
void launch_all_gather(Inflight& op, const Axis& axis, std::string_view pattern, const float* shard,
                       float* full, size_t shard_count);
void launch_reduce_scatter(Inflight& op, const Axis& axis, std::string_view pattern,
                           const float* full, float* shard, size_t shard_count);
void launch_all_reduce(Inflight& op, const Axis& axis, std::string_view pattern, float* data,
                       size_t count);
// A blocking fp32 "allgather", "reducescatter" or "allreduce" from in to
// out; a copy on an axis of one rank.
void fp32_collective(const Axis& axis, std::string_view pattern, std::string_view primitive,
                     const float* in, float* out, size_t in_count, size_t out_count);

// Copies the slab [offset, offset + out.extent(dim)) of `dim` of `in` to `out`.
void copy_slab(const Tensor& in, int dim, size_t offset, const Tensor& out);

// Element-wise helpers for the fp32 layers.
void add_bias(std::span<float> y, std::span<const float> bias, size_t rows);
void accumulate_column_sums(std::span<const float> dy, size_t rows, std::span<float> sums);

// Every rank's gethostname, by an AllGather on comm (on `stream`, waited for;
// null: a blocking call).
std::vector<std::string> exchange_hosts(weftComm_t comm, int size, weftStream_t stream);

// A blocking collective: launched on the axis stream and joined.
void blocking(const Axis& axis, std::string_view pattern, std::string_view primitive, size_t bytes,
              const Inflight::Enqueue& enqueue, size_t sent = 0);

}  // namespace weft::parallel::detail
