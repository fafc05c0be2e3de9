// The table of benchmarked collectives. Each entry says how to size the buffers for a
// byte size, where the in-place pointers go, where each output element comes from (so
// the checker can compute it), how to convert time into bus bandwidth, and how to make
// the call. Adding a collective is adding one entry in collectives.cc.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "weft/weft.h"

namespace weft::perf {

// Element counts of one benchmark size, as nccl-tests sizes them.
struct Geometry {
  size_t send_count = 0;   // elements in each rank's send buffer
  size_t recv_count = 0;   // elements in each rank's receive buffer
  size_t param_count = 0;  // the count argument of the call (the printed count)
  // In place, send = recvbuff + send_inplace_offset * rank and
  // recv = recvbuff + recv_inplace_offset * rank (in elements).
  size_t send_inplace_offset = 0;
  size_t recv_inplace_offset = 0;
};

// Where the expected value of one output element comes from.
struct Source {
  enum class Kind {
    kUnchecked,  // the call leaves this output undefined (e.g. Reduce on a non-root)
    kCopy,       // input(rank, index)
    kReduce,     // the reduction over every rank of input(., index)
  };
  Kind kind = Kind::kUnchecked;
  int rank = 0;
  size_t index = 0;
};

struct CallArgs {
  const void* send;
  void* recv;
  size_t count;  // Geometry::param_count
  weftDataType_t dtype;
  weftRedOp_t op;
  int root;
  int rank;
  int nranks;
  weftComm_t comm;
  weftStream_t stream;  // NULL: the call completes before it returns
};

struct Collective {
  const char* name;
  bool reduces;  // takes a reduction op (else the redop column says "none")
  bool rooted;   // takes a root (else the root column says -1)
  // false where the in-place call aliases a send and a receive of different data, so its
  // result is undefined (SendRecv, AllToAll): timed but not checked ("N/A"), as nccl-tests.
  bool check_in_place;
  // busbw = algbw * bus_factor: the fraction of the data that crosses the busiest link,
  // so that the figure is comparable across rank counts.
  double (*bus_factor)(int nranks);
  Geometry (*geometry)(size_t count, size_t element_size, int nranks);
  Source (*source)(const Geometry& geometry, int rank, int nranks, int root, size_t recv_index);
  weftResult_t (*call)(const CallArgs& args);
  bool tuned = true;  // a collective the library's tuner plans (not point-to-point)
};

std::span<const Collective> collectives();
// nullptr if there is no collective of that name.
const Collective* find_collective(std::string_view name);

// Bytes of one benchmark row: the larger of the send and receive buffers. algbw is this
// over the time, as in nccl-tests.
size_t row_bytes(const Geometry& geometry, size_t element_size);

}  // namespace weft::perf
