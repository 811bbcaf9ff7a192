"""The process group of a ``torchrun`` job, or a world of one: what label sharding and head training need to run
on several processes (`mimdm.pipelines.distributed`, `mimdm.heads.mi_head.train_head`)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job: ``rank`` in ``[0, world_size)``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """True when a process group with more than one process is in use."""
        return self.world_size > 1


def init_distributed(backend: str | None = None, timeout_s: float = 7200.0) -> DistInfo:
    """Join the ``torchrun`` job described by the environment, or run alone.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT``, which
    ``torchrun`` sets). If a default process group already exists it is used as is. With
    ``WORLD_SIZE`` unset or 1 no group is created (world size 1).

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default ``nccl`` when CUDA is available, else ``gloo``.
            With nccl the current CUDA device is set to ``cuda:LOCAL_RANK``.
        timeout_s: collective timeout (seconds); generous, because ranks wait at barriers while
            rank 0 trains a missing model or a rank finishes a long shard.

    Raises:
        RuntimeError: ``WORLD_SIZE`` > 1 but ``torch.distributed`` is unavailable, or the
            rendezvous fails (from ``init_process_group``).
    """
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local)


def barrier(info: DistInfo) -> None:
    """Wait for every rank (nothing in a world of one)."""
    if info.active:
        dist.barrier()


def broadcast(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank (a picklable object)."""
    if not info.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj, info: DistInfo) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not info.active:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def allreduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Element-wise sum over ranks of a list of floats (float64)."""
    if not info.active:
        return list(values)
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def current_dist() -> DistInfo:
    """The process group in use (one made by `init_distributed`), or a world of one; never joins a group."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return DistInfo()
