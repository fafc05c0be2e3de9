// Trees: the double binary tree for AllReduce, binomial trees for the rooted
// collectives. Logarithmic depth; pipelined by chunk where data flows
// through interior ranks.
#include <vector>

#include "algorithms/families.h"

namespace weft::algo::detail {

// Each tree reduces half of the vector to its root and broadcasts it back,
// so every element is summed in one place; a rank is interior in at most
// one tree, which spreads the forwarding work. The trees are built over
// positions in the layout's ring: a subtree covers consecutive positions,
// so it stays inside a node where it can.
void tree_allreduce(const Params& p, Emitter& e) {
  const RingOrder ring = ring_order(p);
  for (int which = 0; which < 2; ++which) {
    const Span half = block_span(p.count, 2, which);
    if (half.count == 0) continue;
    const TreeLinks links = map_links(double_binary_tree(p.nranks, which, ring.pos), ring.members);
    const Range output = at(Buf::Output, half);
    const TreeReduce up = tree_reduce(e, links, at(Buf::Input, half), output, p.chunk);
    // The root starts once a chunk is summed; others overwrite what they
    // sent up (their partial sum, or a leaf's input) only after sending it,
    // which matters for a leaf only in place.
    const bool leaf = links.children.empty();
    const std::vector<uint32_t> none;
    const std::vector<uint32_t>& after =
        links.parent < 0 ? up.ready : (leaf && !p.in_place ? none : up.sent);
    tree_broadcast(e, links, output, output, p.chunk, after);
  }
}

void rooted_broadcast(const Params& p, Emitter& e, const TreeLinks& links) {
  const Range input = at(Buf::Input, 0, p.count);
  const Range output = at(Buf::Output, 0, p.count);
  if (p.rank == p.root && !p.in_place) e.copy(output, input);
  tree_broadcast(e, links, input, output, p.chunk, {});
}

void rooted_reduce(const Params& p, Emitter& e, const TreeLinks& links) {
  // Only the root has an output buffer; the others accumulate in scratch.
  const Range acc = p.rank == p.root ? at(Buf::Output, 0, p.count) : Range{0, 0, Buf::Scratch};
  tree_reduce(e, links, at(Buf::Input, 0, p.count), acc, p.chunk);
}

void binomial_broadcast(const Params& p, Emitter& e) {
  rooted_broadcast(p, e, binomial_tree(p.nranks, p.root, p.rank));
}

void binomial_reduce(const Params& p, Emitter& e) {
  rooted_reduce(p, e, binomial_tree(p.nranks, p.root, p.rank));
}

namespace {

// A binomial subtree [v, v + size) of relative ranks moves as one message,
// cut where the real ranks wrap from n-1 to 0 so that the root can place it
// straight into its rank-ordered buffer. Both ends cut the same way. Spans
// are in ranks, relative to v.
std::vector<Span> subtree_parts(int nranks, int root, int v, int size) {
  const int wrap = nranks - root;  // relative rank of real rank 0
  if (v < wrap && wrap < v + size) {
    return {Span{0, static_cast<uint64_t>(wrap - v)},
            Span{static_cast<uint64_t>(wrap - v), static_cast<uint64_t>(v + size - wrap)}};
  }
  return {Span{0, static_cast<uint64_t>(size)}};
}

// Calls fn(child, vc, part) for every message part of every child's subtree
// (vc: the child's relative rank), children largest first.
template <typename Fn>
void for_each_child_part(const Params& p, const TreeLinks& links, Fn&& fn) {
  for (int child : links.children) {
    const int vc = wrap_rank(int64_t{child} - p.root, p.nranks);
    for (const Span& part : subtree_parts(p.nranks, p.root, vc, binomial_subtree(p.nranks, vc))) {
      fn(child, vc, part);
    }
  }
}

// Real rank of relative rank v + offset.
uint64_t real_rank(int nranks, int root, int v, uint64_t offset) {
  return static_cast<uint64_t>(wrap_rank(int64_t{root} + v + static_cast<int64_t>(offset), nranks));
}

}  // namespace

// Every rank gathers its subtree's pieces in relative-rank order, then hands
// them to its parent in one message (two where the root's buffer wraps).
void binomial_gather(const Params& p, Emitter& e) {
  const int n = p.nranks;
  const uint64_t count = p.count;
  const TreeLinks links = binomial_tree(n, p.root, p.rank);
  const int v = wrap_rank(int64_t{p.rank} - p.root, n);
  const Range input = at(Buf::Input, 0, count);
  if (v == 0) {
    if (!p.in_place) e.copy(at(Buf::Output, p.root * count, count), input);
    for_each_child_part(p, links, [&](int child, int vc, const Span& part) {
      const uint64_t first = real_rank(n, p.root, vc, part.offset);
      e.recv_pieces(child, at(Buf::Output, first * count, part.count * count), p.chunk, {});
    });
    return;
  }
  const int size = binomial_subtree(n, v);
  Range stage = input;
  LastTouch written;  // indexed like stage
  if (!links.children.empty()) {
    stage = e.scratch(size * count);
    written.set(Span{0, count}, e.copy(sub(stage, Span{0, count}), input));
    for_each_child_part(p, links, [&](int child, int vc, const Span& part) {
      const Span at_stage{(vc - v + part.offset) * count, part.count * count};
      recv_noted(e, child, stage, at_stage, p.chunk, nullptr, &written);
    });
  }
  for (const Span& part : subtree_parts(n, p.root, v, size)) {
    send_written(e, links.parent, stage, Span{part.offset * count, part.count * count}, p.chunk,
                 written);
  }
}

// The mirror of gather: each rank receives its subtree's pieces, keeps its
// own and passes the rest down, largest subtree first.
void binomial_scatter(const Params& p, Emitter& e) {
  const int n = p.nranks;
  const uint64_t count = p.count;
  const TreeLinks links = binomial_tree(n, p.root, p.rank);
  const int v = wrap_rank(int64_t{p.rank} - p.root, n);
  const Range output = at(Buf::Output, 0, count);
  if (v == 0) {
    if (!p.in_place) e.copy(output, at(Buf::Input, p.root * count, count));
    for_each_child_part(p, links, [&](int child, int vc, const Span& part) {
      const uint64_t first = real_rank(n, p.root, vc, part.offset);
      e.send_pieces(child, at(Buf::Input, first * count, part.count * count), p.chunk, {});
    });
    return;
  }
  const int size = binomial_subtree(n, v);
  if (links.children.empty()) {
    e.recv_pieces(links.parent, output, p.chunk, {});
    return;
  }
  const Range stage = e.scratch(size * count);
  LastTouch written;  // indexed like stage
  for (const Span& part : subtree_parts(n, p.root, v, size)) {
    recv_noted(e, links.parent, stage, Span{part.offset * count, part.count * count}, p.chunk,
               nullptr, &written);
  }
  std::vector<uint32_t> deps;
  written.collect(Span{0, count}, &deps);
  e.copy(output, sub(stage, Span{0, count}), deps);
  for_each_child_part(p, links, [&](int child, int vc, const Span& part) {
    const Span at_stage{(vc - v + part.offset) * count, part.count * count};
    send_written(e, child, stage, at_stage, p.chunk, written);
  });
}

}  // namespace weft::algo::detail
