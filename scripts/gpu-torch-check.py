"""PyTorch's "nccl" backend running on Weft's libnccl.so.2 (LD_PRELOADed over the NCCL that
torch links), two ranks on one GPU (real NCCL refuses two ranks on one GPU): AllReduce,
AllGather, ReduceScatter, Broadcast and an AllToAll on CUDA tensors, checked exactly.
Run by scripts/gpu-check.sh:  LD_PRELOAD=<build>/nccl/libnccl.so.2 python3 gpu-torch-check.py
Prints one line per rank and exits non-zero on any difference."""
import ctypes
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def rank_main(rank, port, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    x = torch.arange(1031, dtype=torch.float32, device="cuda") + rank
    dist.all_reduce(x)
    want = 2 * torch.arange(1031, dtype=torch.float32, device="cuda") + 1
    ok = torch.equal(x, want)
    parts = [torch.empty(7, dtype=torch.bfloat16, device="cuda") for _ in range(WORLD)]
    dist.all_gather(parts, torch.full((7,), rank + 1.0, dtype=torch.bfloat16, device="cuda"))
    ok &= all(torch.all(p == q + 1).item() for q, p in enumerate(parts))
    out = torch.empty(5, device="cuda")
    dist.reduce_scatter(out, [torch.full((5,), float(rank + q), device="cuda") for q in range(WORLD)])
    ok &= torch.all(out == sum(r + rank for r in range(WORLD))).item()
    y = torch.full((9,), float(rank), device="cuda")
    dist.broadcast(y, src=1)
    ok &= torch.all(y == 1).item()
    a2a = torch.empty(WORLD * 3, device="cuda")
    dist.all_to_all_single(a2a, torch.arange(WORLD * 3, dtype=torch.float32, device="cuda") + 10 * rank)
    ok &= torch.equal(a2a.cpu(), torch.tensor([10.0 * q + 3 * rank + i for q in range(WORLD) for i in range(3)]))
    torch.cuda.synchronize()
    lib = ctypes.CDLL(None)
    version = ctypes.c_int(0)
    lib.ncclGetVersion(ctypes.byref(version))
    print(f"rank {rank}: torch {torch.__version__}, ncclGetVersion {version.value}, "
          f"weftGetVersion present: {hasattr(lib, 'weftGetVersion')}, results {'OK' if ok else 'WRONG'}",
          flush=True)
    if not ok:
        failures.value += 1
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failures = mp.get_context("spawn").Value("i", 0)
    mp.start_processes(rank_main, args=(port, failures), nprocs=WORLD, start_method="spawn")
    return 1 if failures.value else 0


if __name__ == "__main__":
    sys.exit(main())
