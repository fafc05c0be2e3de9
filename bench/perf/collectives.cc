#include "collectives.h"

#include <algorithm>

namespace weft::perf {

namespace {

// Bus-bandwidth factor of collectives where the whole buffer crosses each rank's link
// once (Broadcast, Reduce, SendRecv).
double factor_one(int) {
  return 1;
}

// Every rank's buffers hold the whole count (AllReduce, Broadcast, Reduce, SendRecv);
// in place means send == recv.
Geometry whole(size_t count, size_t, int) {
  return {.send_count = count, .recv_count = count, .param_count = count};
}

using Kind = Source::Kind;

// The collectives proper arrive with the library's collectives.

// 2(n-1)/n: a reduce-scatter then an all-gather, each moving (n-1)/n of the data.
double factor_allreduce(int nranks) {
  return 2.0 * (nranks - 1) / nranks;
}
// (n-1)/n: each rank already holds its own block.
double factor_all_but_own(int nranks) {
  return static_cast<double>(nranks - 1) / nranks;
}

// The per-rank block of the split collectives: count / nranks elements, rounded down to a
// multiple of 16 bytes like nccl-tests does.
size_t block(size_t count, size_t element_size, int nranks) {
  const size_t align = std::max<size_t>(1, 16 / element_size);
  return count / static_cast<size_t>(nranks) / align * align;
}

// One block in, nranks blocks out (AllGather, Gather); in place, the input is this rank's
// block of the output.
Geometry gathered(size_t count, size_t element_size, int nranks) {
  const size_t b = block(count, element_size, nranks);
  return {.send_count = b,
          .recv_count = b * nranks,
          .param_count = b,
          .send_inplace_offset = b,
          .recv_inplace_offset = 0};
}

// nranks blocks in, one block out (ReduceScatter, Scatter); in place, the output is this
// rank's block of the input.
Geometry scattered(size_t count, size_t element_size, int nranks) {
  const size_t b = block(count, element_size, nranks);
  return {.send_count = b * nranks,
          .recv_count = b,
          .param_count = b,
          .send_inplace_offset = 0,
          .recv_inplace_offset = b};
}

// nranks blocks in and out (AllToAll); in place means send == recv.
Geometry exchanged(size_t count, size_t element_size, int nranks) {
  const size_t b = block(count, element_size, nranks);
  return {.send_count = b * nranks, .recv_count = b * nranks, .param_count = b};
}

// Output block k holds block owner k's input (AllGather, and Gather at the root).
Source from_block_owner(const Geometry& g, size_t recv_index) {
  return {Kind::kCopy, static_cast<int>(recv_index / g.param_count), recv_index % g.param_count};
}

const Collective kCollectives[] = {
    {.name = "allreduce",
     .reduces = true,
     .rooted = false,
     .check_in_place = true,
     .bus_factor = factor_allreduce,
     .geometry = whole,
     .source =
         [](const Geometry&, int, int, int, size_t j) {
           return Source{Kind::kReduce, 0, j};
         },
     .call =
         [](const CallArgs& a) {
           return weftAllReduce(a.send, a.recv, a.count, a.dtype, a.op, a.comm, a.stream);
         }},
    {.name = "reducescatter",
     .reduces = true,
     .rooted = false,
     .check_in_place = true,
     .bus_factor = factor_all_but_own,
     .geometry = scattered,
     .source =
         [](const Geometry& g, int rank, int, int, size_t j) {
           return Source{Kind::kReduce, 0, rank * g.param_count + j};
         },
     .call =
         [](const CallArgs& a) {
           return weftReduceScatter(a.send, a.recv, a.count, a.dtype, a.op, a.comm, a.stream);
         }},
    {.name = "allgather",
     .reduces = false,
     .rooted = false,
     .check_in_place = true,
     .bus_factor = factor_all_but_own,
     .geometry = gathered,
     .source = [](const Geometry& g, int, int, int, size_t j) { return from_block_owner(g, j); },
     .call =
         [](const CallArgs& a) {
           return weftAllGather(a.send, a.recv, a.count, a.dtype, a.comm, a.stream);
         }},
    {.name = "broadcast",
     .reduces = false,
     .rooted = true,
     .check_in_place = true,
     .bus_factor = factor_one,
     .geometry = whole,
     .source =
         [](const Geometry&, int, int, int root, size_t j) {
           return Source{Kind::kCopy, root, j};
         },
     .call =
         [](const CallArgs& a) {
           return weftBroadcast(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
         }},
    {.name = "reduce",
     .reduces = true,
     .rooted = true,
     .check_in_place = true,
     .bus_factor = factor_one,
     .geometry = whole,
     .source =
         [](const Geometry&, int rank, int, int root, size_t j) {
           return rank == root ? Source{Kind::kReduce, 0, j} : Source{};
         },
     .call =
         [](const CallArgs& a) {
           return weftReduce(a.send, a.recv, a.count, a.dtype, a.op, a.root, a.comm, a.stream);
         }},
    {.name = "alltoall",
     .reduces = false,
     .rooted = false,
     .check_in_place = false,
     .bus_factor = factor_all_but_own,
     .geometry = exchanged,
     // In place, send == recv (nccl-tests' convention), left unchecked like there.
     // Block k of rank r's output is block r of rank k's input.
     .source =
         [](const Geometry& g, int rank, int, int, size_t j) {
           return Source{Kind::kCopy, static_cast<int>(j / g.param_count),
                         rank * g.param_count + j % g.param_count};
         },
     .call =
         [](const CallArgs& a) {
           return weftAllToAll(a.send, a.recv, a.count, a.dtype, a.comm, a.stream);
         }},
    {.name = "gather",
     .reduces = false,
     .rooted = true,
     .check_in_place = true,
     .bus_factor = factor_all_but_own,
     .geometry = gathered,
     .source = [](const Geometry& g, int rank, int, int root,
                  size_t j) { return rank == root ? from_block_owner(g, j) : Source{}; },
     .call =
         [](const CallArgs& a) {
           return weftGather(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
         }},
    {.name = "scatter",
     .reduces = false,
     .rooted = true,
     .check_in_place = true,
     .bus_factor = factor_all_but_own,
     .geometry = scattered,
     .source =
         [](const Geometry& g, int rank, int, int root, size_t j) {
           return Source{Kind::kCopy, root, rank * g.param_count + j};
         },
     .call =
         [](const CallArgs& a) {
           return weftScatter(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
         }},
    // Each rank sends to the next and receives from the previous, as one group. In place
    // (nccl-tests' convention: zero offsets), the same buffer is sent and received into.
    {.name = "sendrecv",
     .reduces = false,
     .rooted = false,
     .check_in_place = false,
     .bus_factor = factor_one,
     .geometry = whole,
     .source =
         [](const Geometry&, int rank, int nranks, int, size_t j) {
           return Source{Kind::kCopy, (rank + nranks - 1) % nranks, j};
         },
     .call =
         [](const CallArgs& a) {
           weftResult_t result = weftGroupStart();
           if (result != weftSuccess) return result;
           weftResult_t send =
               weftSend(a.send, a.count, a.dtype, (a.rank + 1) % a.nranks, a.comm, a.stream);
           weftResult_t recv = weftRecv(a.recv, a.count, a.dtype,
                                        (a.rank + a.nranks - 1) % a.nranks, a.comm, a.stream);
           // Always close the group; its end reports a failure of either call.
           result = weftGroupEnd();
           if (send != weftSuccess) return send;
           return recv != weftSuccess ? recv : result;
         },
     .tuned = false},
};

}  // namespace

std::span<const Collective> collectives() {
  return kCollectives;
}

const Collective* find_collective(std::string_view name) {
  for (const Collective& collective : kCollectives) {
    if (name == collective.name) return &collective;
  }
  return nullptr;
}

size_t row_bytes(const Geometry& geometry, size_t element_size) {
  return std::max(geometry.send_count, geometry.recv_count) * element_size;
}

}  // namespace weft::perf
