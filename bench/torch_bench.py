#!/usr/bin/env python3
"""torch.distributed with backend "weft" against "gloo", interleaved.

    python bench/torch_bench.py --ranks 2,4 [--min 8] [--max 64M] [--factor 8]
        [--weft-perf build/bench/perf/weft-perf --weftrun build/tools/weftrun/weftrun]

For each world size, one set of ranks holds both groups and times, per
collective and size, weft then gloo on the same buffers (so load drifts hit
both alike): all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single on float32. The size is the larger buffer, as in
nccl-tests. A time is the slowest rank's mean over the iterations.

With --weft-perf, it also runs weft-perf allreduce at the smallest size under
weftrun and prints the binding's overhead per call: torch+weft minus weft-perf
(in place, as torch's all_reduce).
"""

import argparse
import datetime
import os
import re
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import weft_torch  # noqa: F401  (pip install ./python)

COLLECTIVES = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def buffers(name, size, n):
    """(output, input) float32 tensors: `size` bytes is the larger of the two."""
    elements = max(size // 4, n)
    per_rank = max(elements // n, 1)
    if name == "all_reduce":
        t = torch.ones(elements)
        return t, t
    if name == "all_gather_into_tensor":
        return torch.empty(per_rank * n), torch.ones(per_rank)
    if name == "reduce_scatter_tensor":
        return torch.empty(per_rank), torch.ones(per_rank * n)
    return torch.empty(per_rank * n), torch.ones(per_rank * n)


ASYNC = False  # --async-ops: each call with async_op=True, then wait()


def call(name, out, inp, group):
    if name == "all_reduce":
        work = dist.all_reduce(out, group=group, async_op=ASYNC)
    elif name == "all_gather_into_tensor":
        work = dist.all_gather_into_tensor(out, inp, group=group, async_op=ASYNC)
    elif name == "reduce_scatter_tensor":
        work = dist.reduce_scatter_tensor(out, inp, group=group, async_op=ASYNC)
    else:
        work = dist.all_to_all_single(out, inp, group=group, async_op=ASYNC)
    if work is not None:
        work.wait()


def timed(name, out, inp, group, iters, sync):
    dist.barrier(group=sync)
    start = time.perf_counter()
    for _ in range(iters):
        call(name, out, inp, group)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=sync)
    return elapsed.item()


def measure(name, size, group, sync, budget_s):
    out, inp = buffers(name, size, dist.get_world_size())
    first = timed(name, out, inp, group, 2, sync)  # warm-up and calibration
    iters = max(3, min(2000, int(budget_s / max(first, 1e-7))))
    iters = torch.tensor([iters])
    dist.broadcast(iters, 0, group=sync)  # every rank runs the same count
    return timed(name, out, inp, group, int(iters.item()), sync)


def rank_main(rank, n, port, sizes, budget_s, timeout_s, collectives, results):
    dist.init_process_group("weft", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=timeout_s))
    gloo = dist.new_group(backend="gloo")
    weft = dist.group.WORLD
    rows = []
    for name in collectives:
        for size in sizes:
            if rank == 0:
                print(f"# {n} ranks: {name} {size} B", file=sys.stderr, flush=True)
            w = measure(name, size, weft, gloo, budget_s)
            g = measure(name, size, gloo, gloo, budget_s)
            rows.append((name, size, w, g))
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def weft_perf_us(weftrun, weft_perf, n, size):
    out = subprocess.run([weftrun, "-n", str(n), weft_perf, "allreduce", "-b", str(size), "-e",
                          str(size), "-n", "2000", "-w", "100", "-c", "0"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = re.sub(r"^\[\d+\]\s*", "", line).split()  # weftrun's rank prefix
        if len(fields) > 9 and fields[0] == str(size) and re.match(r"^[0-9.]+$", fields[9]):
            return float(fields[9])  # in-place time (us), as torch's all_reduce
    raise RuntimeError("no weft-perf row in:\n" + out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--min", default="8")
    parser.add_argument("--max", default="64M")
    parser.add_argument("--factor", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.25, help="seconds per measurement")
    parser.add_argument("--timeout", type=float, default=600, help="the groups' timeout (s)")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--async-ops", action="store_true",
                        help="async_op=True then wait() (the stream path)")
    parser.add_argument("--weft-perf")
    parser.add_argument("--weftrun")
    args = parser.parse_args()
    global ASYNC
    ASYNC = args.async_ops
    sizes = []
    size = parse_size(args.min)
    while size < parse_size(args.max):
        sizes.append(size)
        size *= args.factor
    sizes.append(parse_size(args.max))
    ctx = mp.get_context("fork")
    print(f"# torch {torch.__version__}, float32, time per call in us (slowest rank), "
          f"{os.cpu_count()} cores")
    for n in [int(r) for r in args.ranks.split(",")]:
        results = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(rank_main, args=(n, port, sizes, args.budget, args.timeout,
                                             args.collectives.split(","), results), nprocs=n,
                           start_method="fork")
        rows = results.get()
        print(f"\n## {n} ranks")
        print(f"{'collective':<24}{'bytes':>10}{'weft us':>12}{'gloo us':>12}{'gloo/weft':>11}")
        for name, size, w, g in rows:
            print(f"{name:<24}{size:>10}{w * 1e6:>12.1f}{g * 1e6:>12.1f}{g / w:>10.1f}x")
        if args.weft_perf:
            base = weft_perf_us(args.weftrun, args.weft_perf, n, sizes[0])
            mine = next(w for name, size, w, _ in rows if name == "all_reduce") * 1e6
            print(f"binding overhead, all_reduce {sizes[0]} B: torch+weft {mine:.1f} us, "
                  f"weft-perf {base:.1f} us, overhead {mine - base:.1f} us per call")


if __name__ == "__main__":
    main()
