#!/usr/bin/env python3
"""Calibrates the cost model on this machine and checks it.

  calibrate.py measure BUILD [-o FILE] [--repeats R] [--rounds K]
      measures the model's inputs with weft-perf and writes them as a
      WEFT_TUNER_FILE (lib/core/calibration.h): per-call overhead and copy
      throughput from memory and from the cache (1 rank), UCX latency and
      bandwidth (2-rank sendrecv), the direct path's synchronisation and
      throughput (2-rank one-shot AllReduce; in the cache, one-shot AllReduce,
      AllGather, ReduceScatter and AllToAll of 16-256 KiB, staged), a read of a peer's buffer by
      cross-memory attach (2-rank one-shot Broadcast), the cores and the slice
      latencies, UCX throughput and single-copy read throughput of
      oversubscribed ranks (sendrecv, one-shot AllReduce and one-shot AllToAll
      read by cross-memory attach, on twice as many ranks as cores).
  calibrate.py table BUILD [--tuner-file FILE] [--ranks 1,2,4,8] [--repeats R]
      prints measured/predicted (weft-perf's own "predicted" figure) for
      AllReduce, AllGather, ReduceScatter, Broadcast and AllToAll at every
      size weft-perf prints (8 B to 16 MiB, x8; 1000 calls each up to 4 KiB,
      100 up to 256 KiB, 10 above) and rank count.

measure takes the fastest of R runs for each figure and, with K rounds of
the whole measurement, writes each figure's median over the rounds (a host
that moves between a fast and a slow state gets figures between the two;
each key's median is taken alone, so a pair such as cache_bytes and
cache_bandwidth_gb_s may come from different rounds);
table prints the median and range. The load average is printed, since the
development machine is shared (docs/tuning.md)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

COLLECTIVES = ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall"]

# A staged one-shot exchange of nccl-tests size S on 2 ranks as the model times it
# (algorithms/cost_model.cc, direct_time): the bytes a rank copies into its staging and
# the bytes it reads from its peer's, per byte of S. (Reads of its own staging, which
# AllReduce, AllGather, ReduceScatter and AllToAll also make, are not timed apart.)
# Broadcast is left out: its readers read a staging nobody writes meanwhile, timed at
# the copy throughput (gained in the cache by this figure's factor).
STAGED_AND_READ = {"allreduce": (1, 1), "allgather": (0.5, 0.5), "reducescatter": (1, 0.5),
                   "alltoall": (1, 0.5)}


def perf(build, nranks, coll, lo, hi, factor, env=None, iters=10):
    """One weft-perf run: {size: (time_us, algorithm, predicted_us)}."""
    cmd = [os.path.join(build, "tools/weftrun/weftrun"), "-n", str(nranks), "--no-prefix",
           "--timeout", "300", os.path.join(build, "bench/perf/weft-perf"), coll,
           "-b", str(lo), "-e", str(hi), "-f", str(factor), "-n", str(iters), "-w", "3",
           "-c", "0", "--json"]
    full_env = dict(os.environ, **(env or {}))
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("calibrate.py: %s failed (exit %d):\n%s" % (" ".join(cmd), done.returncode,
                                                            done.stderr))
    out = done.stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row["count"] == 0:
                continue  # nothing moves (split collectives below n*16 bytes)
            rows[row["size_bytes"]] = (row["out_of_place"]["time_us"], row.get("algorithm", ""),
                                       row.get("predicted_us", -1))
    return rows


def fastest(runs):
    """Per size, the fastest time over runs (and the last run's other
    fields). The machine's own costs are what the least disturbed run shows:
    other processes only ever add time (a rank waiting a whole time slice for
    a descheduled peer), and on a loaded machine most runs of a large size
    are hit somewhere."""
    return {size: (min(r[size][0] for r in runs),) + runs[-1][size][1:] for size in runs[0]}


def bandwidth(points, bytes_per_size, what):
    """GB/s from the median slope between every pair of (size, time) points
    (Theil-Sen: one descheduled run does not move it); None when the times
    do not grow with the size (too noisy to say)."""
    slopes = [(t2 - t1) / (s2 - s1) for i, (s1, t1) in enumerate(points)
              for s2, t2 in points[i + 1:] if s2 != s1]
    slope = statistics.median(slopes)
    if slope <= 0:
        print("# %s: times do not grow with size; keeping the default" % what, file=sys.stderr)
        return None
    return bytes_per_size / slope / 1e3


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def host_speed(build, env):
    """The speed a 1-rank communicator applies to the figures now (docs/tuning.md, "Host
    speed"), from its INIT log line; None where the line is missing."""
    cmd = [os.path.join(build, "tools/weftrun/weftrun"), "-n", "1", "--no-prefix",
           os.path.join(build, "bench/perf/weft-perf"), "allreduce", "-b", "8", "-e", "8",
           "-n", "1", "-w", "0", "-c", "0"]
    full_env = dict(os.environ, WEFT_DEBUG="INFO", WEFT_DEBUG_SUBSYS="INIT", **env)
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    found = re.search(r"cost model at ([0-9.]+) of its figures' host speed",
                      done.stdout + done.stderr)
    return float(found.group(1)) if found else None


def cache_tier(points, memory_bw, what):
    """(cache_bytes, cache GB/s) of a copy curve {size: time}: the slope from
    16 KiB to 256 KiB (in cache) and, at each size from 512 KiB to 2 MiB, the
    bytes that must have run at that speed for the rest at `memory_bw` to
    explain the time (lib/core/calibration.h); the median of those."""
    cache_bw = bandwidth([(s, t) for s, t in points.items() if 16 << 10 <= s <= 256 << 10], 1,
                         what + " in cache")
    if cache_bw is None or memory_bw is None or cache_bw <= memory_bw:
        return None, None
    base = points[min(points)]
    fits = [(t - base - s / (memory_bw * 1e3)) / (1 / (cache_bw * 1e3) - 1 / (memory_bw * 1e3))
            for s, t in points.items() if 512 << 10 <= s <= 2 << 20]
    cache_bytes = min(max(statistics.median(fits), 0.0), float(max(points)))
    return cache_bytes, cache_bw


def direct_cache_bandwidth(run, cache_bw):
    """GB/s of a direct read of a peer's staging that fits the cache: per collective, what
    the 16-256 KiB slope of a staged one-shot call on 2 ranks leaves beyond the staging copy
    (at the cache's throughput); the median over the four exchanges, whose reads gain
    unlike."""
    if cache_bw is None:
        return None
    reads = []
    for coll, (staged, read) in STAGED_AND_READ.items():
        rows = run(2, coll, 16 << 10, 256 << 10, 2, iters=100,
                   env={"WEFT_ALGO": coll + ":oneshot", "WEFT_SHM_CMA_BYTES": "0"})
        size_bw = bandwidth([(s, v[0]) for s, v in rows.items()], 1, coll + " in cache")
        if size_bw is None:
            continue
        read_us_per_byte = 1 / (size_bw * 1e3) - staged / (cache_bw * 1e3)
        if read_us_per_byte > 0:
            reads.append(read / read_us_per_byte / 1e3)
    return statistics.median(reads) if reads else None


def measure(args):
    rounds = [measure_once(args) for _ in range(args.rounds)]
    text = ("# weft cost-model calibration (bench/perf/calibrate.py measure, %d repeats, "
            "median of %d rounds)\n# %s\n" % (args.repeats, args.rounds, load()))
    for key in rounds[0]:
        values = [figures[key] for figures in rounds if figures.get(key) is not None]
        if values:  # none: not measurable now, the default stays
            text += "%s %.4g\n" % (key, statistics.median(values))
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    sys.stdout.write(text)


def measure_once(args):
    """One round: {key: figure, or None where the figure was not measurable}."""
    r = args.repeats
    run = lambda *a, **k: fastest([perf(args.build, *a, **k) for _ in range(r)])
    times = lambda rows: {s: v[0] for s, v in rows.items()}
    out_of_cache = lambda rows: [(s, v[0]) for s, v in rows.items() if s >= 4 << 20]
    memory_overhead = 0.2  # per Reduce/Copy step: not separable from the call here
    print("# " + load(), file=sys.stderr)
    # One rank: an AllReduce is one call plus one copy; from cache up to
    # about the L2's size, from memory beyond.
    one = run(1, "allreduce", 8, 16 << 20, 2)
    call = max(0.0, one[8][0] - memory_overhead)
    memory_bw = bandwidth(out_of_cache(one), 1, "copy")
    cache_bytes, cache_bw = cache_tier(times(one), memory_bw, "copy")
    # Two ranks, UCX: one message each way per call. Messages of at most 512 bytes take the
    # direct path's rings instead (docs/shared-memory.md, "Point-to-point rings"), so the
    # latency comes from 1-4 KiB.
    sr = run(2, "sendrecv", 8, 16 << 20, 2)
    small = [v[0] for s, v in sr.items() if 512 < s <= 4096]
    link_latency = max(0.05, statistics.median(small) - call)
    link_bw = bandwidth(out_of_cache(sr), 1, "UCX")
    # Two ranks, direct one-shot: staging copy (at the copy throughput), one
    # synchronisation, one read of the peer's staging (fused with the reduction):
    # what the slope leaves beyond the copy is that read.
    direct = run(2, "allreduce", 8, 16 << 20, 2, env={"WEFT_ALGO": "allreduce:oneshot"})
    direct_latency = max(0.05, direct[8][0] - memory_overhead)
    direct_both = bandwidth(out_of_cache(direct), 1, "direct")
    direct_bw = None
    if direct_both is not None and memory_bw is not None and direct_both < memory_bw:
        direct_bw = 1 / (1 / direct_both - 1 / memory_bw)
    elif direct_both is not None:
        print("# direct: the one-shot slope leaves nothing beyond the copy; keeping the default",
              file=sys.stderr)
    direct_cache_bw = direct_cache_bandwidth(run, cache_bw)
    # Two ranks, Broadcast read by cross-memory attach at every size: offer, one read of
    # the root's buffer, done word (two synchronisations).
    single = run(2, "broadcast", 8, 16 << 20, 2,
                 env={"WEFT_ALGO": "broadcast:oneshot", "WEFT_SHM_CMA_BYTES": "1"})
    single_latency = max(0.05, single[8][0] - 2 * direct_latency)
    single_bw = bandwidth(out_of_cache(single), 1, "cross-memory attach")
    # Twice as many ranks as cores: every rank gets half the time; what a
    # message or a direct synchronisation costs beyond that is the wait for
    # a peer's time slice.
    cores = os.cpu_count() or 1
    share = 2.0
    over = run(2 * cores, "sendrecv", 8, 4096, 8)
    slices = [(v[0] - share * (call + s / ((link_bw or 6) * 1e3)) - link_latency) / (share - 1)
              for s, v in over.items()]
    slice_latency = max(0.0, statistics.median(slices))
    sliced_link_bw = bandwidth(out_of_cache(run(2 * cores, "sendrecv", 4 << 20, 16 << 20, 2)), 1,
                               "UCX, time-sliced")
    over_direct = run(2 * cores, "allreduce", 8, 4096, 8, env={"WEFT_ALGO": "allreduce:oneshot"})
    direct_slices = [(v[0] - memory_overhead - direct_latency) / (share - 1)
                     for v in over_direct.values()]
    direct_slice_latency = max(0.0, statistics.median(direct_slices))
    # The same ranks, one-shot AllToAll read by cross-memory attach: per size, a rank copies
    # its own block (1/n of the output, at the time-shared memory throughput) and reads the
    # n - 1 others; what the slope leaves beyond that copy is the reads.
    n = 2 * cores
    sliced_single_bw = None
    all_to_all = bandwidth(out_of_cache(run(n, "alltoall", 4 << 20, 16 << 20, 2,
                                            env={"WEFT_ALGO": "alltoall:oneshot",
                                                 "WEFT_SHM_CMA_BYTES": "1"})),
                           1, "cross-memory attach, time-sliced")
    if all_to_all is not None and memory_bw is not None:
        read_us_per_byte = 1 / (all_to_all * 1e3) - (1 / n) / (memory_bw / share * 1e3)
        if read_us_per_byte > 0:
            sliced_single_bw = (n - 1) / n / read_us_per_byte / 1e3
    print("# " + load(), file=sys.stderr)
    return dict([("call_us", call), ("memory_overhead_us", memory_overhead),
                 ("memory_bandwidth_gb_s", memory_bw), ("cache_bytes", cache_bytes),
                 ("cache_bandwidth_gb_s", cache_bw), ("link_latency_us", link_latency),
                 ("link_bandwidth_gb_s", link_bw), ("direct_latency_us", direct_latency),
                 ("direct_bandwidth_gb_s", direct_bw),
                 ("direct_cache_bandwidth_gb_s", direct_cache_bw),
                 ("single_copy_latency_us", single_latency),
                 ("single_copy_bandwidth_gb_s", single_bw), ("cores", cores),
                 ("slice_latency_us", slice_latency),
                 ("direct_slice_latency_us", direct_slice_latency),
                 ("sliced_link_bandwidth_gb_s", sliced_link_bw),
                 ("sliced_single_copy_bandwidth_gb_s", sliced_single_bw)])


def table(args):
    env = {"WEFT_TUNER_FILE": os.path.abspath(args.tuner_file)} if args.tuner_file else {}
    ranks = [int(n) for n in args.ranks.split(",")]
    speed = lambda: "; host speed %s" % host_speed(args.build, env)
    print("# " + load() + speed())
    results = {}  # (coll, size) -> {nranks: (ratio, lo, hi, algorithm)}
    for n in ranks:
        for coll in COLLECTIVES:
            # Small calls 100 times each: 10 calls of ranks time-sharing the cores mostly time
            # the ranks' first meeting (8 ranks on 2 cores, AllToAll 512 B: 47-54 us per call
            # over 10 calls, 10-19 over 100). Up to 4 KiB 1000 times: 100 calls of 0.1-1 us are
            # one time slice or less, and a Broadcast's root runs 31 calls ahead of its
            # readers (4 ranks on 2 cores, 8 B: 0.5-0.8 us per call over 100 calls, 0.3 over
            # 20000).
            runs = [{**perf(args.build, n, coll, 8, 4 << 10, 8, env, iters=1000),
                     **perf(args.build, n, coll, 32 << 10, 256 << 10, 8, env, iters=100),
                     **perf(args.build, n, coll, 2 << 20, 16 << 20, 8, env)}
                    for _ in range(args.repeats)]
            for size in runs[0]:
                predicted = runs[-1][size][2]
                if predicted is None or predicted <= 0.01:
                    continue  # empty calls (count 0)
                ratios = [run[size][0] / predicted for run in runs]
                results.setdefault((coll, size), {})[n] = (
                    statistics.median(ratios), min(ratios), max(ratios), runs[-1][size][1])
    print("# " + load() + speed())
    print("%-13s %9s" % ("collective", "bytes") +
          "".join(" %22s" % ("%d ranks" % n) for n in ranks))
    worst = []
    for (coll, size), by_n in results.items():
        cells = ""
        for n in ranks:
            if n in by_n:
                med, lo, hi, algo = by_n[n]
                cells += " %5.2f [%4.2f-%5.2f] %-4s" % (med, lo, hi, algo[:4])
                worst.append(med)
            else:
                cells += " %22s" % "-"
        print("%-13s %9d%s" % (coll, size, cells))
    inside = sum(1 for m in worst if 0.5 <= m <= 2)
    print("# measured/predicted medians: %.2f to %.2f; %d of %d within 0.5-2x" %
          (min(worst), max(worst), inside, len(worst)))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("build")
    m.add_argument("-o", "--output")
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--rounds", type=int, default=1)
    t = sub.add_parser("table")
    t.add_argument("build")
    t.add_argument("--tuner-file")
    t.add_argument("--ranks", default="1,2,4,8")
    t.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1 or getattr(args, "rounds", 1) < 1:
        parser.error("--repeats and --rounds must be at least 1")
    measure(args) if args.command == "measure" else table(args)


if __name__ == "__main__":
    main()
