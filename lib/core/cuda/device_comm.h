// A communicator's GPU side (docs/gpu.md): the memory its ranks share on one node, the
// stream its operations run on, and the executor that enqueues lowered stream-operation
// lists (algorithms/lowering.h) there, so that a call returns at once and the GPU runs it in
// the caller's stream order. Made at communicator init when the config names a CUDA device.
//
// Each rank exposes one region of device memory: two 64-bit counters per peer (Inbound[p],
// raised by p after each chunk it put in this rank's slots; Ack[p], raised by p after it
// consumed a chunk this rank sent), then per peer `slots` receive slots of `slot_bytes`.
// Counters count chunks per directed channel over the communicator's whole life, never
// reset, so every wait is "counter >= value" and no operation needs its peers to have
// started: a sender waits only until its slot's previous chunk was consumed.
//
// No kernel ever waits for another rank: waits are stream memory operations. A dead or
// stalled peer leaves a wait unsatisfied: a watchdog thread fails the communicator when an
// operation makes no progress within its timeout, and on any failure (a timeout here, a peer's
// failure reported through the bootstrap, a revoke) releases this rank's waits by raising
// every counter it waits on, so that the stream drains (with meaningless data) instead of
// hanging; the error reaches the caller through the communicator.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/lowering.h"
#include "common/status.h"
#include "core/cuda/driver.h"
#include "core/cuda/peer_memory.h"
#include "core/executor.h"
#include "core/reduce/reduce.h"

namespace weft {

class Communicator;

namespace cuda {

// A lowered list with what it moves per channel, cached per call shape.
struct DeviceProgram {
  algo::LoweredProgram lowered;
  std::vector<uint64_t> chunks_to, chunks_from;  // per peer
  double predicted_us = 0;                       // the device cost model's time
  algo::Algorithm algorithm = algo::Algorithm::Ring;
};

// One operation as the executor enqueues it.
struct DeviceOp {
  const DeviceProgram* program = nullptr;
  drv::DevicePtr input = 0, output = 0;
  JobMath math;  // dtype, op; PreMulSum (input scaled into scratch first); Avg (divided after)
  const char* what = "";
};

class DeviceComm {
 public:
  using Allgather = std::function<Status(const Blob& mine, std::vector<Blob>* all)>;

  // Collective over the communicator's ranks, which must all be on this node: binds to
  // `device` (its primary context), allocates and exports this rank's region, maps every
  // peer's (Pointer, PosixFd or Legacy per pair: peer_memory.h) and starts watching.
  static Status create(Communicator* comm, int device, const Allgather& allgather,
                       std::unique_ptr<DeviceComm>* out);
  ~DeviceComm();

  int device() const { return device_; }
  drv::Context context() const { return context_; }
  // Slots per peer and their size, for lowering (element_size is the call's).
  algo::LowerConfig lower_config(size_t element_size) const;
  // How this rank reaches each peer's region ("pointer", "posix-fd", "legacy"; "" for itself).
  std::string ipc_kinds() const;

  // The lowered list for a call (`params`, its algorithm ignored): with `forced`'s algorithm
  // if given, else with the candidate the device cost model times fastest; cached per shape.
  Status plan(const algo::Params& params, size_t element_size, const algo::Algorithm* forced,
              std::shared_ptr<const DeviceProgram>* out);
  // The list of one rank's point-to-point messages issued together (algo::lower_p2p; their
  // buffers addressed absolutely, so a DeviceOp with input and output 0 runs it).
  Status p2p_program(const std::vector<algo::P2pMessage>& sends,
                     const std::vector<algo::P2pMessage>& receives,
                     std::shared_ptr<const DeviceProgram>* out) const;
  // The last plan's algorithm name ("" before the first) and prediction (weftCommLastAlgorithm).
  const char* last_algorithm() const { return last_algorithm_; }
  double last_predicted_us() const { return last_predicted_us_; }

  // Enqueues `op` on the communicator's stream after `user_stream`'s work so far (a
  // cudaStream_t; NULL: the legacy default stream) and, if `join`, makes `user_stream`'s later
  // work wait for it (a blocking call waits on the host instead: ranks that are threads of one
  // process share the legacy stream, where each one's join would hold back the others' ops).
  // *ticket identifies it for wait(). A failure half way fails the communicator everywhere
  // (its peers would wait for the rest).
  Status enqueue(const DeviceOp& op, void* user_stream, bool join, uint64_t* ticket);
  // Blocks until the operation `ticket` completed or the communicator failed (the watchdog
  // fails it when an operation makes no progress within the timeout).
  Status wait(uint64_t ticket);
  // Waits for every operation launched so far (as wait()).
  Status wait_all();

  // Called before the communicator leaves the bootstrap: with Legacy IPC a peer's mapping
  // must not outlive this rank's memory, so healthy ranks wait here for each other.
  void finalize(const Allgather& allgather);

  // Raises every counter this rank waits on past any value a wait can ask, so that its
  // stream drains (after a failure). Idempotent; repeated by the watchdog while work is stuck.
  void release_waits();
  // The watchdog's look at this communicator (watchdog thread only).
  void watch(std::chrono::steady_clock::time_point now);

 private:
  DeviceComm() = default;
  Status setup(const Allgather& allgather);
  Status lower(const algo::Params& params, size_t element_size,
               std::shared_ptr<DeviceProgram>* out) const;
  // Counts what the list moves per channel.
  void count_channels(DeviceProgram* program) const;
  Status ensure_scratch(size_t bytes);
  Status emit(const DeviceOp& op, drv::DevicePtr staged_input);
  drv::DevicePtr flag(drv::DevicePtr base, algo::Flag which, int peer) const;
  drv::DevicePtr inbound(drv::DevicePtr base, int sender) const;
  uint64_t completed() const;
  // The message for the oldest operation in flight, stuck for `waited_ms`: it names the peers
  // whose chunks it still waits for (read off this rank's counters).
  std::string stuck_message(int64_t waited_ms);

  Communicator* comm_ = nullptr;
  int rank_ = 0, nranks_ = 0;
  int device_ = -1;
  drv::Context context_ = nullptr;
  bool context_retained_ = false;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0;
  size_t flags_bytes_ = 0;
  std::shared_ptr<Region> region_;
  std::vector<Region> peers_;                          // by rank; empty for this rank
  std::vector<std::shared_ptr<Region>> same_process_;  // peers' regions kept alive
  std::vector<IpcKind> kinds_;                         // by rank
  bool legacy_ = false;                                // some peer maps Legacy
  drv::Stream queue_ = nullptr, rescue_ = nullptr;
  drv::Event ready_ = nullptr, done_ = nullptr;
  // Completed operations, written by the stream after each one into pinned host memory.
  uint64_t* completed_host_ = nullptr;
  drv::DevicePtr completed_device_ = 0;
  std::atomic<uint64_t> launched_{0};
  // Operations in flight, oldest first (enqueue appends, the watchdog drops completed ones):
  // what a stuck one waits for.
  struct InFlight {
    uint64_t ticket;
    const char* what;
    std::vector<uint64_t> inbound_end, ack_end;  // per peer: the counters it waits to reach
  };
  std::mutex in_flight_mutex_;
  std::deque<InFlight> in_flight_;
  // Chunks sent to / received from each peer before the next operation (channel bases).
  std::vector<uint64_t> sent_, received_;
  drv::DevicePtr scratch_ = 0;
  size_t scratch_bytes_ = 0;
  std::map<std::string, std::shared_ptr<const DeviceProgram>> programs_;
  const char* last_algorithm_ = "";
  double last_predicted_us_ = -1;
  // Watchdog state (its thread only).
  uint64_t watched_done_ = 0;
  bool was_idle_ = true;
  std::chrono::steady_clock::time_point last_progress_;
};

}  // namespace cuda
}  // namespace weft
