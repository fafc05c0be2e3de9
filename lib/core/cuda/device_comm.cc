#include "core/cuda/device_comm.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "common/env.h"
#include "common/log.h"
#include "common/wire.h"
#include "core/bootstrap_protocol.h"
#include "core/communicator.h"
#include "core/cuda/reduce_launch.h"
#include "core/socket.h"
#include "transports/cuda_ipc/fd_exchange.h"

namespace weft::cuda {

namespace {

constexpr const char* kWhat = "GPU path";
// Above every value a wait asks (counters count chunks: far below 2^62 in any life), and
// "(int64_t)(value - wanted) >= 0" for all of them.
constexpr uint64_t kReleased = uint64_t{1} << 62;
constexpr size_t kNonceBytes = 16;

#define WEFT_CU(call, name)                                                                 \
  do {                                                                                      \
    if (drv::Result r_ = (call); r_ != drv::kSuccess) return driver_error(r_, kWhat, name); \
  } while (0)

// Regions of ranks that are threads of this process, by communicator nonce and rank: a peer
// thread keeps the region alive while its stream may still write there.
std::mutex g_regions_mutex;
std::map<std::pair<std::string, int>, std::weak_ptr<Region>>* g_regions =
    new std::map<std::pair<std::string, int>, std::weak_ptr<Region>>;

// One thread per process watches every device communicator with work in flight.
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* watchdog = new Watchdog;  // never destroyed: ranks may outlive statics
    return *watchdog;
  }
  void add(DeviceComm* comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.insert(comm);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    changed_.notify_all();
  }
  void remove(DeviceComm* comm) {
    std::unique_lock<std::mutex> lock(mutex_);
    comms_.erase(comm);
    // A look at `comm` in progress finishes before its owner goes on to free it.
    changed_.wait(lock, [&] { return watching_ != comm; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait_for(lock, kTick, [&] { return false; });
      const auto now = std::chrono::steady_clock::now();
      std::vector<DeviceComm*> comms(comms_.begin(), comms_.end());
      for (DeviceComm* comm : comms) {
        if (comms_.count(comm) == 0) continue;
        watching_ = comm;
        lock.unlock();
        comm->watch(now);
        lock.lock();
        watching_ = nullptr;
        changed_.notify_all();
      }
    }
  }
  static constexpr auto kTick = std::chrono::milliseconds(10);
  std::mutex mutex_;
  std::condition_variable changed_;
  std::set<DeviceComm*> comms_;
  DeviceComm* watching_ = nullptr;
  std::thread thread_;
};

std::string hex(const uint8_t* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    text += digits[bytes[i] >> 4];
    text += digits[bytes[i] & 15];
  }
  return text;
}

// What each rank tells the others before anything is allocated.
struct Announcement {
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  int32_t device = -1;
  uint8_t posix_fd = 0;  // the device can export POSIX-fd handles
  uint8_t forced = 0;    // WEFT_CUDA_IPC: 0 auto, 1 posix-fd, 2 legacy
  uint8_t nonce[kNonceBytes] = {};
};

}  // namespace

Status DeviceComm::create(Communicator* comm, int device, const Allgather& allgather,
                          std::unique_ptr<DeviceComm>* out) {
  std::unique_ptr<DeviceComm> self(new DeviceComm);
  self->comm_ = comm;
  self->rank_ = comm->rank();
  self->nranks_ = comm->nranks();
  self->device_ = device;
  WEFT_RETURN_IF_ERROR(self->setup(allgather));
  Watchdog::instance().add(self.get());
  *out = std::move(self);
  return Status::Ok();
}

Status DeviceComm::setup(const Allgather& allgather) {
  const Api* d = api();
  if (d == nullptr)
    return Error(weftInvalidUsage,
                 "config->cudaDevice is %d, but this process has not loaded the CUDA driver: "
                 "initialise CUDA (cudaSetDevice, cuInit) before creating the communicator",
                 device_);
  int devices = 0;
  WEFT_CU(d->device_get_count(&devices), "cuDeviceGetCount");
  if (device_ < 0 || device_ >= devices)
    return Error(weftInvalidArgument,
                 "config->cudaDevice %d is not a CUDA device (this process sees %d)", device_,
                 devices);
  drv::Device handle = 0;
  WEFT_CU(d->device_get(&handle, device_), "cuDeviceGet");
  WEFT_CU(d->primary_ctx_retain(&context_, handle), "cuDevicePrimaryCtxRetain");
  context_retained_ = true;
  ContextScope scope(context_);
  WEFT_RETURN_IF_ERROR(scope.status());

  for (const PeerInfo& peer : comm_->peers())
    if (peer.host_hash != comm_->peers()[rank_].host_hash)
      return Error(weftInvalidUsage,
                   "a GPU communicator needs every rank on one node for now (rank %d is on %s, "
                   "rank %d on %s): the GPU path between nodes (staging through host memory "
                   "over UCX) is not built yet",
                   rank_, comm_->peers()[rank_].host.c_str(),
                   static_cast<int>(&peer - comm_->peers().data()), peer.host.c_str());

  Announcement mine;
  mine.slot_bytes = env_value("WEFT_CUDA_SLOT_BYTES");
  mine.slots = static_cast<uint32_t>(env_value("WEFT_CUDA_SLOTS"));
  mine.device = device_;
  mine.posix_fd = supports_posix_fd(handle) ? 1 : 0;
  mine.forced = static_cast<uint8_t>(env_value("WEFT_CUDA_IPC"));
  if (rank_ == 0) WEFT_RETURN_IF_ERROR(random_bytes(mine.nonce, sizeof mine.nonce));
  WireWriter writer;
  writer.put(mine);
  std::vector<Blob> all;
  WEFT_RETURN_IF_ERROR(allgather(writer.data(), &all));
  std::vector<Announcement> ranks(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    WireReader reader(all[r]);
    if (!reader.get(&ranks[r]))
      return Error(weftRemoteError, "malformed GPU setup announcement from rank %d", r);
    if (ranks[r].slot_bytes != mine.slot_bytes || ranks[r].slots != mine.slots)
      return Error(weftInvalidUsage,
                   "WEFT_CUDA_SLOT_BYTES / WEFT_CUDA_SLOTS differ between ranks: rank %d has "
                   "%llu x %u, rank %d has %llu x %u",
                   rank_, static_cast<unsigned long long>(mine.slot_bytes), mine.slots, r,
                   static_cast<unsigned long long>(ranks[r].slot_bytes), ranks[r].slots);
    if (ranks[r].forced != mine.forced)
      return Error(weftInvalidUsage, "WEFT_CUDA_IPC differs between ranks %d and %d", rank_, r);
  }
  slot_bytes_ = mine.slot_bytes;
  slots_ = mine.slots;
  const std::string nonce = hex(ranks[0].nonce, kNonceBytes);

  // How each pair meets: threads of one process by pointer; otherwise every rank's one kind.
  bool cross = false, all_fd = true;
  kinds_.assign(nranks_, IpcKind::Pointer);
  for (int r = 0; r < nranks_; ++r) {
    cross |= comm_->peers()[r].pid != comm_->peers()[rank_].pid;
    all_fd &= ranks[r].posix_fd != 0;
  }
  IpcKind kind = IpcKind::Pointer;
  if (cross) {
    if (mine.forced == 1 && !all_fd)
      return Error(weftInvalidUsage,
                   "WEFT_CUDA_IPC=posix-fd, but a rank's GPU cannot export POSIX-fd handles");
    kind = mine.forced == 2 || !all_fd ? IpcKind::Legacy : IpcKind::PosixFd;
    legacy_ = kind == IpcKind::Legacy;
  }
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && comm_->peers()[r].pid != comm_->peers()[rank_].pid) kinds_[r] = kind;

  flags_bytes_ = (2 * static_cast<size_t>(nranks_) * sizeof(uint64_t) + 4095) / 4096 * 4096;
  const size_t region_bytes = flags_bytes_ + static_cast<size_t>(nranks_) * slots_ * slot_bytes_;
  region_ = std::make_shared<Region>();
  WEFT_RETURN_IF_ERROR(Region::allocate(handle, region_bytes, kind, region_.get()));
  // Counters start at zero before any peer can see them.
  WEFT_CU(d->stream_create(&queue_, drv::kStreamNonBlocking), "cuStreamCreate");
  WEFT_CU(d->stream_create(&rescue_, drv::kStreamNonBlocking), "cuStreamCreate");
  WEFT_CU(d->memset_d8_async(region_->base(), 0, flags_bytes_, queue_), "cuMemsetD8Async");
  WEFT_CU(d->stream_synchronize(queue_), "cuStreamSynchronize");
  {
    std::lock_guard<std::mutex> lock(g_regions_mutex);
    (*g_regions)[{nonce, rank_}] = region_;
  }

  cuda_ipc::FdExchange fds;
  if (kind == IpcKind::PosixFd)
    WEFT_RETURN_IF_ERROR(fds.listen(ranks[0].nonce, kNonceBytes, rank_, nranks_));
  WireWriter second;
  second.put<uint64_t>(region_->base());
  second.put<uint64_t>(region_->bytes());
  drv::IpcMemHandle legacy{};
  if (kind == IpcKind::Legacy) WEFT_RETURN_IF_ERROR(region_->export_legacy(&legacy));
  second.put(legacy);
  all.clear();
  WEFT_RETURN_IF_ERROR(allgather(second.data(), &all));

  peers_.resize(nranks_);
  same_process_.resize(nranks_);
  const int64_t timeout_ms = comm_->timeout_ms();
  if (kind == IpcKind::PosixFd) {
    int fd = -1;
    WEFT_RETURN_IF_ERROR(region_->export_fd(&fd));
    cuda_ipc::UniqueFd exported(fd);
    const uint64_t bytes = region_->bytes();
    for (int r = 0; r < nranks_; ++r)
      if (kinds_[r] == IpcKind::PosixFd)
        WEFT_RETURN_IF_ERROR(fds.send(r, &fd, 1, &bytes, sizeof bytes, timeout_ms));
  }
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    WireReader reader(all[r]);
    uint64_t base = 0, bytes = 0;
    drv::IpcMemHandle handle_bytes{};
    if (!reader.get(&base) || !reader.get(&bytes) || !reader.get(&handle_bytes))
      return Error(weftRemoteError, "malformed GPU region description from rank %d", r);
    switch (kinds_[r]) {
      case IpcKind::Pointer: {
        std::lock_guard<std::mutex> lock(g_regions_mutex);
        auto it = g_regions->find({nonce, r});
        same_process_[r] = it != g_regions->end() ? it->second.lock() : nullptr;
        if (!same_process_[r] || same_process_[r]->base() != base)
          return Error(weftInternalError, "rank %d's GPU region is not in this process", r);
        peers_[r] = Region::from_pointer(base, bytes);
        break;
      }
      case IpcKind::PosixFd: {
        cuda_ipc::FdMessage message;
        WEFT_RETURN_IF_ERROR(fds.recv(r, &message, timeout_ms));
        if (message.fds.size() != 1)
          return Error(weftRemoteError, "rank %d sent %zu descriptors for its GPU region", r,
                       message.fds.size());
        WEFT_RETURN_IF_ERROR(Region::from_fd(message.fds[0].get(), bytes, handle, &peers_[r]));
        break;
      }
      case IpcKind::Legacy:
        WEFT_RETURN_IF_ERROR(Region::from_legacy(handle_bytes, bytes, &peers_[r]));
        break;
    }
  }
  {
    // The entry is only needed while the peers of this process look it up.
    std::lock_guard<std::mutex> lock(g_regions_mutex);
    for (auto it = g_regions->begin(); it != g_regions->end();)
      it = it->second.expired() ? g_regions->erase(it) : std::next(it);
  }

  WEFT_CU(d->event_create(&ready_, drv::kEventDisableTiming), "cuEventCreate");
  WEFT_CU(d->event_create(&done_, drv::kEventDisableTiming), "cuEventCreate");
  void* host = nullptr;
  WEFT_CU(d->mem_host_alloc(&host, sizeof(uint64_t),
                            drv::kHostAllocPortable | drv::kHostAllocDeviceMap),
          "cuMemHostAlloc");
  completed_host_ = static_cast<uint64_t*>(host);
  __atomic_store_n(completed_host_, 0, __ATOMIC_RELEASE);
  WEFT_CU(d->mem_host_get_device_pointer(&completed_device_, host, 0), "cuMemHostGetDevicePointer");
  sent_.assign(nranks_, 0);
  received_.assign(nranks_, 0);
  WEFT_LOG(INFO, INIT, "GPU %d: region %zu bytes (%u slots of %llu bytes per peer), peers by %s",
           device_, region_->bytes(), slots_, static_cast<unsigned long long>(slot_bytes_),
           ipc_kinds().c_str());
  return Status::Ok();
}

DeviceComm::~DeviceComm() {
  Watchdog::instance().remove(this);
  if (!context_retained_) return;
  const Api& d = *api();
  {
    ContextScope scope(context_);
    if (queue_ != nullptr && completed() < launched_.load()) {
      // Work still in flight finishes or, on a failed communicator, drains once released.
      if (comm_->async_error() == weftSuccess) (void)wait_all();
      release_waits();
      d.stream_synchronize(queue_);
    }
    if (rescue_ != nullptr) {
      d.stream_synchronize(rescue_);
      d.stream_destroy(rescue_);
    }
    if (queue_ != nullptr) d.stream_destroy(queue_);
    if (ready_ != nullptr) d.event_destroy(ready_);
    if (done_ != nullptr) d.event_destroy(done_);
    if (completed_host_ != nullptr) d.mem_free_host(completed_host_);
    if (scratch_ != 0) d.mem_free(scratch_);
    peers_.clear();
    same_process_.clear();
    region_.reset();
  }
  drv::Device handle = 0;
  if (d.device_get(&handle, device_) == drv::kSuccess) d.primary_ctx_release(handle);
}

algo::LowerConfig DeviceComm::lower_config(size_t element_size) const {
  algo::LowerConfig config;
  config.element_size = element_size;
  config.slot_bytes = slot_bytes_ / element_size * element_size;
  config.slots = slots_;
  return config;
}

std::string DeviceComm::ipc_kinds() const {
  std::string text;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    if (!text.empty()) text += ",";
    text += std::to_string(r) + ":" + ipc_kind_name(kinds_[r]);
  }
  return text.empty() ? "none (one rank)" : text;
}

Status DeviceComm::lower(const algo::Params& params, size_t element_size,
                         std::shared_ptr<DeviceProgram>* out) const {
  auto built = std::make_shared<DeviceProgram>();
  std::string error;
  std::vector<algo::LoweredProgram> all;
  if (!algo::lower_all(params, lower_config(element_size), &all, &error))
    return Error(weftInvalidUsage, "%s (%s) on the GPU: %s",
                 algo::collective_name(params.collective), algo::algorithm_name(params.algorithm),
                 error.c_str());
  // Every rank times the same lists (the slowest rank's is the call's), so that all choose alike.
  for (const algo::LoweredProgram& list : all)
    built->predicted_us =
        std::max(built->predicted_us, algo::predict_device_us(list, element_size));
  built->lowered = std::move(all[rank_]);
  count_channels(built.get());
  built->algorithm = params.algorithm;
  *out = std::move(built);
  return Status::Ok();
}

void DeviceComm::count_channels(DeviceProgram* program) const {
  program->chunks_to.assign(nranks_, 0);
  program->chunks_from.assign(nranks_, 0);
  for (const algo::StreamOp& op : program->lowered.ops) {
    if (op.kind != algo::OpKind::WriteFlag || op.value == 0) continue;
    // Each chunk raises the receiver's Inbound once (sent) and the sender's Ack once (consumed).
    if (op.flag == algo::Flag::Inbound) ++program->chunks_to[op.peer];
    if (op.flag == algo::Flag::Ack) ++program->chunks_from[op.peer];
  }
}

Status DeviceComm::p2p_program(const std::vector<algo::P2pMessage>& sends,
                               const std::vector<algo::P2pMessage>& receives,
                               std::shared_ptr<const DeviceProgram>* out) const {
  auto built = std::make_shared<DeviceProgram>();
  std::string error;
  if (!algo::lower_p2p(nranks_, rank_, sends, receives, lower_config(1), &built->lowered, &error))
    return Error(weftInvalidUsage, "send/recv on the GPU: %s", error.c_str());
  count_channels(built.get());
  built->predicted_us = algo::predict_device_us(built->lowered, 1);
  *out = std::move(built);
  return Status::Ok();
}

Status DeviceComm::plan(const algo::Params& params, size_t element_size,
                        const algo::Algorithm* forced, std::shared_ptr<const DeviceProgram>* out) {
  char key[160];
  snprintf(key, sizeof key, "%d/%d/%llu/%d/%d/%zu", static_cast<int>(params.collective),
           forced != nullptr ? static_cast<int>(*forced) : -1,
           static_cast<unsigned long long>(params.count), params.root, params.in_place ? 1 : 0,
           element_size);
  auto it = programs_.find(key);
  if (it == programs_.end()) {
    std::shared_ptr<DeviceProgram> best;
    Status first_error;
    for (int a = 0; a < algo::kNumAlgorithms; ++a) {
      const auto algorithm = static_cast<algo::Algorithm>(a);
      // Every rank is on this node: the node-level compositions add nothing, and the direct
      // algorithms are the host's shared-memory ones.
      if (forced != nullptr
              ? algorithm != *forced
              : (algo::is_direct(algorithm) || algorithm == algo::Algorithm::Hierarchical ||
                 algorithm == algo::Algorithm::NodeLeader))
        continue;
      algo::Params candidate = params;
      candidate.algorithm = algorithm;
      std::string why;
      if (!algo::supports(algorithm, params.collective) || !algo::applicable(candidate, &why)) {
        if (forced != nullptr)
          return Error(weftInvalidUsage,
                       "%s: the forced algorithm %s does not apply on the GPU: %s",
                       algo::collective_name(params.collective), algo::algorithm_name(algorithm),
                       why.empty() ? "it does not implement it" : why.c_str());
        continue;
      }
      std::shared_ptr<DeviceProgram> lowered;
      Status status = lower(candidate, element_size, &lowered);
      if (!status.ok()) {
        if (first_error.ok()) first_error = status;
        continue;
      }
      if (!best || lowered->predicted_us < best->predicted_us) best = std::move(lowered);
    }
    if (!best)
      return first_error.ok() ? Error(weftInvalidUsage, "%s: no algorithm runs it on the GPU",
                                      algo::collective_name(params.collective))
                              : first_error;
    // Shapes vary with the callers' sizes: keep the cache bounded.
    if (programs_.size() >= 256) programs_.clear();
    it = programs_.emplace(key, std::move(best)).first;
  }
  last_algorithm_ = algo::algorithm_name(it->second->algorithm);
  last_predicted_us_ = it->second->predicted_us;
  *out = it->second;
  return Status::Ok();
}

drv::DevicePtr DeviceComm::flag(drv::DevicePtr base, algo::Flag which, int peer) const {
  const size_t index = (which == algo::Flag::Inbound ? 0 : static_cast<size_t>(nranks_)) + peer;
  return base + index * sizeof(uint64_t);
}

drv::DevicePtr DeviceComm::inbound(drv::DevicePtr base, int sender) const {
  return base + flags_bytes_ + static_cast<size_t>(sender) * slots_ * slot_bytes_;
}

uint64_t DeviceComm::completed() const {
  return __atomic_load_n(completed_host_, __ATOMIC_ACQUIRE);
}

Status DeviceComm::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return Status::Ok();
  const Api& d = *api();
  // Work in flight may still use the old scratch.
  if (scratch_ != 0) {
    WEFT_CU(d.stream_synchronize(queue_), "cuStreamSynchronize");
    WEFT_CU(d.mem_free(scratch_), "cuMemFree");
    scratch_ = 0;
    scratch_bytes_ = 0;
  }
  size_t rounded = 1 << 16;
  while (rounded < bytes) rounded *= 2;
  WEFT_CU(d.mem_alloc(&scratch_, rounded), "cuMemAlloc (scratch)");
  scratch_bytes_ = rounded;
  return Status::Ok();
}

Status DeviceComm::emit(const DeviceOp& op, drv::DevicePtr staged_input) {
  const Api& d = *api();
  const algo::LoweredProgram& lowered = op.program->lowered;
  const size_t element = op.math.element_size;
  auto address = [&](const algo::Loc& loc) -> drv::DevicePtr {
    switch (loc.space) {
      case algo::Space::Input:
        return (staged_input != 0 ? staged_input : op.input) + loc.offset;
      case algo::Space::Output:
        return op.output + loc.offset;
      case algo::Space::Scratch:
        return scratch_ + loc.offset;
      case algo::Space::Inbound:
        return inbound(region_->base(), loc.peer) + loc.offset;
      case algo::Space::PeerInbound:
        return inbound(peers_[loc.peer].base(), rank_) + loc.offset;
    }
    return 0;
  };
  for (const algo::StreamOp& s : lowered.ops) {
    switch (s.kind) {
      case algo::OpKind::Copy:
        WEFT_CU(d.memcpy_async(address(s.dst), address(s.a), s.bytes, queue_), "cuMemcpyAsync");
        break;
      case algo::OpKind::WriteFlag: {
        // Inbound: a chunk this rank sent to s.peer; Ack: one it consumed from s.peer.
        const bool sent = s.flag == algo::Flag::Inbound;
        if (!sent && s.value == 0) break;  // the opening Ack: counters never restart
        const uint64_t value = (sent ? sent_[s.peer] : received_[s.peer]) + s.value;
        WEFT_CU(d.stream_write_value64(queue_, flag(peers_[s.peer].base(), s.flag, rank_), value,
                                       drv::kWriteValueDefault),
                "cuStreamWriteValue64");
        break;
      }
      case algo::OpKind::WaitFlag: {
        // Inbound: s.peer's chunk has arrived; Ack: s.peer consumed what this rank sent.
        const bool arrived = s.flag == algo::Flag::Inbound;
        const uint64_t value = (arrived ? received_[s.peer] : sent_[s.peer]) + s.value;
        WEFT_CU(d.stream_wait_value64(queue_, flag(region_->base(), s.flag, s.peer), value,
                                      drv::kWaitValueGeq),
                "cuStreamWaitValue64");
        break;
      }
      case algo::OpKind::Reduce: {
        const void* inputs[2] = {reinterpret_cast<const void*>(address(s.a)),
                                 reinterpret_cast<const void*>(address(s.b))};
        ReduceCall call;
        call.dtype = op.math.dtype;
        call.op = op.math.op;
        call.n = 2;
        call.inputs = inputs;
        call.output = reinterpret_cast<void*>(address(s.dst));
        call.count = s.count;
        WEFT_RETURN_IF_ERROR(launch_reduce(call, queue_));
        break;
      }
    }
  }
  for (int p = 0; p < nranks_; ++p) {
    sent_[p] += op.program->chunks_to[p];
    received_[p] += op.program->chunks_from[p];
  }
  if (op.math.divide_count > 0) {
    void* out = reinterpret_cast<void*>(op.output + op.math.divide_offset * element);
    const void* inputs[1] = {out};
    ReduceCall call;
    call.dtype = op.math.dtype;
    call.n = 1;
    call.inputs = inputs;
    call.output = out;
    call.count = op.math.divide_count;
    call.divisor = op.math.divisor;
    WEFT_RETURN_IF_ERROR(launch_reduce(call, queue_));
  }
  return Status::Ok();
}

Status DeviceComm::enqueue(const DeviceOp& op, void* user_stream, bool join, uint64_t* ticket) {
  const Api& d = *api();
  ContextScope scope(context_);
  WEFT_RETURN_IF_ERROR(scope.status());
  const size_t element = op.math.element_size;
  const size_t list_scratch = (op.program->lowered.scratch_bytes + 255) / 256 * 256;
  const size_t staged_bytes = op.math.premul ? op.math.premul_count * element : 0;
  WEFT_RETURN_IF_ERROR(ensure_scratch(list_scratch + staged_bytes));
  auto run = [&]() -> Status {
    WEFT_CU(d.event_record(ready_, user_stream), "cuEventRecord (the caller's stream)");
    WEFT_CU(d.stream_wait_event(queue_, ready_, 0), "cuStreamWaitEvent");
    drv::DevicePtr staged = 0;
    if (op.math.premul && staged_bytes > 0) {
      staged = scratch_ + list_scratch;
      const void* inputs[1] = {reinterpret_cast<const void*>(op.input)};
      ReduceCall call;
      call.dtype = op.math.dtype;
      call.n = 1;
      call.inputs = inputs;
      call.output = reinterpret_cast<void*>(staged);
      call.count = op.math.premul_count;
      if (op.math.premul_source != nullptr)
        call.scalar_device = op.math.premul_source;
      else
        call.scalar_host = op.math.premul_value;
      WEFT_RETURN_IF_ERROR(launch_reduce(call, queue_));
    }
    WEFT_RETURN_IF_ERROR(emit(op, staged));
    const uint64_t number = launched_.load(std::memory_order_relaxed) + 1;
    InFlight record{number, op.what, received_, std::vector<uint64_t>(nranks_, 0)};
    for (int p = 0; p < nranks_; ++p) record.ack_end[p] = sent_[p] - op.program->chunks_to[p];
    for (const algo::StreamOp& s : op.program->lowered.ops)
      if (s.kind == algo::OpKind::WaitFlag && s.flag == algo::Flag::Ack)
        record.ack_end[s.peer] = std::max(record.ack_end[s.peer],
                                          sent_[s.peer] - op.program->chunks_to[s.peer] + s.value);
    WEFT_CU(d.stream_write_value64(queue_, completed_device_, number, drv::kWriteValueDefault),
            "cuStreamWriteValue64");
    if (join) {
      WEFT_CU(d.event_record(done_, queue_), "cuEventRecord");
      WEFT_CU(d.stream_wait_event(user_stream, done_, 0),
              "cuStreamWaitEvent (the caller's stream)");
    }
    {
      std::lock_guard<std::mutex> lock(in_flight_mutex_);
      in_flight_.push_back(std::move(record));
    }
    launched_.store(number, std::memory_order_release);
    *ticket = number;
    return Status::Ok();
  };
  Status status = run();
  if (!status.ok()) {
    // Peers are left waiting for what this rank never enqueued.
    comm_->fail_everywhere(status.code(), status.message());
    release_waits();
  }
  return status;
}

std::string DeviceComm::stuck_message(int64_t waited_ms) {
  InFlight oldest{0, "", {}, {}};
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    const uint64_t done = completed();
    while (!in_flight_.empty() && in_flight_.front().ticket <= done) in_flight_.pop_front();
    if (!in_flight_.empty()) oldest = in_flight_.front();
  }
  // This rank's counters, read through the rescue stream (the queue is stuck).
  std::vector<uint64_t> counters(2 * static_cast<size_t>(nranks_), 0);
  const Api& d = *api();
  std::string peers;
  ContextScope scope(context_);
  if (scope.status().ok() && !oldest.inbound_end.empty() &&
      d.memcpy_async(reinterpret_cast<drv::DevicePtr>(counters.data()), region_->base(),
                     counters.size() * sizeof(uint64_t), rescue_) == drv::kSuccess &&
      d.stream_synchronize(rescue_) == drv::kSuccess) {
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      const bool missing_chunks = counters[p] < oldest.inbound_end[p];
      const bool unconsumed = counters[nranks_ + p] < oldest.ack_end[p];
      if (missing_chunks || unconsumed)
        peers += (peers.empty() ? "rank " : ", rank ") + std::to_string(p);
    }
  }
  char text[512];
  snprintf(text, sizeof text,
           "rank %d: GPU operation %llu (%s) made no progress for %lld ms%s%s: a peer did not make "
           "the matching call, or stalled, or died",
           rank_, static_cast<unsigned long long>(oldest.ticket), oldest.what,
           static_cast<long long>(waited_ms), peers.empty() ? "" : " waiting for ", peers.c_str());
  return text;
}

Status DeviceComm::wait(uint64_t ticket) {
  for (int spin = 0; completed() < ticket && comm_->async_error() == weftSuccess; ++spin) {
    // A small call completes within microseconds; a large one may take milliseconds.
    if (spin < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1000 ? 20 : 200));
  }
  return comm_->failure();
}

Status DeviceComm::wait_all() {
  return wait(launched_.load(std::memory_order_acquire));
}

void DeviceComm::finalize(const Allgather& allgather) {
  if (!legacy_ || comm_->async_error() != weftSuccess) return;
  if (!wait_all().ok()) return;
  std::vector<Blob> ignored;
  (void)allgather(Blob{}, &ignored);
}

void DeviceComm::release_waits() {
  const Api* d = api();
  if (d == nullptr || rescue_ == nullptr) return;
  ContextScope scope(context_);
  if (!scope.status().ok()) return;
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    for (algo::Flag which : {algo::Flag::Inbound, algo::Flag::Ack})
      d->stream_write_value64(rescue_, flag(region_->base(), which, p), kReleased,
                              drv::kWriteValueDefault);
  }
}

void DeviceComm::watch(std::chrono::steady_clock::time_point now) {
  const uint64_t done = completed(), launched = launched_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    while (!in_flight_.empty() && in_flight_.front().ticket <= done) in_flight_.pop_front();
  }
  if (done >= launched) {
    was_idle_ = true;
    return;
  }
  if (comm_->async_error() != weftSuccess) {
    release_waits();
    return;
  }
  if (done != watched_done_ || was_idle_) {  // progress, or new work: the clock starts now
    watched_done_ = done;
    was_idle_ = false;
    last_progress_ = now;
    return;
  }
  const int64_t waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress_).count();
  if (waited <= comm_->timeout_ms()) return;
  const std::string message = stuck_message(waited);
  WEFT_LOG(WARN, COLL, "%s", message.c_str());
  comm_->fail(weftTimeout, message);
  release_waits();
}

}  // namespace weft::cuda
