// weft-peer-mpi: the weft-perf sweep through MPI collectives (Open MPI's defaults, no
// tuning). Run with: mpirun --oversubscribe --allow-run-as-root -np 2 weft-peer-mpi allreduce
#include <mpi.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_driver.h"

namespace weft::peers {
namespace {

class MpiBackend : public Backend {
 public:
  MpiBackend(int* argc, char*** argv) {
    MPI_Init(argc, argv);
    // Errors come back as codes, so they are reported like the other libraries' failures.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
  }
  ~MpiBackend() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string name() const override { return "openmpi"; }
  std::string version() const override {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(text, &length);
    std::string line(text, static_cast<size_t>(length));
    return line.substr(0, line.find_first_of(",\n"));
  }
  bool supports(std::string_view) const override { return true; }

  // MPI_Reduce_scatter_block with MPI_IN_PLACE reads the whole buffer and leaves this
  // rank's block at its start.
  void adjust_in_place(std::string_view collective, perf::Geometry* g) const override {
    if (collective == "reducescatter") g->recv_inplace_offset = 0;
  }

  void call(const PeerCall& c) override {
    const int count = static_cast<int>(c.count);
    const bool root = c.rank == c.root;
    // In place, MPI takes MPI_IN_PLACE for the input (at the root only, for rooted calls).
    const void* send = c.in_place ? MPI_IN_PLACE : c.send;
    const std::string_view name = c.collective;
    int result = MPI_SUCCESS;
    if (name == "allreduce") {
      result = MPI_Allreduce(send, c.recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (name == "reducescatter") {
      result = MPI_Reduce_scatter_block(send, c.recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (name == "allgather") {
      result = MPI_Allgather(send, count, MPI_FLOAT, c.recv, count, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (name == "broadcast") {
      // One buffer in MPI: out of place, the root first copies its input there (as a user
      // of nccl-style out-of-place semantics has to).
      if (!c.in_place && root) std::memcpy(c.recv, c.send, c.count * sizeof(float));
      result = MPI_Bcast(c.recv, count, MPI_FLOAT, c.root, MPI_COMM_WORLD);
    } else if (name == "reduce") {
      result = MPI_Reduce(c.in_place && !root ? c.recv : send, c.recv, count, MPI_FLOAT, MPI_SUM,
                          c.root, MPI_COMM_WORLD);
    } else if (name == "alltoall") {
      result = MPI_Alltoall(send, count, MPI_FLOAT, c.recv, count, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (name == "alltoallv") {
      result = all_to_all_v(send, c);
    } else if (name == "gather") {
      result = MPI_Gather(c.in_place && root ? MPI_IN_PLACE : c.send, count, MPI_FLOAT, c.recv,
                          count, MPI_FLOAT, c.root, MPI_COMM_WORLD);
    } else if (name == "scatter") {
      result = MPI_Scatter(c.send, count, MPI_FLOAT, c.in_place && root ? MPI_IN_PLACE : c.recv,
                           count, MPI_FLOAT, c.root, MPI_COMM_WORLD);
    } else if (name == "sendrecv") {
      result = send_recv(c);
    } else if (name == "pingpong") {
      result = ping_pong(c);
    }
    require(result, c.collective);
  }

  void barrier() override { require(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void allgather_bytes(const void* mine, void* all, size_t bytes) override {
    const int n = static_cast<int>(bytes);
    require(MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }

 private:
  static void require(int result, std::string_view what) {
    if (result == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(result, text, &length);
    throw std::runtime_error(std::string(what) + " failed: " + std::string(text, length));
  }

  int all_to_all_v(const void* send, const PeerCall& c) {
    const int count = static_cast<int>(c.count);
    std::vector<int> counts(static_cast<size_t>(c.nranks), count);
    std::vector<int> displs(counts.size());
    for (size_t k = 0; k < displs.size(); ++k) displs[k] = static_cast<int>(k) * count;
    return MPI_Alltoallv(send, counts.data(), displs.data(), MPI_FLOAT, c.recv, counts.data(),
                         displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  }

  // To the next rank, from the previous one; in place, one buffer is sent and replaced.
  static int send_recv(const PeerCall& c) {
    const int count = static_cast<int>(c.count);
    const int next = (c.rank + 1) % c.nranks;
    const int prev = (c.rank + c.nranks - 1) % c.nranks;
    if (c.in_place)
      return MPI_Sendrecv_replace(c.recv, count, MPI_FLOAT, next, 0, prev, 0, MPI_COMM_WORLD,
                                  MPI_STATUS_IGNORE);
    return MPI_Sendrecv(c.send, count, MPI_FLOAT, next, 0, c.recv, count, MPI_FLOAT, prev, 0,
                        MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }

  static int ping_pong(const PeerCall& c) {
    const int count = static_cast<int>(c.count);
    if (c.rank == 0) {
      int result = MPI_Send(c.send, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
      if (result != MPI_SUCCESS) return result;
      return MPI_Recv(c.recv, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (c.rank == 1) {
      int result = MPI_Recv(c.recv, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (result != MPI_SUCCESS) return result;
      return MPI_Send(c.recv, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
    }
    return MPI_SUCCESS;
  }

  int rank_ = 0;
  int nranks_ = 1;
};

std::unique_ptr<Backend> make(const perf::Options&, int* argc, char*** argv) {
  return std::make_unique<MpiBackend>(argc, argv);
}

}  // namespace
}  // namespace weft::peers

int main(int argc, char** argv) {
  return weft::peers::peer_main(argc, argv, "weft-peer-mpi", weft::peers::make);
}
