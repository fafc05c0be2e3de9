// weft-peer-gloo: the weft-perf sweep through Gloo's collectives over its TCP transport
// (loopback). Ranks are separate processes that meet through a FileStore in a directory
// named after the job's secret. Run under weftrun:
//   weftrun -n 2 weft-peer-gloo allreduce -b 8 -e 64M -f 4
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_driver.h"

namespace weft::peers {
namespace {

// Gloo's collectives reserve slot prefixes 1-8; the point-to-point calls use their own.
constexpr uint8_t kPointToPointSlot = 0x20;
constexpr std::chrono::seconds kTimeout{300};

int env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0')
    throw std::runtime_error(std::string(name) + " is not set (run under weftrun)");
  return std::atoi(text);
}

void sum_floats(void* out, const void* a, const void* b, size_t n) {
  gloo::sum<float>(out, a, b, n);
}

class GlooBackend : public Backend {
 public:
  GlooBackend() : rank_(env_int("WEFT_RANK")), nranks_(env_int("WEFT_NRANKS")) {
    const char* secret = std::getenv("WEFT_SECRET");
    if (secret == nullptr || *secret == '\0')
      throw std::runtime_error("WEFT_SECRET is not set (run under weftrun)");
    // A directory of this job only, removed once every rank is connected.
    const std::filesystem::path store_dir =
        std::filesystem::temp_directory_path() / ("weft-peer-gloo-" + std::string(secret));
    std::filesystem::create_directories(store_dir);
    gloo::rendezvous::FileStore store(store_dir.string());
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, nranks_);
    context->setTimeout(kTimeout);
    context->connectFullMesh(store, device);
    context_ = context;
    barrier();
    if (rank_ == 0) std::filesystem::remove_all(store_dir);
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string name() const override { return "gloo"; }
  std::string version() const override {
    return "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) +
           "." + std::to_string(GLOO_VERSION_PATCH) + " (TCP transport, loopback)";
  }
  bool supports(std::string_view c) const override {
    return c == "allreduce" || c == "reducescatter" || c == "allgather" || c == "broadcast" ||
           c == "reduce" || c == "alltoall" || c == "alltoallv" || c == "sendrecv" ||
           c == "pingpong";
  }

  // Gloo's reduce-scatter leaves this rank's block at the start of the buffer it reduces.
  void adjust_in_place(std::string_view collective, perf::Geometry* g) const override {
    if (collective == "reducescatter") g->recv_inplace_offset = 0;
  }

  // Gloo's reduce-scatter is an algorithm object over one buffer that it reduces in place;
  // building it registers that buffer with every pair, so it is built once per buffer and
  // count, as Gloo's users do. Out of place it works on a scratch copy of the input.
  // This Gloo's run() can leave wrong values at the end of rank 0's block for blocks of
  // several MiB (the other ranks overwrite the start of their buffer while a send from it
  // may still be in flight); the check counts them (docs/performance.md).
  void prepare(const PeerCall& c) override {
    if (c.collective != "reducescatter") return;
    const size_t total = c.count * static_cast<size_t>(nranks_);
    float* buffer = c.in_place ? const_cast<float*>(c.send) : nullptr;
    if (!c.in_place) {
      if (scratch_.size() < total) scratch_.assign(total, 0.0f);
      buffer = scratch_.data();
    }
    if (reduce_scatter_ && reduce_scatter_buffer_ == buffer && reduce_scatter_count_ == c.count)
      return;
    reduce_scatter_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
        context_, std::vector<float*>{buffer}, static_cast<int>(total),
        std::vector<int>(static_cast<size_t>(nranks_), static_cast<int>(c.count)));
    reduce_scatter_buffer_ = buffer;
    reduce_scatter_count_ = c.count;
  }

  void call(const PeerCall& c) override {
    if (c.count == 0) return;  // Gloo divides by zero on empty calls: nothing to move
    float* send = const_cast<float*>(c.send);
    const size_t n = static_cast<size_t>(nranks_);
    const std::string_view name = c.collective;
    if (name == "allreduce") {
      gloo::AllreduceOptions opts(context_);
      if (!c.in_place) opts.setInput(send, c.count);
      opts.setOutput(c.recv, c.count);
      opts.setReduceFunction(sum_floats);
      gloo::allreduce(opts);
    } else if (name == "reducescatter") {
      reduce_scatter(c);
    } else if (name == "allgather") {
      // Without an input, Gloo takes this rank's block of the output as it.
      gloo::AllgatherOptions opts(context_);
      if (!c.in_place) opts.setInput(send, c.count);
      opts.setOutput(c.recv, c.count * n);
      gloo::allgather(opts);
    } else if (name == "broadcast") {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(c.root);
      if (!c.in_place && c.rank == c.root) opts.setInput(send, c.count);
      opts.setOutput(c.recv, c.count);
      gloo::broadcast(opts);
    } else if (name == "reduce") {
      gloo::ReduceOptions opts(context_);
      opts.setRoot(c.root);
      if (!c.in_place) opts.setInput(send, c.count);
      opts.setOutput(c.recv, c.count);
      opts.setReduceFunction(sum_floats);
      gloo::reduce(opts);
    } else if (name == "alltoall") {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(send, c.count * n);
      opts.setOutput(c.recv, c.count * n);
      gloo::alltoall(opts);
    } else if (name == "alltoallv") {
      gloo::AlltoallvOptions opts(context_);
      const std::vector<int64_t> counts(n, static_cast<int64_t>(c.count));
      opts.setInput(send, counts);
      opts.setOutput(c.recv, counts);
      gloo::alltoallv(opts);
    } else if (name == "sendrecv") {
      send_recv(c);
    } else if (name == "pingpong") {
      ping_pong(c);
    } else {
      throw std::runtime_error("gloo: no " + std::string(name));
    }
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }

  void allgather_bytes(const void* mine, void* all, size_t bytes) override {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<char*>(const_cast<void*>(mine)), bytes);
    opts.setOutput(static_cast<char*>(all), bytes * static_cast<size_t>(nranks_));
    gloo::allgather(opts);
  }

 private:
  void reduce_scatter(const PeerCall& c) {
    const size_t block_bytes = c.count * sizeof(float);
    if (!c.in_place) std::memcpy(scratch_.data(), c.send, block_bytes * nranks_);
    reduce_scatter_->run();
    if (!c.in_place) std::memcpy(c.recv, scratch_.data(), block_bytes);
  }

  void send_recv(const PeerCall& c) {
    const size_t bytes = c.count * sizeof(float);
    const uint64_t slot = gloo::Slot::build(kPointToPointSlot, 0);
    auto out = context_->createUnboundBuffer(const_cast<float*>(c.send), bytes);
    auto in = context_->createUnboundBuffer(c.recv, bytes);
    in->recv((c.rank + nranks_ - 1) % nranks_, slot);
    out->send((c.rank + 1) % nranks_, slot);
    out->waitSend();
    in->waitRecv();
  }

  void ping_pong(const PeerCall& c) {
    const size_t bytes = c.count * sizeof(float);
    const uint64_t slot = gloo::Slot::build(kPointToPointSlot, 1);
    auto in = context_->createUnboundBuffer(c.recv, bytes);
    if (c.rank == 0) {
      auto out = context_->createUnboundBuffer(const_cast<float*>(c.send), bytes);
      out->send(1, slot);
      out->waitSend();
      in->recv(1, slot);
      in->waitRecv();
    } else if (c.rank == 1) {
      in->recv(0, slot);
      in->waitRecv();
      in->send(0, slot);
      in->waitSend();
    }
  }

  const int rank_;
  const int nranks_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<float> scratch_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter_;
  const float* reduce_scatter_buffer_ = nullptr;
  size_t reduce_scatter_count_ = 0;
};

std::unique_ptr<Backend> make(const perf::Options&, int*, char***) {
  return std::make_unique<GlooBackend>();
}

}  // namespace
}  // namespace weft::peers

int main(int argc, char** argv) {
  return weft::peers::peer_main(argc, argv, "weft-peer-gloo", weft::peers::make);
}
