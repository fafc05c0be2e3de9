#!/usr/bin/env python3
"""Side-by-side benchmark: Weft, Open MPI and Gloo on the same collectives and sizes.

Runs weft-perf (under weftrun), weft-peer-mpi (under mpirun) and weft-peer-gloo (under
weftrun) one size at a time, rotating the order of the libraries from size to size and
from repeat to repeat, so that drift of the (shared) machine hits all three alike. Each
round also measures the machine's copy bandwidth (weft-copybw) and turns it into the
best busbw each collective could reach (the ceiling; docs/performance.md derives it).
Small sizes are also run with many iterations through weft-peer-{weft,mpi,gloo}, which
time every call, for median and p99 latencies.

Prints Markdown tables (busbw and time per library, ratios, share of the ceiling;
latencies; the targets of docs/performance.md) and, with --out DIR, writes raw.csv,
summary.csv, latency.csv, ceiling.csv, meta.json and one SVG chart per collective and
rank count. Exit status: 0 when every run passed its check, 1 otherwise, 2 for usage.

Example (the run behind docs/performance.md):
  scripts/bench-compare.py --build build --ranks 2,4 --repeats 3 --out docs/perf
"""

import argparse
import csv
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

LIBRARIES = ("weft", "openmpi", "gloo")
LABELS = {"weft": "Weft", "openmpi": "Open MPI", "gloo": "Gloo", "ceiling": "ceiling"}
COLORS = {"weft": "#1f77b4", "openmpi": "#ff7f0e", "gloo": "#2ca02c", "ceiling": "#7f7f7f"}
TITLES = {
    "allreduce": "AllReduce", "reducescatter": "ReduceScatter", "allgather": "AllGather",
    "alltoall": "AllToAll", "alltoallv": "AllToAllv", "broadcast": "Broadcast",
    "reduce": "Reduce", "sendrecv": "SendRecv", "pingpong": "ping-pong",
}
# Collectives weft-perf has; the others run through weft-peer-weft for Weft as well.
WEFT_PERF_COLLECTIVES = {"allreduce", "reducescatter", "allgather", "broadcast", "reduce",
                         "alltoall", "sendrecv"}
# busbw = algbw * factor (nccl-tests' convention, as weft-perf prints it).
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "alltoallv": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "pingpong": lambda n: 1.0,
}
# Fewest bytes read plus written in memory, over all ranks, per byte of the row's size S
# (docs/performance.md, "The ceiling"): AllReduce reads n inputs and writes n outputs of S;
# ReduceScatter reads n*S and writes n blocks of S/n; AllGather the reverse; AllToAll
# reads and writes n*S; Broadcast reads S and writes n*S; Reduce reads n*S and writes S;
# SendRecv reads and writes S per rank; a ping-pong message is read and written once.
TRAFFIC = {
    "allreduce": lambda n: 2 * n,
    "reducescatter": lambda n: n + 1,
    "allgather": lambda n: n + 1,
    "alltoall": lambda n: 2 * n,
    "alltoallv": lambda n: 2 * n,
    "broadcast": lambda n: n + 1,
    "reduce": lambda n: n + 1,
    "sendrecv": lambda n: 2 * n,
    "pingpong": lambda n: 2,
}
# Those whose buffers hold one block per rank.
SPLIT_COLLECTIVES = {"reducescatter", "allgather", "alltoall", "alltoallv"}
TARGET_COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall")
KIB, MIB = 1 << 10, 1 << 20
# raw.csv: one line per run, size and placement.
RECORD_FIELDS = ("kind", "nranks", "collective", "library", "repeat", "size_bytes", "count",
                 "iters")
MEASUREMENT_FIELDS = ("time_us", "algbw_gbps", "busbw_gbps", "wrong", "median_us", "p99_us")
FLOAT_FIELDS = {"time_us", "algbw_gbps", "busbw_gbps", "median_us", "p99_us", "copy_gbps",
                "ceiling_busbw"}
INT_FIELDS = {"nranks", "repeat", "size_bytes", "count", "iters", "wrong"}


def ceiling_busbw(collective, nranks, copy_gbps):
    """Best busbw when memory moves 2*copy_gbps GB/s (a copy reads and writes each byte)."""
    return BUS_FACTOR[collective](nranks) * 2 * copy_gbps / TRAFFIC[collective](nranks)


def parse_size(text):
    units = {"K": KIB, "M": MIB, "G": 1 << 30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def size_label(size):
    for unit, name in ((1 << 30, "G"), (MIB, "M"), (KIB, "K")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{name}"
    return str(size)


def geometric(first, last, factor):
    sizes = [first]
    while sizes[-1] * factor <= last:
        sizes.append(sizes[-1] * factor)
    return sizes


def smallest_size(collective, nranks):
    """The smallest size with a nonzero count: weft-perf gives each rank of the split
    collectives a block rounded down to 16 bytes, as nccl-tests does."""
    return 16 * nranks if collective in SPLIT_COLLECTIVES else 4


def rotated(items, shift):
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


class Tools:
    """Paths of the programs in a build directory, and the libraries that can run."""

    def __init__(self, build, wanted):
        build = Path(build)
        self.weftrun = build / "tools/weftrun/weftrun"
        self.weft_perf = build / "bench/perf/weft-perf"
        peers = build / "bench/peers"
        self.copybw = peers / "weft-copybw"
        self.peer = {lib: peers / f"weft-peer-{'mpi' if lib == 'openmpi' else lib}"
                     for lib in LIBRARIES}
        self.mpirun = shutil.which("mpirun")
        missing = [p for p in (self.weftrun, self.weft_perf, self.copybw, self.peer["weft"])
                   if not p.exists()]
        if missing:
            sys.exit(f"bench-compare: not built: {', '.join(map(str, missing))} "
                     f"(ninja -C {build} weft-perf weftrun weft-copybw weft-peer-weft)")
        self.libraries = []
        for lib in wanted:
            reason = None
            if not self.peer[lib].exists():
                reason = f"{self.peer[lib].name} is not built"
            elif lib == "openmpi" and self.mpirun is None:
                reason = "mpirun is not on PATH"
            if reason:
                print(f"bench-compare: skipping {LABELS[lib]}: {reason}", file=sys.stderr)
            else:
                self.libraries.append(lib)


class Runner:
    """Launches one program run and returns its JSON rows; records failures."""

    def __init__(self, tools, timeout, mpi_args):
        self.tools = tools
        self.timeout = timeout
        self.mpi_args = mpi_args
        self.failures = []
        # weftrun picks a fresh rendezvous and secret unless these are set.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("WEFT_ROOT", "WEFT_SECRET", "WEFT_PERF_CORRUPT")}

    def launcher(self, lib, nranks):
        if lib == "openmpi":
            return [self.tools.mpirun, "--oversubscribe", "--allow-run-as-root", "-np",
                    str(nranks), *self.mpi_args]
        # Each library as its users launch it: Open MPI with mpirun's binding, Weft with
        # weftrun's, Gloo unbound as torchrun leaves it (bound to one core, Gloo's call
        # and its event-loop thread take turns on it and a call costs ~4 ms).
        binding = ["--bind-to", "none"] if lib == "gloo" else []
        return [str(self.tools.weftrun), "-n", str(nranks), "--timeout", str(self.timeout),
                "--no-prefix", *binding]

    def program(self, lib, collective, latency):
        # Weft's bandwidth rows come from weft-perf itself; per-call latencies (and the
        # collectives weft-perf lacks) from the same driver as the peers.
        if lib == "weft" and not latency and collective in WEFT_PERF_COLLECTIVES:
            return str(self.tools.weft_perf)
        return str(self.tools.peer[lib])

    def collective(self, lib, collective, nranks, flags, latency=False):
        command = [*self.launcher(lib, nranks), self.program(lib, collective, latency),
                   collective, *flags, "--json"]
        rows = self.json_lines(command)
        for row in rows:
            row["library"] = lib  # weft-perf's rows do not name it
        bad = [r for r in rows if any(r[p] is not None and r[p]["wrong"] not in (0, None)
                                      for p in ("out_of_place", "in_place"))]
        if bad:
            self.failures.append(f"{' '.join(command)}: wrong results in {len(bad)} rows")
        return rows

    def copy_bandwidth(self, args):
        rows = self.json_lines([str(self.tools.copybw), "--json", *args])
        return rows[0]["copy_gbps_best"] if rows else None

    def json_lines(self, command):
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=self.env,
                                  timeout=self.timeout + 30)
        except subprocess.TimeoutExpired:
            self.failures.append(f"{' '.join(command)}: timed out")
            return []
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not rows:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            self.failures.append(f"{' '.join(command)}: exit {done.returncode}\n{tail}")
        return rows


def iterations(args, size, previous_us):
    """-n for one run: by bytes (more for small sizes), trimmed to the time budget once
    an earlier repeat has timed this library at this size."""
    if args.iters:
        return args.iters
    n = max(args.min_iters, min(args.max_iters, args.iter_bytes // max(size, 1)))
    if previous_us:
        n = min(n, max(args.min_iters, int(args.run_budget * 1e6 / 2 / previous_us)))
    return n


def loadavg():
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def measure(args, tools, runner):
    """All runs, interleaved. Returns (records, ceilings, load samples)."""
    records, ceilings, loads = [], [], []
    sizes = geometric(args.min_bytes, args.max_bytes, args.stepfactor)
    last_time = {}  # (nranks, collective, lib, size) -> us per call
    common = ["-w", str(args.warmup), "-c", str(args.check)]
    for nranks in args.ranks:
        for collective in args.collectives:
            for rep in range(args.repeats):
                print(f"bench-compare: {collective}, {nranks} ranks, repeat {rep + 1} of "
                      f"{args.repeats}", file=sys.stderr, flush=True)
                loads.append(loadavg())
                copy = runner.copy_bandwidth(["-s", args.copy_bytes, "-r", str(args.copy_repeats)])
                if copy is not None:
                    ceilings.append({"nranks": nranks, "collective": collective, "repeat": rep,
                                     "copy_gbps": copy,
                                     "ceiling_busbw": ceiling_busbw(collective, nranks, copy)})
                for i, size in enumerate(sizes):
                    for lib in rotated(tools.libraries, rep + i):
                        key = (nranks, collective, lib, size)
                        n = iterations(args, size, last_time.get(key))
                        flags = ["-b", str(size), "-e", str(size), "-n", str(n), *common]
                        for row in runner.collective(lib, collective, nranks, flags):
                            last_time[key] = row["out_of_place"]["time_us"]
                            records.append(dict(row, kind="busbw", repeat=rep, iters=n))
                lat_sizes = [s for s in geometric(args.lat_min_bytes, args.lat_max_bytes,
                                                  args.lat_factor)
                             if s >= smallest_size(collective, nranks)]
                for lib in rotated(tools.libraries, rep):
                    n = args.lat_iters_gloo if lib == "gloo" else args.lat_iters
                    if n <= 0 or not lat_sizes:
                        continue
                    flags = ["-b", str(lat_sizes[0]), "-e", str(lat_sizes[-1]),
                             "-f", str(args.lat_factor), "-n", str(n), *common]
                    for row in runner.collective(lib, collective, nranks, flags, latency=True):
                        if row["size_bytes"] in lat_sizes:
                            records.append(dict(row, kind="latency", repeat=rep, iters=n))
            loads.append(loadavg())
    return records, ceilings, [x for x in loads if x is not None]


def spread(values):
    """(max - min) / median: how far repeats disagree."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else 0.0


def summarize(records, ceilings, placement):
    """Medians over repeats per (nranks, collective, library, size), split by kind. Runs
    with wrong results are left out (they are reported as failures)."""
    groups = {}
    for r in records:
        m = r[placement]
        if m is None or r["count"] == 0 or m["wrong"] not in (0, None):
            continue
        key = (r["kind"], r["nranks"], r["collective"], r["library"], r["size_bytes"])
        groups.setdefault(key, []).append(m)
    summary = {}
    for (kind, nranks, collective, lib, size), ms in groups.items():
        busbw = [m["busbw_gbps"] for m in ms]
        entry = {"runs": len(ms), "busbw": statistics.median(busbw), "busbw_min": min(busbw),
                 "busbw_max": max(busbw), "busbw_spread": spread(busbw),
                 "time_us": statistics.median(m["time_us"] for m in ms)}
        if "median_us" in ms[0]:
            medians = [m["median_us"] for m in ms]
            entry.update(median_us=statistics.median(medians), median_min=min(medians),
                         median_max=max(medians), median_spread=spread(medians),
                         p99_us=statistics.median(m["p99_us"] for m in ms))
        summary[(kind, nranks, collective, lib, size)] = entry
    ceiling = {}
    for c in ceilings:
        ceiling.setdefault((c["nranks"], c["collective"]), []).append(c)
    ceiling = {k: {"copy_gbps": statistics.median(x["copy_gbps"] for x in v),
                   "copy_spread": spread([x["copy_gbps"] for x in v]),
                   "ceiling_busbw": statistics.median(x["ceiling_busbw"] for x in v)}
               for k, v in ceiling.items()}
    return summary, ceiling


def sizes_of(summary, kind, nranks, collective):
    return sorted({k[4] for k in summary if k[:3] == (kind, nranks, collective)})


def fmt(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def times(value):
    return "–" if value is None else f"{value:.2f}x"


def percent(value):
    return "–" if value is None else f"{100 * value:.0f}%"


def ratio(a, b):
    return a / b if a is not None and b else None


def markdown(head, rows):
    return "\n".join("| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head), *rows])


def table(summary, kind, nranks, collective, columns):
    """Markdown table, one row per size; columns: (title, cell(entry, size)) where
    entry(lib, size) is that library's summary there ({} when missing)."""
    entry = lambda lib, size: summary.get((kind, nranks, collective, lib, size)) or {}
    rows = [[size_label(size)] + [cell(entry, size) for _, cell in columns]
            for size in sizes_of(summary, kind, nranks, collective)]
    return markdown(["size"] + [title for title, _ in columns], rows)


def busbw_table(summary, ceiling, nranks, collective, libraries):
    ceil = ceiling.get((nranks, collective), {}).get("ceiling_busbw")
    columns = []
    for lib in libraries:
        columns += [(f"{LABELS[lib]} busbw", lambda e, s, lib=lib: fmt(e(lib, s).get("busbw"))),
                    (f"{LABELS[lib]} µs", lambda e, s, lib=lib: fmt(e(lib, s).get("time_us"), 1))]
    for lib in libraries:
        if lib != "weft":
            columns.append((f"Weft/{LABELS[lib]}", lambda e, s, lib=lib: times(
                ratio(e("weft", s).get("busbw"), e(lib, s).get("busbw")))))
    for lib in libraries:
        columns.append((f"{LABELS[lib]} % ceiling",
                        lambda e, s, lib=lib: percent(ratio(e(lib, s).get("busbw"), ceil))))
    return table(summary, "busbw", nranks, collective, columns)


def latency_table(summary, nranks, collective, libraries):
    columns = []
    for lib in libraries:
        columns += [(f"{LABELS[lib]} median µs", lambda e, s, lib=lib: fmt(e(lib, s).get(
                        "median_us"))),
                    (f"{LABELS[lib]} p99 µs", lambda e, s, lib=lib: fmt(e(lib, s).get("p99_us")))]
    # Time ratios the other way round, so that above 1 means Weft is faster, as for busbw.
    for lib in libraries:
        if lib != "weft":
            columns.append((f"{LABELS[lib]}/Weft median", lambda e, s, lib=lib: times(
                ratio(e(lib, s).get("median_us"), e("weft", s).get("median_us")))))
    return table(summary, "latency", nranks, collective, columns)


def target_rows(summary, ceiling, nranks, collective, libraries):
    """The issue's targets, measured: (target, measured, met) triples."""
    busbw = lambda lib, size: (summary.get(("busbw", nranks, collective, lib, size)) or {}).get(
        "busbw")
    sizes = sizes_of(summary, "busbw", nranks, collective)
    rows = []

    def worst(lib, from_size):
        rs = [(ratio(busbw("weft", s), busbw(lib, s)), s) for s in sizes if s >= from_size]
        rs = [(r, s) for r, s in rs if r is not None]
        return min(rs) if rs else None

    if "openmpi" in libraries:
        for label, from_size, goal in (("≥ 1.0x Open MPI busbw from 4K", 4 * KIB, 1.0),
                                       ("≥ 1.5x Open MPI busbw from 16M", 16 * MIB, 1.5)):
            w = worst("openmpi", from_size)
            if w:
                rows.append((label, f"worst {w[0]:.2f}x at {size_label(w[1])}", w[0] >= goal))
        lat = sizes_of(summary, "latency", nranks, collective)
        if lat:
            get = lambda lib: summary.get(("latency", nranks, collective, lib, lat[0]))
            weft, mpi = get("weft"), get("openmpi")
            if weft and mpi:
                rows.append((f"{size_label(lat[0])} B median latency ≤ Open MPI",
                             f"{weft['median_us']:.2f} vs {mpi['median_us']:.2f} µs",
                             weft["median_us"] <= mpi["median_us"]))
    if "gloo" in libraries:
        w = worst("gloo", 0)
        if w:
            rows.append(("≥ 10x Gloo busbw at every size",
                         f"worst {w[0]:.1f}x at {size_label(w[1])}", w[0] >= 10))
    ceil = ceiling.get((nranks, collective))
    if sizes and ceil and busbw("weft", sizes[-1]) is not None:
        share = busbw("weft", sizes[-1]) / ceil["ceiling_busbw"]
        rows.append((f"≥ 60% of ceiling at {size_label(sizes[-1])}",
                     f"{100 * share:.1f}% of {ceil['ceiling_busbw']:.2f} GB/s", share >= 0.6))
    return rows


# ---- SVG charts (hand-written: no plotting library, no network) ----

def nice_step(span, ticks=5):
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def svg_chart(title, y_label, series, x_values, y_log=False, hline=None):
    """Line chart, log2 x axis over the sizes. series: {lib: [(x, y, lo, hi)]};
    hline: (label, y) for a dashed horizontal line."""
    width, height = 720, 420
    left, right, top, bottom = 70, 150, 40, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    ys = [p[3] for pts in series.values() for p in pts] + [p[1] for pts in series.values()
                                                            for p in pts]
    if hline:
        ys.append(hline[1])
    ys = [y for y in ys if y and y > 0] or [1.0]
    if y_log:
        y_lo = 10 ** math.floor(math.log10(min(ys)))
        y_hi = 10 ** math.ceil(math.log10(max(ys)))
        y_ticks = [10 ** e for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1)]
        ymap = lambda y: top + plot_h * (1 - (math.log10(y) - math.log10(y_lo)) /
                                         (math.log10(y_hi) - math.log10(y_lo)))
    else:
        step = nice_step(max(ys) * 1.08)
        y_hi = step * math.ceil(max(ys) * 1.08 / step)
        y_ticks = [i * step for i in range(int(round(y_hi / step)) + 1)]
        ymap = lambda y: top + plot_h * (1 - y / y_hi)
    x_lo, x_hi = math.log2(min(x_values)), math.log2(max(x_values))
    x_span = max(x_hi - x_lo, 1)
    xmap = lambda x: left + plot_w * (math.log2(x) - x_lo) / x_span
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left + plot_w / 2}" y="22" text-anchor="middle" font-size="15">'
           f'{title}</text>']
    for y in y_ticks:
        py = ymap(y)
        label = f"{y:g}"
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + plot_w}" y2="{py:.1f}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{label}</text>')
    for x in x_values:
        px = xmap(x)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + plot_h}" '
                   f'stroke="#f0f0f0"/>')
        out.append(f'<text x="{px:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                   f'{size_label(x)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="black"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">'
               f'message size (bytes, log scale)</text>')
    out.append(f'<text x="18" y="{top + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {top + plot_h / 2})">{y_label}</text>')
    legend_y = top + 10
    if hline:
        py = ymap(hline[1])
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + plot_w}" y2="{py:.1f}" '
                   f'stroke="{COLORS["ceiling"]}" stroke-dasharray="6 4" stroke-width="1.5"/>')
    for i, (lib, points) in enumerate(series.items()):
        if not points:
            continue
        color = COLORS[lib]
        path = " ".join(f"{xmap(x):.1f},{ymap(y):.1f}" for x, y, _, _ in points)
        out.append(f'<polyline class="series" data-library="{lib}" fill="none" '
                   f'stroke="{color}" stroke-width="2" points="{path}"/>')
        # Each library's min-max bars a little apart, so that they do not hide each other.
        shift = 4 * (i - (len(series) - 1) / 2)
        for x, y, lo, hi in points:
            px = xmap(x) + shift
            out.append(f'<line x1="{px:.1f}" y1="{ymap(lo):.1f}" x2="{px:.1f}" '
                       f'y2="{ymap(hi):.1f}" stroke="{color}" stroke-width="1"/>')
            out.append(f'<circle cx="{px - shift:.1f}" cy="{ymap(y):.1f}" r="3" fill="{color}"/>')
    entries = [(lib, LABELS[lib], "") for lib, pts in series.items() if pts]
    if hline:
        entries.append(("ceiling", hline[0], ' stroke-dasharray="6 4"'))
    for lib, label, dash in entries:
        lx = left + plot_w + 12
        out.append(f'<line x1="{lx}" y1="{legend_y}" x2="{lx + 22}" y2="{legend_y}" '
                   f'stroke="{COLORS[lib]}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 28}" y="{legend_y + 4}">{label}</text>')
        legend_y += 18
    out.append(f'<text x="{left + plot_w + 12}" y="{legend_y + 10}" font-size="10" '
               f'fill="#555">bars: min–max</text>')
    out.append(f'<text x="{left + plot_w + 12}" y="{legend_y + 23}" font-size="10" '
               f'fill="#555">over repeats</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_charts(out, summary, ceiling, ranks, collectives, libraries, placement):
    written = []
    for nranks in ranks:
        for collective in collectives:
            title = f"{TITLES.get(collective, collective)}, {nranks} ranks"
            for kind, field, lo, hi, y_label, y_log in (
                    ("busbw", "busbw", "busbw_min", "busbw_max", "busbw (GB/s)", False),
                    ("latency", "median_us", "median_min", "median_max", "median µs per call",
                     True)):
                sizes = sizes_of(summary, kind, nranks, collective)
                if not sizes:
                    continue
                series = {}
                for lib in libraries:
                    points = []
                    for size in sizes:
                        e = summary.get((kind, nranks, collective, lib, size))
                        if e:
                            points.append((size, e[field], e[lo], e[hi]))
                    series[lib] = points
                ceil = ceiling.get((nranks, collective)) if kind == "busbw" else None
                hline = ("memory ceiling", ceil["ceiling_busbw"]) if ceil else None
                what = "busbw" if kind == "busbw" else "median latency"
                svg = svg_chart(f"{title}: {what} (float sum, {placement.replace('_', '-')})",
                                y_label, series, sizes, y_log=y_log, hline=hline)
                path = Path(out) / f"{kind}_{collective}_{nranks}ranks.svg"
                path.write_text(svg)
                written.append(path)
    return written


def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_outputs(out, records, ceilings, summary, ceiling, meta):
    out.mkdir(parents=True, exist_ok=True)
    raw = [{**{k: r[k] for k in RECORD_FIELDS}, "placement": placement, **r[placement]}
           for r in records for placement in ("out_of_place", "in_place")
           if r[placement] is not None]
    write_csv(out / "raw.csv", [*RECORD_FIELDS, "placement", *MEASUREMENT_FIELDS], raw)
    rows = []
    for (kind, nranks, collective, lib, size), e in sorted(summary.items()):
        ceil = ceiling.get((nranks, collective), {})
        rows.append({"kind": kind, "nranks": nranks, "collective": collective, "library": lib,
                     "size_bytes": size, **{k: round(v, 6) for k, v in e.items()},
                     "ceiling_busbw": round(ceil.get("ceiling_busbw", 0), 6)})
    busbw_fields = ["nranks", "collective", "library", "size_bytes", "runs", "busbw",
                    "busbw_min", "busbw_max", "busbw_spread", "time_us", "ceiling_busbw"]
    write_csv(out / "summary.csv", busbw_fields, [r for r in rows if r["kind"] == "busbw"])
    write_csv(out / "latency.csv", ["nranks", "collective", "library", "size_bytes", "runs",
                                    "median_us", "median_spread", "p99_us", "time_us"],
              [r for r in rows if r["kind"] == "latency"])
    write_csv(out / "ceiling.csv", ["nranks", "collective", "repeat", "copy_gbps",
                                    "ceiling_busbw"], ceilings)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def machine():
    info = {"nproc": os.cpu_count(), "kernel": platform.release()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "L3 cache", "Hypervisor vendor"):
                info[key.strip()] = value.strip()
    except OSError:
        pass
    return info


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=str(Path(__file__).resolve().parent.parent / "build"),
                   help="build directory (default: build/ of this checkout)")
    p.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (2,4)")
    p.add_argument("--collectives", default=",".join(TARGET_COLLECTIVES),
                   help=f"comma-separated, from: {' '.join(BUS_FACTOR)}")
    p.add_argument("--libraries", default=",".join(LIBRARIES), help="weft,openmpi,gloo")
    p.add_argument("-b", "--minbytes", default="4K", help="smallest bandwidth size (4K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest bandwidth size (64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size factor (4)")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help="iterations per size (default: by size and time budget)")
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--iter-bytes", default="256M", help="auto -n: about this many bytes")
    p.add_argument("--run-budget", type=float, default=1.0,
                   help="auto -n: seconds of calls per run, once a repeat has timed it")
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("--lat-min", default="8", help="smallest latency size (8)")
    p.add_argument("--lat-max", default="4K", help="largest latency size (4K)")
    p.add_argument("--lat-factor", type=int, default=8)
    p.add_argument("--lat-iters", type=int, default=1000,
                   help="timed calls per latency size (0: no latency runs)")
    p.add_argument("--lat-iters-gloo", type=int, default=200,
                   help="the same for Gloo, whose small calls take milliseconds here")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--placement", choices=("out_of_place", "in_place"), default="out_of_place")
    p.add_argument("--copy-bytes", default="256M", help="weft-copybw -s (256M)")
    p.add_argument("--copy-repeats", type=int, default=10)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--mpi-args", default="", help="extra mpirun arguments")
    p.add_argument("--out", help="write CSV, SVG and meta.json here")
    p.add_argument("--replot", metavar="DIR",
                   help="measure nothing: tables (and with --out, files) from DIR's files")
    args = p.parse_args(argv)
    args.ranks = [int(x) for x in args.ranks.split(",")]
    args.collectives = args.collectives.split(",")
    args.libraries = args.libraries.split(",")
    bad = [c for c in args.collectives if c not in BUS_FACTOR]
    bad += [lib for lib in args.libraries if lib not in LIBRARIES]
    if bad or min(args.ranks) < 2:
        p.error(f"unknown: {' '.join(bad)}" if bad else "ranks must be >= 2")
    args.min_bytes, args.max_bytes = parse_size(args.minbytes), parse_size(args.maxbytes)
    args.lat_min_bytes, args.lat_max_bytes = parse_size(args.lat_min), parse_size(args.lat_max)
    args.iter_bytes = parse_size(args.iter_bytes)
    args.mpi_args = args.mpi_args.split()
    return args


def load_outputs(directory):
    """records, ceilings and meta of an earlier run, from the files write_outputs wrote."""
    def value(field, text):
        if text == "":
            return None
        return float(text) if field in FLOAT_FIELDS else int(text) if field in INT_FIELDS else text

    records = {}
    with open(directory / "raw.csv", newline="") as f:
        for row in csv.DictReader(f):
            row = {k: value(k, v) for k, v in row.items()}
            key = tuple(row[k] for k in ("kind", "nranks", "collective", "library", "repeat",
                                         "size_bytes"))
            record = records.setdefault(key, {**{k: row[k] for k in RECORD_FIELDS},
                                              "out_of_place": None, "in_place": None})
            record[row["placement"]] = {k: row[k] for k in MEASUREMENT_FIELDS
                                        if row[k] is not None or k == "wrong"}
    with open(directory / "ceiling.csv", newline="") as f:
        ceilings = [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]
    return list(records.values()), ceilings, json.loads((directory / "meta.json").read_text())


def report(summary, ceiling, settings, libraries, loads):
    """The Markdown tables on stdout."""
    print(f"# bench-compare: {', '.join(LABELS[lib] for lib in libraries)}; "
          f"{settings['placement'].replace('_', '-')}, float sum, median of "
          f"{settings['repeats']} repeats")
    for nranks in settings["ranks"]:
        for collective in settings["collectives"]:
            print(f"\n## {TITLES.get(collective, collective)}, {nranks} ranks\n")
            ceil = ceiling.get((nranks, collective))
            if ceil:
                print(f"ceiling: {ceil['ceiling_busbw']:.2f} GB/s busbw (copy "
                      f"{ceil['copy_gbps']:.2f} GB/s, spread {100 * ceil['copy_spread']:.0f}%)\n")
            print(busbw_table(summary, ceiling, nranks, collective, libraries))
            if sizes_of(summary, "latency", nranks, collective):
                print(f"\nper-call latency ({settings['lat_iters']} calls per size, Gloo "
                      f"{settings['lat_iters_gloo']}; nearest-rank median and p99 per run, "
                      f"then the median over repeats):\n")
                print(latency_table(summary, nranks, collective, libraries))
            targets = target_rows(summary, ceiling, nranks, collective, libraries)
            if targets:
                print("\n" + markdown(["target", "measured", "met"],
                                      [[label, measured, "yes" if met else "NO"]
                                       for label, measured, met in targets]))
    spreads = [e["busbw_spread"] for k, e in summary.items() if k[0] == "busbw"]
    if spreads:
        print(f"\nnoise: busbw spread (max-min)/median over repeats: median "
              f"{100 * statistics.median(spreads):.0f}%, worst {100 * max(spreads):.0f}%; "
              f"load average during the run {min(loads, default=0):.2f}–"
              f"{max(loads, default=0):.2f}")


def main(argv):
    args = parse_args(argv)
    if args.replot:
        records, ceilings, meta = load_outputs(Path(args.replot))
        meta["settings"]["placement"] = args.placement
    else:
        tools = Tools(args.build, args.libraries)
        runner = Runner(tools, args.timeout, args.mpi_args)
        started = time.time()
        records, ceilings, loads = measure(args, tools, runner)
        settings = {k: getattr(args, k) for k in ("ranks", "collectives", "repeats", "lat_iters",
                                                  "lat_iters_gloo", "placement")}
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                "command": " ".join([Path(sys.argv[0]).name, *argv]),
                "seconds": round(time.time() - started, 1), "machine": machine(),
                "libraries": tools.libraries, "settings": settings, "loadavg": loads,
                "failures": runner.failures}
    summary, ceiling = summarize(records, ceilings, args.placement)
    report(summary, ceiling, meta["settings"], meta["libraries"], meta["loadavg"])
    if args.out:
        out = Path(args.out)
        write_outputs(out, records, ceilings, summary, ceiling, meta)
        charts = write_charts(out, summary, ceiling, meta["settings"]["ranks"],
                              meta["settings"]["collectives"], meta["libraries"], args.placement)
        print(f"\nwrote {out}/raw.csv summary.csv latency.csv ceiling.csv meta.json and "
              f"{len(charts)} SVG charts")
    for failure in meta["failures"]:
        print(f"bench-compare: FAILED: {failure}", file=sys.stderr)
    return 1 if meta["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
