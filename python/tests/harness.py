"""Runs a function on every rank of a fresh local world (forked processes).

Each rank initialises the default group with backend "weft" through a TCP
store; an exception on any rank fails the caller with that rank's traceback.
"""

import datetime
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

import weft_torch  # noqa: F401  registers the backend


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, timeout_s, fn, args):
    dist.init_process_group(
        "weft",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_world(world_size, fn, *args, timeout_s=60):
    # fork: the parent imported torch already, and the ranks start in a blink.
    mp.start_processes(
        _entry,
        args=(world_size, free_port(), timeout_s, fn, args),
        nprocs=world_size,
        start_method="fork",
    )
