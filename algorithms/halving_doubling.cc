// Recursive halving (reduce-scatter) and recursive doubling (allgather,
// small-vector allreduce): log2 steps. Non-powers of two fold the odd ranks
// below 2*extra into their even neighbour first (see Fold).
#include <algorithm>
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

namespace {

// Elements owned at the end by virtual ranks [lo, hi): bounds[v] is where
// virtual rank v's part of the vector starts, bounds[pow2] its length.
Span owned(const std::vector<uint64_t>& bounds, int lo, int hi) {
  return Span{bounds[lo], bounds[hi] - bounds[lo]};
}

// A rank folded into its buddy contributes, then receives the result; this
// is its whole program. Returns false for the other ranks. In place, result
// element i is contribution element i + shift, so each received piece first
// waits for the sends that read it.
bool fold_out(const Params& p, Emitter& e, const Fold& fold, const Range& contribution,
              const Range& result, int64_t shift) {
  if (fold.vrank >= 0) return false;
  LastTouch read;  // indexed like `result`
  for (uint64_t i = 0; i < chunk_count(contribution.count, p.chunk); ++i) {
    const Span piece = chunk_span(contribution.count, p.chunk, i);
    const uint32_t step = e.send(fold.buddy, sub(contribution, piece));
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(piece.offset) - shift, 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(piece.end()) - shift,
                                         static_cast<int64_t>(result.count));
    if (p.in_place && lo < hi) {
      read.set(Span{static_cast<uint64_t>(lo), static_cast<uint64_t>(hi - lo)}, step);
    }
  }
  recv_noted(e, fold.buddy, result, Span{0, result.count}, p.chunk, &read, nullptr);
  return true;
}

struct Halving {
  LastTouch written;  // running-sum elements -> last writer
  LastTouch sent;     // running-sum elements -> the halving send that read them
};

// Recursive halving among the virtual ranks: in the round with mask m a rank
// keeps the half of its range holding its own virtual rank and sends the
// other half to v ^ m, so after log2(pow2) rounds virtual rank v holds the
// full sum of owned(v, v + 1) in `acc`. A rank with a buddy first folds the
// buddy's whole vector in. Operands are ordered lower rank first.
// `aliased`: the input shares acc's memory (an in-place AllReduce).
Halving recursive_halving(Emitter& e, const Fold& fold, const std::vector<uint64_t>& bounds,
                          const Range& input, const Range& acc, bool aliased, uint64_t chunk) {
  Halving h;
  const uint64_t total = bounds.back();
  bool summed = false;  // acc holds running sums; before that they are the input
  std::vector<uint32_t> deps;
  if (fold.buddy >= 0) {
    const Range stage = acc.buf == Buf::Scratch ? acc : e.scratch(total);
    LastTouch got;
    recv_noted(e, fold.buddy, stage, Span{0, total}, chunk, nullptr, &got);
    for (uint64_t i = 0; i < chunk_count(total, chunk); ++i) {
      const Span piece = chunk_span(total, chunk, i);
      deps.clear();
      got.collect(piece, &deps);
      h.written.set(piece, e.reduce(sub(acc, piece), sub(input, piece), sub(stage, piece), deps));
    }
    summed = true;
  }
  const int v = fold.vrank;
  int lo = 0;
  int hi = fold.pow2;
  for (int m = fold.pow2 / 2; m >= 1; m /= 2) {
    const bool upper = v >= lo + m;
    const Span keep = upper ? owned(bounds, lo + m, hi) : owned(bounds, lo, lo + m);
    const Span give = upper ? owned(bounds, lo, lo + m) : owned(bounds, lo + m, hi);
    const int partner = fold_first_real(fold, v ^ m);
    send_written(e, partner, summed ? acc : input, give, chunk, h.written,
                 summed || aliased ? &h.sent : nullptr);
    const Range stage = e.scratch(keep.count);
    for (uint64_t i = 0; i < chunk_count(keep.count, chunk); ++i) {
      const Span rel = chunk_span(keep.count, chunk, i);
      const Span abs{keep.offset + rel.offset, rel.count};
      deps.clear();
      deps.push_back(e.recv(partner, sub(stage, rel)));
      h.written.collect(abs, &deps);
      const Range mine = sub(summed ? acc : input, abs);
      const Range theirs = sub(stage, rel);
      h.written.set(abs,
                    e.reduce(sub(acc, abs), upper ? theirs : mine, upper ? mine : theirs, deps));
    }
    summed = true;
    if (upper) {
      lo += m;
    } else {
      hi = lo + m;
    }
  }
  return h;
}

std::vector<uint64_t> block_bounds(uint64_t count, int pieces) {
  std::vector<uint64_t> bounds(pieces + 1);
  for (int v = 0; v <= pieces; ++v) bounds[v] = block_span(count, pieces, v).offset;
  return bounds;
}

// Where each virtual rank's real ranks' blocks of `count` elements start.
std::vector<uint64_t> rank_bounds(const Fold& fold, uint64_t count) {
  std::vector<uint64_t> bounds(fold.pow2 + 1);
  for (int v = 0; v <= fold.pow2; ++v) bounds[v] = fold_first_real(fold, v) * count;
  return bounds;
}

}  // namespace

// Rabenseifner: recursive-halving reduce-scatter, then recursive-doubling
// allgather. Each block is summed at one virtual rank, so all ranks end with
// the same bits.
void rhd_allreduce(const Params& p, Emitter& e) {
  const Fold fold = fold_for(p.nranks, p.rank);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  if (fold_out(p, e, fold, input, output, 0)) return;
  const std::vector<uint64_t> bounds = block_bounds(p.count, fold.pow2);
  Halving h = recursive_halving(e, fold, bounds, input, output, p.in_place, p.chunk);
  // With mask m the partner's group is exactly what this rank gave away in
  // the halving round with mask m: receiving it waits for that send.
  const int v = fold.vrank;
  int lo = v;
  int hi = v + 1;
  for (int m = 1; m < fold.pow2; m *= 2) {
    const int partner = fold_first_real(fold, v ^ m);
    const int other = (v & m) ? lo - m : hi;
    send_written(e, partner, output, owned(bounds, lo, hi), p.chunk, h.written);
    recv_noted(e, partner, output, owned(bounds, other, other + m), p.chunk, &h.sent, &h.written);
    lo = std::min(lo, other);
    hi = std::max(hi, other + m);
  }
  if (fold.buddy >= 0) {
    send_written(e, fold.buddy, output, Span{0, p.count}, p.chunk, h.written);
  }
}

// Recursive halving over real-rank blocks; a virtual rank ends with its real
// ranks' blocks and hands the buddy's over.
void rhd_reduce_scatter(const Params& p, Emitter& e) {
  const Fold fold = fold_for(p.nranks, p.rank);
  const uint64_t total = p.nranks * p.count;
  const Range input = at(Buf::Input, 0, total);
  const Range output = at(Buf::Output, 0, p.count);
  if (fold_out(p, e, fold, input, output, p.rank * p.count)) return;
  const Range acc = e.scratch(total);
  Halving h = recursive_halving(e, fold, rank_bounds(fold, p.count), input, acc, false, p.chunk);
  const Span own{p.rank * p.count, p.count};
  std::vector<uint32_t> deps;
  h.written.collect(own, &deps);
  // In place this overwrites the input block, which every earlier writer of
  // these elements read (transitively) before.
  e.copy(output, sub(acc, own), deps);
  if (fold.buddy >= 0) {
    send_written(e, fold.buddy, acc, Span{fold.buddy * p.count, p.count}, p.chunk, h.written);
  }
}

// Whole-vector recursive doubling, for small vectors: log2 rounds, each rank
// computes the sum itself. Operands are always ordered lower half first, so
// the two partners of a round compute the same expression and every rank
// ends with the same bits.
void rd_allreduce(const Params& p, Emitter& e) {
  const Fold fold = fold_for(p.nranks, p.rank);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  if (fold_out(p, e, fold, input, output, 0)) return;
  const uint64_t chunks = chunk_count(p.count, p.chunk);
  const uint64_t slot_len = p.chunk == 0 ? p.count : std::min(p.chunk, p.count);
  SlotRing slots(e, slot_len, 2 * std::min<uint64_t>(chunks, kPipelineDepth));
  uint64_t use = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const Span piece = chunk_span(p.count, p.chunk, c);
    const Range in = sub(input, piece);
    const Range out = sub(output, piece);
    Range sum = in;
    uint32_t last = kNone;
    // Receives a peer's value of this chunk into a slot and folds it into the
    // running sum, ordered lower rank first. Overwriting what was just sent
    // waits for the send (which itself waited for the previous sum).
    auto combine = [&](int peer, bool peer_first, uint32_t sent) {
      const Range slot = slots.slot(use, piece.count);
      const uint32_t got = e.recv(peer, slot, {slots.reuse_dep(use)});
      const bool overwrites_sent = sum.buf == Buf::Output || p.in_place;
      last = e.reduce(out, peer_first ? slot : sum, peer_first ? sum : slot,
                      {got, overwrites_sent ? sent : last});
      slots.release(use++, last);
      sum = out;
    };
    if (fold.buddy >= 0) combine(fold.buddy, false, kNone);
    for (int m = 1; m < fold.pow2; m *= 2) {
      const int partner = fold_first_real(fold, fold.vrank ^ m);
      combine(partner, (fold.vrank & m) != 0, e.send(partner, sum, {last}));
    }
    if (fold.buddy >= 0) e.send(fold.buddy, out, {last});
  }
}

// Recursive doubling straight in the output: with mask m a rank swaps its
// group of m virtual ranks' blocks (contiguous real ranks) with the
// neighbouring group.
void rd_allgather(const Params& p, Emitter& e) {
  const Fold fold = fold_for(p.nranks, p.rank);
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.nranks * p.count);
  if (fold_out(p, e, fold, input, output, -static_cast<int64_t>(p.rank * p.count))) return;
  const std::vector<uint64_t> bounds = rank_bounds(fold, p.count);
  LastTouch written;
  const Span own{p.rank * p.count, p.count};
  if (!p.in_place) written.set(own, e.copy(sub(output, own), input));
  if (fold.buddy >= 0) {
    recv_noted(e, fold.buddy, output, Span{fold.buddy * p.count, p.count}, p.chunk, nullptr,
               &written);
  }
  const int v = fold.vrank;
  for (int m = 1; m < fold.pow2; m *= 2) {
    const int group = v & ~(m - 1);
    const int partner = fold_first_real(fold, v ^ m);
    send_written(e, partner, output, owned(bounds, group, group + m), p.chunk, written);
    recv_noted(e, partner, output, owned(bounds, group ^ m, (group ^ m) + m), p.chunk, nullptr,
               &written);
  }
  if (fold.buddy >= 0) {
    send_written(e, fold.buddy, output, Span{0, p.nranks * p.count}, p.chunk, written);
  }
}

}  // namespace weft::algo::detail
