// Host streams and events. A stream runs its operations in order, streams
// run concurrently, and an enqueue returns at once. One progress thread per
// process drives every stream: it advances the operation at the head of each
// stream together (so two streams overlap, and an operation waiting on a
// peer never blocks another stream), and sleeps on the transports' event fds
// when nothing moves, so an idle process costs no CPU.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "core/executor.h"

namespace weft {

class Event {
 public:
  static constexpr uint64_t kMagic = 0x7765667445564e54ull;  // "weftEVNT"
  uint64_t magic = kMagic;

 private:
  friend class StreamEngine;
  uint64_t recorded_ = 0;   // generation of the last record call
  uint64_t completed_ = 0;  // generation the stream has passed
  Status error_;            // set if the stream had failed when it passed the record
};

class Stream {
 public:
  static constexpr uint64_t kMagic = 0x7765667453545245ull;  // "weftSTRE"
  uint64_t magic = kMagic;
  Stream();
  ~Stream();

  // Set by weftStreamCreateFromCuda: the cudaStream_t this stream stands for
  // (null: the legacy default stream) and its device.
  struct Cuda {
    bool bound = false;
    void* stream = nullptr;
    int device = -1;
  };
  Cuda cuda;

 private:
  friend class StreamEngine;
  struct Op;
  std::deque<std::unique_ptr<Op>> queue_;
  Status error_;  // first failure; later operations complete with it
};

class StreamEngine {
 public:
  static StreamEngine& instance();

  void add_stream(Stream* stream);
  // Drains the stream's work, then forgets it; with the last stream the thread
  // and its eventfd end, so a process holds them only while it has streams.
  Status remove_stream(Stream* stream);

  // Queues a batch of jobs (prepared, sequence numbers assigned) on `stream`.
  void enqueue_jobs(Stream* stream, JobBatch batch);
  void enqueue_record(Stream* stream, Event* event);
  void enqueue_wait(Stream* stream, Event* event);

  // Waits until the stream has run everything queued so far.
  Status synchronize(Stream* stream);
  // Ok when idle, weftInProgress while busy, or the stream's error.
  Status query(Stream* stream);
  Status event_synchronize(Event* event);
  Status event_query(Event* event);
  // Waits until no queued operation refers to the event, so it can be freed.
  void forget_event(Event* event);
  // Waits until no queued operation uses `comm`.
  void wait_for_comm(Communicator* comm);

 private:
  StreamEngine() = default;
  ~StreamEngine();
  void ensure_thread();
  void forget_in_child();
  void wake();
  void run();
  // Under mutex_: moves every stream's head along as far as it goes without
  // running jobs; returns the heads that are jobs in progress.
  void collect_heads(std::vector<Stream::Op*>* active);
  void finish_head(Stream* stream, const Status& status);

  // Held while the thread starts or stops (taken before mutex_), so that a stream added
  // meanwhile gets a running thread.
  std::mutex lifecycle_mutex_;
  std::mutex mutex_;
  std::condition_variable changed_;  // an operation finished
  std::vector<Stream*> streams_;
  std::thread thread_;
  int wake_fd_ = -1;
  // Set (under mutex_) while the thread may sleep on a direct doorbell
  // instead of wake_fd_: wake() rings it too.
  std::atomic<shm::Doorbell*> sleeping_bell_{nullptr};
  bool stopping_ = false;
  // Threads of a parent, in a forked child; never freed (their threads are gone).
  std::vector<std::thread>* orphans_ = nullptr;
};

}  // namespace weft
