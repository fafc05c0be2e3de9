"""A rank killed mid-job: the survivors' next operation raises within the
group's timeout (never hangs), and their processes end."""

import datetime
import multiprocessing
import os
import signal
import time

import torch
import torch.distributed as dist

import weft_torch  # noqa: F401
from harness import free_port

WORLD = 3
TIMEOUT_S = 10
VICTIM = 2


def rank_main(rank, port, results):
    dist.init_process_group("weft", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.barrier()
    if rank == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(100):  # the death is noticed by the first op or a later one
            dist.all_reduce(t)
        results.put((rank, "no error", time.monotonic() - start))
    except Exception as error:  # noqa: BLE001  (the type is asserted by the parent)
        results.put((rank, f"{type(error).__name__}: {error}", time.monotonic() - start))
    dist.destroy_process_group()


def test_killed_rank_makes_survivors_raise():
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=TIMEOUT_S + 60) for _ in range(WORLD - 1)]
    for p in procs:
        p.join(timeout=60)
        assert not p.is_alive(), "a survivor did not end"
    assert procs[VICTIM].exitcode == -signal.SIGKILL
    for rank, outcome, elapsed in reports:
        assert rank != VICTIM
        assert outcome.startswith("DistBackendError: weft:"), outcome
        assert elapsed < TIMEOUT_S + 5, f"rank {rank} took {elapsed:.1f} s to notice"
