// Ring and chain: bandwidth-optimal for large vectors, n-1 steps of latency.
#include <algorithm>
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

namespace {

// Position q's block is real rank members[q]'s block of `count` elements,
// as AllGather and ReduceScatter lay their buffers out.
std::vector<Span> rank_blocks(const RingOrder& ring, uint64_t count) {
  std::vector<Span> blocks(ring.size());
  for (int q = 0; q < ring.size(); ++q) blocks[q] = Span{ring.members[q] * count, count};
  return blocks;
}

// The AllReduce vector in n near-equal blocks, one per ring position.
std::vector<Span> even_blocks(int nranks, uint64_t count) {
  std::vector<Span> blocks(nranks);
  for (int j = 0; j < nranks; ++j) blocks[j] = block_span(count, nranks, j);
  return blocks;
}

// The chain runs along the layout's ring, starting at the root.
TreeLinks chain_links(const Params& p) {
  const RingOrder ring = ring_order(p);
  const int root_pos = position_of(ring.members, p.root);
  return map_links(chain_tree(p.nranks, root_pos, ring.pos), ring.members);
}

}  // namespace

// Reduce-scatter then allgather over n near-equal blocks. Each block is
// summed at one rank and then copied around, so every rank ends with the
// same bits. Neighbours follow the layout's ring, so that the ring crosses
// each node boundary once.
void ring_allreduce(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  const std::vector<Span> blocks = even_blocks(p.nranks, p.count);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  const Range own = at(Buf::Output, blocks[ring.pos]);
  RingReduceScatter rs = detail::ring_reduce_scatter(e, ring, blocks, p.chunk, input, output, own);
  // The allgather overwrites block j only after this rank forwarded its
  // partial sum of block j. The first send forwards the input itself, which
  // only in place shares the output's memory.
  if (!p.in_place) std::fill_n(rs.sends.begin(), rs.chunks_per_block, kNone);
  detail::ring_allgather(e, ring, blocks, p.chunk, own, rs.own_ready, output, rs.sends);
}

void ring_allreduce_reduce_phase(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  const std::vector<Span> blocks = even_blocks(p.nranks, p.count);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  if (p.nranks == 1) {
    if (!p.in_place) e.copy(output, input);
    return;
  }
  detail::ring_reduce_scatter(e, ring, blocks, p.chunk, input, output,
                              at(Buf::Output, blocks[ring.pos]));
}

void ring_allreduce_gather_phase(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  const std::vector<Span> blocks = even_blocks(p.nranks, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  detail::ring_allgather(e, ring, blocks, p.chunk, at(Buf::Output, blocks[ring.pos]), {}, output,
                         {});
}

void ring_reduce_scatter(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  const Range input = at(Buf::Input, 0, p.nranks * p.count);
  detail::ring_reduce_scatter(e, ring, rank_blocks(ring, p.count), p.chunk, input,
                              Range{0, 0, Buf::Scratch}, at(Buf::Output, 0, p.count));
}

void ring_allgather(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  const Range input = at(Buf::Input, 0, p.count);
  if (!p.in_place) e.copy(at(Buf::Output, p.rank * p.count, p.count), input);
  detail::ring_allgather(e, ring, rank_blocks(ring, p.count), p.chunk, input, {},
                         at(Buf::Output, 0, p.nranks * p.count), {});
}

void chain_broadcast(const Params& p, Emitter& e) {
  rooted_broadcast(p, e, chain_links(p));
}

void chain_reduce(const Params& p, Emitter& e) {
  rooted_reduce(p, e, chain_links(p));
}

}  // namespace weft::algo::detail
