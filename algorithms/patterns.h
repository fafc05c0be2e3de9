// Peer patterns shared by the algorithm families: who talks to whom and which
// piece of the vector each rank handles. Pure arithmetic; no steps are built
// here, so every family (and the tuner) sees the same shapes.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::algo {

// `value` mod n in [0, n), for rank arithmetic that may go negative.
inline int wrap_rank(int64_t value, int n) {
  int64_t m = value % n;
  return static_cast<int>(m < 0 ? m + n : m);
}
inline int ring_next(int rank, int n) {
  return rank + 1 == n ? 0 : rank + 1;
}
inline int ring_prev(int rank, int n) {
  return rank == 0 ? n - 1 : rank - 1;
}

// floor(log2(n)) and ceil(log2(n)) for n >= 1.
int log2_floor(uint64_t n);
int log2_ceil(uint64_t n);

// A run of elements [offset, offset + count).
struct Span {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t end() const { return offset + count; }
};

// Piece `index` of `total` elements cut into `pieces` near-equal parts, the
// first total % pieces parts one element longer. index == pieces gives the
// empty span at `total`, so [block(i).offset, block(j).offset) covers blocks
// i..j-1.
Span block_span(uint64_t total, uint64_t pieces, uint64_t index);

// Pieces of at most `chunk` elements (0: unlimited) that cover `count`
// elements; none when count is 0. chunk_span is relative to the start.
uint64_t chunk_count(uint64_t count, uint64_t chunk);
Span chunk_span(uint64_t count, uint64_t chunk, uint64_t index);

// One rank's links in a rooted spanning tree. Children are listed largest
// subtree first: senders serve the longest path first, reducers consume the
// list backwards so that the earliest arrivals are folded in first.
struct TreeLinks {
  int parent = -1;  // -1 at the root
  std::vector<int> children;
};

// Binomial tree over ranks relative to `root`: relative rank v's parent is v
// with its lowest set bit cleared; its subtree is [v, v + binomial_subtree).
TreeLinks binomial_tree(int nranks, int root, int rank);
int binomial_subtree(int nranks, int vrank);

// Chain root -> root+1 -> ... -> root-1 (mod nranks).
TreeLinks chain_tree(int nranks, int root, int rank);

// Double binary tree: two binary trees (which = 0, 1) spanning all ranks in
// which every rank is an interior node of at most one, so the two halves of
// a vector can be reduced through disjoint sets of interior links.
TreeLinks double_binary_tree(int nranks, int which, int rank);

// `links` over positions 0..n-1 turned into links between members[position].
TreeLinks map_links(TreeLinks links, const std::vector<int>& members);
// Where `rank` sits in `members` (members.size() if absent).
int position_of(const std::vector<int>& members, int rank);

// Recursive doubling/halving on any rank count: with pow2 the largest power
// of two <= nranks and extra = nranks - pow2, ranks 2i+1 < 2*extra fold into
// rank 2i, and the pow2 remaining ("virtual") ranks run the power-of-two
// algorithm. Virtual rank v stands for the real ranks
// [fold_first_real(v), fold_first_real(v + 1)), so any run of virtual ranks
// covers a contiguous run of real ranks.
struct Fold {
  int pow2 = 1;
  int extra = 0;
  int vrank = -1;  // this rank's virtual rank, -1 when it folds into its buddy
  int buddy = -1;  // the rank folded together with this one, -1 if none
};
Fold fold_for(int nranks, int rank);
inline int fold_first_real(const Fold& fold, int vrank) {
  return vrank < fold.extra ? 2 * vrank : vrank + fold.extra;
}

// Pairwise exchange as a round-robin tournament: in every round each rank
// meets at most one partner and the meeting is mutual; over all rounds every
// pair meets exactly once. nranks - 1 rounds for even nranks, nranks for odd
// (each rank sits out once). Partner -1: idle this round.
int exchange_rounds(int nranks);
int exchange_partner(int nranks, int round, int rank);

}  // namespace weft::algo
