"""Every collective of the "weft" backend at 1-4 ranks against gloo's result on
the same inputs (or, where gloo has no such op or dtype, against the exact
result every rank computes from all ranks' inputs, which are deterministic).

One world per rank count runs every check, so torch starts once per world."""

import datetime

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from harness import run_world

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + FLOAT8 + INTS + [torch.bool]
# Data movement is byte-wise, so it takes dtypes Weft cannot reduce too.
MOVE_DTYPES = DTYPES + [torch.int16, torch.complex64]
GLOO_TYPES = FLOATS + INTS  # the dtypes gloo takes for every collective below
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
SHAPES = [(5,), (129, 67)]  # the second runs the larger-message algorithms
TOLERANCE = {
    torch.float32: 1e-6,
    torch.float64: 1e-12,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
    torch.float8_e4m3fn: 0.125,
    torch.float8_e5m2: 0.25,
}


def values(rank, shape, dtype, seed=0):
    """Small integers, so every sum and product below is exact in every dtype."""
    g = torch.Generator().manual_seed(7919 * seed + 104729 * rank + 17)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    low = 0 if dtype == torch.uint8 else -1
    return torch.randint(low, 3, shape, generator=g).to(torch.float32).to(dtype)


def exact_reduce(tensors, op):
    stack = torch.stack([t.to(torch.float64) for t in tensors])
    if op == dist.ReduceOp.SUM:
        out = stack.sum(0)
    elif op == dist.ReduceOp.PRODUCT:
        out = stack.prod(0)
    elif op == dist.ReduceOp.MIN:
        out = stack.amin(0)
    else:
        out = stack.amax(0)
    if tensors[0].dtype == torch.bool:
        return out != 0
    return out.to(torch.float32).to(tensors[0].dtype)


def same(got, want, what):
    assert got.dtype == want.dtype, what
    wide = torch.complex128 if got.is_complex() else torch.float64
    assert torch.equal(got.to(wide), want.to(wide)), f"{what}: {got} != {want}"


def gloo_or_exact(x, op, gloo, rank_inputs):
    if x.dtype not in GLOO_TYPES:
        return exact_reduce(rank_inputs, op)
    want = x.clone()
    dist.all_reduce(want, op=op, group=gloo)
    return want


def check_all_reduce(rank, n, gloo):
    for dtype in DTYPES:
        for shape in SHAPES:
            everyone = [values(r, shape, dtype) for r in range(n)]
            for op in OPS:
                got = everyone[rank].clone()
                dist.all_reduce(got, op=op)
                want = gloo_or_exact(everyone[rank], op, gloo, everyone)
                same(got, want, f"all_reduce {dtype} {op} {shape}")
            if dtype in FLOATS + FLOAT8:
                tol = TOLERANCE[dtype]
                got = everyone[rank].clone()
                dist.all_reduce(got, op=dist.ReduceOp.AVG)
                want = exact_reduce(everyone, dist.ReduceOp.SUM).to(torch.float64) / n
                assert_close(got.to(torch.float64), want, rtol=tol, atol=tol)
                got = everyone[rank].clone()
                dist.all_reduce(got, op=dist._make_nccl_premul_sum(2.0))
                want = exact_reduce([2 * t.to(torch.float64) for t in everyone], dist.ReduceOp.SUM)
                same(got.to(torch.float64), want, f"premul_sum {dtype} {shape}")
    # Non-contiguous: every other column, the rest untouched.
    base = [values(r, (6, 8), torch.float32) for r in range(n)]
    got = base[rank].clone()
    dist.all_reduce(got[:, ::2])
    want = base[rank].clone()
    want[:, ::2] = exact_reduce([b[:, ::2] for b in base], dist.ReduceOp.SUM)
    same(got, want, "all_reduce of a strided view")


def check_coalesced(rank, n, gloo):
    tensors = [values(rank, (3, 4), torch.float32, s) for s in range(3)]
    got = [t.clone() for t in tensors]
    dist.all_reduce_coalesced(got)
    for t, g in zip(tensors, got):
        want = t.clone()
        dist.all_reduce(want, group=gloo)
        same(g, want, "all_reduce_coalesced")
    # The coalescing manager turns these into the *_coalesced backend calls.
    ins = [values(rank, (k + 1,), torch.float32, k) for k in range(3)]
    gathered = [torch.empty(n * (k + 1)) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for i, o in zip(ins, gathered):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, o in enumerate(gathered):
        same(o, torch.cat([values(r, (k + 1,), torch.float32, k) for r in range(n)]), "ag coalesced")
    big = [values(rank, (n * (k + 2),), torch.float32, k) for k in range(3)]
    scattered = [torch.empty(k + 2) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for i, o in zip(big, scattered):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k, o in enumerate(scattered):
        full = exact_reduce([values(r, (n * (k + 2),), torch.float32, k) for r in range(n)],
                            dist.ReduceOp.SUM)
        same(o, full[rank * (k + 2):(rank + 1) * (k + 2)], "rs coalesced")


def check_rooted(rank, n, gloo):
    def make(rank, dtype):
        if dtype == torch.complex64:
            return torch.complex(values(rank, (4, 3), torch.float32),
                                 values(rank, (4, 3), torch.float32, 1))
        return values(rank, (4, 3), dtype)

    for dtype in MOVE_DTYPES:
        for root in range(n):
            got = make(rank, dtype)
            dist.broadcast(got, root)
            same(got, make(root, dtype), f"broadcast {dtype} root {root}")
            if dtype in GLOO_TYPES:
                want = make(rank, dtype)
                dist.broadcast(want, root, group=gloo)
                same(got, want, f"broadcast {dtype} root {root} (gloo)")
    for dtype in [torch.float32, torch.int64, torch.bfloat16]:
        for root in range(n):
            everyone = [values(r, (33,), dtype) for r in range(n)]
            got = everyone[rank].clone()
            dist.reduce(got, root)
            if rank == root:
                same(got, exact_reduce(everyone, dist.ReduceOp.SUM), f"reduce {dtype}")
    for root in range(n):
        x = values(rank, (2, 5), torch.int32)
        got = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        want = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        dist.gather(x, got, dst=root)
        dist.gather(x, want, dst=root, group=gloo)
        if rank == root:
            for g, w in zip(got, want):
                same(g, w, "gather")
        pieces = [values(root, (2, 5), torch.float64, j) for j in range(n)] if rank == root else None
        got = torch.empty(2, 5, dtype=torch.float64)
        dist.scatter(got, pieces, src=root)
        same(got, values(root, (2, 5), torch.float64, rank), "scatter")


def check_gathers(rank, n, gloo):
    for dtype in MOVE_DTYPES:
        if dtype == torch.complex64:
            continue
        x = values(rank, (3, 2), dtype)
        got = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(got, x)
        for r in range(n):
            same(got[r], values(r, (3, 2), dtype), f"all_gather {dtype}")
        out = torch.empty((n * 3, 2), dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        want = torch.empty_like(out)
        if dtype in GLOO_TYPES:
            dist.all_gather_into_tensor(want, x, group=gloo)
        else:
            want = torch.cat([values(r, (3, 2), dtype) for r in range(n)])
        same(out, want, f"all_gather_into_tensor {dtype}")
        # In place: the input is this rank's slot of the output.
        out = torch.zeros((n * 3, 2), dtype=dtype)
        out[rank * 3:(rank + 1) * 3] = x
        dist.all_gather_into_tensor(out, out[rank * 3:(rank + 1) * 3])
        same(out, want, f"all_gather_into_tensor in place {dtype}")


def check_reduce_scatters(rank, n, gloo):
    for dtype in DTYPES:
        for op in OPS:
            full = [values(r, (n * 6,), dtype, 3) for r in range(n)]
            want = exact_reduce(full, op)[rank * 6:(rank + 1) * 6]
            if dtype in GLOO_TYPES and op == dist.ReduceOp.SUM:
                gloo_out = torch.empty(6, dtype=dtype)
                dist.reduce_scatter_tensor(gloo_out, full[rank].clone(), group=gloo)
                same(gloo_out, want, "gloo agrees")
            got = torch.empty(6, dtype=dtype)
            dist.reduce_scatter_tensor(got, full[rank].clone(), op=op)
            same(got, want, f"reduce_scatter_tensor {dtype} {op}")
            buf = full[rank].clone()
            dist.reduce_scatter_tensor(buf[rank * 6:(rank + 1) * 6], buf, op=op)
            same(buf[rank * 6:(rank + 1) * 6], want, f"reduce_scatter_tensor in place {dtype}")
            got = torch.empty(6, dtype=dtype)
            dist.reduce_scatter(got, list(full[rank].clone().chunk(n)), op=op)
            same(got, want, f"reduce_scatter {dtype} {op}")


def block(src, dst, rows, dtype=torch.float32):
    """The rows rank `src` sends rank `dst` in the all_to_all checks."""
    return (1000 * src + 100 * dst + torch.arange(rows * 4).reshape(rows, 4)).to(dtype)


def check_all_to_all(rank, n, gloo):
    for dtype in [torch.float32, torch.int64, torch.float16, torch.int16]:
        x = torch.cat([block(rank, j, 2, dtype) for j in range(n)])
        got = torch.empty_like(x)
        dist.all_to_all_single(got, x)
        want = torch.empty_like(x)
        if dtype != torch.int16:
            dist.all_to_all_single(want, x, group=gloo)
        else:
            want = torch.cat([block(j, rank, 2, dtype) for j in range(n)])
        same(got, want, f"all_to_all_single {dtype}")
    # Uneven splits, zeros included.
    rows = lambda src, dst: (2 * src + dst) % 3  # noqa: E731
    x = torch.cat([block(rank, j, rows(rank, j)) for j in range(n)])
    in_splits = [rows(rank, j) for j in range(n)]
    out_splits = [rows(j, rank) for j in range(n)]
    got = torch.empty(sum(out_splits), 4)
    dist.all_to_all_single(got, x, out_splits, in_splits)
    want = torch.empty_like(got)
    dist.all_to_all_single(want, x, out_splits, in_splits, group=gloo)
    same(got, want, "all_to_all_single uneven")
    same(got, torch.cat([block(j, rank, rows(j, rank)) for j in range(n)]), "uneven exact")
    # The list form, uneven too.
    ins = [block(rank, j, rows(rank, j) + 1) for j in range(n)]
    outs = [torch.empty(rows(j, rank) + 1, 4) for j in range(n)]
    dist.all_to_all(outs, ins)
    for j in range(n):
        same(outs[j], block(j, rank, rows(j, rank) + 1), "all_to_all")


def check_point_to_point(rank, n, gloo):
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    x = values(rank, (10,), torch.float64)
    got = torch.empty(10, dtype=torch.float64)
    # Blocking: even ranks send first, so the ring cannot wait on itself.
    if rank % 2 == 0:
        dist.send(x, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(x, right)
    same(got, values(left, (10,), torch.float64), "send/recv")
    # Both posted before waiting, on every rank at once.
    got = torch.empty(10, dtype=torch.float64)
    works = [dist.isend(x, right), dist.irecv(got, left)]
    for w in works:
        w.wait()
    same(got, values(left, (10,), torch.float64), "isend/irecv")
    # Coalesced (a Weft group): a strided receive buffer too.
    big = torch.zeros(10, 2)
    ops = [dist.P2POp(dist.isend, x.float(), right), dist.P2POp(dist.irecv, big[:, 1], left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(big[:, 1], values(left, (10,), torch.float64).float(), "batch_isend_irecv")
    same(big[:, 0], torch.zeros(10), "batch_isend_irecv left the other column")


def check_async(rank, n, gloo):
    tensors = [values(rank, (1000 * (k + 1),), torch.float32, k) for k in range(6)]
    got = [t.clone() for t in tensors]
    works = [dist.all_reduce(g, async_op=True) for g in got]
    gathered = torch.empty(n * 1000)
    works.append(dist.all_gather_into_tensor(gathered, tensors[0], async_op=True))
    works.append(dist.barrier(async_op=True))
    futures = [w.get_future() for w in works[:2]]
    for w in reversed(works):
        w.wait()
    for k, (t, g) in enumerate(zip(tensors, got)):
        want = t.clone()
        dist.all_reduce(want, group=gloo)
        same(g, want, f"async all_reduce {k}")
    same(futures[0].wait()[0], got[0], "future value")
    same(gathered, torch.cat([values(r, (1000,), torch.float32, 0) for r in range(n)]), "async ag")


def check_subgroups(rank, n, gloo):
    # Every rank takes part in creating every group (torch's rule).
    evens = list(range(0, n, 2))
    tail = list(range(1, n))
    groups = {}
    for ranks in (evens, tail):
        if ranks:
            groups[tuple(ranks)] = (dist.new_group(ranks), dist.new_group(ranks, backend="gloo"))
    for ranks, (weft_group, gloo_group) in groups.items():
        if rank not in ranks:
            continue
        x = values(rank, (17,), torch.float32)
        got = x.clone()
        dist.all_reduce(got, group=weft_group)
        want = x.clone()
        dist.all_reduce(want, group=gloo_group)
        same(got, want, f"subgroup {ranks} all_reduce")
        assert dist.get_rank(weft_group) == ranks.index(rank)
        out = torch.empty(len(ranks) * 17)
        dist.all_gather_into_tensor(out, x, group=weft_group)
        same(out, torch.cat([values(r, (17,), torch.float32) for r in ranks]), "subgroup gather")
        b = x.clone()
        dist.broadcast(b, ranks[-1], group=weft_group)  # root given as a global rank
        same(b, values(ranks[-1], (17,), torch.float32), "subgroup broadcast")


def check_wait_timeout(rank, n, gloo):
    """wait(timeout) raises while the peer has not sent yet; the op still completes."""
    if n == 1:
        return
    if rank == 0:
        got = torch.zeros(4)
        work = dist.irecv(got, 1)
        with pytest.raises(dist.DistBackendError, match="did not complete within 200 ms"):
            work.wait(timeout=datetime.timedelta(milliseconds=200))
        dist.barrier()
        work.wait()
        same(got, torch.arange(4.0), "receive after a timed-out wait")
    else:
        dist.barrier()
        if rank == 1:
            dist.send(torch.arange(4.0), 0)


def check_errors(rank, n, gloo):
    # An operation of an open coalescing batch has nothing to wait for yet.
    dist.distributed_c10d._get_default_group()._start_coalescing(torch.device("cpu"))
    early = dist.all_reduce(torch.ones(2), async_op=True)
    with pytest.raises(dist.DistBackendError, match="before its coalescing batch ended"):
        early.wait()
    dist.distributed_c10d._get_default_group()._end_coalescing(torch.device("cpu")).wait()
    early.wait()
    with pytest.raises(dist.DistBackendError, match="reduction"):
        dist.all_reduce(torch.ones(3, dtype=torch.int16))
    with pytest.raises(dist.DistBackendError, match="add up to dimension 0"):
        dist.all_to_all_single(torch.empty(n * 2), torch.empty(n * 2), [2] * n, [3] * n)
    if n > 1:
        with pytest.raises(dist.DistBackendError, match="equal pieces"):
            dist.all_to_all_single(torch.empty(n * 2 + 1), torch.empty(n * 2 + 1))


def all_checks(rank, n):
    gloo = dist.new_group(backend="gloo")
    for check in (check_all_reduce, check_coalesced, check_rooted, check_gathers,
                  check_reduce_scatters, check_all_to_all, check_point_to_point, check_async,
                  check_subgroups, check_wait_timeout, check_errors):
        check(rank, n, gloo)
        dist.barrier()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives(world_size):
    run_world(world_size, all_checks)
