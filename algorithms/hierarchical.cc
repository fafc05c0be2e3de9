// Two-level compositions for multi-node communicators. Hierarchical: inside
// each node, across nodes among the ranks with the same index in their node
// (each node's ranks carry a slice, so every rank's link out of the node
// works), inside each node again. Node leader: through one rank per node,
// for small messages where the fewest cross-node messages win. Every phase
// is an existing schedule built for a sub-group and composed into this
// rank's program, one phase after the other.
#include <algorithm>
#include <string>
#include <vector>

#include "algorithms/compose.h"
#include "algorithms/families.h"

namespace weft::algo::detail {

namespace {

// The layout as two levels: nodes in the order the ring first enters them,
// each node's ranks in ring order (so sub-rings follow the topology too).
struct Nodes {
  std::vector<std::vector<int>> ranks;  // [node][local index] -> rank
  int node = 0;                         // this rank's node
  int local = 0;                        // this rank's index in it

  int count() const { return static_cast<int>(ranks.size()); }
  const std::vector<int>& mine() const { return ranks[node]; }
  // The ranks with local index j, one per node (all nodes must have j).
  std::vector<int> same_index(int j) const {
    std::vector<int> out;
    for (const std::vector<int>& group : ranks) out.push_back(group[j]);
    return out;
  }
  // The node holding `rank`.
  int node_of(int rank) const {
    for (int k = 0; k < count(); ++k) {
      if (position_of(ranks[k], rank) < static_cast<int>(ranks[k].size())) return k;
    }
    return -1;
  }
};

Nodes nodes_of(const Params& p) {
  const RingOrder ring = ring_order(p);
  Nodes out;
  std::vector<int> slot(p.nranks, -1);  // node id -> index in out.ranks
  for (int rank : ring.members) {
    const int id = p.layout != nullptr ? p.layout->node_of[rank] : 0;
    if (slot[id] < 0) {
      slot[id] = out.count();
      out.ranks.emplace_back();
    }
    std::vector<int>& group = out.ranks[slot[id]];
    if (rank == p.rank) {
      out.node = slot[id];
      out.local = static_cast<int>(group.size());
    }
    group.push_back(rank);
  }
  return out;
}

// A sub-group's Params: no layout (members come in ring order), the outer
// chunking.
Params sub_params(const Params& p, Collective collective, Algorithm algorithm,
                  const std::vector<int>& members, int index, uint64_t count, bool in_place,
                  int root = 0) {
  Params sub;
  sub.collective = collective;
  sub.algorithm = algorithm;
  sub.nranks = static_cast<int>(members.size());
  sub.rank = index;
  sub.root = root;
  sub.count = count;
  sub.chunk = p.chunk;
  sub.in_place = in_place;
  return sub;
}

// The rank that speaks for node k: the root in the root's node, else the
// node's first rank.
int leader_of(const Nodes& nodes, int k, int root_node, int root) {
  return k == root_node ? root : nodes.ranks[k][0];
}

// For every node k and local index j, copies block from(k, j) of `src` to
// block to(k, j) of `dst` (blocks of c elements), each after `after`.
template <typename From, typename To>
std::vector<uint32_t> copy_blocks(Emitter& e, const Nodes& nodes, uint64_t c, const Range& src,
                                  From from, const Range& dst, To to,
                                  const std::vector<uint32_t>& after_all) {
  const std::vector<uint32_t> after = funnel(e, after_all);
  std::vector<uint32_t> copies;
  for (int k = 0; k < nodes.count(); ++k) {
    for (int j = 0; j < static_cast<int>(nodes.ranks[k].size()); ++j) {
      copies.push_back(
          e.copy(sub(dst, Span{to(k, j) * c, c}), sub(src, Span{from(k, j) * c, c}), after));
    }
  }
  return copies;
}

}  // namespace

namespace {

// Hierarchical AllToAllv relays other ranks' pieces, so it needs every
// rank's counts, and they must agree with this rank's own.
bool matrix_applicable(const Params& p, std::string* why) {
  const auto refuse = [&](std::string reason) {
    if (why) *why = "hier alltoallv: " + std::move(reason);
    return false;
  };
  if (p.all_send_counts == nullptr) {
    return refuse(
        "needs every rank's send counts (Params::all_send_counts): a rank relaying for "
        "others must know what they send");
  }
  const size_t n = static_cast<size_t>(p.nranks);
  const size_t me = static_cast<size_t>(p.rank);
  for (size_t q = 0; q < n; ++q) {
    if (p.all_send_counts[me * n + q] != p.send_counts[q]) {
      return refuse("the count matrix says this rank sends " +
                    std::to_string(p.all_send_counts[me * n + q]) + " elements to rank " +
                    std::to_string(q) + ", its send counts say " +
                    std::to_string(p.send_counts[q]));
    }
    if (p.all_send_counts[q * n + me] != p.recv_counts[q]) {
      return refuse("rank " + std::to_string(q) + " sends " +
                    std::to_string(p.all_send_counts[q * n + me]) +
                    " elements to this rank, but its receive count for it is " +
                    std::to_string(p.recv_counts[q]));
    }
  }
  return true;
}

}  // namespace

bool hier_applicable(const Params& p, std::string* why) {
  if (p.algorithm == Algorithm::Hierarchical && p.collective == Collective::AllToAllv) {
    return matrix_applicable(p, why);
  }
  const bool sliced =
      p.algorithm == Algorithm::Hierarchical &&
      (p.collective == Collective::ReduceScatter || p.collective == Collective::AllGather ||
       p.collective == Collective::AllToAll);
  if (!sliced || p.layout == nullptr) return true;
  const Nodes nodes = nodes_of(p);
  for (const std::vector<int>& group : nodes.ranks) {
    if (group.size() != nodes.ranks[0].size()) {
      if (why) {
        *why = std::string("hier ") + collective_name(p.collective) +
               " needs the same number of ranks on every node (the layout has nodes of " +
               std::to_string(nodes.ranks[0].size()) + " and " + std::to_string(group.size()) +
               " ranks)";
      }
      return false;
    }
  }
  return true;
}

// Reduce-scatter inside the node into slices (slice j at local index j),
// allreduce each slice across nodes among the ranks holding it, allgather
// the slices inside the node. Only the middle phase crosses nodes, and it
// moves 1/S of the vector per rank. Each slice is summed in one place and
// copied from there, so all ranks get the same bits. Nodes of unequal size
// use S = the smallest node's rank count: local rank i >= S first folds its
// vector into local rank i mod S (a reduce in their group) and gets the
// result back at the end (a broadcast).
void hier_allreduce(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  if (nodes.count() == 1) return ring_allreduce(p, e);
  const std::vector<int>& local = nodes.mine();
  size_t slices = local.size();
  for (const std::vector<int>& group : nodes.ranks) slices = std::min(slices, group.size());
  const int s = static_cast<int>(slices);
  const Range output = at(Buf::Output, 0, p.count);
  // The fold group: local ranks j, j + S, j + 2S, ... with j = local mod S.
  std::vector<int> fold;
  for (size_t i = nodes.local % slices; i < local.size(); i += slices) fold.push_back(local[i]);
  const int in_fold = nodes.local / s;
  const bool folds = fold.size() > 1;
  std::vector<uint32_t> done;
  if (folds) {
    const Params gather_in =
        sub_params(p, Collective::Reduce, Algorithm::Binomial, fold, in_fold, p.count, p.in_place);
    done = compose_built(e, gather_in, fold, {at(Buf::Input, 0, p.count), output}, {});
  }
  if (in_fold == 0) {
    // After a fold the partial sum already sits in the output.
    const Range input = folds ? output : at(Buf::Input, 0, p.count);
    const std::vector<int> active(local.begin(), local.begin() + s);
    Params intra = sub_params(p, Collective::AllReduce, Algorithm::Ring, active, nodes.local,
                              p.count, folds || p.in_place);
    done = compose_built(e, intra, active, {input, output}, done, ring_allreduce_reduce_phase);
    const Span slice = block_span(p.count, slices, nodes.local);
    const std::vector<int> peers = nodes.same_index(nodes.local);
    const Params across =
        sub_params(p, Collective::AllReduce, Algorithm::Ring, peers, nodes.node, slice.count, true);
    done = compose_built(e, across, peers, {at(Buf::Output, slice), at(Buf::Output, slice)}, done);
    intra.in_place = true;
    done = compose_built(e, intra, active, {output, output}, done, ring_allreduce_gather_phase);
  }
  if (!folds) return;
  const Params give_back =
      sub_params(p, Collective::Broadcast, Algorithm::Binomial, fold, in_fold, p.count, true);
  compose_built(e, give_back, fold, {output, output}, done);
}

// Staged in scratch as [local index j][node k] blocks of the rank nodes[k][j]:
// a reduce-scatter inside the node leaves local index j the node's partial
// sums of the blocks of all ranks with index j, which a reduce-scatter
// among those ranks finishes across nodes.
void hier_reduce_scatter(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  if (nodes.count() == 1) return ring_reduce_scatter(p, e);
  const std::vector<int>& local = nodes.mine();
  const uint64_t c = p.count;
  const uint64_t nn = static_cast<uint64_t>(nodes.count());
  const uint64_t row = nn * c;  // one local index's blocks
  const Range stage = e.scratch(local.size() * row);
  const auto rank_block = [&](int k, int j) { return static_cast<uint64_t>(nodes.ranks[k][j]); };
  const auto staged = [&](int k, int j) { return j * nn + k; };
  std::vector<uint32_t> done =
      copy_blocks(e, nodes, c, at(Buf::Input, 0, p.nranks * c), rank_block, stage, staged, {});
  const Range mine = sub(stage, Span{nodes.local * row, row});
  const Params intra =
      sub_params(p, Collective::ReduceScatter, Algorithm::Ring, local, nodes.local, row, true);
  done = compose_built(e, intra, local, {stage, mine}, done);
  const std::vector<int> peers = nodes.same_index(nodes.local);
  const Params across =
      sub_params(p, Collective::ReduceScatter, Algorithm::Ring, peers, nodes.node, c, false);
  compose_built(e, across, peers, {mine, at(Buf::Output, 0, c)}, done);
}

// The mirror of the reduce-scatter: an allgather across nodes among the
// ranks with the same local index, then one inside the node, staged in
// scratch as [local index][node] and copied to the ranks' blocks.
void hier_allgather(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  if (nodes.count() == 1) return ring_allgather(p, e);
  const std::vector<int>& local = nodes.mine();
  const uint64_t c = p.count;
  const uint64_t nn = static_cast<uint64_t>(nodes.count());
  const uint64_t row = nn * c;
  const Range stage = e.scratch(local.size() * row);
  const Range mine = sub(stage, Span{nodes.local * row, row});
  const std::vector<int> peers = nodes.same_index(nodes.local);
  const Params across =
      sub_params(p, Collective::AllGather, Algorithm::Ring, peers, nodes.node, c, false);
  std::vector<uint32_t> done = compose_built(e, across, peers, {at(Buf::Input, 0, c), mine}, {});
  const Params intra =
      sub_params(p, Collective::AllGather, Algorithm::Ring, local, nodes.local, row, true);
  done = compose_built(e, intra, local, {mine, stage}, done);
  const auto staged = [&](int k, int j) { return j * nn + k; };
  const auto rank_block = [&](int k, int j) { return static_cast<uint64_t>(nodes.ranks[k][j]); };
  copy_blocks(e, nodes, c, stage, staged, at(Buf::Output, 0, p.nranks * c), rank_block, done);
}

// Two hops: every rank sends each other node, in one message, what it has
// for that node's ranks (an all-to-all among the ranks with its local
// index), and those ranks hand the pieces on inside their node (an
// all-to-all there). Cross-node messages per rank drop from n - L to N - 1,
// each L times larger. Pieces are regrouped in scratch between the hops.
void hier_alltoall(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  if (nodes.count() == 1) return pairwise_alltoall(p, e);
  const std::vector<int>& local = nodes.mine();
  const uint64_t c = p.count;
  const uint64_t nn = static_cast<uint64_t>(nodes.count());
  const uint64_t ln = local.size();
  const uint64_t total = nn * ln * c;
  // out: [node k][local j] what goes to rank (k, j); back: [node k][local j]
  // from the rank with this rank's local index on node k, for local rank j.
  const Range out = e.scratch(total);
  const Range back = e.scratch(total);
  const auto rank_block = [&](int k, int j) { return static_cast<uint64_t>(nodes.ranks[k][j]); };
  const auto node_major = [&](int k, int j) { return k * ln + j; };
  const auto local_major = [&](int k, int j) { return j * nn + k; };
  std::vector<uint32_t> done =
      copy_blocks(e, nodes, c, at(Buf::Input, 0, total), rank_block, out, node_major, {});
  const std::vector<int> peers = nodes.same_index(nodes.local);
  const Params across =
      sub_params(p, Collective::AllToAll, Algorithm::Pairwise, peers, nodes.node, ln * c, false);
  done = compose_built(e, across, peers, {out, back}, done);
  // Regrouped by the local rank they go to: [local j][node k].
  done = copy_blocks(e, nodes, c, back, node_major, out, local_major, done);
  const Params inside =
      sub_params(p, Collective::AllToAll, Algorithm::Pairwise, local, nodes.local, nn * c, false);
  done = compose_built(e, inside, local, {out, back}, done);
  // back: [local i][node k] from rank (k, i).
  copy_blocks(e, nodes, c, back, local_major, at(Buf::Output, 0, total), rank_block, done);
}

namespace {

// An AllToAllv piece: where it lies (or is to land) and the steps after
// which it is there.
struct Held {
  Range at;
  std::vector<uint32_t> ready;
};

// Sends `pieces` to `peer` as one message (none when they are all empty,
// as pairwise sends no empty messages: the receiver knows the sizes too),
// straight from where it lies when only one piece has elements, else
// packed into scratch first.
void send_message(Emitter& e, int peer, const std::vector<const Held*>& pieces, uint64_t chunk) {
  std::vector<const Held*> full;
  uint64_t total = 0;
  for (const Held* piece : pieces) {
    if (piece->at.count == 0) continue;
    full.push_back(piece);
    total += piece->at.count;
  }
  if (full.empty()) return;
  if (full.size() == 1) return e.send_pieces(peer, full[0]->at, chunk, full[0]->ready);
  const Range packed = e.scratch(total);
  std::vector<uint32_t> copies;
  uint64_t offset = 0;
  for (const Held* piece : full) {
    copies.push_back(e.copy(sub(packed, Span{offset, piece->at.count}), piece->at, piece->ready));
    offset += piece->at.count;
  }
  e.send_pieces(peer, packed, chunk, funnel(e, copies));
}

// Receives the message send_message() makes of pieces of `counts`
// elements. It lands in scratch, or straight at homes[q] (where piece q is
// to end up, count 0: elsewhere) when piece q has all its elements.
// Returns where each piece is.
std::vector<Held> recv_message(Emitter& e, int peer, const std::vector<uint64_t>& counts,
                               const std::vector<Range>& homes, uint64_t chunk) {
  uint64_t total = 0;
  int full = 0, last_full = -1;
  for (size_t q = 0; q < counts.size(); ++q) {
    total += counts[q];
    if (counts[q] > 0) ++full, last_full = static_cast<int>(q);
  }
  std::vector<Held> out(counts.size());
  if (total == 0) return out;
  std::vector<uint32_t> steps;
  if (full == 1 && homes[last_full].count > 0) {
    e.recv_pieces(peer, homes[last_full], chunk, {}, &steps);
    out[last_full] = Held{homes[last_full], funnel(e, steps)};
    return out;
  }
  const Range landed = e.scratch(total);
  e.recv_pieces(peer, landed, chunk, {}, &steps);
  const std::vector<uint32_t> ready = funnel(e, steps);
  uint64_t offset = 0;
  for (size_t q = 0; q < counts.size(); ++q) {
    out[q] = Held{sub(landed, Span{offset, counts[q]}), ready};
    offset += counts[q];
  }
  return out;
}

// Copies `piece` to `home` unless it is there already.
void deliver(Emitter& e, const Held& piece, const Range& home) {
  if (home.count == 0 || (piece.at.buf == home.buf && piece.at.offset == home.offset)) return;
  e.copy(home, piece.at, piece.ready);
}

}  // namespace

// Two hops, as hier AllToAll, with counts from the full matrix: every rank
// sends each other node it has data for, in one message, all it has for
// that node's ranks, to the rank there with its own local index (modulo
// the node's size, so nodes may differ in size). Each rank then sends every rank of its node,
// in one message, the pieces for it from itself and from the ranks it
// relays for, and every piece lands at its receiver's recv_displs. A
// message made of one non-empty piece is sent from, and lands at, that
// piece's place without staging copies.
void hier_alltoallv(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  const size_t n = static_cast<size_t>(p.nranks);
  const auto count = [&](int s, int d) { return p.all_send_counts[s * n + d]; };
  const std::vector<int>& local = nodes.mine();
  const int nn = nodes.count();
  const int ln = static_cast<int>(local.size());
  const int me = p.rank;
  const auto relay = [&](int k, int index) {
    const std::vector<int>& group = nodes.ranks[k];
    return group[index % group.size()];
  };
  // The ranks whose pieces for this node the rank at local index x hands
  // out: itself, then (node by node) those whose message for this node it
  // receives.
  const auto sources = [&](int x) {
    std::vector<int> out = {local[x]};
    for (int k = 0; k < nn; ++k) {
      if (k == nodes.node) continue;
      for (size_t y = 0; y < nodes.ranks[k].size(); ++y) {
        if (relay(nodes.node, static_cast<int>(y)) == local[x]) out.push_back(nodes.ranks[k][y]);
      }
    }
    return out;
  };
  const auto own_input = [&](int d) {
    return Held{at(Buf::Input, p.send_displs[d], count(me, d)), {}};
  };
  const auto home = [&](int s) { return at(Buf::Output, p.recv_displs[s], count(s, me)); };

  // Hop 1: one message to each other node, starting with the next one.
  for (int t = 1; t < nn; ++t) {
    const int k = (nodes.node + t) % nn;
    std::vector<Held> pieces;
    for (int d : nodes.ranks[k]) pieces.push_back(own_input(d));
    std::vector<const Held*> refs;
    for (const Held& piece : pieces) refs.push_back(&piece);
    send_message(e, relay(k, nodes.local), refs, p.chunk);
  }
  // held[x][j]: the piece of source x for local rank j.
  const std::vector<int> mine = sources(nodes.local);
  std::vector<std::vector<Held>> held(mine.size());
  for (int d : local) held[0].push_back(own_input(d));
  for (size_t x = 1; x < mine.size(); ++x) {
    std::vector<uint64_t> counts;
    std::vector<Range> homes;
    for (int d : local) {
      counts.push_back(count(mine[x], d));
      homes.push_back(d == me ? home(mine[x]) : Range{});
    }
    held[x] = recv_message(e, mine[x], counts, homes, p.chunk);
  }

  // Hop 2: one message to each other rank of the node.
  for (int t = 1; t < ln; ++t) {
    const int j = (nodes.local + t) % ln;
    std::vector<const Held*> refs;
    for (const std::vector<Held>& from : held) refs.push_back(&from[j]);
    send_message(e, local[j], refs, p.chunk);
  }
  for (size_t x = 0; x < mine.size(); ++x) deliver(e, held[x][nodes.local], home(mine[x]));
  for (int t = 1; t < ln; ++t) {
    const int j = (nodes.local - t + ln) % ln;
    const std::vector<int> from = sources(j);
    std::vector<uint64_t> counts;
    std::vector<Range> homes;
    for (int s : from) {
      counts.push_back(count(s, me));
      homes.push_back(home(s));
    }
    const std::vector<Held> got = recv_message(e, local[j], counts, homes, p.chunk);
    for (size_t x = 0; x < from.size(); ++x) deliver(e, got[x], homes[x]);
  }
}

namespace {

// Broadcast among the node leaders (the root leads its node), then inside
// every node from its leader, both with `tree`.
void two_level_broadcast(const Params& p, Emitter& e, Algorithm tree) {
  const Nodes nodes = nodes_of(p);
  const int root_node = nodes.node_of(p.root);
  const int lead = leader_of(nodes, nodes.node, root_node, p.root);
  const Range output = at(Buf::Output, 0, p.count);
  std::vector<uint32_t> done;
  if (p.rank == lead) {
    std::vector<int> leaders;
    for (int k = 0; k < nodes.count(); ++k)
      leaders.push_back(leader_of(nodes, k, root_node, p.root));
    const Params across = sub_params(p, Collective::Broadcast, tree, leaders, nodes.node, p.count,
                                     p.in_place, root_node);
    done = compose_built(e, across, leaders, {at(Buf::Input, 0, input_count(p)), output}, {});
  }
  const std::vector<int>& local = nodes.mine();
  const Params intra = sub_params(p, Collective::Broadcast, tree, local, nodes.local, p.count, true,
                                  position_of(local, lead));
  compose_built(e, intra, local, {output, output}, done);
}

// Reduce inside every node to its leader, then among the leaders to the
// root, both with `tree`. Leaders other than the root hold their node's
// partial sum in scratch.
void two_level_reduce(const Params& p, Emitter& e, Algorithm tree) {
  const Nodes nodes = nodes_of(p);
  const int root_node = nodes.node_of(p.root);
  const int lead = leader_of(nodes, nodes.node, root_node, p.root);
  const bool root = p.rank == p.root;
  const Range partial = root             ? at(Buf::Output, 0, p.count)
                        : p.rank == lead ? e.scratch(p.count)
                                         : Range{0, 0, Buf::Output};
  const std::vector<int>& local = nodes.mine();
  const Params intra = sub_params(p, Collective::Reduce, tree, local, nodes.local, p.count,
                                  root && p.in_place, position_of(local, lead));
  const std::vector<uint32_t> done =
      compose_built(e, intra, local, {at(Buf::Input, 0, p.count), partial}, {});
  if (p.rank != lead) return;
  std::vector<int> leaders;
  for (int k = 0; k < nodes.count(); ++k) leaders.push_back(leader_of(nodes, k, root_node, p.root));
  const Params across =
      sub_params(p, Collective::Reduce, tree, leaders, nodes.node, p.count, true, root_node);
  compose_built(e, across, leaders, {partial, partial}, done);
}

}  // namespace

void hier_broadcast(const Params& p, Emitter& e) {
  two_level_broadcast(p, e, Algorithm::Chain);
}

void hier_reduce(const Params& p, Emitter& e) {
  two_level_reduce(p, e, Algorithm::Chain);
}

void leader_broadcast(const Params& p, Emitter& e) {
  two_level_broadcast(p, e, Algorithm::Binomial);
}

void leader_reduce(const Params& p, Emitter& e) {
  two_level_reduce(p, e, Algorithm::Binomial);
}

// Reduce to each node's first rank, allreduce among those leaders by
// recursive doubling, broadcast inside each node: one cross-node exchange
// per round, and the sum is made once among the leaders (who all get the
// same bits) and copied from there.
void leader_allreduce(const Params& p, Emitter& e) {
  const Nodes nodes = nodes_of(p);
  const std::vector<int>& local = nodes.mine();
  const Range output = at(Buf::Output, 0, p.count);
  const Params reduce = sub_params(p, Collective::Reduce, Algorithm::Binomial, local, nodes.local,
                                   p.count, p.in_place, 0);
  std::vector<uint32_t> done =
      compose_built(e, reduce, local, {at(Buf::Input, 0, p.count), output}, {});
  if (nodes.local == 0) {
    const std::vector<int> leaders = nodes.same_index(0);
    const Params across =
        sub_params(p, Collective::AllReduce, Algorithm::Rd, leaders, nodes.node, p.count, true);
    done = compose_built(e, across, leaders, {output, output}, done);
  }
  const Params spread = sub_params(p, Collective::Broadcast, Algorithm::Binomial, local,
                                   nodes.local, p.count, true, 0);
  compose_built(e, spread, local, {output, output}, done);
}

}  // namespace weft::algo::detail
