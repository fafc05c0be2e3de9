// The cost model's machine inputs: what one call, one message, one copy or
// reduction and one synchronisation through shared memory cost on this
// machine, and how ranks that outnumber the cores slow each other. Defaults
// are the development machine's figures (docs/perf/calibration-run6.txt:
// `calibrate.py measure --rounds 9`, each figure's median over the rounds;
// direct_cache_bandwidth_gb_s from run 7, `--rounds 7`);
// WEFT_TUNER_FILE names a file
// written by bench/perf/calibrate.py (docs/tuning.md, "Calibration") that
// replaces any of them:
//   # comment
//   call_us 1.1
//   link_latency_us 0.9
//   link_bandwidth_gb_s 6.5
//   ...
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "algorithms/cost_model.h"
#include "common/status.h"
#include "topo/cluster.h"

namespace weft {

struct Calibration {
  // Host-side cost of one scheduled call (API entry, tuner lookup, job set-up),
  // added to every prediction of a message-based algorithm.
  double call_us = 0;
  // Ranks of one node over UCX (every intra-node link class unless a topology
  // file gives costs).
  topo::LinkCost link{5.8, 2.26};
  // Reduce and Copy steps on one core: per-step overhead, throughput.
  algo::LinkTime memory{0.2, 25.1};
  // Direct algorithms: one synchronisation, the throughput of reading what
  // another core has just written to its staging (the copy into staging is
  // memory's).
  algo::LinkTime direct{0.05, 12.6};
  // Direct reads of a peer's buffer by cross-memory attach: per read (the
  // system call), throughput.
  algo::LinkTime single_copy{1.84, 7.3};
  // Calls whose larger buffer per rank is up to cache_bytes run their copies
  // (memory and CMA reads) from the cache at cache_bandwidth_gb_s instead of
  // memory_bandwidth; a larger call's first cache_bytes still do (cache_speedup).
  // 0: one throughput for every size. 1 MiB: measured 2026-12-08 (1.00 and 1.01 MB in two
  // `calibrate.py measure --rounds 3`; 730 KiB in run 6, on the host before).
  double cache_bytes = 1 << 20;
  double cache_bandwidth_gb_s = 122;
  // What moves lines between cores gains less from the cache than a rank's own copies
  // (docs/tuning.md, run 7): direct reads of a peer's staging run at
  // direct_cache_bandwidth_gb_s instead of direct_bandwidth while the input per rank
  // (what a peer stages) fits cache_bytes, and the node's links gain by the same
  // factor while the larger buffer does. 0: both take the copies' factor, as they do
  // for a file that gives direct_bandwidth_gb_s without this key.
  double direct_cache_bandwidth_gb_s = 22.3;
  // Cores the ranks of one node share; 0: the processors online.
  int cores = 0;
  // Oversubscribed (ranks per node > cores): the ranks time-share the cores,
  // so every throughput divides by s = ranks / cores, and each message waits
  // for its receiver's next time slice, about slice_latency_us * (s - 1)
  // more. A direct synchronisation waits less (direct_slice_latency_us): its
  // waiters yield the core at once, where a message first needs the
  // receiver's progress engine to run.
  double slice_latency_us = 6.2;
  double direct_slice_latency_us = 2.06;
  // A link's throughput per rank measured with twice as many ranks as cores
  // (s = 2); 0: link_bandwidth / s. Messages lose more than their share of
  // the cores: a rank waiting for one spins on a core its peer needs.
  // Other s follow the same power of s (sliced_link_bandwidth).
  double sliced_link_bandwidth_gb_s = 2.7;
  // A read by cross-memory attach per rank at s = 2 (0: single_copy_bandwidth / s).
  // It also loses more than its share, by the same factor at every s here (one-shot
  // AllToAll at 16 MiB: 4 ranks on 2 cores read at 0.43 of single_copy_bandwidth / 2,
  // 8 ranks at 0.44 of single_copy_bandwidth / 4), so other s scale it by 2 / s
  // (sliced_single_copy_bandwidth).
  double sliced_single_copy_bandwidth_gb_s = 2.42;

  // s for `ranks_per_node` ranks on `cores` cores (at least 1).
  static double share(int ranks_per_node, int cores);
  // A cost seen by time-sliced ranks: throughput / s, and `slice_us` * (s - 1)
  // more latency (0 for local work, which waits for nobody).
  static algo::LinkTime sliced(algo::LinkTime time, double share, double slice_us);
  // A node link's throughput at share s, given its throughput at s = 2
  // (`at_two`, 0: unknown, bandwidth / s): bandwidth / s^k with k such that
  // s = 2 gives at_two.
  static double sliced_link_bandwidth(double bandwidth_gb_s, double share, double at_two);
  // A single-copy read's throughput at share s, given its throughput at s = 2 (`at_two`,
  // 0: unknown, bandwidth / s): at_two * 2 / s.
  static double sliced_single_copy_bandwidth(double bandwidth_gb_s, double share, double at_two);
  // Throughput of copies in a call whose larger buffer per rank is `bytes`,
  // over memory_bandwidth: 1 without a cache tier, up to
  // cache_bandwidth / memory_bandwidth for calls that fit.
  static double cache_speedup(double bytes, double cache_bytes, double cache_gb_s,
                              double memory_gb_s);

  // The figures of a host running at `speed` times the speed of the one they were measured
  // on (docs/tuning.md, "Host speed"): every throughput times speed; the latencies of work
  // on the ranks' own cores (the call, a copy step, a direct synchronisation, the waits for
  // a time slice) over it. A UCX message's latency and a cross-memory read's system call
  // are left as they are: they did not follow the cores between this host's states.
  void scale_to_speed(double speed);
};

// GB/s of a 64 KiB copy from this core's cache: the median of 32 samples of 4 copies, measured at
// the process's first call and kept (what calibrate.py measures as cache_bandwidth_gb_s).
double probe_cache_copy_gb_s();

// This rank's view of the host's speed against `machine`: WEFT_HOST_SPEED / 100 when set,
// else probe_cache_copy_gb_s() / machine.cache_bandwidth_gb_s, within [1/20, 20].
double local_host_speed(const Calibration& machine);

// Whether `speed` is one local_host_speed can give: a peer's record with another is malformed.
bool valid_host_speed(double speed);

// The speed a communicator's ranks apply alike: the median of their views, one per rank
// (the lower middle one for an even count); 1 for none.
double agreed_host_speed(std::vector<double> views);

// Parses the calibration file format above into *out (keys not given keep
// their value). Unknown keys, missing or non-positive numbers are errors
// naming the source and line.
Status parse_calibration(std::string_view text, const std::string& source, Calibration* out);

// The defaults, replaced by WEFT_TUNER_FILE's values when it is set; a file
// that cannot be read or parsed is an error naming it.
Status load_calibration(Calibration* out);

}  // namespace weft
