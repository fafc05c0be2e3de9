#!/usr/bin/env python3
"""8-byte latency of the collectives the blocking fast path serves, interleaved: Weft with
the fast path, Weft without it (WEFT_FAST_PATH=0), Weft without mismatch detection
(WEFT_CHECK=off) and Open MPI (weft-peer-mpi), in turn,
REPEATS times per (ranks, collective), with the load average before each round. Prints
the median and range of weft-perf's out-of-place time column (wall clock over -n calls
divided by -n, the same in both programs). ReduceScatter, AllGather and AllToAll take the
smallest size weft-perf keeps for them, 16 bytes x ranks (it rounds smaller ones to 0).

    bench/perf/fast_path_latency.py BUILD_DIR [--ranks 2,4] [--repeats 3] [--iters 20000]
        [--collectives broadcast,reduce] [--base OTHER_BUILD_DIR]

--base adds Weft as built in another tree (an earlier commit, in a git worktree) to each
round, for a before/after comparison in one interleaved run.
"""
import argparse
import os
import statistics
import subprocess
import sys

COLLECTIVES = ["allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall"]


def size_of(collective, nranks):
    return 16 * nranks if collective in ("reducescatter", "allgather", "alltoall") else 8


def time_us(command, env, size):
    for _ in range(3):  # a bootstrap port another job took in the meantime: try again
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if out.returncode == 0 or "Address already in use" not in out.stdout + out.stderr:
            break
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 10 and fields[0] == str(size) and not line.startswith("#"):
            return float(fields[5])
    sys.exit(f"no {size}-byte row in the output of {' '.join(command)}:\n{out.stdout}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--base", help="another build directory, run as the variant 'base'")
    args = p.parse_args()
    collectives = args.collectives.split(",")
    flags = lambda n, c: ["-b", str(size_of(c, n)), "-e", str(size_of(c, n)), "-n",
                          str(args.iters), "-w", "1000", "-c", "0"]
    weftrun = os.path.join(args.build, "tools/weftrun/weftrun")
    perf = os.path.join(args.build, "bench/perf/weft-perf")
    mpi = os.path.join(args.build, "bench/peers/weft-peer-mpi")
    variants = {}
    if args.base:
        variants["base"] = lambda n, c: ([os.path.join(args.base, "tools/weftrun/weftrun"), "-n",
                                          str(n), "--no-prefix",
                                          os.path.join(args.base, "bench/perf/weft-perf"), c,
                                          *flags(n, c)], {})
    variants |= {
        "weft": lambda n, c: ([weftrun, "-n", str(n), "--no-prefix", perf, c, *flags(n, c)], {}),
        "weft, WEFT_FAST_PATH=0": lambda n, c: ([weftrun, "-n", str(n), "--no-prefix", perf, c, *flags(n, c)],
                                                {"WEFT_FAST_PATH": "0"}),
        # What mismatch detection (WEFT_CHECK=on, the default) costs: the same call unchecked.
        "weft, WEFT_CHECK=off": lambda n, c: ([weftrun, "-n", str(n), "--no-prefix", perf, c, *flags(n, c)],
                                              {"WEFT_CHECK": "off"}),
        "open mpi": lambda n, c: (["mpirun", "--oversubscribe", "--allow-run-as-root", "-np",
                                   str(n), mpi, c, *flags(n, c)], {}),
    }
    loads = []
    times = {}
    for rep in range(args.repeats):
        for n in [int(r) for r in args.ranks.split(",")]:
            for c in collectives:
                loads.append(os.getloadavg()[0])
                for name, make in variants.items():
                    command, extra = make(n, c)
                    times.setdefault((n, c, name), []).append(
                        time_us(command, dict(os.environ, **extra), size_of(c, n)))
    print(f"# load average (1 min) before each round: {min(loads):.2f}-{max(loads):.2f}, "
          f"median {statistics.median(loads):.2f}")
    print("| ranks | collective | " + " | ".join(f"{v} µs" for v in variants) +
          " | Weft/Open MPI |")
    print("|---|---|" + "---|" * (len(variants) + 1))
    for n in [int(r) for r in args.ranks.split(",")]:
        for c in collectives:
            cells, medians = [], []
            for v in variants:
                t = times[(n, c, v)]
                medians.append(statistics.median(t))
                cells.append(f"{medians[-1]:.2f} ({min(t):.2f}-{max(t):.2f})")
            weft = list(variants).index("weft")
            print(f"| {n} | {c} | " + " | ".join(cells) + f" | {medians[weft] / medians[-1]:.2f}x |")


if __name__ == "__main__":
    main()
