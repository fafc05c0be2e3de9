// The per-family program builders behind build(). Each one receives
// validated Params with nranks >= 2 and, except Barrier and AllToAllv,
// count >= 1; build() handles the trivial cases. Internal to weft_algorithms.
#pragma once

#include <string>

#include "algorithms/patterns.h"
#include "algorithms/schedule.h"
#include "algorithms/steps.h"

namespace weft::algo::detail {

// ring.cc
void ring_allreduce(const Params& p, Emitter& e);
void ring_reduce_scatter(const Params& p, Emitter& e);
void ring_allgather(const Params& p, Emitter& e);
void chain_broadcast(const Params& p, Emitter& e);
void chain_reduce(const Params& p, Emitter& e);
// The halves of ring AllReduce as separate phases, for compositions (any
// nranks): the first leaves block q of the sum (block_span(count, n, q)) in
// ring position q's Output; the second, in place on Output, copies every
// position's block to all.
void ring_allreduce_reduce_phase(const Params& p, Emitter& e);
void ring_allreduce_gather_phase(const Params& p, Emitter& e);

// tree.cc
void tree_allreduce(const Params& p, Emitter& e);
void binomial_broadcast(const Params& p, Emitter& e);
void binomial_reduce(const Params& p, Emitter& e);
void binomial_gather(const Params& p, Emitter& e);
void binomial_scatter(const Params& p, Emitter& e);
// Broadcast / Reduce over any rooted tree (binomial, chain).
void rooted_broadcast(const Params& p, Emitter& e, const TreeLinks& links);
void rooted_reduce(const Params& p, Emitter& e, const TreeLinks& links);

// halving_doubling.cc
void rhd_allreduce(const Params& p, Emitter& e);
void rhd_reduce_scatter(const Params& p, Emitter& e);
void rd_allreduce(const Params& p, Emitter& e);
void rd_allgather(const Params& p, Emitter& e);

// bruck.cc
void bruck_allgather(const Params& p, Emitter& e);
void bruck_alltoall(const Params& p, Emitter& e);

// pairwise.cc
void pairwise_reduce_scatter(const Params& p, Emitter& e);
void pairwise_alltoall(const Params& p, Emitter& e);  // AllToAll and AllToAllv
void dissemination_barrier(const Params& p, Emitter& e);

// hierarchical.cc
void hier_allreduce(const Params& p, Emitter& e);
void hier_reduce_scatter(const Params& p, Emitter& e);
void hier_allgather(const Params& p, Emitter& e);
void hier_broadcast(const Params& p, Emitter& e);
void hier_reduce(const Params& p, Emitter& e);
void hier_alltoall(const Params& p, Emitter& e);
void hier_alltoallv(const Params& p, Emitter& e);
void leader_allreduce(const Params& p, Emitter& e);
void leader_broadcast(const Params& p, Emitter& e);
void leader_reduce(const Params& p, Emitter& e);
// Whether the layout suits the hierarchical schedule of p's collective;
// *why says what is missing.
bool hier_applicable(const Params& p, std::string* why);

}  // namespace weft::algo::detail
