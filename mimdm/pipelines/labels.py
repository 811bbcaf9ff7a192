"""Label generation for the MI head: contexts, their ground-truth MI by probing, hidden states.

Contexts are drawn the way decoding visits them. Every *source* (the unit of the
train/validation/test split) is either a real puzzle with a unique solution (24-35 clues) or a
random solution grid, with equal probability. The generator takes ``contexts_per_source - 1``
random maskings of the source's solution at rates uniform in [``min_mask_rate``, 1] (0.05 by default), and one state from the
model's own sequential decoding trajectory (started from the puzzle's givens, or from a random
subset of 0-40 cells of the grid, and stopped after a random number of steps).
Each context is stored with its probed MI matrix (nats), the marginal entropies, and the MDM's
hidden states at the configured layers.

Storage is sharded and resumable: shard k is generated from its own random stream
``(seed, k)``, written atomically to ``shard_{k:05d}.pt`` (``shard_00003.pt``) and recorded in ``manifest.json``. An
interrupted run skips completed shards and produces exactly the files an uninterrupted run would.
Splits are by source (``source_id % 10``: 0 test, 1 validation, else train), never by context.

A complete label set packs into one file, ``labels.pt`` (`pack_labels`: no hidden states, the symmetric MI and
asymmetry matrices as upper triangles), small enough to ship with a trained model (`mimdm.core.shipped`);
`unpack_labels` rebuilds the shards from it, recomputing the hidden states with the model.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from mimdm.core.artifacts import artifact_dir, atomic_save, atomic_write_text, file_lock, load_checkpoint, verify_file
from mimdm.core.contract import MaskedModel
from mimdm.data import sudoku as sd
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.probing.exact import probe_mi
from mimdm.sampling.decoding import Sequential, decode

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
#: The folder lock of a shard folder (held while its manifest is read or written).
LOCK = ".lock"


def split_of(source_id: Tensor | np.ndarray | int):
    """Split index of a source: 2 (test) if ``id % 10 == 0``, 1 (validation) if 1, else 0 (train)."""
    r = source_id % 10
    if isinstance(r, (int, np.integer)):
        return 2 if r == 0 else 1 if r == 1 else 0
    return (r == 0) * 2 + (r == 1) * 1


@dataclass(frozen=True)
class LabelConfig:
    """Label set settings (counts in contexts; rates in (0, 1])."""

    n_shards: int = 12
    sources_per_shard: int = 20
    contexts_per_source: int = 4
    min_mask_rate: float = 0.05
    layers: tuple[int, ...] = (-1,)
    delta: float = 0.0
    batch_tokens: int | str = 81 * 512  # per forward pass; "auto": from free GPU memory (`mimdm.probing.exact.probe_mi`)
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def make_contexts(model: MaskedModel, cfg: LabelConfig, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The contexts of one shard: ``(grids [N, 81] int8, source_id [N] int64, kind [N] int8)``.

    ``kind`` is 0 for a random masking, 1 for a decoding-trajectory state. Deterministic in
    ``(cfg.seed, shard)`` and the model.
    """
    rng = np.random.default_rng([cfg.seed, shard])
    n_src = cfg.sources_per_shard
    grids, src, kind = [], [], []
    starts = []
    for s in range(n_src):
        sid = shard * n_src + s
        if rng.random() < 0.5:  # a real puzzle: its solution, and decoding starts from its givens
            p = sd.make_puzzle(int(rng.integers(24, 36)), rng)
            sol, start = p.solution, p.puzzle.copy()
        else:  # a solution grid; decoding starts from an under-determined subset of it
            sol = sd.random_solutions(1, rng)[0]
            start = sd.random_partial(sol, int(rng.integers(0, 41)), rng)
        for _ in range(cfg.contexts_per_source - 1):
            rate = rng.uniform(cfg.min_mask_rate, 1.0)
            n_clues = 81 - max(1, int(round(81 * rate)))
            grids.append(sd.random_partial(sol, n_clues, rng))
            src.append(sid)
            kind.append(0)
        starts.append(start)
    # trajectory states: decode each start sequentially and stop after a random number of steps
    start = np.stack(starts)
    res = decode(model, grids_to_tokens(start, model.device), Sequential("confidence"))
    order = res.step_of.cpu().numpy()
    final = res.tokens.cpu().numpy()
    for s in range(n_src):
        n_masked = int((start[s] == 0).sum())
        stop = int(rng.integers(0, max(1, n_masked - 1)))  # leave at least two cells masked
        keep = (order[s] >= 0) & (order[s] < stop)
        g = start[s].copy()
        g[keep] = final[s][keep] + 1
        grids.append(g)
        src.append(shard * n_src + s)
        kind.append(1)
    return np.stack(grids).astype(np.int8), np.array(src, dtype=np.int64), np.array(kind, dtype=np.int8)


@torch.no_grad()
def label_shard(model: MaskedModel, cfg: LabelConfig, shard: int) -> dict:
    """Generate one shard: contexts, probed MI, entropies, hidden states (see module docstring).

    Returns a dict of tensors: ``tokens [N, L]`` long, ``mi [N, L, L]`` float32 (nats),
    ``asymmetry [N, L, L]`` float16, ``entropy [N, L]`` float32 (nats), ``hidden_<layer> [N, L, D]``
    float16 for each configured layer, ``source_id [N]``, ``split [N]``, ``kind [N]``,
    ``nfe [N]`` (probing passes), ``seconds`` (probing wall-clock).
    """
    grids, src, kind = make_contexts(model, cfg, shard)
    tokens = grids_to_tokens(grids, model.device)
    res = probe_mi(model, tokens, delta=cfg.delta, batch_tokens=cfg.batch_tokens)
    out = {
        "tokens": tokens.cpu(), "mi": res.mi.float().cpu(), "asymmetry": res.asymmetry.half().cpu(),
        "entropy": res.entropy.float().cpu(), "source_id": torch.from_numpy(src),
        "split": torch.from_numpy(split_of(src)), "kind": torch.from_numpy(kind),
        "nfe": res.nfe.cpu(), "seconds": torch.tensor(res.seconds),
    }
    for layer in cfg.layers:
        out[f"hidden_{layer}"] = model(tokens, layer=layer).hidden.half().cpu()
    return out


def label_dir(model_dir: Path, cfg: LabelConfig, root: Path | None = None, create: bool = True) -> Path:
    """Artifact folder of a label set: keyed by the model's folder name and the label config (``create=False``: only
    the path, for a read-only lookup)."""
    return artifact_dir("labels", Path(model_dir).name, {"model": Path(model_dir).name, **cfg.to_dict()}, root, create)


@dataclass
class ShardReport:
    """What one `compute_shards` call did.

    Attributes:
        out_dir: the folder.
        computed: shards computed by this call, in order.
        dropped: manifest entries dropped because their file was gone or no longer matched its sha256.
        complete: every shard is in the manifest after the call.
    """

    out_dir: Path
    computed: list[int]
    dropped: list[int]
    complete: bool


def _read_manifest(out_dir: Path, config: dict) -> dict:
    man_path = out_dir / MANIFEST
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {"config": config, "shards": {}}
    if manifest["config"] != config:
        raise ValueError(f"{out_dir} holds labels of another config; use a new folder (see label_dir)")
    return manifest


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    manifest = {**manifest, "shards": dict(sorted(manifest["shards"].items(), key=lambda kv: int(kv[0])))}
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1))


def pending_shards(out_dir: Path, config: dict, n_shards: int) -> tuple[list[int], list[int]]:
    """``(shards not yet done, manifest entries dropped now)`` of the shard folder ``out_dir``, creating it with its
    manifest if missing. An entry whose file is gone or no longer matches its sha256 is dropped (with a warning) so
    the shard is computed again.

    Raises:
        ValueError: ``out_dir`` holds shards of another config.
    """
    out_dir = Path(out_dir)
    config = json.loads(json.dumps(config))  # as stored (tuples become lists)
    with file_lock(out_dir / LOCK):
        manifest = _read_manifest(out_dir, config)
        dropped = sorted(int(k) for k in manifest["shards"] if not _shard_intact(shard_path(out_dir, int(k))))
        for k in dropped:
            del manifest["shards"][str(k)]
        if dropped or not (out_dir / MANIFEST).exists():
            _write_manifest(out_dir, manifest)
    return [k for k in range(n_shards) if str(k) not in manifest["shards"]], dropped


def compute_shards(out_dir: Path, config: dict, n_shards: int, make_shard, desc: str = "probe labels",
                   progress: bool = True, max_new_shards: int | None = None, only: list[int] | None = None,
                   on_shard_done=None) -> ShardReport:
    """The one resumable shard loop (Sudoku and protein label sets, alone or on the ranks of a ``torchrun`` job):
    compute every shard missing from ``out_dir``.

    ``manifest.json`` records the config and each finished shard (context count, probing NFE, seconds). A shard
    file is written atomically (`mimdm.core.artifacts.atomic_save`, with its sha256) before its manifest entry, so
    an interrupted run resumes at the first unfinished shard; an entry whose file is gone or damaged is dropped and
    the shard computed again (`pending_shards`). Concurrent runs on one folder (two ``mimdm probe`` calls, or ranks)
    split the work: a shard is computed under an exclusive lock of its own (`mimdm.core.artifacts.file_lock`) and
    the manifest is read and written under the folder's lock, so no shard is computed twice and no entry is lost.
    A shard another run is computing is waited for at the end (and computed here if that run died).

    Args:
        config: the label config as a JSON-able dict (stored; a folder holding another config raises).
        make_shard: ``k -> dict`` of tensors with at least ``tokens [N, L]``, ``nfe [N]`` and ``seconds``.
        max_new_shards: stop after this many new shards (to bound a call; a later call continues); >= 0.
        only: compute only these shards (a rank's share); default all.
        on_shard_done: ``k -> None``, called after shard k's file and manifest entry are written.

    Returns:
        A `ShardReport`.

    Raises:
        ValueError: ``out_dir`` holds shards of another config, or ``max_new_shards`` < 0.
    """
    if max_new_shards is not None and max_new_shards < 0:
        raise ValueError(f"max_new_shards must be >= 0, got {max_new_shards}")
    out_dir = Path(out_dir)
    config = json.loads(json.dumps(config))
    todo, dropped = pending_shards(out_dir, config, n_shards)
    if only is not None:
        todo = [k for k in todo if k in set(only)]
    computed: list[int] = []

    def attempt(k: int, blocking: bool) -> bool:
        """Compute shard k unless it is done; False when another run holds it (non-blocking)."""
        lock = out_dir / f"shard_{k:05d}.lock"
        with file_lock(lock, blocking) as held:
            if not held:
                return False
            with file_lock(out_dir / LOCK):
                if str(k) in _read_manifest(out_dir, config)["shards"]:
                    lock.unlink(missing_ok=True)
                    return True  # finished by another run meanwhile
            for tmp in out_dir.glob(f"shard_{k:05d}.pt.*.tmp"):  # left by a run that died writing it
                tmp.unlink(missing_ok=True)
            shard = make_shard(k)
            atomic_save(shard, shard_path(out_dir, k))
            with file_lock(out_dir / LOCK):
                manifest = _read_manifest(out_dir, config)
                manifest["shards"][str(k)] = {"n_contexts": int(shard["tokens"].shape[0]),
                                              "nfe": int(shard["nfe"].sum()), "seconds": float(shard["seconds"])}
                _write_manifest(out_dir, manifest)
            computed.append(k)
            lock.unlink(missing_ok=True)
        if on_shard_done is not None:
            on_shard_done(k)
        return True

    budget = len(todo) if max_new_shards is None else max_new_shards
    waiting = []
    bar = tqdm(total=min(budget, len(todo)), desc=desc, unit="shard", disable=not progress)
    for k in todo:
        if len(computed) >= budget:
            break
        n = len(computed)
        if not attempt(k, blocking=False):
            waiting.append(k)
        bar.update(len(computed) - n)
    for k in waiting:  # held by another run: wait for it, and compute the shard if that run died
        if len(computed) >= budget:
            break
        n = len(computed)
        attempt(k, blocking=True)
        bar.update(len(computed) - n)
    bar.close()
    with file_lock(out_dir / LOCK):
        complete = len(_read_manifest(out_dir, config)["shards"]) == n_shards
    return ShardReport(out_dir, computed, dropped, complete)


def run_shards(out_dir: Path, config: dict, n_shards: int, make_shard, desc: str = "probe labels",
               progress: bool = True, max_new_shards: int | None = None) -> Path:
    """`compute_shards`, returning ``out_dir``."""
    return compute_shards(out_dir, config, n_shards, make_shard, desc, progress, max_new_shards).out_dir


def _shard_intact(path: Path) -> bool:
    """The shard file exists and matches the sha256 recorded when it was written (`mimdm.core.artifacts.verify_file`);
    a shard that does not is reported (a warning) and recomputed."""
    if not path.is_file():
        return False
    try:
        verify_file(path)
    except ValueError as e:
        warnings.warn(f"recomputing a label shard: {e}", stacklevel=3)
        return False
    return True


def shard_path(out_dir: Path, k: int) -> Path:
    """``out_dir/shard_0000k.pt``: the file of shard ``k`` of a label set."""
    return Path(out_dir) / f"shard_{k:05d}.pt"


def generate_labels(model: MaskedModel, cfg: LabelConfig, out_dir: Path, progress: bool = True,
                    max_new_shards: int | None = None) -> Path:
    """Generate every missing shard of a Sudoku label set into ``out_dir`` (resumable; `run_shards`).

    Args:
        max_new_shards: stop after this many new shards (to bound a call; a later call continues).

    Returns:
        ``out_dir``; ``manifest.json`` lists the completed shards with their context counts.

    Raises:
        ValueError: ``out_dir`` holds labels of another config.
    """
    model.eval()
    return run_shards(out_dir, cfg.to_dict(), cfg.n_shards, lambda k: label_shard(model, cfg, k), "probe labels",
                      progress, max_new_shards)


def is_complete(out_dir: Path, cfg: LabelConfig) -> bool:
    """True when every shard of ``cfg`` is recorded in the manifest and its file exists."""
    man = Path(out_dir) / "manifest.json"
    if not man.exists():
        return False
    done = json.loads(man.read_text())["shards"]
    return len(done) == cfg.n_shards and all(shard_path(out_dir, int(k)).is_file() for k in done)


def load_labels(out_dir: Path, split: str | None = None) -> dict:
    """Concatenate all shards (optionally one split: ``"train"``, ``"val"``, ``"test"``).

    Raises:
        FileNotFoundError: no manifest or no finished shard (labels not generated), or a listed shard file
            is missing.
        ValueError: unknown split.
    """
    out_dir = Path(out_dir)
    man = out_dir / "manifest.json"
    if not man.exists():
        raise FileNotFoundError(f"no label set at {out_dir} (manifest.json missing): generate it first")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    shards = sorted(int(k) for k in json.loads(man.read_text())["shards"])
    if not shards:
        raise FileNotFoundError(f"the label set at {out_dir} holds no finished shard: generate it first")
    missing = [str(shard_path(out_dir, k)) for k in shards if not shard_path(out_dir, k).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} shard files listed in {man} are missing (e.g. {missing[0]}); "
                                "run the label generation again to recompute them")
    parts = [load_checkpoint(shard_path(out_dir, k)) for k in shards]
    out = {}
    for key in parts[0]:
        if key == "seconds":
            out[key] = float(sum(float(p[key]) for p in parts))
            continue
        out[key] = torch.cat([p[key] for p in parts])
    if split is not None:
        sel = out["split"] == SPLITS.index(split)
        out = {k: (v[sel] if isinstance(v, torch.Tensor) and v.shape[:1] == sel.shape else v) for k, v in out.items()}
    return out


#: File name of a packed label set (`pack_labels`) inside its label folder.
PACKED = "labels.pt"
_PACKED_KIND = "sudoku_labels_packed"


def pack_labels(out_dir: Path) -> Path:
    """Pack the complete label set in ``out_dir`` into ``out_dir/labels.pt``.

    Kept: tokens (int8), the upper triangles (diagonal included) of ``mi`` (float32, exact) and ``asymmetry``
    (float16, as stored), entropies, source ids, splits, kinds, probing NFE, each context's shard and each shard's
    seconds, the manifest. Left out: the hidden states, a deterministic function of the tokens and the model
    (`unpack_labels` recomputes them). For the `cpu` label set (800 contexts) about 16 MB instead of 75.

    Returns:
        The written file.

    Raises:
        FileNotFoundError: no manifest, or a listed shard missing.
        ValueError: a shard's ``mi`` or ``asymmetry`` is not symmetric.
    """
    out_dir = Path(out_dir)
    man = json.loads((out_dir / "manifest.json").read_text()) if (out_dir / "manifest.json").exists() else None
    if man is None:
        raise FileNotFoundError(f"no label set at {out_dir} (manifest.json missing)")
    shards = sorted(int(k) for k in man["shards"])
    parts, seconds = [], []
    for k in shards:
        if not shard_path(out_dir, k).is_file():
            raise FileNotFoundError(f"{shard_path(out_dir, k)} listed in the manifest is missing")
        parts.append(load_checkpoint(shard_path(out_dir, k)))
        seconds.append(float(parts[-1]["seconds"]))
    L = parts[0]["tokens"].shape[1]
    iu = torch.triu_indices(L, L)
    packed = {"kind": _PACKED_KIND, "manifest": json.dumps(man), "shard": [], "shard_seconds": torch.tensor(seconds)}
    cols = {"tokens": [], "mi_triu": [], "asymmetry_triu": [], "entropy": [], "source_id": [], "split": [], "kind_": [],
            "nfe": []}
    for k, p in zip(shards, parts):
        for key in ("mi", "asymmetry"):
            if not torch.equal(p[key], p[key].transpose(1, 2)):
                raise ValueError(f"shard {k}: {key} is not symmetric; it cannot be packed as a triangle")
        cols["tokens"].append(p["tokens"].to(torch.int8))
        cols["mi_triu"].append(p["mi"][:, iu[0], iu[1]])
        cols["asymmetry_triu"].append(p["asymmetry"][:, iu[0], iu[1]])
        for key in ("entropy", "source_id", "split", "nfe"):
            cols[key].append(p[key])
        cols["kind_"].append(p["kind"])
        packed["shard"].append(torch.full((p["tokens"].shape[0],), k, dtype=torch.int64))
    packed.update({k: torch.cat(v) for k, v in cols.items()})
    packed["shard"] = torch.cat(packed["shard"])
    atomic_save(packed, out_dir / PACKED)
    return out_dir / PACKED


@torch.no_grad()
def unpack_labels(model: MaskedModel, cfg: LabelConfig, out_dir: Path) -> Path:
    """Rebuild the shards and manifest of ``out_dir`` from its packed ``labels.pt`` (`pack_labels`).

    Each shard's hidden states at ``cfg.layers`` are recomputed with ``model`` on that shard's contexts in one batch,
    as `label_shard` computed them; everything else is restored exactly.

    Returns:
        ``out_dir``.

    Raises:
        FileNotFoundError: no ``labels.pt``. ValueError: it is not a packed label set, or holds labels of another
        config.
    """
    out_dir = Path(out_dir)
    path = out_dir / PACKED
    if not path.is_file():
        raise FileNotFoundError(f"no packed label set at {path}")
    pk = load_checkpoint(path)
    if pk.get("kind") != _PACKED_KIND:
        raise ValueError(f"{path} is not a packed label set (kind={pk.get('kind')!r})")
    man = json.loads(pk["manifest"])
    if man["config"] != json.loads(json.dumps(cfg.to_dict())):
        raise ValueError(f"{path} holds labels of another config")
    model.eval()
    L = pk["tokens"].shape[1]
    iu = torch.triu_indices(L, L)

    def full(tri: Tensor) -> Tensor:
        m = torch.zeros(tri.shape[0], L, L, dtype=tri.dtype)
        m[:, iu[0], iu[1]] = tri
        m[:, iu[1], iu[0]] = tri
        return m

    for i, k in enumerate(sorted(int(k) for k in man["shards"])):
        sel = pk["shard"] == k
        tokens = pk["tokens"][sel].long()
        shard = {"tokens": tokens, "mi": full(pk["mi_triu"][sel]), "asymmetry": full(pk["asymmetry_triu"][sel]),
                 "entropy": pk["entropy"][sel], "source_id": pk["source_id"][sel], "split": pk["split"][sel],
                 "kind": pk["kind_"][sel], "nfe": pk["nfe"][sel], "seconds": pk["shard_seconds"][i]}
        dev_tokens = tokens.to(model.device)
        for layer in cfg.layers:
            shard[f"hidden_{layer}"] = model(dev_tokens, layer=layer).hidden.half().cpu()
        atomic_save(shard, shard_path(out_dir, k))
    tmp = (out_dir / "manifest.json").with_suffix(".tmp")
    tmp.write_text(json.dumps(man, indent=1))
    tmp.replace(out_dir / "manifest.json")
    return out_dir
