#include "algorithms/patterns.h"

#include <algorithm>
#include <bit>

namespace weft::algo {

int log2_floor(uint64_t n) {
  return 63 - std::countl_zero(n);
}
int log2_ceil(uint64_t n) {
  return n <= 1 ? 0 : 64 - std::countl_zero(n - 1);
}

Span block_span(uint64_t total, uint64_t pieces, uint64_t index) {
  const uint64_t base = total / pieces;
  const uint64_t rem = total % pieces;
  return Span{index * base + std::min(index, rem), index < rem ? base + 1 : base};
}

uint64_t chunk_count(uint64_t count, uint64_t chunk) {
  if (count == 0) return 0;
  return chunk == 0 ? 1 : (count + chunk - 1) / chunk;
}

Span chunk_span(uint64_t count, uint64_t chunk, uint64_t index) {
  if (chunk == 0) return Span{0, count};
  const uint64_t offset = index * chunk;
  return Span{offset, std::min(chunk, count - offset)};
}

int binomial_subtree(int nranks, int vrank) {
  if (vrank == 0) return nranks;
  const int low = vrank & -vrank;
  return std::min(low, nranks - vrank);
}

TreeLinks binomial_tree(int nranks, int root, int rank) {
  TreeLinks links;
  const int v = wrap_rank(int64_t{rank} - root, nranks);
  if (v != 0) links.parent = wrap_rank(int64_t{v - (v & -v)} + root, nranks);
  // Children v + m for every power of two m below v's lowest set bit.
  const int64_t limit = v == 0 ? int64_t{nranks} : int64_t{v & -v};
  std::vector<int> rel;
  for (int64_t m = 1; m < limit && v + m < nranks; m <<= 1) rel.push_back(v + static_cast<int>(m));
  std::stable_sort(rel.begin(), rel.end(), [&](int a, int b) {
    return binomial_subtree(nranks, a) > binomial_subtree(nranks, b);
  });
  for (int c : rel) links.children.push_back(wrap_rank(int64_t{c} + root, nranks));
  return links;
}

TreeLinks chain_tree(int nranks, int root, int rank) {
  TreeLinks links;
  const int v = wrap_rank(int64_t{rank} - root, nranks);
  if (v != 0) links.parent = ring_prev(rank, nranks);
  if (v + 1 < nranks) links.children.push_back(ring_next(rank, nranks));
  return links;
}

namespace {

// In-order binary tree over positions 1..n: position p with lowest set bit L
// has children p - L/2 and the largest p + h (h = L/2, L/4, ...) within n;
// odd positions are leaves, the root is the largest power of two <= n.
int inorder_parent(int n, int p) {
  const int top = 1 << log2_floor(static_cast<uint64_t>(n));
  if (p == top) return 0;
  do {
    const int low = p & -p;
    p = (p - low) | (low << 1);
  } while (p > n);
  return p;
}

void inorder_children(int n, int p, std::vector<int>* children) {
  const int low = p & -p;
  if (low == 1) return;
  children->push_back(p - low / 2);
  for (int h = low / 2; h >= 1; h /= 2) {
    if (p + h <= n) {
      children->push_back(p + h);
      return;
    }
  }
}

// Tree 0 puts rank r at position r + 1, so odd ranks are interior. Tree 1
// must make those leaves: for even n it mirrors (position n - r), for odd n
// it shifts by one (position r, rank 0 at n); either way the ranks interior
// in tree 1 are even.
int dbt_position(int n, int which, int rank) {
  if (which == 0) return rank + 1;
  if (n % 2 == 0) return n - rank;
  return rank == 0 ? n : rank;
}

int dbt_rank(int n, int which, int position) {
  if (which == 0) return position - 1;
  if (n % 2 == 0) return n - position;
  return position == n ? 0 : position;
}

}  // namespace

TreeLinks double_binary_tree(int nranks, int which, int rank) {
  TreeLinks links;
  const int p = dbt_position(nranks, which, rank);
  const int parent = inorder_parent(nranks, p);
  if (parent != 0) links.parent = dbt_rank(nranks, which, parent);
  std::vector<int> children;
  inorder_children(nranks, p, &children);
  for (int c : children) links.children.push_back(dbt_rank(nranks, which, c));
  return links;
}

TreeLinks map_links(TreeLinks links, const std::vector<int>& members) {
  if (links.parent >= 0) links.parent = members[links.parent];
  for (int& child : links.children) child = members[child];
  return links;
}

int position_of(const std::vector<int>& members, int rank) {
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

Fold fold_for(int nranks, int rank) {
  Fold fold;
  fold.pow2 = 1 << log2_floor(static_cast<uint64_t>(nranks));
  fold.extra = nranks - fold.pow2;
  if (rank < 2 * fold.extra) {
    const bool odd = rank % 2 == 1;
    fold.vrank = odd ? -1 : rank / 2;
    fold.buddy = odd ? rank - 1 : rank + 1;
  } else {
    fold.vrank = rank - fold.extra;
  }
  return fold;
}

int exchange_rounds(int nranks) {
  return nranks % 2 == 0 ? nranks - 1 : nranks;
}

int exchange_partner(int nranks, int round, int rank) {
  if (nranks % 2 == 1) {
    // Circle method on an odd count: r meets round - r; the rank that would
    // meet itself sits out.
    const int p = wrap_rank(int64_t{round} - rank, nranks);
    return p == rank ? -1 : p;
  }
  // Even count: run the odd schedule on ranks 0..n-2 and pair the rank that
  // would sit out with rank n-1 (who meets the r with 2r = round mod n-1,
  // r = round * n/2 since n/2 inverts 2 modulo n-1).
  const int m = nranks - 1;
  if (rank == m) return static_cast<int>((int64_t{round} * (nranks / 2)) % m);
  const int p = wrap_rank(int64_t{round} - rank, m);
  return p == rank ? m : p;
}

}  // namespace weft::algo
