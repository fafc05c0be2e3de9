#include "algorithms/steps.h"

#include <algorithm>
#include <iterator>

namespace weft::algo::detail {

uint32_t Emitter::add(const Step& step, const Deps& deps) {
  Step out = step;
  out.first_dep = static_cast<uint32_t>(program_->deps.size());
  uint32_t num = 0;
  // Lists are short; dropping repeats keeps the program tidy without a sort.
  constexpr uint32_t kDedupWindow = 16;
  for (uint32_t dep : deps) {
    if (dep == kNone) continue;
    const auto first = program_->deps.end() - num;
    if (num <= kDedupWindow &&
        std::find(first, program_->deps.end(), dep) != program_->deps.end()) {
      continue;
    }
    program_->deps.push_back(dep);
    ++num;
  }
  out.num_deps = num;
  program_->steps.push_back(out);
  return static_cast<uint32_t>(program_->steps.size() - 1);
}

uint32_t Emitter::emit(StepKind kind, int peer, const Range& a, const Range& b, const Range& dst,
                       const Deps& deps) {
  Step step;
  step.kind = kind;
  step.peer = peer;
  step.a = a;
  step.b = b;
  step.dst = dst;
  return add(step, deps);
}

void Emitter::pieces(StepKind kind, int peer, const Range& range, uint64_t chunk, const Deps& deps,
                     std::vector<uint32_t>* steps) {
  const uint64_t count = chunk_count(range.count, chunk);
  for (uint64_t i = 0; i < count; ++i) {
    const Range piece = sub(range, chunk_span(range.count, chunk, i));
    const uint32_t step =
        kind == StepKind::Send ? send(peer, piece, deps) : recv(peer, piece, deps);
    if (steps) steps->push_back(step);
  }
}

Range Emitter::scratch(uint64_t count) {
  const Range range{program_->scratch_count, count, Buf::Scratch};
  program_->scratch_count += count;
  return range;
}

SlotRing::SlotRing(Emitter& emitter, uint64_t len, uint64_t depth)
    : len_(len), depth_(std::max<uint64_t>(depth, 1)), last_reader_(depth_, kNone) {
  base_ = emitter.scratch(len_ * depth_).offset;
}

void LastTouch::set(Span span, uint32_t step) {
  if (span.count == 0) return;
  const uint64_t begin = span.offset;
  const uint64_t end = span.end();
  auto it = runs_.lower_bound(begin);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    const auto [prev_end, prev_step] = prev->second;
    if (prev_end > begin) {
      prev->second.first = begin;
      if (prev_end > end) runs_.emplace(end, std::make_pair(prev_end, prev_step));
    }
  }
  it = runs_.lower_bound(begin);
  while (it != runs_.end() && it->first < end) {
    const auto [run_end, run_step] = it->second;
    it = runs_.erase(it);
    if (run_end > end) {
      runs_.emplace(end, std::make_pair(run_end, run_step));
      break;
    }
  }
  runs_.emplace(begin, std::make_pair(end, step));
}

void LastTouch::collect(Span span, std::vector<uint32_t>* out) const {
  if (span.count == 0) return;
  auto push = [out](uint32_t step) {
    if (out->empty() || out->back() != step) out->push_back(step);
  };
  auto it = runs_.upper_bound(span.offset);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.first > span.offset) push(prev->second.second);
  }
  for (; it != runs_.end() && it->first < span.end(); ++it) push(it->second.second);
}

void send_written(Emitter& e, int peer, const Range& base, Span span, uint64_t chunk,
                  const LastTouch& written, LastTouch* read) {
  std::vector<uint32_t> deps;
  for (uint64_t i = 0; i < chunk_count(span.count, chunk); ++i) {
    const Span piece = chunk_span(span.count, chunk, i);
    const Span abs{span.offset + piece.offset, piece.count};
    deps.clear();
    written.collect(abs, &deps);
    const uint32_t step = e.send(peer, sub(base, abs), deps);
    if (read) read->set(abs, step);
  }
}

void recv_noted(Emitter& e, int peer, const Range& base, Span span, uint64_t chunk,
                const LastTouch* wait, LastTouch* written) {
  std::vector<uint32_t> deps;
  for (uint64_t i = 0; i < chunk_count(span.count, chunk); ++i) {
    const Span piece = chunk_span(span.count, chunk, i);
    const Span abs{span.offset + piece.offset, piece.count};
    deps.clear();
    if (wait) wait->collect(abs, &deps);
    const uint32_t step = e.recv(peer, sub(base, abs), deps);
    if (written) written->set(abs, step);
  }
}

RingOrder ring_order(const Params& p) {
  RingOrder order;
  if (p.layout != nullptr && !p.layout->ring.empty()) {
    order.members = p.layout->ring;
  } else {
    order.members.resize(p.nranks);
    for (int r = 0; r < p.nranks; ++r) order.members[r] = r;
  }
  order.pos = position_of(order.members, p.rank);
  return order;
}

namespace {

uint64_t max_count(const std::vector<Span>& blocks) {
  uint64_t most = 0;
  for (const Span& b : blocks) most = std::max(most, b.count);
  return most;
}

Span absolute(const Span& block, const Span& piece) {
  return Span{block.offset + piece.offset, piece.count};
}

}  // namespace

RingReduceScatter ring_reduce_scatter(Emitter& e, const RingOrder& ring,
                                      const std::vector<Span>& blocks, uint64_t chunk,
                                      const Range& input, const Range& acc, const Range& own_dst) {
  RingReduceScatter out;
  const int nranks = ring.size();
  const int rank = ring.pos;
  const uint64_t largest = max_count(blocks);
  const uint64_t per = chunk_count(largest, chunk);
  out.chunks_per_block = per;
  out.sends.assign(static_cast<size_t>(nranks - 1) * per, kNone);
  if (per == 0) return out;
  const bool in_acc = acc.count > 0;
  // Two steps' worth of chunks: receiving step s overlaps forwarding step s-1.
  SlotRing slots(e, chunk == 0 ? largest : std::min(chunk, largest), 2 * per);
  const int right = ring.right();
  const int left = ring.left();
  std::vector<uint32_t> reduced(per, kNone);  // per chunk, the block received last step
  for (int s = 0; s + 1 < nranks; ++s) {
    const Span& out_block = blocks[wrap_rank(int64_t{rank} - 1 - s, nranks)];
    const Span& in_block = blocks[wrap_rank(int64_t{rank} - 2 - s, nranks)];
    const bool last = s + 2 == nranks;
    for (uint64_t c = 0; c < chunk_count(out_block.count, chunk); ++c) {
      const Span piece = chunk_span(out_block.count, chunk, c);
      const Span abs = absolute(out_block, piece);
      const uint64_t held = (s - 1) * per + c;  // the slot use that summed it
      Range src = s == 0 ? sub(input, abs) : in_acc ? sub(acc, abs) : slots.slot(held, piece.count);
      const uint32_t step = e.send(right, src, {s == 0 ? kNone : reduced[c]});
      out.sends[s * per + c] = step;
      if (s > 0 && !in_acc) slots.release(held, step);
    }
    for (uint64_t c = 0; c < chunk_count(in_block.count, chunk); ++c) {
      const Span piece = chunk_span(in_block.count, chunk, c);
      const Span abs = absolute(in_block, piece);
      const uint64_t use = s * per + c;
      const Range slot = slots.slot(use, piece.count);
      const uint32_t got = e.recv(left, slot, {slots.reuse_dep(use)});
      const Range dst = last ? sub(own_dst, piece) : in_acc ? sub(acc, abs) : slot;
      reduced[c] = e.reduce(dst, sub(input, abs), slot, {got});
      if (in_acc || last) slots.release(use, reduced[c]);
    }
  }
  reduced.resize(chunk_count(blocks[rank].count, chunk));
  out.own_ready = std::move(reduced);
  return out;
}

void ring_allgather(Emitter& e, const RingOrder& ring, const std::vector<Span>& blocks,
                    uint64_t chunk, const Range& own_src, const std::vector<uint32_t>& own_ready,
                    const Range& out, const std::vector<uint32_t>& recv_after) {
  const uint64_t per = chunk_count(max_count(blocks), chunk);
  const int nranks = ring.size();
  const int rank = ring.pos;
  const int right = ring.right();
  const int left = ring.left();
  std::vector<uint32_t> received(per, kNone);  // per chunk, the block received last step
  for (int s = 0; s + 1 < nranks; ++s) {
    const Span& out_block = blocks[wrap_rank(int64_t{rank} - s, nranks)];
    const Span& in_block = blocks[wrap_rank(int64_t{rank} - s - 1, nranks)];
    for (uint64_t c = 0; c < chunk_count(out_block.count, chunk); ++c) {
      const Span piece = chunk_span(out_block.count, chunk, c);
      if (s == 0) {
        e.send(right, sub(own_src, piece), {own_ready.empty() ? kNone : own_ready[c]});
      } else {
        e.send(right, sub(out, absolute(out_block, piece)), {received[c]});
      }
    }
    for (uint64_t c = 0; c < chunk_count(in_block.count, chunk); ++c) {
      const Span piece = chunk_span(in_block.count, chunk, c);
      const uint32_t after = recv_after.empty() ? kNone : recv_after[s * per + c];
      received[c] = e.recv(left, sub(out, absolute(in_block, piece)), {after});
    }
  }
}

TreeReduce tree_reduce(Emitter& e, const TreeLinks& links, const Range& input, const Range& acc,
                       uint64_t chunk) {
  TreeReduce out;
  const uint64_t chunks = chunk_count(input.count, chunk);
  out.ready.assign(chunks, kNone);
  out.sent.assign(chunks, kNone);
  const size_t nc = links.children.size();
  const bool in_slot = acc.count == 0;
  std::vector<SlotRing> rings;
  const uint64_t slot_len = chunk == 0 ? input.count : std::min(chunk, input.count);
  for (size_t i = 0; i < nc; ++i) {
    rings.emplace_back(e, slot_len, std::min<uint64_t>(chunks, kPipelineDepth));
  }
  std::vector<uint32_t> got(nc);
  for (uint64_t c = 0; c < chunks; ++c) {
    const Span piece = chunk_span(input.count, chunk, c);
    const Range in = sub(input, piece);
    if (nc == 0) {
      out.ready[c] = out.sent[c] = e.send(links.parent, in);
      continue;
    }
    for (size_t i = 0; i < nc; ++i) {
      got[i] = e.recv(links.children[i], rings[i].slot(c, piece.count), {rings[i].reuse_dep(c)});
    }
    // Fold the smallest subtree (listed last, arriving first) in first.
    const Range sum = in_slot ? rings[nc - 1].slot(c, piece.count) : sub(acc, piece);
    uint32_t prev = kNone;
    for (size_t k = nc; k-- > 0;) {
      const Range a = k == nc - 1 ? in : sum;
      prev = e.reduce(sum, a, rings[k].slot(c, piece.count), {got[k], prev});
      if (!in_slot || k != nc - 1) rings[k].release(c, prev);
    }
    out.ready[c] = prev;
    if (links.parent >= 0) {
      out.sent[c] = e.send(links.parent, sum, {prev});
      if (in_slot) rings[nc - 1].release(c, out.sent[c]);
    }
  }
  return out;
}

void tree_broadcast(Emitter& e, const TreeLinks& links, const Range& root_src, const Range& dst,
                    uint64_t chunk, const std::vector<uint32_t>& after) {
  const uint64_t chunks = chunk_count(dst.count, chunk);
  for (uint64_t c = 0; c < chunks; ++c) {
    const Span piece = chunk_span(dst.count, chunk, c);
    const uint32_t wait = after.empty() ? kNone : after[c];
    Range src = sub(root_src, piece);
    uint32_t ready = wait;
    if (links.parent >= 0) {
      src = sub(dst, piece);
      ready = e.recv(links.parent, src, {wait});
    }
    for (int child : links.children) e.send(child, src, {ready});
  }
}

}  // namespace weft::algo::detail
