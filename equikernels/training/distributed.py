"""torch.distributed helpers: one process per device, launched by ``torchrun`` (which sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). NCCL on CUDA, gloo on CPU.

Every collective here names its device: an NCCL barrier or object broadcast otherwise runs on the
*current* CUDA device, which is cuda:0 in every process that never called ``set_device``, and a
rank that enters a collective on another device than its peers waits forever."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .. import settings


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: Optional[torch.device] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


_DEVICE: Optional[torch.device] = None  # this process's device for collectives (CUDA only)


def process_device(device: torch.device, local_rank: int) -> torch.device:
    """The device this process trains on: a bare ``cuda`` means cuda:LOCAL_RANK under torchrun."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", local_rank)
    return device


def setup(device: torch.device) -> DistInfo:
    """Join the process group torchrun describes (no-op for a single process). On CUDA the
    process's device is made current and bound to the group, so that every collective, barriers
    included, runs on it."""
    global _DEVICE
    world = settings.get().world_size
    if world <= 1 and not is_active():
        return DistInfo(device=device)
    local_rank = settings.get().local_rank
    device = process_device(device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        _DEVICE = device
    if not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group(backend="nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def wrap_ddp(model: torch.nn.Module, params, device: torch.device) -> torch.nn.Module:
    """``model`` in DDP, with the gradients of ``params`` (its trainable parameters) held in DDP's
    communication buckets: each gets a zero gradient first, which DDP turns into a view of its bucket,
    so backward accumulates into the buckets and no gradient is copied in or out. Clear them with
    ``zero_grad(set_to_none=False)`` to keep it so. A gradient that autograd hands over on its own
    (``.grad`` None) may differ from its parameter in the stride of a size-1 dimension (a one-element
    model's symmetric-contraction weights): harmless, but DDP warns "Grad strides do not match bucket
    view strides" for it."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # a dense parameter's layout, which DDP's bucket views take
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", settings.get().local_rank)
    return torch.device("cpu")


def is_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_active():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def world_size() -> int:
    return dist.get_world_size() if is_active() else 1


def _object_device() -> Optional[torch.device]:
    return _DEVICE if _DEVICE is not None and dist.get_backend() == "nccl" else None


def broadcast_object(obj, src: int = 0):
    if not is_active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_object_device())
    return box[0]


def barrier() -> None:
    if is_active():
        device = _object_device()
        dist.barrier(device_ids=[device.index] if device is not None else None)


def on_main(fn: Callable[[], object]):
    """Run ``fn`` on rank 0 only and give every rank its result. An exception on rank 0 is raised
    on every rank (as a RuntimeError naming it on the others), so no rank is left waiting in a
    collective that rank 0 will never reach."""
    result, error = None, None
    if not is_active() or dist.get_rank() == 0:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the peers know
            error = exc
    if not is_active():
        if error is not None:
            raise error
        return result
    shared = broadcast_object((result, None if error is None else f"{type(error).__name__}: {error}"))
    if error is not None:
        raise error
    if shared[1] is not None:
        raise RuntimeError(f"rank 0 failed: {shared[1]}")
    return shared[0]
