"""The "weft" torch.distributed backend.

    import weft_torch
    torch.distributed.init_process_group(backend="weft")

Every group's ranks meet through the c10d Store torch gives the backend: rank 0
publishes a Weft unique id there, the others read it, all join one communicator.
"""

from datetime import timedelta

import torch.distributed as dist

from . import _C

__all__ = ["BACKEND"]

BACKEND = "weft"
_UNIQUE_ID_KEY = "weft_unique_id"


def _milliseconds(timeout):
    if isinstance(timeout, timedelta):
        return max(1, int(timeout.total_seconds() * 1000))
    return max(1, int(float(timeout) * 1000))


def _create_backend(dist_options, _backend_options):
    store = dist_options.store
    rank = dist_options.group_rank
    if rank == 0:
        unique_id = _C.new_unique_id()
        store.set(_UNIQUE_ID_KEY, unique_id)
    else:
        unique_id = store.get(_UNIQUE_ID_KEY)
    return _C.create_backend(
        bytes(unique_id), rank, dist_options.group_size, _milliseconds(dist_options.timeout)
    )


dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cpu"])
