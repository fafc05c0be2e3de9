// The per-family program builders behind build(). Each one receives
// validated Params with nranks >= 2 and, except Barrier and AllToAllv,
// count >= 1; build() handles the trivial cases. Internal to weft_algorithms.
#pragma once

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

}  // namespace weft::algo::detail
