"""Sharded MI-label generation and MI-head training on several processes (``torch.distributed``).

Run under ``torchrun`` (one process per GPU, or several CPU processes with the gloo backend)::

    torchrun --nproc_per_node 2 -m mimdm.distributed labels --profile smoke
    torchrun --nproc_per_node 2 -m mimdm.distributed head --profile smoke

Both also run as a plain ``python -m mimdm.distributed ...`` (world size 1, no process group).

**Labels** (`generate_labels_distributed`). The label set is the one `mimdm.labels.generate_labels`
writes, in the same folder (`mimdm.labels.label_dir`), with the same files and the same tensors:
shard k depends only on ``(cfg, k)`` and the model, so who computes it does not matter. Protocol:

0. the ranks compare their models' weights (`model_fingerprint`; `RuntimeError` if they differ);
1. rank 0 validates the folder: the manifest's config must be ``cfg`` (else `ValueError` on every
   rank); completion markers left by a crashed run are merged into the manifest when the shard file
   they describe is intact (size and SHA-256 match), otherwise dropped; manifest entries whose shard
   file is missing are dropped; stale ``*.tmp`` files are removed;
2. rank 0 broadcasts the list of incomplete shards ``todo`` (sorted); rank r takes
   ``todo[r::world_size]`` (so, in a fresh run, shards r, r+N, r+2N, ...);
3. each rank writes each of its shards atomically (``shard_0000k.pt`` via a temporary file and a
   rename), then a completion marker ``shard_0000k.done.json`` (atomically too) holding the manifest
   entry and the shard file's size and SHA-256;
4. only rank 0 writes ``manifest.json``: it merges the markers present after each of its own shards
   and, after a final barrier, all of them; merged markers are deleted, so the finished folder holds
   exactly what a single-process run writes.

A rank that crashes mid-shard leaves at most a ``*.tmp`` file, or a torn ``shard_*.pt`` without a
marker; neither is in the manifest, so the shard is recomputed on restart, while shards whose
marker was written are kept. All ranks must see the same file system (one machine, or a shared one).

**Head** (`train_head_ddp`): `mimdm.heads.train_head` with `torch.nn.parallel.DistributedDataParallel`;
see its docstring for how the batches are split and how it relates to `train_head`.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .heads import HeadTrainConfig, MIHead, MIHeadConfig, make_optimizer, mi_loss, save_head
from .labels import LabelConfig, label_shard, shard_path
from .artifacts import atomic_save, file_sha256
from .models.base import MaskedModel

MANIFEST = "manifest.json"
MARKER_SUFFIX = ".done.json"


# ----------------------------------------------------------------------------------------------
# process group


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


def _barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


def _broadcast(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank (a picklable object)."""
    if not info.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(obj, info: DistInfo) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not info.active:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def _allreduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Element-wise sum over ranks of a list of floats (float64)."""
    if not info.active:
        return list(values)
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


# ----------------------------------------------------------------------------------------------
# labels


def marker_path(out_dir: Path, k: int) -> Path:
    """Completion marker of shard ``k``: ``out_dir/shard_0000k.done.json`` (removed once merged)."""
    return Path(out_dir) / f"shard_{k:05d}{MARKER_SUFFIX}"


def _write_json_atomic(obj, path: Path, indent: int | None = None) -> None:
    tmp = path.with_suffix(".tmp") if path.name == MANIFEST else path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent))
    os.replace(tmp, path)


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    """Atomically write the manifest, shards in ascending order (format of `generate_labels`)."""
    manifest = {**manifest, "shards": {str(k): manifest["shards"][str(k)]
                                       for k in sorted(int(s) for s in manifest["shards"])}}
    _write_json_atomic(manifest, out_dir / MANIFEST, indent=1)


def _merge_markers(out_dir: Path, manifest: dict, n_shards: int) -> list[int]:
    """Merge valid completion markers into ``manifest`` (in memory and on disk); drop invalid ones.

    A marker is valid when its shard file exists with the recorded size and SHA-256. Returns the
    shards newly added to the manifest. Rank 0 only.
    """
    added, seen = [], []
    for m in sorted(out_dir.glob(f"shard_*{MARKER_SUFFIX}")):
        seen.append(m)
        try:
            k = int(m.name[len("shard_"):-len(MARKER_SUFFIX)])
            rec = json.loads(m.read_text())
            p = shard_path(out_dir, k)
            ok = 0 <= k < n_shards and p.is_file() and p.stat().st_size == rec["bytes"] and file_sha256(p) == rec["sha256"]
        except (ValueError, KeyError, OSError):
            ok = False
        if ok and str(k) not in manifest["shards"]:
            manifest["shards"][str(k)] = rec["entry"]
            added.append(k)
    if added:
        _write_manifest(out_dir, manifest)
    for m in seen:  # after the manifest is on disk: a crash in between leaves a harmless marker
        m.unlink(missing_ok=True)
    return added


@dataclass
class LabelRunReport:
    """What one `generate_labels_distributed` call did (the same on every rank).

    Attributes:
        out_dir: the label folder.
        computed: shards computed in this call, per rank (``computed[r]`` by rank r).
        recovered: shards a previous, crashed run had finished (valid markers merged at start).
        dropped: manifest entries dropped at start because their shard file was missing.
        complete: every shard of the config is in the manifest.
    """

    out_dir: Path
    computed: list[list[int]] = field(default_factory=list)
    recovered: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    complete: bool = False

    @property
    def all_computed(self) -> list[int]:
        """Every shard computed in this call, sorted."""
        return sorted(k for c in self.computed for k in c)


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (hex) of a model's state dict (names, dtypes, shapes, bytes): equal weights, equal digest."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _prepare_label_dir(out_dir: Path, cfg: LabelConfig) -> tuple[dict, list[int], list[int]]:
    """Rank 0: validate ``out_dir``, recover a crashed run's markers; returns (manifest, recovered, dropped).

    Raises:
        ValueError: the folder holds labels of another config.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    man_path = out_dir / MANIFEST
    config = json.loads(json.dumps(cfg.to_dict()))  # as stored (tuples become lists)
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {"config": config, "shards": {}}
    if manifest["config"] != config:
        raise ValueError(f"{out_dir} holds labels of another config; use a new folder (see label_dir)")
    for tmp in out_dir.glob("*.tmp"):  # torn temporaries of a crashed run; nobody else writes yet
        tmp.unlink(missing_ok=True)
    dropped = [int(k) for k in manifest["shards"] if not shard_path(out_dir, int(k)).is_file()]
    for k in dropped:
        del manifest["shards"][str(k)]
    if dropped:
        _write_manifest(out_dir, manifest)
    recovered = _merge_markers(out_dir, manifest, cfg.n_shards)
    return manifest, recovered, dropped


def generate_labels_distributed(model: MaskedModel, cfg: LabelConfig, out_dir: Path, progress: bool = True,
                                max_new_shards: int | None = None,
                                on_shard_done: Callable[[int], None] | None = None) -> LabelRunReport:
    """Generate every missing shard of a label set, shards spread over the ranks of a ``torchrun`` job.

    Call it on every rank with the same arguments (the same model weights on each rank: load them
    from one checkpoint). Joins the process group from the environment if none exists
    (`init_distributed`: gloo on CPU, nccl with CUDA); with world size 1 it runs alone. The finished
    folder equals that of `mimdm.labels.generate_labels(model, cfg, out_dir)`: the same files
    (``manifest.json``, ``shard_0000k.pt``), the same stored tensors (bit for bit when every rank
    computes on the same kind of device with the same kernels and thread count as the reference),
    the same manifest apart from the timing fields ``seconds``. See the module docstring for the
    protocol and its crash behaviour.

    Args:
        model: the MDM (on this rank's device), in eval mode or not (set to eval here).
        cfg: label settings (`mimdm.labels.LabelConfig`).
        out_dir: the label folder (normally `mimdm.labels.label_dir`); shared by all ranks.
        progress: a progress bar on rank 0 (over its own shards).
        max_new_shards: compute at most this many shards in this call, over all ranks (the first
            ones of the sorted incomplete shards); a later call continues.
        on_shard_done: called as ``on_shard_done(k)`` on the rank that computed shard ``k``, after
            its file and completion marker are written (for logging or fault injection in tests).

    Returns:
        A `LabelRunReport` (identical on every rank), returned after ``manifest.json`` is final.

    Raises:
        ValueError: ``out_dir`` holds labels of another config (on every rank).
        RuntimeError: the ranks' models differ (`model_fingerprint`; on every rank), or rank 0
            could not prepare ``out_dir`` (rank 0 raises the original error, the others this).
    """
    info = init_distributed("nccl" if model.device.type == "cuda" else "gloo")  # the existing group, if any
    out_dir = Path(out_dir)
    if info.active and len(set(_gather(model_fingerprint(model), info))) != 1:
        raise RuntimeError("the ranks hold different model weights: load the same checkpoint on every rank")
    plan: dict = {}
    if info.is_main:
        try:
            manifest, recovered, dropped = _prepare_label_dir(out_dir, cfg)
            todo = [k for k in range(cfg.n_shards) if str(k) not in manifest["shards"]]
            if max_new_shards is not None:
                todo = todo[:max(0, max_new_shards)]
            plan = {"todo": todo, "recovered": recovered, "dropped": dropped}
        except Exception as e:  # tell the other ranks instead of leaving them at the broadcast
            _broadcast({"error": f"{type(e).__name__}: {e}", "value_error": isinstance(e, ValueError)}, info)
            raise
    plan = _broadcast(plan, info)
    if "error" in plan:
        raise (ValueError if plan["value_error"] else RuntimeError)(f"rank 0 failed to prepare {out_dir}: {plan['error']}")
    mine = plan["todo"][info.rank::info.world_size]
    model.eval()
    done = []
    for k in tqdm(mine, desc=f"probe labels (rank {info.rank}/{info.world_size})", unit="shard",
                  disable=not (progress and info.is_main)):
        shard = label_shard(model, cfg, k)
        p = shard_path(out_dir, k)
        atomic_save(shard, p)
        entry = {"n_contexts": int(shard["tokens"].shape[0]), "nfe": int(shard["nfe"].sum()),
                 "seconds": float(shard["seconds"])}
        _write_json_atomic({"entry": entry, "bytes": p.stat().st_size, "sha256": file_sha256(p), "rank": info.rank},
                           marker_path(out_dir, k))
        done.append(k)
        if info.is_main:  # keep the manifest current (crash resilience, visible progress)
            _merge_markers(out_dir, manifest, cfg.n_shards)
        if on_shard_done is not None:
            on_shard_done(k)
    computed = _gather(done, info)  # also the barrier: every rank has finished its shards
    complete = False
    if info.is_main:
        _merge_markers(out_dir, manifest, cfg.n_shards)
        complete = len(manifest["shards"]) == cfg.n_shards
        if not (out_dir / MANIFEST).exists():  # nothing to do and no manifest yet (n_shards == 0)
            _write_manifest(out_dir, manifest)
    complete = _broadcast(complete, info)  # also the barrier: the manifest is final
    return LabelRunReport(out_dir, computed, plan["recovered"], plan["dropped"], complete)


# ----------------------------------------------------------------------------------------------
# head


def _split(idx: np.ndarray, world: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s contiguous part of ``idx`` (``np.array_split`` into ``world`` parts)."""
    return np.array_split(idx, world)[rank] if world > 1 else idx


def _val_loss_sum(head: MIHead, data: dict, layer: int, kind: str, mask_id: int, info: DistInfo,
                  device: torch.device, batch_size: int = 64, scale: float = 0.01,
                  weight_scale: float = 0.05) -> tuple[float, int]:
    """Rank's share of the validation loss: batches ``i ≡ rank (mod world)`` of `evaluate_loss`'s batches.

    Returns ``(sum over its batches of loss × batch size, number of contexts)``.
    """
    head.eval()
    n = len(data["tokens"])
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i, s in enumerate(range(0, n, batch_size)):
            if i % info.world_size != info.rank:
                continue
            b = torch.arange(s, min(s + batch_size, n))
            h = data[f"hidden_{layer}"][b].to(device)
            masked = (data["tokens"][b] == mask_id).to(device)
            pred = head(h, masked, data["entropy"][b].to(device))
            tot += mi_loss(pred, data["mi"][b].to(device), masked, kind, scale, weight_scale).item() * len(b)
            cnt += len(b)
    return tot, cnt


def train_head_ddp(train: dict, val: dict, head_cfg: MIHeadConfig, cfg: HeadTrainConfig, mask_id: int,
                   progress: bool = True, save_path: Path | None = None, extra: dict | None = None,
                   device: str | torch.device | None = None) -> tuple[MIHead, list[dict]]:
    """`mimdm.heads.train_head` on the ranks of a ``torchrun`` job, with `DistributedDataParallel`.

    Call it on every rank with the same label splits (each rank loads them). Joins the process
    group from the environment if none exists (`init_distributed`).

    Data split. Every rank draws the same permutation of the training contexts per epoch (numpy
    generator seeded with ``cfg.seed``, as `train_head`) and cuts it into the same global batches of
    ``cfg.batch_size``; each global batch is split into ``world_size`` contiguous parts
    (``np.array_split``), rank r taking part r, so in an epoch the ranks see disjoint slices whose
    union is the training split, in as many optimiser steps as `train_head`. Each rank's loss (the
    pair-weighted `mi_loss` over its part) is scaled by ``world_size × n_r / n_batch`` so that DDP's
    gradient average is the context-weighted mean of the parts' gradients. Validation: the batches
    of `mimdm.heads.evaluate_loss` (64 contexts) are dealt round-robin to the ranks and the sums of
    loss × batch size and of contexts are all-reduced, so the validation loss is that of
    `evaluate_loss` up to float64 summation order, and identical on all ranks (so are the
    early-stopping decisions). The logged ``train_loss`` is the mean over steps of the
    context-weighted mean of the parts' losses.

    Relation to `train_head`: with world size 1 (no process group; DDP is not used) it runs the
    same operations in the same order and returns the same weights and log bit for bit (apart from
    ``seconds``). With N > 1 ranks the gradient of a step is the context-weighted mean of the
    gradients of the N parts' losses rather than the gradient of one pair-weighted loss over the
    whole batch (`mi_loss` weights pairs, not contexts), so results differ slightly; they do not
    depend on anything but ``cfg``, the data and N. All ranks hold identical weights throughout
    (same initialisation, DDP-averaged gradients, same AdamW steps).

    Args:
        train, val: label splits from `mimdm.labels.load_labels` (with ``hidden_<cfg.layer>``).
        head_cfg, cfg: head architecture and training settings.
        mask_id: the MDM's mask token id.
        progress: a progress bar on rank 0.
        save_path: if given, rank 0 saves the best head there (`mimdm.heads.save_head`, with
            ``extra`` plus ``{"trainer": "ddp", "world_size": N}``) before all ranks return.
        device: where to train; default ``cuda:LOCAL_RANK`` under an nccl group, else the CPU.

    Returns:
        ``(head with the best validation loss (unwrapped, eval mode, on ``device``), log)`` on
        every rank; log entries ``{"epoch", "train_loss", "val_loss", "seconds"}``.

    Raises:
        KeyError: the labels hold no hidden states of ``cfg.layer``.
        ValueError: an empty training or validation split (as `train_head`).
        RuntimeError: the validation loss was never finite.
    """
    key = f"hidden_{cfg.layer}"
    for name, split in (("training", train), ("validation", val)):
        if len(split.get("tokens", ())) == 0:
            raise ValueError(f"the {name} split holds no contexts: generate more label shards "
                             "(mimdm.labels) or change the split")
    if key not in train:
        raise KeyError(f"labels hold no hidden states of layer {cfg.layer} (have: {[k for k in train if k.startswith('hidden_')]})")
    info = init_distributed()
    if device is None:
        nccl = info.active and dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    head = MIHead(head_cfg).to(device)
    net = head
    if info.active:
        net = torch.nn.parallel.DistributedDataParallel(
            head, device_ids=[device.index] if device.type == "cuda" else None)
    n = len(train["tokens"])
    opt, sched = make_optimizer(head, cfg, math.ceil(n / cfg.batch_size))
    best, best_state, bad, log = float("inf"), None, 0, []
    t0 = time.perf_counter()
    for epoch in tqdm(range(cfg.epochs), desc=f"train MI head (DDP x{info.world_size})", unit="epoch",
                      disable=not (progress and info.is_main)):
        net.train()
        losses = []
        perm = rng.permutation(n)
        for s in range(0, n, cfg.batch_size):
            glob = perm[s:s + cfg.batch_size]
            b = torch.from_numpy(_split(glob, info.world_size, info.rank))
            masked = (train["tokens"][b] == mask_id).to(device)
            pred = net(train[key][b].to(device), masked, train["entropy"][b].to(device))
            loss = mi_loss(pred, train["mi"][b].to(device), masked, cfg.loss, cfg.loss_scale, cfg.loss_weight_scale)
            if info.active:
                frac = len(b) / len(glob)
                losses.append(loss.item() * frac)
                loss = loss * (info.world_size * frac)
            else:
                losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
        if info.active:
            losses = _allreduce_sum(losses, info)
        tot, cnt = _val_loss_sum(head, val, cfg.layer, cfg.loss, mask_id, info, device, scale=cfg.loss_scale,
                                 weight_scale=cfg.loss_weight_scale)
        tot, cnt = _allreduce_sum([tot, float(cnt)], info)
        v = tot / max(1, int(cnt))
        log.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "val_loss": v,
                    "seconds": time.perf_counter() - t0})
        if v < best - 1e-6:
            best, best_state, bad = v, {k: x.clone() for k, x in head.state_dict().items()}, 0
        else:
            bad += 1
            if cfg.patience is not None and bad >= cfg.patience:
                break
    if best_state is None:
        raise RuntimeError("the validation loss was never finite: check the labels (empty validation split?)")
    head.load_state_dict(best_state)
    head.eval()
    if save_path is not None and info.is_main:
        save_head(head, Path(save_path), cfg, log, {**(extra or {}), "trainer": "ddp", "world_size": info.world_size})
    _barrier(info)
    return head, log


# ----------------------------------------------------------------------------------------------
# command line


def _model_of_profile(profile, info: DistInfo, device: str | None):
    """The profile's Sudoku MDM on every rank: rank 0 loads or trains it first, the others then load it."""
    from .models.zoo import profile_sudoku_mdm

    if device is None:
        device = f"cuda:{info.local_rank}" if torch.cuda.is_available() else "cpu"
    if info.is_main:
        out = profile_sudoku_mdm(profile, device=device, progress=True)
    _barrier(info)
    if not info.is_main:
        out = profile_sudoku_mdm(profile, device=device, progress=False, train=False)
    return out


def head_artifact_path(labels: Path, head_cfg: MIHeadConfig, train_cfg: HeadTrainConfig, world_size: int) -> Path:
    """Where `main` saves a head: with world size 1, the cache path of
    `mimdm.experiments.mi_head.load_or_train_head` (same config hash: the result is identical);
    with N > 1 the config also holds ``ddp_world_size`` (the weights differ slightly, see
    `train_head_ddp`), so the book's cached head is never replaced by a DDP one."""
    from .artifacts import artifact_dir

    config = {"labels": Path(labels).name, "head": head_cfg.to_dict(), "train": train_cfg.to_dict()}
    if world_size > 1:
        config["ddp_world_size"] = world_size
    return artifact_dir("mi_head", Path(labels).name, config) / "head.pt"


def main(argv: list[str] | None = None) -> int:
    """``[torchrun --nproc_per_node N] python -m mimdm.distributed {labels,head} --profile P [--device D]``.

    ``labels``: the profile's MDM (rank 0 trains it if it is not cached, the others wait), then its
    label set in `mimdm.labels.label_dir`, shards spread over the ranks. ``head``: the label set
    (generated first if incomplete), then the profile's main MI head with `train_head_ddp`, saved
    by rank 0 at `head_artifact_path`. Prints the paths on rank 0.
    """
    from .experiments.mi_head import head_config_for
    from .labels import label_dir, load_labels
    from .profiles import PROFILES, get_profile

    ap = argparse.ArgumentParser(prog="python -m mimdm.distributed",
                                 description="MI labels / MI head on several processes (run under torchrun).")
    ap.add_argument("what", choices=["labels", "head"])
    ap.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    ap.add_argument("--device", default=None, help="cpu | cuda:N (default: cuda:LOCAL_RANK if CUDA is available, else cpu)")
    ap.add_argument("--backend", default=None, help="gloo | nccl (default: nccl for CUDA devices, else gloo)")
    ap.add_argument("--max-new-shards", type=int, default=None, help="labels: compute at most this many shards now")
    args = ap.parse_args(argv)

    p = get_profile(args.profile)
    dev = args.device
    if dev is None:
        dev = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("nccl" if str(dev).startswith("cuda") else "gloo")
    info = init_distributed(backend)
    model, rec = _model_of_profile(p, info, dev)
    model_dir = Path(rec["path"]).parent
    if info.is_main:
        label_dir(model_dir, p.labels)  # creates the folder and its config.json once
    _barrier(info)
    labels = label_dir(model_dir, p.labels)
    rep = generate_labels_distributed(model, p.labels, labels, max_new_shards=args.max_new_shards)
    if info.is_main:
        print(f"[mimdm] MI labels ({'complete' if rep.complete else 'incomplete'}; computed now "
              f"{rep.all_computed} on {info.world_size} process(es)) -> {labels}", flush=True)
    if args.what == "head":
        if not rep.complete:
            raise SystemExit("the label set is incomplete (--max-new-shards?): run `labels` until it is complete")
        hcfg = head_config_for(p, model)
        path = head_artifact_path(labels, hcfg, p.head_train, info.world_size) if info.is_main else None
        path = _broadcast(path, info)
        if path.exists():
            if info.is_main:
                print(f"[mimdm] MI head already trained -> {path}", flush=True)
        else:
            # alone: on the CPU, like load_or_train_head (bit-identical, so the shared cache path is right)
            train_dev = dev if (backend == "nccl" and info.active) else "cpu"
            train_head_ddp(load_labels(labels, "train"), load_labels(labels, "val"), hcfg, p.head_train,
                           model.mask_id, progress=info.is_main, save_path=path, device=train_dev)
            if info.is_main:
                print(f"[mimdm] MI head (DDP x{info.world_size}) -> {path}", flush=True)
    if info.active:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
