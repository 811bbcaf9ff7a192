"""Headline numbers of each chapter, written to ``book/results/<chapter>.json``.

Each file records the values together with the profile, its full configuration, the device,
library versions and the git commit, so any number quoted in the book can be traced.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from pathlib import Path

import torch

from .artifacts import git_commit


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _clean(x.tolist())
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_results(chapter: str, values: dict, profile, device: str, results_dir: str | Path = "results") -> Path:
    """Write ``<results_dir>/<chapter>.json`` and return its path.

    Args:
        chapter: file stem, e.g. ``"ground_truth_mi"``.
        values: headline numbers (JSON-serialisable after converting tensors/numpy scalars;
            non-finite floats become null).
        profile: the `mimdm.profiles.Profile` used.
        device: the device the chapter ran on.
    """
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    rec = {
        "chapter": chapter,
        "profile": profile.name,
        "values": _clean(values),
        "config": _clean(profile.to_dict()),
        "device": str(device),
        "commit": git_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    path = d / f"{chapter}.json"
    path.write_text(json.dumps(rec, indent=2, sort_keys=False) + "\n")
    return path


def read_results(chapter: str, results_dir: str | Path = "results") -> dict:
    """Read ``<results_dir>/<chapter>.json``.

    Raises:
        FileNotFoundError: the chapter has not been run (the message names the file).
    """
    path = Path(results_dir) / f"{chapter}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}: run the chapter first (mimdm book)")
    return json.loads(path.read_text())
