"""PyTorch's own training stacks over the "weft" backend, against a
single-process run on the full batch (float64, so equal means assert_close
at float64 tolerance): DDP (plain, gradient_as_bucket_view, a comm hook),
FSDP2 fully_shard over a 1-D mesh and a 2-D (HSDP) mesh, DTensor
redistribution."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing import assert_close

from harness import run_world

STEPS = 3
PER_RANK = 4  # samples per rank per step


def batches(n, features, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n * PER_RANK, features, generator=g, dtype=torch.float64),
             torch.randn(n * PER_RANK, 1, generator=g, dtype=torch.float64))
            for _ in range(STEPS)]


def mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 1)).double()


def ddp_checks(rank, n):
    variants = [dict(), dict(gradient_as_bucket_view=True, bucket_cap_mb=0.0005),
                dict(hook=True)]
    for variant in variants:
        hook = variant.pop("hook", False)
        reference = mlp()
        model = DDP(copy.deepcopy(reference), **variant)
        if hook:
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        for x, y in batches(n, 8, 2):
            mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            opt.zero_grad()
            nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            ref_opt.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            for p, q in zip(model.module.parameters(), reference.parameters()):
                assert_close(p.grad, q.grad, msg=f"DDP {variant} hook={hook}: gradient")
            opt.step()
            ref_opt.step()
            for p, q in zip(model.module.parameters(), reference.parameters()):
                assert_close(p, q, msg=f"DDP {variant} hook={hook}: parameter")


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp(world_size):
    run_world(world_size, ddp_checks)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).mean(dim=(1, 2))


def sequences(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n * PER_RANK, 5, 16, generator=g, dtype=torch.float64),
             torch.randn(n * PER_RANK, generator=g, dtype=torch.float64)) for _ in range(STEPS)]


def train_sharded(rank, n, mesh, batch_rank, batch_ranks):
    reference = Tiny().double()
    model = copy.deepcopy(reference)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for x, y in sequences(batch_ranks, 4):
        mine = slice(batch_rank * PER_RANK, (batch_rank + 1) * PER_RANK)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ref_loss = nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        assert_close(mean_loss / n, ref_loss.detach(), msg="FSDP2 loss")
        for p, q in zip(model.parameters(), reference.parameters()):
            assert isinstance(p, DTensor)
            assert_close(p.full_tensor(), q.detach(), msg="FSDP2 parameter")


def fsdp_checks(rank, n):
    train_sharded(rank, n, init_device_mesh("cpu", (n,)), rank, n)
    if n == 4:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        train_sharded(rank, n, mesh, rank, n)


def dtensor_checks(rank, n):
    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(n * 6 * 4, dtype=torch.float64).reshape(n * 6, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full[rank * 6:(rank + 1) * 6])
    replicated = sharded.redistribute(mesh, [Replicate()])
    assert torch.equal(replicated.to_local(), full)
    back = replicated.redistribute(mesh, [Shard(0)])
    assert torch.equal(back.to_local(), full[rank * 6:(rank + 1) * 6])
    columns = sharded.redistribute(mesh, [Shard(1)])  # an all_to_all
    assert torch.equal(columns.full_tensor(), full)
    partial = DTensor.from_local(full * (rank + 1), mesh, [Partial()])
    total = full * (n * (n + 1) // 2)
    assert torch.equal(partial.redistribute(mesh, [Replicate()]).to_local(), total)
    assert torch.equal(partial.redistribute(mesh, [Shard(0)]).to_local(),
                       total[rank * 6:(rank + 1) * 6])


def sharded_checks(rank, n):
    dtensor_checks(rank, n)
    fsdp_checks(rank, n)


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_and_dtensor(world_size):
    run_world(world_size, sharded_checks)
