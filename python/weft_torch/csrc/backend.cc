#include "backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <optional>

namespace weft_torch {
namespace {

[[noreturn]] void fail(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, "weft: " + message);
}

std::exception_ptr error_for(const std::string& message) {
  try {
    fail(message);
  } catch (...) {
    return std::current_exception();
  }
}

std::optional<weftDataType_t> weft_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return weftFloat32;
    case at::kDouble:
      return weftFloat64;
    case at::kHalf:
      return weftFloat16;
    case at::kBFloat16:
      return weftBfloat16;
    case at::kFloat8_e4m3fn:
      return weftFloat8e4m3;
    case at::kFloat8_e5m2:
      return weftFloat8e5m2;
    case at::kChar:
      return weftInt8;
    case at::kByte:
      return weftUint8;
    case at::kBool:
      return weftUint8;
    case at::kInt:
      return weftInt32;
    case at::kUInt32:
      return weftUint32;
    case at::kLong:
      return weftInt64;
    case at::kUInt64:
      return weftUint64;
    default:
      return std::nullopt;
  }
}

weftDataType_t reduction_type(const at::Tensor& tensor) {
  std::optional<weftDataType_t> type = weft_type(tensor.scalar_type());
  if (!type) fail(std::string("no reduction for dtype ") + c10::toString(tensor.scalar_type()));
  return *type;
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    fail(std::string(what) + " takes one tensor per rank, got " + std::to_string(tensors.size()));
  return tensors[0];
}

void check_tensor(const at::Tensor& tensor, const char* what) {
  if (!tensor.device().is_cpu())
    fail(std::string(what) + ": tensors must be on the CPU, got " + tensor.device().str());
  if (tensor.layout() != at::kStrided) fail(std::string(what) + ": tensors must be dense");
}

// A contiguous tensor with `tensor`'s values: itself when it is contiguous.
at::Tensor dense(const at::Tensor& tensor, const char* what) {
  check_tensor(tensor, what);
  return tensor.contiguous();
}

// Copies `from` into `to` when they are different storage (a non-contiguous
// tensor's contiguous twin, or a temporary).
void copy_back(const at::Tensor& to, const at::Tensor& from) {
  if (!to.is_same(from)) to.copy_(from.view(to.sizes()));
}

at::Tensor flat_cat(const std::vector<at::Tensor>& tensors, const char* what) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    check_tensor(tensor, what);
    flat.push_back(tensor.reshape({-1}));
  }
  return at::cat(flat);
}

// Writes consecutive pieces of `flat` into `outputs`.
void split_into(const at::Tensor& flat, const std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (const at::Tensor& output : outputs) {
    int64_t n = output.numel();
    output.copy_(flat.narrow(0, offset, n).view(output.sizes()));
    offset += n;
  }
}

void* data(const at::Tensor& tensor) {
  return tensor.data_ptr();
}
size_t bytes(const at::Tensor& tensor) {
  return tensor.numel() * tensor.element_size();
}

void check_same_layout(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                       const char* what) {
  for (const at::Tensor& tensor : tensors) {
    if (tensor.numel() != like.numel() || tensor.scalar_type() != like.scalar_type())
      fail(std::string(what) + ": every tensor of the list must match the input's size and dtype");
  }
}

// Reduction op for `tensor`; creates a PreMulSum op (released by `release`)
// for PREMUL_SUM.
class ReduceOpScope {
 public:
  ReduceOpScope(const c10d::ReduceOp& op, const at::Tensor& tensor, weftComm_t comm) : comm_(comm) {
    bool boolean = tensor.scalar_type() == at::kBool;
    switch (op.op_) {
      // Sums and products of bools are ORs and ANDs.
      case c10d::ReduceOp::SUM:
        op_ = boolean ? weftMax : weftSum;
        break;
      case c10d::ReduceOp::PRODUCT:
        op_ = boolean ? weftMin : weftProd;
        break;
      case c10d::ReduceOp::MIN:
        op_ = weftMin;
        break;
      case c10d::ReduceOp::MAX:
        op_ = weftMax;
        break;
      case c10d::ReduceOp::AVG:
        if (boolean) fail("AVG of bool tensors is undefined");
        op_ = weftAvg;
        break;
      case c10d::ReduceOp::PREMUL_SUM: {
        auto* factor = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
        if (factor == nullptr) fail("PREMUL_SUM without a factor");
        at::Tensor scalar =
            factor->tensor_factor.defined()
                ? factor->tensor_factor.to(at::kCPU, tensor.scalar_type())
                      .reshape({-1})
                      .slice(0, 0, 1)
                      .contiguous()
                : at::scalar_tensor(factor->double_factor,
                                    at::TensorOptions().dtype(tensor.scalar_type()));
        check(weftRedOpCreatePreMulSum(&op_, scalar.data_ptr(), reduction_type(tensor),
                                       weftScalarHostImmediate, comm),
              "weftRedOpCreatePreMulSum");
        custom_ = true;
        break;
      }
      default:
        fail("reduce op " + std::to_string(static_cast<int>(op.op_)) + " is not supported");
    }
  }
  // The value of a PreMulSum op is copied when a call is queued, so the op
  // can go as soon as the calls using it are.
  ~ReduceOpScope() {
    if (custom_) weftRedOpDestroy(op_, comm_);
  }
  ReduceOpScope(const ReduceOpScope&) = delete;
  ReduceOpScope& operator=(const ReduceOpScope&) = delete;
  weftRedOp_t get() const { return op_; }

 private:
  weftComm_t comm_;
  weftRedOp_t op_ = weftSum;
  bool custom_ = false;
};

// Contiguous twins of matching output and input lists where one side of
// each pair holds world_size times the other's elements (the larger is the
// output when `gathering`), and the buffers the stream must keep alive.
struct Pairs {
  std::vector<at::Tensor> sends, receives, keep;
};

Pairs pair_up(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
              int size, bool gathering, const char* what) {
  if (outputs.size() != inputs.size()) fail(std::string(what) + ": as many outputs as inputs");
  Pairs out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& large = gathering ? outputs[i] : inputs[i];
    const at::Tensor& small = gathering ? inputs[i] : outputs[i];
    if (large.numel() != small.numel() * size || large.scalar_type() != small.scalar_type())
      fail(std::string(what) + (gathering ? ": the output" : ": the input") +
           " must hold world_size times the other's elements, of the same dtype");
    out.sends.push_back(dense(inputs[i], what));
    out.receives.push_back(dense(outputs[i], what));
    out.keep.push_back(out.sends.back());
    out.keep.push_back(out.receives.back());
  }
  return out;
}

int to_int(int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX) fail(std::string(what) + " out of range");
  return static_cast<int>(value);
}

// Byte counts and displacements of an all_to_all_single side: equal pieces
// when `splits` is empty, else splits[i] rows of the tensor's first dimension.
struct Pieces {
  std::vector<size_t> counts;
  std::vector<size_t> displs;
};

Pieces pieces(const at::Tensor& tensor, const std::vector<int64_t>& splits, int size,
              const char* side) {
  Pieces out;
  out.counts.resize(size);
  out.displs.resize(size);
  if (splits.empty()) {
    if (tensor.numel() % size != 0)
      fail(std::string("all_to_all: ") + side + " of " + std::to_string(tensor.numel()) +
           " elements does not split into " + std::to_string(size) + " equal pieces");
    std::fill(out.counts.begin(), out.counts.end(), bytes(tensor) / size);
  } else {
    if (static_cast<int>(splits.size()) != size)
      fail(std::string("all_to_all: ") + side + " split sizes must have one entry per rank");
    int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
    int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    if (total != rows || std::any_of(splits.begin(), splits.end(), [](int64_t s) { return s < 0; }))
      fail(std::string("all_to_all: ") + side + " split sizes must add up to dimension 0 (" +
           std::to_string(rows) + ")");
    size_t row_bytes = rows == 0 ? 0 : bytes(tensor) / rows;
    for (int i = 0; i < size; ++i) out.counts[i] = splits[i] * row_bytes;
  }
  for (int i = 1; i < size; ++i) out.displs[i] = out.displs[i - 1] + out.counts[i - 1];
  return out;
}

}  // namespace

void check(weftResult_t result, const char* what) {
  if (result == weftSuccess) return;
  const char* message = weftGetLastError(nullptr);
  fail(std::string(what) + " failed: " + weftGetErrorString(result) +
       (message != nullptr && *message != '\0' ? std::string(": ") + message : std::string()));
}

std::string new_unique_id() {
  weftUniqueId id;
  check(weftGetUniqueId(&id), "weftGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

EventHandle::EventHandle() {
  check(weftEventCreate(&event_), "weftEventCreate");
}
EventHandle::~EventHandle() {
  weftEventDestroy(event_);
}

WeftWork::WeftWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                   std::chrono::milliseconds timeout)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void WeftWork::keep(std::vector<at::Tensor> tensors) {
  kept_.insert(kept_.end(), std::make_move_iterator(tensors.begin()),
               std::make_move_iterator(tensors.end()));
}

void WeftWork::complete() {
  if (deferred_ && event_ == nullptr)
    fail("wait on an operation before its coalescing batch ended");
  weftResult_t result = weftSuccess;
  std::string message;
  if (event_ != nullptr) {
    result = weftEventSynchronize(event_->get());
    if (result != weftSuccess) message = weftGetLastError(nullptr);
  }
  if (claimed_.exchange(true)) {  // another thread is finishing it
    wait_finished(::kNoTimeout);
    return;
  }
  for (const auto& child : children_) child->complete();
  std::exception_ptr error;
  if (result != weftSuccess) {
    error = error_for(std::string(weftGetErrorString(result)) + ": " + message);
  } else if (on_done_) {
    try {
      on_done_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  on_done_ = nullptr;
  kept_.clear();
  finish(error);
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

void WeftWork::wait_finished(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == ::kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    lock.unlock();
    fail("operation did not complete within " + std::to_string(timeout.count()) + " ms");
  }
}

bool WeftWork::wait(std::chrono::milliseconds timeout) {
  // Weft bounds every wait of the stream by the communicator's timeout (the
  // group's), so waiting here for the event honours it; a shorter timeout
  // waits for the completer instead.
  if (timeout == ::kNoTimeout || timeout >= timeout_)
    complete();
  else
    wait_finished(timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

Completer::Completer() : thread_([this] { run(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  thread_.join();
}

void Completer::push(c10::intrusive_ptr<WeftWork> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
  }
  ready_.notify_one();
}

void Completer::run() {
  for (;;) {
    c10::intrusive_ptr<WeftWork> work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->complete();
  }
}

WeftBackend::WeftBackend(const std::string& unique_id, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      options_(c10::make_intrusive<Options>("weft", timeout)) {
  if (unique_id.size() != WEFT_UNIQUE_ID_BYTES)
    fail("unique id must be " + std::to_string(WEFT_UNIQUE_ID_BYTES) + " bytes, got " +
         std::to_string(unique_id.size()));
  weftUniqueId id;
  memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.timeoutMs = static_cast<int>(std::clamp<int64_t>(timeout.count(), 1, INT_MAX));
  check(weftCommInitRankConfig(&comm_, size, id, rank, &config), "weftCommInitRankConfig");
  for (Lane* lane : {&collectives_, &sends_, &receives_}) {
    check(weftStreamCreate(&lane->stream), "weftStreamCreate");
    lane->completer = std::make_unique<Completer>();
  }
}

WeftBackend::~WeftBackend() {
  shutdown();
}

void WeftBackend::shutdown() {
  std::lock_guard<std::mutex> lock(submit_mutex_);
  if (comm_ == nullptr) return;
  weftResult_t async_error = weftSuccess;
  weftCommGetAsyncError(comm_, &async_error);
  // A failed communicator's peers may be gone: abandon instead of finishing.
  if (async_error != weftSuccess || failed_) weftCommAbort(comm_);
  for (Lane* lane : {&collectives_, &sends_, &receives_}) {
    lane->completer.reset();  // every queued work completes (or fails) first
    weftStreamDestroy(lane->stream);
    lane->stream = nullptr;
  }
  if (async_error == weftSuccess && !failed_) weftCommDestroy(comm_);
  comm_ = nullptr;
}

void WeftBackend::abort() {
  failed_ = true;
  shutdown();
}

void WeftBackend::require_open() const {
  if (comm_ == nullptr) fail("the process group was shut down or aborted");
}

std::chrono::milliseconds WeftBackend::effective(std::chrono::milliseconds timeout) const {
  return timeout.count() > 0 ? timeout : timeout_;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::submit(Op op, std::chrono::milliseconds timeout,
                                                   Lane* lane) {
  std::lock_guard<std::mutex> lock(submit_mutex_);
  require_open();
  // A coalesced batch is one Weft group, which runs on one stream.
  if (lane == nullptr || coalescing_) lane = &collectives_;
  weftStream_t stream = lane->stream;
  auto work =
      c10::make_intrusive<WeftWork>(rank_, op.type, std::move(op.outputs), effective(timeout));
  if (op.blocking && !coalescing_ && weftStreamQuery(stream) == weftSuccess) {
    op.launch(nullptr);  // complete when it returns; a failure throws here
    work->set_on_done(std::move(op.on_done));
    work->complete();
    return work;
  }
  // What a failed launch had already queued must stay alive until the stream
  // passes it, so the work is queued either way.
  std::exception_ptr launch_error;
  try {
    op.launch(stream);
  } catch (...) {
    launch_error = std::current_exception();
  }
  work->keep(std::move(op.keep));
  if (!launch_error) work->set_on_done(std::move(op.on_done));
  if (coalescing_) {
    if (launch_error) std::rethrow_exception(launch_error);
    work->defer();
    coalesced_.push_back(work);
    return work;
  }
  auto event = std::make_shared<EventHandle>();
  weftResult_t recorded = weftEventRecord(event->get(), stream);
  if (recorded == weftSuccess) {
    work->set_event(std::move(event));
    lane->completer->push(work);
  }
  if (launch_error) std::rethrow_exception(launch_error);
  check(recorded, "weftEventRecord");
  return work;
}

void WeftBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(submit_mutex_);
  require_open();
  if (coalescing_) fail("startCoalescing: already coalescing");
  check(weftGroupStart(), "weftGroupStart");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::endCoalescing() {
  std::lock_guard<std::mutex> lock(submit_mutex_);
  require_open();
  if (!coalescing_) fail("endCoalescing without startCoalescing");
  coalescing_ = false;
  std::vector<c10::intrusive_ptr<WeftWork>> members = std::move(coalesced_);
  coalesced_.clear();
  check(weftGroupEnd(), "weftGroupEnd");
  auto event = std::make_shared<EventHandle>();
  check(weftEventRecord(event->get(), collectives_.stream), "weftEventRecord");
  std::vector<at::Tensor> outputs;
  for (const auto& member : members) {
    std::vector<at::Tensor> result = member->result();
    outputs.insert(outputs.end(), result.begin(), result.end());
  }
  auto batch =
      c10::make_intrusive<WeftWork>(rank_, c10d::OpType::COALESCED, std::move(outputs), timeout_);
  batch->set_event(event);
  for (const auto& member : members) {
    member->set_event(event);
    batch->add_child(member);
  }
  collectives_.completer->push(batch);
  return batch;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  const at::Tensor& tensor = single(tensors, "broadcast");
  at::Tensor buffer = dense(tensor, "broadcast");
  int root = to_int(opts.rootRank, "broadcast root");
  return submit({c10d::OpType::BROADCAST,
                 tensors,
                 {buffer},
                 [=, this](weftStream_t stream) {
                   check(weftBroadcast(data(buffer), data(buffer), bytes(buffer), weftUint8, root,
                                       comm_, stream),
                         "weftBroadcast");
                 },
                 [=] { copy_back(tensor, buffer); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  const at::Tensor& tensor = single(tensors, "allreduce");
  at::Tensor buffer = dense(tensor, "allreduce");
  weftDataType_t type = reduction_type(buffer);
  c10d::ReduceOp op = opts.reduceOp;
  return submit({c10d::OpType::ALLREDUCE,
                 tensors,
                 {buffer},
                 [=, this](weftStream_t stream) {
                   ReduceOpScope scope(op, buffer, comm_);
                   check(weftAllReduce(data(buffer), data(buffer), buffer.numel(), type,
                                       scope.get(), comm_, stream),
                         "weftAllReduce");
                 },
                 [=] { copy_back(tensor, buffer); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) fail("allreduce_coalesced: no tensors");
  for (const at::Tensor& tensor : tensors) {
    if (tensor.scalar_type() != tensors[0].scalar_type())
      fail("allreduce_coalesced: every tensor must have the same dtype");
  }
  at::Tensor flat = flat_cat(tensors, "allreduce_coalesced");
  weftDataType_t type = reduction_type(flat);
  c10d::ReduceOp op = opts.reduceOp;
  std::vector<at::Tensor> outputs = tensors;
  return submit({c10d::OpType::ALLREDUCE_COALESCED,
                 tensors,
                 {flat},
                 [=, this](weftStream_t stream) {
                   ReduceOpScope scope(op, flat, comm_);
                   check(weftAllReduce(data(flat), data(flat), flat.numel(), type, scope.get(),
                                       comm_, stream),
                         "weftAllReduce");
                 },
                 [=] { split_into(flat, outputs); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  const at::Tensor& tensor = single(tensors, "reduce");
  at::Tensor buffer = dense(tensor, "reduce");
  weftDataType_t type = reduction_type(buffer);
  int root = to_int(opts.rootRank, "reduce root");
  c10d::ReduceOp op = opts.reduceOp;
  bool is_root = root == rank_;
  return submit({c10d::OpType::REDUCE,
                 tensors,
                 {buffer},
                 [=, this](weftStream_t stream) {
                   ReduceOpScope scope(op, buffer, comm_);
                   check(weftReduce(data(buffer), data(buffer), buffer.numel(), type, scope.get(),
                                    root, comm_, stream),
                         "weftReduce");
                 },
                 [=] {
                   if (is_root) copy_back(tensor, buffer);
                 },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Pairs pairs = pair_up(outputs, inputs, size_, true, "all_gather_into_tensor");
  std::vector<at::Tensor> targets = outputs;
  return submit({c10d::OpType::_ALLGATHER_BASE, outputs, pairs.keep,
                 [=, this](weftStream_t stream) {
                   for (size_t i = 0; i < pairs.sends.size(); ++i)
                     check(weftAllGather(data(pairs.sends[i]), data(pairs.receives[i]),
                                         bytes(pairs.sends[i]), weftUint8, comm_, stream),
                           "weftAllGather");
                 },
                 [=] {
                   for (size_t i = 0; i < targets.size(); ++i)
                     copy_back(targets[i], pairs.receives[i]);
                 },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  at::Tensor input = dense(single(inputs, "allgather"), "allgather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
    fail("allgather: the output list must hold world_size tensors");
  check_same_layout(outputs[0], input, "allgather");
  at::Tensor flat = at::empty({input.numel() * size_}, input.options());
  std::vector<at::Tensor> targets = outputs[0];
  return submit(
      {c10d::OpType::ALLGATHER,
       targets,
       {input, flat},
       [=, this](weftStream_t stream) {
         check(weftAllGather(data(input), data(flat), bytes(input), weftUint8, comm_, stream),
               "weftAllGather");
       },
       [=] { split_into(flat, targets); },
       !opts.asyncOp},
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputs[r][i] is rank r's inputs[i]: one gather of the inputs laid end to end.
  if (static_cast<int>(outputs.size()) != size_)
    fail("allgather_coalesced: the output must hold world_size lists");
  at::Tensor flat_in = flat_cat(inputs, "allgather_coalesced");
  at::Tensor flat_out = at::empty({flat_in.numel() * size_}, flat_in.options());
  std::vector<at::Tensor> targets;
  for (const auto& list : outputs) {
    check_same_layout(list, list.empty() ? flat_in : list[0], "allgather_coalesced");
    targets.insert(targets.end(), list.begin(), list.end());
  }
  return submit({c10d::OpType::ALLGATHER_COALESCED,
                 targets,
                 {flat_in, flat_out},
                 [=, this](weftStream_t stream) {
                   check(weftAllGather(data(flat_in), data(flat_out), bytes(flat_in), weftUint8,
                                       comm_, stream),
                         "weftAllGather");
                 },
                 [=] { split_into(flat_out, targets); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  at::Tensor input = dense(single(inputs, "gather"), "gather");
  int root = to_int(opts.rootRank, "gather root");
  std::vector<at::Tensor> targets;
  at::Tensor flat;
  if (root == rank_) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      fail("gather: the root's output list must hold world_size tensors");
    check_same_layout(outputs[0], input, "gather");
    targets = outputs[0];
    flat = at::empty({input.numel() * size_}, input.options());
  }
  return submit({c10d::OpType::GATHER,
                 targets,
                 {input, flat},
                 [=, this](weftStream_t stream) {
                   check(weftGather(data(input), flat.defined() ? data(flat) : nullptr,
                                    bytes(input), weftUint8, root, comm_, stream),
                         "weftGather");
                 },
                 [=] {
                   if (flat.defined()) split_into(flat, targets);
                 },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  const at::Tensor& output = single(outputs, "scatter");
  at::Tensor buffer = dense(output, "scatter");
  int root = to_int(opts.rootRank, "scatter root");
  at::Tensor flat;
  if (root == rank_) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      fail("scatter: the root's input list must hold world_size tensors");
    check_same_layout(inputs[0], buffer, "scatter");
    flat = flat_cat(inputs[0], "scatter");
  }
  return submit({c10d::OpType::SCATTER,
                 outputs,
                 {buffer, flat},
                 [=, this](weftStream_t stream) {
                   check(weftScatter(flat.defined() ? data(flat) : nullptr, data(buffer),
                                     bytes(buffer), weftUint8, root, comm_, stream),
                         "weftScatter");
                 },
                 [=] { copy_back(output, buffer); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Pairs pairs = pair_up(outputs, inputs, size_, false, "reduce_scatter_tensor");
  for (const at::Tensor& send : pairs.sends) reduction_type(send);
  std::vector<at::Tensor> targets = outputs;
  c10d::ReduceOp op = opts.reduceOp;
  return submit(
      {c10d::OpType::_REDUCE_SCATTER_BASE, outputs, pairs.keep,
       [=, this](weftStream_t stream) {
         for (size_t i = 0; i < pairs.sends.size(); ++i) {
           ReduceOpScope scope(op, pairs.sends[i], comm_);
           check(weftReduceScatter(data(pairs.sends[i]), data(pairs.receives[i]),
                                   pairs.receives[i].numel(), reduction_type(pairs.sends[i]),
                                   scope.get(), comm_, stream),
                 "weftReduceScatter");
         }
       },
       [=] {
         for (size_t i = 0; i < targets.size(); ++i) copy_back(targets[i], pairs.receives[i]);
       },
       !opts.asyncOp},
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& output = single(outputs, "reduce_scatter");
  at::Tensor buffer = dense(output, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
    fail("reduce_scatter: the input list must hold world_size tensors");
  check_same_layout(inputs[0], buffer, "reduce_scatter");
  at::Tensor flat = flat_cat(inputs[0], "reduce_scatter");
  weftDataType_t type = reduction_type(flat);
  c10d::ReduceOp op = opts.reduceOp;
  return submit({c10d::OpType::REDUCE_SCATTER,
                 outputs,
                 {buffer, flat},
                 [=, this](weftStream_t stream) {
                   ReduceOpScope scope(op, flat, comm_);
                   check(weftReduceScatter(data(flat), data(buffer), buffer.numel(), type,
                                           scope.get(), comm_, stream),
                         "weftReduceScatter");
                 },
                 [=] { copy_back(output, buffer); },
                 !opts.asyncOp},
                opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const c10d::AllToAllOptions& opts) {
  at::Tensor send = dense(input, "all_to_all_single");
  at::Tensor receive = dense(output, "all_to_all_single");
  if (send.scalar_type() != receive.scalar_type())
    fail("all_to_all_single: input and output must have the same dtype");
  auto in = std::make_shared<Pieces>(pieces(send, input_splits, size_, "input"));
  auto out = std::make_shared<Pieces>(pieces(receive, output_splits, size_, "output"));
  bool equal = input_splits.empty() && output_splits.empty();
  if (equal && bytes(send) != bytes(receive))
    fail("all_to_all_single: input and output must have the same size without split sizes");
  at::Tensor target = output;
  return submit(
      {c10d::OpType::ALLTOALL_BASE,
       {output},
       {send, receive},
       [=, this](weftStream_t stream) {
         if (equal)  // the equal-piece collective has more algorithms than the v form
           check(weftAllToAll(data(send), data(receive), in->counts[0], weftUint8, comm_, stream),
                 "weftAllToAll");
         else
           check(weftAllToAllv(data(send), in->counts.data(), in->displs.data(), data(receive),
                               out->counts.data(), out->displs.data(), weftUint8, comm_, stream),
                 "weftAllToAllv");
       },
       [=] { copy_back(target, receive); },
       !opts.asyncOp},
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_)
    fail("all_to_all: the input and output lists must hold world_size tensors");
  at::Tensor send = flat_cat(inputs, "all_to_all");
  int64_t received = 0;
  for (const at::Tensor& tensor : outputs) {
    check_tensor(tensor, "all_to_all");
    if (tensor.scalar_type() != send.scalar_type())
      fail("all_to_all: every tensor must have the same dtype");
    received += tensor.numel();
  }
  at::Tensor receive = at::empty({received}, send.options());
  auto in = std::make_shared<Pieces>();
  auto out = std::make_shared<Pieces>();
  for (int i = 0; i < size_; ++i) {
    in->counts.push_back(bytes(inputs[i]));
    out->counts.push_back(bytes(outputs[i]));
    in->displs.push_back(i == 0 ? 0 : in->displs[i - 1] + in->counts[i - 1]);
    out->displs.push_back(i == 0 ? 0 : out->displs[i - 1] + out->counts[i - 1]);
  }
  std::vector<at::Tensor> targets = outputs;
  return submit(
      {c10d::OpType::ALLTOALL,
       outputs,
       {send, receive},
       [=, this](weftStream_t stream) {
         check(weftAllToAllv(data(send), in->counts.data(), in->displs.data(), data(receive),
                             out->counts.data(), out->displs.data(), weftUint8, comm_, stream),
               "weftAllToAllv");
       },
       [=] { split_into(receive, targets); },
       !opts.asyncOp},
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                 int /*tag: Weft orders messages per peer*/) {
  at::Tensor buffer = dense(single(tensors, "send"), "send");
  return submit({c10d::OpType::SEND,
                 tensors,
                 {buffer},
                 [=, this](weftStream_t stream) {
                   check(weftSend(data(buffer), bytes(buffer), weftUint8, dst, comm_, stream),
                         "weftSend");
                 },
                 nullptr},
                ::kNoTimeout, &sends_);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                 int /*tag*/) {
  const at::Tensor& tensor = single(tensors, "recv");
  at::Tensor buffer = dense(tensor, "recv");
  return submit({c10d::OpType::RECV,
                 tensors,
                 {buffer},
                 [=, this](weftStream_t stream) {
                   check(weftRecv(data(buffer), bytes(buffer), weftUint8, src, comm_, stream),
                         "weftRecv");
                 },
                 [=] { copy_back(tensor, buffer); }},
                ::kNoTimeout, &receives_);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::barrier(const c10d::BarrierOptions& opts) {
  return submit({c10d::OpType::BARRIER,
                 {},
                 {},
                 [this](weftStream_t stream) { check(weftBarrier(comm_, stream), "weftBarrier"); },
                 nullptr,
                 !opts.asyncOp},
                opts.timeout);
}

}  // namespace weft_torch
