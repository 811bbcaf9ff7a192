"""Where trained artifacts live, keyed by their configuration.

Every trained object (a model, a label set, a head) is stored under
``<root>/<kind>/<name>-<hash>/`` where ``hash`` is a short digest of its full configuration, so a
rerun with the same configuration finds it instead of retraining, and a changed configuration
never picks up a stale artifact. ``root`` is ``$MIMDM_ARTIFACTS`` if set, else ``artifacts/`` at
the top of the repository (git-ignored).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mimdm.core.device import resolve_device

REPO_ROOT = Path(__file__).resolve().parents[2]


def artifacts_root() -> Path:
    """The root folder of all artifacts (``$MIMDM_ARTIFACTS`` or ``<repo>/artifacts``)."""
    env = os.environ.get("MIMDM_ARTIFACTS")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "artifacts"


def config_hash(config: dict) -> str:
    """A 10-hex-digit digest of a JSON-serialisable configuration (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def artifact_dir(kind: str, name: str, config: dict, root: Path | None = None, create: bool = True) -> Path:
    """``<root>/<kind>/<name>-<config_hash(config)>``, created if missing with ``config.json`` inside
    (``create=False``: only the path, nothing is written; for read-only lookups)."""
    d = (root or artifacts_root()) / kind / f"{name}-{config_hash(config)}"
    if not create:
        return d
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "config.json"
    if not cfg.exists():
        cfg.write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return d


def sidecar_path(path: Path) -> Path:
    """``<file>.sha256``: the digest `atomic_save` records next to each file it writes."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_save(obj, path: Path) -> None:
    """``torch.save`` to a temporary file of its own and rename, so an interrupted save never leaves a torn file and
    two writers never share a temporary file; then record the file's sha256 in `sidecar_path` (checked by
    `verify_file` and `load_checkpoint`, so bytes changed after the save are caught). The rename and the record happen
    under an exclusive ``flock`` on the folder, so concurrent writers leave one intact pair."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        digest = file_sha256(Path(tmp))
        # the rename and the digest's record happen under one lock (on the folder: no lock file left behind), so two
        # writers never pair one's file with the other's digest
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            os.replace(tmp, path)
            atomic_write_text(sidecar_path(path), f"{digest}  {path.name}\n")
        finally:
            os.close(dir_fd)  # releases the lock
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file of its own and a rename (no torn or shared temporary files)."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True):
    """An exclusive advisory lock (``fcntl.flock``) on ``path`` (created if missing) for the ``with`` block.

    The operating system releases it when the holder exits or dies, so a crashed run never leaves a stale lock.
    Yields True when the lock is held; with ``blocking=False`` yields False at once if another process holds it.
    Used so that concurrent runs on one artifact folder neither collide nor repeat each other's work
    (`mimdm.pipelines.labels.compute_shards`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def verify_file(path: Path) -> None:
    """Check ``path`` against the sha256 recorded by `atomic_save` (no record: nothing to check).

    Raises:
        ValueError: the file's bytes differ from the recorded digest (modified, truncated or corrupted since it was
            written).
    """
    side = sidecar_path(path)
    if not side.is_file():
        return
    want = side.read_text().split()[0] if side.read_text().strip() else ""
    got = file_sha256(path)
    if got != want:
        raise ValueError(f"{path} does not match the sha256 recorded when it was written ({side.name}: "
                         f"{want[:12] or 'empty'}…, file: {got[:12]}…): it was modified, truncated or corrupted; "
                         "delete it (and its .sha256) and train again")


#: Messages of torch.load's RuntimeErrors that mean the file itself cannot be read.
_UNREADABLE = ("PytorchStreamReader", "zip archive", "central directory", "invalid header", "archive is corrupted")


def load_checkpoint(path: Path, device: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with ``weights_only=True`` onto ``device`` (checked by `mimdm.core.device.resolve_device`).

    Raises:
        FileNotFoundError: no file at ``path`` (the message says how to produce it).
        ValueError: the file is not a readable checkpoint (torn, truncated or not written by torch.save), its bytes
            differ from the sha256 `atomic_save` recorded (`verify_file`), or ``device`` is not a device name.
        RuntimeError: ``device`` asks for CUDA on a machine without it.
    """

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path}. Train it first (e.g. `mimdm train --profile cpu`) "
            "or point MIMDM_ARTIFACTS at the folder that holds it."
        )
    device = resolve_device(device)
    verify_file(path)
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as e:
        msg = str(e).partition("\n")[0][:200]
        if isinstance(e, RuntimeError) and not any(s in msg for s in _UNREADABLE):
            raise  # e.g. CUDA out of memory while loading: the file is fine
        raise ValueError(f"{path} is not a readable checkpoint ({type(e).__name__}: {msg or 'empty file'}); "
                         "it may be torn or truncated: delete it and train again") from e


def tensor_sha256(t: Tensor | np.ndarray) -> str:
    """Hex sha256 of a tensor's dtype, shape and values (on CPU, contiguous)."""
    a = t.detach().cpu().contiguous().numpy() if isinstance(t, Tensor) else np.ascontiguousarray(t)
    h = hashlib.sha256(f"{a.dtype}|{a.shape}|".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def module_sha256(module: torch.nn.Module) -> str:
    """Hex sha256 of a module's class name and state dict (names, dtypes, shapes, values), in name order."""
    h = hashlib.sha256(type(module).__name__.encode())
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor_sha256(t).encode())
    return h.hexdigest()


def git_commit() -> str | None:
    """The current commit hash of the repository, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
