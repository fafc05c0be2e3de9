// Pairwise exchange (one partner per round, as a round-robin tournament) and
// the dissemination barrier.
#include <algorithm>
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

namespace {

// Where the block exchanged with each peer lies in the input and the output.
struct PeerBlocks {
  std::vector<Span> send;
  std::vector<Span> recv;
};

PeerBlocks peer_blocks(const Params& p) {
  PeerBlocks blocks;
  blocks.send.resize(p.nranks);
  blocks.recv.resize(p.nranks);
  for (int q = 0; q < p.nranks; ++q) {
    if (p.collective == Collective::AllToAllv) {
      blocks.send[q] = Span{p.send_displs[q], p.send_counts[q]};
      blocks.recv[q] = Span{p.recv_displs[q], p.recv_counts[q]};
    } else {
      blocks.send[q] = blocks.recv[q] = Span{q * p.count, p.count};
    }
  }
  return blocks;
}

}  // namespace

// Each round a rank sends the partner its block of the partner's result and
// folds the partner's contribution into its own block. Every block is summed
// at one rank, so the fixed order needs no agreement between ranks.
void pairwise_reduce_scatter(const Params& p, Emitter& e) {
  const uint64_t pieces = chunk_count(p.count, p.chunk);
  const uint64_t slot_len = p.chunk == 0 ? p.count : std::min(p.chunk, p.count);
  SlotRing slots(e, slot_len, kPipelineDepth * pieces);
  const Range output = at(Buf::Output, 0, p.count);
  const Range mine = at(Buf::Input, p.rank * p.count, p.count);  // the output, in place
  std::vector<uint32_t> last(pieces, kNone);
  for (int round = 0; round < exchange_rounds(p.nranks); ++round) {
    const int q = exchange_partner(p.nranks, round, p.rank);
    if (q < 0) continue;
    e.send_pieces(q, at(Buf::Input, q * p.count, p.count), p.chunk, {});
    for (uint64_t i = 0; i < pieces; ++i) {
      const Span piece = chunk_span(p.count, p.chunk, i);
      const uint64_t use = round * pieces + i;
      const Range slot = slots.slot(use, piece.count);
      const uint32_t got = e.recv(q, slot, {slots.reuse_dep(use)});
      const Range acc = last[i] == kNone ? sub(mine, piece) : sub(output, piece);
      last[i] = e.reduce(sub(output, piece), acc, slot, {got, last[i]});
      slots.release(use, last[i]);
    }
  }
}

// Out of place every exchange is independent: program order (round by
// round) is the intended posting order, so an executor that bounds its
// operations in flight gets the one-partner-at-a-time schedule. In place the
// partner's block is received into a slot and copied over the outgoing
// block once that has been sent; kPipelineDepth slots bound the rounds in
// flight.
void pairwise_alltoall(const Params& p, Emitter& e) {
  const PeerBlocks blocks = peer_blocks(p);
  const int r = p.rank;
  if (!p.in_place && blocks.send[r].count > 0) {
    e.copy(at(Buf::Output, blocks.recv[r]), at(Buf::Input, blocks.send[r]));
  }
  const uint64_t pieces = chunk_count(p.count, p.chunk);
  SlotRing slots;
  if (p.in_place) {
    slots =
        SlotRing(e, p.chunk == 0 ? p.count : std::min(p.chunk, p.count), kPipelineDepth * pieces);
  }
  for (int round = 0; round < exchange_rounds(p.nranks); ++round) {
    const int q = exchange_partner(p.nranks, round, r);
    if (q < 0) continue;
    if (!p.in_place) {
      e.send_pieces(q, at(Buf::Input, blocks.send[q]), p.chunk, {});
      e.recv_pieces(q, at(Buf::Output, blocks.recv[q]), p.chunk, {});
      continue;
    }
    const Range block = at(Buf::Output, blocks.recv[q]);
    for (uint64_t i = 0; i < pieces; ++i) {
      const Span piece = chunk_span(p.count, p.chunk, i);
      const uint64_t use = round * pieces + i;
      const Range slot = slots.slot(use, piece.count);
      const uint32_t got = e.recv(q, slot, {slots.reuse_dep(use)});
      const uint32_t sent = e.send(q, sub(block, piece));
      const uint32_t placed = e.copy(sub(block, piece), slot, {got, sent});
      slots.release(use, placed);
    }
  }
}

// Round k: tell rank r + 2^k, hear from rank r - 2^k. Each round's message
// carries everything heard before, so after ceil(log2 n) rounds every rank
// has (transitively) heard from all.
void dissemination_barrier(const Params& p, Emitter& e) {
  const Range nothing = at(Buf::Input, 0, 0);
  uint32_t heard = kNone;
  for (int d = 1; d < p.nranks; d *= 2) {
    e.send(wrap_rank(int64_t{p.rank} + d, p.nranks), nothing, {heard});
    heard = e.recv(wrap_rank(int64_t{p.rank} - d, p.nranks), nothing, {heard});
  }
}

}  // namespace weft::algo::detail
