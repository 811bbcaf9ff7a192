"""Where trained artifacts live, keyed by their configuration.

Every trained object (a model, a label set, a head) is stored under
``<root>/<kind>/<name>-<hash>/`` where ``hash`` is a short digest of its full configuration, so a
rerun with the same configuration finds it instead of retraining, and a changed configuration
never picks up a stale artifact. ``root`` is ``$MIMDM_ARTIFACTS`` if set, else ``artifacts/`` at
the top of the repository (git-ignored).
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def artifacts_root() -> Path:
    """The root folder of all artifacts (``$MIMDM_ARTIFACTS`` or ``<repo>/artifacts``)."""
    env = os.environ.get("MIMDM_ARTIFACTS")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "artifacts"


def config_hash(config: dict) -> str:
    """A 10-hex-digit digest of a JSON-serialisable configuration (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def artifact_dir(kind: str, name: str, config: dict, root: Path | None = None) -> Path:
    """``<root>/<kind>/<name>-<config_hash(config)>``, created if missing, with ``config.json`` inside."""
    d = (root or artifacts_root()) / kind / f"{name}-{config_hash(config)}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "config.json"
    if not cfg.exists():
        cfg.write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return d


def atomic_save(obj, path: Path) -> None:
    """``torch.save`` to a temporary file and rename, so an interrupted save never leaves a torn file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


#: Messages of torch.load's RuntimeErrors that mean the file itself cannot be read.
_UNREADABLE = ("PytorchStreamReader", "zip archive", "central directory", "invalid header", "archive is corrupted")


def load_checkpoint(path: Path, device: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with ``weights_only=True`` onto ``device`` (checked by `mimdm.device.resolve_device`).

    Raises:
        FileNotFoundError: no file at ``path`` (the message says how to produce it).
        ValueError: the file is not a readable checkpoint (torn, truncated or not written by torch.save),
            or ``device`` is not a device name.
        RuntimeError: ``device`` asks for CUDA on a machine without it.
    """
    from .device import resolve_device

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path}. Train it first (e.g. `mimdm train --profile cpu`) "
            "or point MIMDM_ARTIFACTS at the folder that holds it."
        )
    device = resolve_device(device)
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
        msg = str(e).partition("\n")[0][:200]
        if isinstance(e, RuntimeError) and not any(s in msg for s in _UNREADABLE):
            raise  # e.g. CUDA out of memory while loading: the file is fine
        raise ValueError(f"{path} is not a readable checkpoint ({type(e).__name__}: {msg or 'empty file'}); "
                         "it may be torn or truncated: delete it and train again") from e


def git_commit() -> str | None:
    """The current commit hash of the repository, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
