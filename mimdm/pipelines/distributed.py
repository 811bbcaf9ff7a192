"""Sharded MI-label generation and MI-head training on several processes (``torch.distributed``).

Run under ``torchrun`` through `mimdm.app.torchrun` (one process per GPU, or several CPU processes with the
gloo backend)::

    torchrun --nproc_per_node 2 -m mimdm.app.torchrun labels --profile smoke
    torchrun --nproc_per_node 2 -m mimdm.app.torchrun head --profile smoke

Both also run as a plain ``python -m mimdm.app.torchrun ...`` (world size 1, no process group).

**Labels** (`generate_labels_distributed`). The label set is the one `mimdm.pipelines.labels.generate_labels`
writes, in the same folder (`mimdm.pipelines.labels.label_dir`), with the same files and the same tensors:
shard k depends only on ``(cfg, k)`` and the model, so who computes it does not matter. Protocol:

0. the ranks compare their models' weights (`mimdm.core.artifacts.module_sha256`; `RuntimeError` if they differ);
1. rank 0 validates the folder (`mimdm.pipelines.labels.pending_shards`: the manifest's config must be ``cfg``,
   else `ValueError` on every rank; entries whose shard file is gone or damaged are dropped) and broadcasts the
   sorted list of incomplete shards ``todo``; rank r takes ``todo[r::world_size]`` (so, in a fresh run, shards
   r, r+N, r+2N, ...);
2. each rank runs the one shard loop, `mimdm.pipelines.labels.compute_shards`, on its share: a shard is written
   atomically with its sha256 under a lock of its own, then entered in ``manifest.json`` under the folder's lock,
   so the ranks never overwrite each other's entries and the finished folder holds exactly what a
   single-process run writes.

A rank that crashes mid-shard leaves at most a temporary file or a shard file without a manifest entry; the shard
is computed again on restart, while every shard entered in the manifest is kept. All ranks must see the same file
system (one machine, or a shared one).

**Head**: `mimdm.heads.mi_head.train_head` runs on the ranks of the same job with
`torch.nn.parallel.DistributedDataParallel`; see its docstring for how the batches are split.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mimdm.core.artifacts import module_sha256
from mimdm.core.contract import MaskedModel
from mimdm.core.distributed import broadcast, gather, init_distributed
from mimdm.pipelines.labels import LabelConfig, compute_shards, is_complete, label_shard, pending_shards


@dataclass
class LabelRunReport:
    """What one `generate_labels_distributed` call did (the same on every rank).

    Attributes:
        out_dir: the label folder.
        computed: shards computed in this call, per rank (``computed[r]`` by rank r).
        dropped: manifest entries dropped at start because their shard file was gone or damaged.
        complete: every shard of the config is in the manifest.
    """

    out_dir: Path
    computed: list[list[int]] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    complete: bool = False

    @property
    def all_computed(self) -> list[int]:
        """Every shard computed in this call, sorted."""
        return sorted(k for c in self.computed for k in c)


def generate_labels_distributed(model: MaskedModel, cfg: LabelConfig, out_dir: Path, progress: bool = True,
                                max_new_shards: int | None = None,
                                on_shard_done: Callable[[int], None] | None = None) -> LabelRunReport:
    """Generate every missing shard of a label set, shards spread over the ranks of a ``torchrun`` job.

    Call it on every rank with the same arguments (the same model weights on each rank: load them
    from one checkpoint). Joins the process group from the environment if none exists
    (`init_distributed`: gloo on CPU, nccl with CUDA); with world size 1 it runs alone. The finished
    folder equals that of `mimdm.pipelines.labels.generate_labels(model, cfg, out_dir)`: the same files
    (``manifest.json``, ``shard_0000k.pt``), the same stored tensors (bit for bit when every rank
    computes on the same kind of device with the same kernels and thread count as the reference),
    the same manifest apart from the timing fields ``seconds``. See the module docstring for the
    protocol and its crash behaviour.

    Args:
        model: the MDM (on this rank's device), in eval mode or not (set to eval here).
        cfg: label settings (`mimdm.pipelines.labels.LabelConfig`).
        out_dir: the label folder (normally `mimdm.pipelines.labels.label_dir`); shared by all ranks.
        progress: a progress bar on rank 0 (over its own shards).
        max_new_shards: compute at most this many shards in this call, over all ranks (the first
            ones of the sorted incomplete shards); a later call continues.
        on_shard_done: called as ``on_shard_done(k)`` on the rank that computed shard ``k``, after
            its file and manifest entry are written (for logging or fault injection in tests).

    Returns:
        A `LabelRunReport` (identical on every rank), returned after ``manifest.json`` is final.

    Raises:
        ValueError: ``out_dir`` holds labels of another config (on every rank).
        RuntimeError: the ranks' models differ (`mimdm.core.artifacts.module_sha256`; on every rank), or rank 0
            could not prepare ``out_dir`` (rank 0 raises the original error, the others this).
    """
    info = init_distributed("nccl" if model.device.type == "cuda" else "gloo")  # the existing group, if any
    out_dir = Path(out_dir)
    if info.active and len(set(gather(module_sha256(model), info))) != 1:
        raise RuntimeError("the ranks hold different model weights: load the same checkpoint on every rank")
    plan: dict = {}
    if info.is_main:
        try:
            todo, dropped = pending_shards(out_dir, cfg.to_dict(), cfg.n_shards)
            if max_new_shards is not None:
                todo = todo[:max(0, max_new_shards)]
            plan = {"todo": todo, "dropped": dropped}
        except Exception as e:  # tell the other ranks instead of leaving them at the broadcast
            broadcast({"error": f"{type(e).__name__}: {e}", "value_error": isinstance(e, ValueError)}, info)
            raise
    plan = broadcast(plan, info)
    if "error" in plan:
        raise (ValueError if plan["value_error"] else RuntimeError)(f"rank 0 failed to prepare {out_dir}: {plan['error']}")
    model.eval()
    rep = compute_shards(out_dir, cfg.to_dict(), cfg.n_shards, lambda k: label_shard(model, cfg, k),
                         f"probe labels (rank {info.rank}/{info.world_size})", progress and info.is_main,
                         only=plan["todo"][info.rank::info.world_size], on_shard_done=on_shard_done)
    computed = gather(rep.computed, info)  # also the barrier: every rank has finished its shards
    complete = broadcast(is_complete(out_dir, cfg), info)
    return LabelRunReport(out_dir, computed, plan["dropped"], complete)
