// Ring and chain: bandwidth-optimal for large vectors, n-1 steps of latency.
#include <algorithm>
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

namespace {

// n blocks of `count` elements each, block j at j * count.
std::vector<Span> equal_blocks(int nranks, uint64_t count) {
  std::vector<Span> blocks(nranks);
  for (int j = 0; j < nranks; ++j) blocks[j] = Span{j * count, count};
  return blocks;
}

}  // namespace

// Reduce-scatter then allgather over n near-equal blocks. Each block is
// summed at one rank and then copied around, so every rank ends with the
// same bits.
void ring_allreduce(const Params& p, Emitter& e) {
  std::vector<Span> blocks(p.nranks);
  for (int j = 0; j < p.nranks; ++j) blocks[j] = block_span(p.count, p.nranks, j);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  const Range own = at(Buf::Output, blocks[p.rank]);
  RingReduceScatter rs =
      detail::ring_reduce_scatter(e, p.nranks, p.rank, blocks, p.chunk, input, output, own);
  // The allgather overwrites block j only after this rank forwarded its
  // partial sum of block j. The first send forwards the input itself, which
  // only in place shares the output's memory.
  if (!p.in_place) std::fill_n(rs.sends.begin(), rs.chunks_per_block, kNone);
  detail::ring_allgather(e, p.nranks, p.rank, blocks, p.chunk, own, rs.own_ready, output, rs.sends);
}

void ring_reduce_scatter(const Params& p, Emitter& e) {
  const Range input = at(Buf::Input, 0, p.nranks * p.count);
  detail::ring_reduce_scatter(e, p.nranks, p.rank, equal_blocks(p.nranks, p.count), p.chunk, input,
                              Range{0, 0, Buf::Scratch}, at(Buf::Output, 0, p.count));
}

void ring_allgather(const Params& p, Emitter& e) {
  const Range input = at(Buf::Input, 0, p.count);
  if (!p.in_place) e.copy(at(Buf::Output, p.rank * p.count, p.count), input);
  detail::ring_allgather(e, p.nranks, p.rank, equal_blocks(p.nranks, p.count), p.chunk, input, {},
                         at(Buf::Output, 0, p.nranks * p.count), {});
}

void chain_broadcast(const Params& p, Emitter& e) {
  rooted_broadcast(p, e, chain_tree(p.nranks, p.root, p.rank));
}

void chain_reduce(const Params& p, Emitter& e) {
  rooted_reduce(p, e, chain_tree(p.nranks, p.root, p.rank));
}

}  // namespace weft::algo::detail
