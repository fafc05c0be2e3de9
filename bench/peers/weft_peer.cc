// weft-peer-weft: Weft through the peer driver, for per-call latency quantiles (weft-perf
// reports means only) and for the exchanges weft-perf lacks (alltoallv, pingpong).
// Run under weftrun: weftrun -n 2 weft-peer-weft allreduce -b 8 -e 4K -f 2 -n 1000
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_driver.h"
#include "weft/weft.h"

namespace weft::peers {
namespace {

class WeftBackend : public Backend {
 public:
  explicit WeftBackend(const perf::Options& options) {
    const std::string forced = perf::forced_algorithm(options);
    if (!forced.empty()) setenv("WEFT_ALGO", forced.c_str(), 1);
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    if (options.timeout_s > 0) config.timeoutMs = options.timeout_s * 1000;
    require(weftCommInitFromEnv(&comm_, &config), "weftCommInitFromEnv");
    require(weftCommUserRank(comm_, &rank_), "weftCommUserRank");
    require(weftCommCount(comm_, &nranks_), "weftCommCount");
  }
  ~WeftBackend() override {
    if (comm_ != nullptr) weftCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string name() const override { return "weft"; }
  std::string version() const override {
    return "Weft " + std::to_string(WEFT_MAJOR) + "." + std::to_string(WEFT_MINOR) + "." +
           std::to_string(WEFT_PATCH);
  }
  bool supports(std::string_view) const override { return true; }
  bool has_in_place(std::string_view collective) const override {
    return collective != "alltoallv";
  }

  void call(const PeerCall& c) override {
    if (c.collective == "alltoallv") return all_to_all_v(c);
    if (c.collective == "pingpong") return ping_pong(c);
    const perf::CallArgs args{c.send, c.recv, c.count,  weftFloat32, weftSum,
                              c.root, c.rank, c.nranks, comm_,       nullptr};
    require(perf::find_collective(c.collective)->call(args), "collective");
  }

  void barrier() override { require(weftBarrier(comm_, nullptr), "weftBarrier"); }

  void allgather_bytes(const void* mine, void* all, size_t bytes) override {
    require(weftAllGather(mine, all, bytes, weftUint8, comm_, nullptr), "weftAllGather");
  }

 private:
  // Failures abort the communicator, so that the peers fail fast instead of timing out.
  void require(weftResult_t result, const char* what) {
    if (result == weftSuccess) return;
    // The last error starts with the failed function's name.
    const std::string detail = weftGetLastError(comm_);
    const std::string message = (detail.empty() ? std::string(what) + " failed" : detail) + " (" +
                                weftGetErrorString(result) + ")";
    if (comm_ != nullptr) weftCommAbort(comm_);
    comm_ = nullptr;
    throw std::runtime_error(message);
  }

  void all_to_all_v(const PeerCall& c) {
    const size_t n = static_cast<size_t>(c.nranks);
    std::vector<size_t> counts(n, c.count);
    std::vector<size_t> displs(n);
    for (size_t k = 0; k < n; ++k) displs[k] = k * c.count;
    require(weftAllToAllv(c.send, counts.data(), displs.data(), c.recv, counts.data(),
                          displs.data(), weftFloat32, comm_, nullptr),
            "weftAllToAllv");
  }

  void ping_pong(const PeerCall& c) {
    if (c.rank == 0) {
      require(weftSend(c.send, c.count, weftFloat32, 1, comm_, nullptr), "weftSend");
      require(weftRecv(c.recv, c.count, weftFloat32, 1, comm_, nullptr), "weftRecv");
    } else if (c.rank == 1) {
      require(weftRecv(c.recv, c.count, weftFloat32, 0, comm_, nullptr), "weftRecv");
      require(weftSend(c.recv, c.count, weftFloat32, 0, comm_, nullptr), "weftSend");
    }
  }

  weftComm_t comm_ = nullptr;
  int rank_ = 0;
  int nranks_ = 1;
};

std::unique_ptr<Backend> make(const perf::Options& options, int*, char***) {
  return std::make_unique<WeftBackend>(options);
}

}  // namespace
}  // namespace weft::peers

int main(int argc, char** argv) {
  return weft::peers::peer_main(argc, argv, "weft-peer-weft", weft::peers::make);
}
