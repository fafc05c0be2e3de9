"""Run by test_launch.py under torchrun: env:// rendezvous, no arguments."""

import torch
import torch.distributed as dist

import weft_torch  # noqa: F401

dist.init_process_group("weft")
rank, n = dist.get_rank(), dist.get_world_size()
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((3,), n * (n + 1) / 2)), t
dist.destroy_process_group()
print(f"rank {rank} of {n}: ok", flush=True)
