// weft-overlap's arithmetic, apart from the benchmark so that tests can check
// it: the compute kernel, the efficiency and the spread of repeats.
#pragma once

#include <span>
#include <vector>

namespace weft::overlap {

// A fixed amount of vector work on data that fits in cache (it competes for
// cores rather than memory bandwidth). Returns a checksum of every element
// after the last iteration: the caller prints it, so no iteration can be
// dropped, and each iteration moves every element (x -> 0.999x + 0.001 has
// its fixed point at 1; callers start away from it).
float compute(std::span<float> data, long iterations);

// One repeat's times, all on the calling thread's clock: compute alone,
// the AllReduce alone, both together (AllReduce queued, then the same
// compute, then the stream synchronised) and, inside that overlapped run,
// how long the compute took.
struct Times {
  double compute = 0;
  double comm = 0;
  double both = 0;
  double compute_in_both = 0;
};

// The share of the AllReduce hidden behind compute: 1 - (what overlapping
// failed to hide) / comm, where what it failed to hide is the time the
// thread waited for the stream after its compute (both - compute_in_both,
// never negative since the compute ran inside `both`) plus how much longer
// the compute took while sharing the cores with the communication
// (compute_in_both - compute, counted only when positive: a faster compute
// in the overlapped run is noise, not hidden communication). So it is at
// most 1 by construction; it is 0 for no overlap (both = compute + comm) and
// negative when overlapping costs more than running one after the other.
double efficiency(const Times& t);

struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> values);

}  // namespace weft::overlap
