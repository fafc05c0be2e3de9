// The "weft" torch.distributed backend: a c10d::Backend over one Weft
// communicator. Every operation is queued on a Weft stream (Weft's progress
// thread runs it) and returns a Work whose future completes when the stream
// passes the operation's event. Collectives share one stream (their order is
// the program's); sends and receives have a stream each, so an exchange of
// isend and irecv between two ranks cannot wait on itself. A blocking call
// with nothing queued before it runs in the caller's thread instead.
#pragma once

#include <weft/weft.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft_torch {

// Throws c10::DistBackendError carrying Weft's message when result fails.
void check(weftResult_t result, const char* what);

// One Weft event, shared by the works of a coalesced batch.
class EventHandle {
 public:
  EventHandle();
  ~EventHandle();
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;
  weftEvent_t get() const { return event_; }

 private:
  weftEvent_t event_ = nullptr;
};

class WeftWork : public c10d::Work {
 public:
  WeftWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
           std::chrono::milliseconds timeout);

  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Blocks until the operation passed its event, then finishes the work
  // (once, whichever thread gets here first).
  void complete();

  void set_event(std::shared_ptr<EventHandle> event) { event_ = std::move(event); }
  // A member of a coalescing batch: it has no event until the batch ends.
  void defer() { deferred_ = true; }
  // Runs once the operation passed its event, before the future completes
  // (copies results out of temporaries).
  void set_on_done(std::function<void()> on_done) { on_done_ = std::move(on_done); }
  // Buffers the stream reads or writes, held until it passed the operation.
  void keep(std::vector<at::Tensor> tensors);
  void add_child(c10::intrusive_ptr<WeftWork> child) { children_.push_back(std::move(child)); }

 private:
  void wait_finished(std::chrono::milliseconds timeout);

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> kept_;
  std::shared_ptr<EventHandle> event_;
  std::function<void()> on_done_;
  std::vector<c10::intrusive_ptr<WeftWork>> children_;  // a coalesced batch's members
  std::chrono::milliseconds timeout_;
  bool deferred_ = false;
  std::atomic<bool> claimed_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Completes works in stream order on its own thread, so futures complete
// even when nobody waits (DDP's comm hooks chain on them).
class Completer {
 public:
  Completer();
  ~Completer();
  void push(c10::intrusive_ptr<WeftWork> work);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<c10::intrusive_ptr<WeftWork>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

class WeftBackend : public c10d::Backend {
 public:
  // Every rank of the group calls this with the id rank 0 got from
  // weftGetUniqueId (exchanged through the c10d Store by the Python side).
  WeftBackend(const std::string& unique_id, int rank, int size, std::chrono::milliseconds timeout);
  ~WeftBackend() override;

  const std::string getBackendName() const override { return "weft"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Abandons outstanding work; later calls fail.
  void abort() override;
  void shutdown() override;

 private:
  // What one operation hands to submit(): the Weft calls to make (on the
  // stream), the tensors the work reports, and what to run when it is done.
  // `blocking` (async_op=False) lets an operation with nothing queued before
  // it run in the caller's thread (the NULL stream), as Weft's own blocking
  // calls do, instead of through the progress thread and back.
  struct Op {
    c10d::OpType type;
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> keep;
    std::function<void(weftStream_t)> launch;
    std::function<void()> on_done;
    bool blocking = false;
  };
  // A stream and the completer of its works.
  struct Lane {
    weftStream_t stream = nullptr;
    std::unique_ptr<Completer> completer;
  };
  c10::intrusive_ptr<c10d::Work> submit(Op op, std::chrono::milliseconds timeout,
                                        Lane* lane = nullptr);
  std::chrono::milliseconds effective(std::chrono::milliseconds timeout) const;
  void require_open() const;

  weftComm_t comm_ = nullptr;
  Lane collectives_, sends_, receives_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<Options> options_;
  std::mutex submit_mutex_;  // one thread at a time uses the communicator
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<WeftWork>> coalesced_;
  std::atomic<bool> failed_{false};
};

// A fresh weftUniqueId (this process then hosts the rendezvous).
std::string new_unique_id();

}  // namespace weft_torch
