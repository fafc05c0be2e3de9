#include "core/stream.h"

#include <pthread.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"

namespace weft {

struct Stream::Op {
  enum class Kind { Jobs, Record, Wait };
  Kind kind = Kind::Jobs;
  Stream* stream = nullptr;
  JobBatch batch;
  std::unique_ptr<JobRunner> runner;
  bool started = false;
  Deadline deadline;
  Event* event = nullptr;
  uint64_t generation = 0;
};

Stream::Stream() = default;
Stream::~Stream() = default;

StreamEngine& StreamEngine::instance() {
  static StreamEngine engine;
  return engine;
}

StreamEngine::~StreamEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void StreamEngine::ensure_thread() {
  if (thread_.joinable()) return;
  if (orphans_ == nullptr) {
    // The thread does not follow a fork: a child starts afresh, with its own
    // thread should it make streams, and never joins the parent's.
    orphans_ = new std::vector<std::thread>();
    pthread_atfork(
        [] {
          instance().lifecycle_mutex_.lock();
          instance().mutex_.lock();
        },
        [] {
          instance().mutex_.unlock();
          instance().lifecycle_mutex_.unlock();
        },
        [] { instance().forget_in_child(); });
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { run(); });
  // Named before any caller can look (top -H, gdb, the tests).
  pthread_setname_np(thread_.native_handle(), "weft-streams");
}

void StreamEngine::forget_in_child() {
  if (thread_.joinable()) {
    // Neither joinable nor destructible without its thread: kept, unused.
    orphans_->push_back(std::move(thread_));
    close(wake_fd_);
    wake_fd_ = -1;
  }
  streams_.clear();  // the parent's
  mutex_.unlock();
  lifecycle_mutex_.unlock();
}

void StreamEngine::wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (shm::Doorbell* bell = sleeping_bell_.load()) bell->interrupt();
}

void StreamEngine::add_stream(Stream* stream) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_thread();
  streams_.push_back(stream);
}

Status StreamEngine::remove_stream(Stream* stream) {
  Status status = synchronize(stream);
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  std::thread retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
    if (!streams_.empty() || !thread_.joinable()) return status;
    stopping_ = true;  // no stream left, so no work queued
    wake();
    retired = std::move(thread_);
  }
  retired.join();
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = false;
  close(wake_fd_);
  wake_fd_ = -1;
  return status;
}

void StreamEngine::enqueue_jobs(Stream* stream, JobBatch batch) {
  auto op = std::make_unique<Stream::Op>();
  op->kind = Stream::Op::Kind::Jobs;
  op->stream = stream;
  op->batch = std::move(batch);
  assign_direct_tickets(op->batch.jobs);
  for (const Job& job : op->batch.jobs) job.comm->pending_stream_ops().fetch_add(1);
  std::lock_guard<std::mutex> lock(mutex_);
  stream->queue_.push_back(std::move(op));
  wake();
}

void StreamEngine::enqueue_record(Stream* stream, Event* event) {
  auto op = std::make_unique<Stream::Op>();
  op->kind = Stream::Op::Kind::Record;
  op->stream = stream;
  op->event = event;
  std::lock_guard<std::mutex> lock(mutex_);
  op->generation = ++event->recorded_;
  stream->queue_.push_back(std::move(op));
  wake();
}

void StreamEngine::enqueue_wait(Stream* stream, Event* event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (event->recorded_ == 0) return;  // never recorded: nothing to wait for
  auto op = std::make_unique<Stream::Op>();
  op->kind = Stream::Op::Kind::Wait;
  op->stream = stream;
  op->event = event;
  op->generation = event->recorded_;
  stream->queue_.push_back(std::move(op));
  wake();
}

Status StreamEngine::synchronize(Stream* stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return stream->queue_.empty(); });
  return stream->error_;
}

Status StreamEngine::query(Stream* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stream->queue_.empty()) return Status(weftInProgress, "stream has work in progress");
  return stream->error_;
}

Status StreamEngine::event_synchronize(Event* event) {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t target = event->recorded_;
  changed_.wait(lock, [&] { return event->completed_ >= target; });
  return event->error_;
}

Status StreamEngine::event_query(Event* event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (event->completed_ < event->recorded_) return Status(weftInProgress, "event not reached yet");
  return event->error_;
}

void StreamEngine::forget_event(Event* event) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    for (Stream* stream : streams_)
      for (const auto& op : stream->queue_)
        if (op->event == event) return false;
    return true;
  });
}

void StreamEngine::wait_for_comm(Communicator* comm) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return comm->pending_stream_ops().load() == 0; });
}

void StreamEngine::finish_head(Stream* stream, const Status& status) {
  std::unique_ptr<Stream::Op> op = std::move(stream->queue_.front());
  stream->queue_.pop_front();
  if (!status.ok() && stream->error_.ok()) stream->error_ = status;
  for (const Job& job : op->batch.jobs) job.comm->pending_stream_ops().fetch_sub(1);
  changed_.notify_all();
}

void StreamEngine::collect_heads(std::vector<Stream::Op*>* active) {
  active->clear();
  bool changed = true;
  while (changed) {  // a record can release a wait on another stream
    changed = false;
    for (Stream* stream : streams_) {
      while (!stream->queue_.empty()) {
        Stream::Op* op = stream->queue_.front().get();
        if (op->kind == Stream::Op::Kind::Record) {
          op->event->completed_ = std::max(op->event->completed_, op->generation);
          op->event->error_ = stream->error_;
          finish_head(stream, Status::Ok());
          changed = true;
        } else if (op->kind == Stream::Op::Kind::Wait) {
          if (op->event->completed_ < op->generation) break;
          finish_head(stream, Status::Ok());
          changed = true;
        } else if (!op->started && !stream->error_.ok()) {
          // Work queued behind a failure completes at once with that failure.
          finish_head(stream, stream->error_);
          changed = true;
        } else {
          break;
        }
      }
    }
  }
  for (Stream* stream : streams_) {
    if (stream->queue_.empty()) continue;
    Stream::Op* op = stream->queue_.front().get();
    if (op->kind != Stream::Op::Kind::Jobs) continue;
    if (!op->started) {
      op->runner = std::make_unique<JobRunner>();
      op->runner->start(op->batch.jobs);
      op->deadline = deadline_after_ms(op->runner->timeout_ms());
      op->started = true;
    }
    active->push_back(op);
  }
}

void StreamEngine::run() {
  std::vector<Stream::Op*> active;
  std::vector<Communicator*> comms;
  ProgressLoop loop(comms, wake_fd_);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sleeping_bell_.store(nullptr);  // before any op can finish and its comm go away
      if (stopping_) return;
      collect_heads(&active);
    }
    bool progressed = false;
    for (Stream::Op* op : active) {
      bool moved = false;
      Status status = op->runner->advance(&moved);
      if (status.ok() && moved) op->deadline = deadline_after_ms(op->runner->timeout_ms());
      if (status.ok() && !op->runner->done() && Clock::now() >= op->deadline) {
        status = Error(
            weftTimeout, "rank %d: stream operation timed out after %lld ms waiting for %s",
            op->runner->comms().front()->rank(), static_cast<long long>(op->runner->timeout_ms()),
            op->runner->describe_waits().c_str());
        for (Communicator* comm : op->runner->comms()) comm->fail(status.code(), status.message());
        status = op->runner->comms().front()->failure();  // the verdict
        op->runner->abandon();
      }
      if (!status.ok() || op->runner->done()) {
        loop.disarm();
        std::lock_guard<std::mutex> lock(mutex_);
        finish_head(op->stream, status);
        moved = true;
      }
      progressed = progressed || moved;
    }
    if (progressed) {
      loop.progressed();
      continue;
    }
    if (active.empty()) {
      // Nothing to run: sleep until work is queued.
      pollfd wake{wake_fd_, POLLIN, 0};
      poll(&wake, 1, -1);
      uint64_t drained;
      (void)!read(wake_fd_, &drained, sizeof(drained));
      continue;
    }
    comms.clear();
    Deadline nearest = active.front()->deadline;
    // Sleep on a doorbell only when every active op waits for direct peers.
    shm::Doorbell* bell = active.front()->runner->doorbell();
    bool direct_waits = false;
    for (Stream::Op* op : active) {
      nearest = std::min(nearest, op->deadline);
      if (op->runner->doorbell() == nullptr) bell = nullptr;
      direct_waits = direct_waits || op->runner->direct_waiting();
      for (Communicator* comm : op->runner->comms())
        if (std::find(comms.begin(), comms.end(), comm) == comms.end()) comms.push_back(comm);
    }
    loop.set_comms(comms);
    if (std::any_of(active.begin(), active.end(),
                    [](const Stream::Op* op) { return op->runner->transfers_moved(); })) {
      loop.progressed();  // data is moving: keep at it instead of idling (JobRunner)
      continue;
    }
    if (bell != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      sleeping_bell_.store(bell);
      // Work queued since the heads were collected wrote wake_fd_ before
      // it could see the bell: look again instead of sleeping.
      pollfd wake{wake_fd_, POLLIN, 0};
      if (poll(&wake, 1, 0) > 0) {
        uint64_t drained;
        (void)!read(wake_fd_, &drained, sizeof(drained));
        continue;
      }
    }
    loop.idle(Clock::now(), nearest, bell, direct_waits);
  }
}

}  // namespace weft
