// The benchmark loop shared by the weft-peer-* programs: weft-perf's sweep, buffer layout,
// result check and table, run over any library through the Backend interface, with every
// call timed on its own so that rows also carry median and p99 latencies.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives.h"
#include "options.h"

namespace weft::peers {

// One call with its buffers already placed (elements are floats; the op is sum).
struct PeerCall {
  std::string_view collective;
  const float* send;
  float* recv;
  size_t count;  // weft-perf's printed count (perf::Geometry::param_count)
  bool in_place;
  int root;
  int rank;
  int nranks;
};

// What a library must provide. Failures throw (std::exception); the driver reports them
// and exits with weft-perf's status 3.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Short name for the JSON rows ("openmpi"), and a line for the header.
  virtual std::string name() const = 0;
  virtual std::string version() const = 0;
  virtual bool supports(std::string_view collective) const = 0;
  // False where the library has no in-place form: that placement is not run.
  virtual bool has_in_place(std::string_view /*collective*/) const { return true; }
  // In place, a library may leave the result elsewhere than nccl-tests' offsets (e.g.
  // MPI_Reduce_scatter_block writes it at the start of the buffer); adjust the geometry.
  virtual void adjust_in_place(std::string_view /*collective*/, perf::Geometry* /*g*/) const {}
  // Called before each timed series with the arguments of its calls, so that one-time
  // set-up a library allows to be reused (e.g. Gloo's algorithm objects) is not timed.
  virtual void prepare(const PeerCall& /*call*/) {}
  virtual void call(const PeerCall& call) = 0;
  virtual void barrier() = 0;
  // Every rank's `bytes` bytes, in rank order, at every rank.
  virtual void allgather_bytes(const void* mine, void* all, size_t bytes) = 0;
};

// Creates the backend once the flags are parsed (MPI wants argc/argv).
using BackendFactory = std::unique_ptr<Backend> (*)(const perf::Options& options, int* argc,
                                                    char*** argv);

// main() of a weft-peer-* program. Exit statuses as weft-perf: 0 success, 1 wrong results,
// 2 usage error, 3 a library call failed.
int peer_main(int argc, char** argv, const char* program, BackendFactory make);

// Nearest-rank quantile (q in (0, 1]) of unsorted samples; 0 for none.
double quantile(std::vector<double> samples, double q);

}  // namespace weft::peers
