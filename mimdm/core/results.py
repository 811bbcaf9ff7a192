"""Headline numbers of each chapter: the book's record ``book/results/<chapter>.json``, or a run's own copy.

Each file records the values together with the profile, its full configuration, the device,
library versions and the git commit, so any number quoted in the book can be traced. Only the main job
(`mimdm book`, ``record=True``) under a full profile (`RECORD_PROFILES`) writes the record; every other run of a
chapter writes ``book/results/<profile>/<chapter>.json`` (git-ignored), so rerunning a chapter never replaces the
committed record by accident.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from pathlib import Path

import torch

from mimdm.core.artifacts import git_commit, module_sha256


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


#: Profiles whose runs may write the book's record (`write_results` with ``record=True``); a ``smoke`` run only
#: tests that the code runs, so its numbers never become the record.
RECORD_PROFILES = ("cpu", "paper")


def results_path(chapter: str, profile_name: str, results_dir: str | Path = "results", record: bool = False) -> Path:
    """Where `write_results` writes: ``<results_dir>/<chapter>.json`` for the record (``record`` and a profile of
    `RECORD_PROFILES`), else ``<results_dir>/<profile>/<chapter>.json``."""
    d = Path(results_dir)
    return d / f"{chapter}.json" if record and profile_name in RECORD_PROFILES else d / profile_name / f"{chapter}.json"


def results_name(chapter: str, puzzle_file: str | Path | None = None, model_path: str | Path | None = None) -> str:
    """The results file stem of a Sudoku chapter run: ``chapter`` for the study's own puzzles and model, else with
    the puzzle file's stem and the model folder's name (or file stem) appended, so a run on another set or model
    never replaces the study's results (as chapter 4 does for other families)."""
    parts = [chapter]
    if puzzle_file is not None:
        parts.append(Path(puzzle_file).stem)
    if model_path is not None:
        parts.append(Path(model_path).parent.name or Path(model_path).stem)
    return "_".join(parts)


def run_banner(profile, device: str) -> str:
    """Markdown for the top of a chapter page: the profile, device, commit and date (UTC) of the run; under a profile
    outside `RECORD_PROFILES` (``smoke``) first a warning that its numbers only test that the code runs."""
    commit = git_commit()
    line = (f"*Run: profile `{profile.name}`, device `{device}`, commit `{commit[:10] if commit else 'unknown'}`, "
            f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC.*")
    if profile.name in RECORD_PROFILES:
        return line
    return (f"**This is a `{profile.name}` run: tiny models and data that only test that the code runs. Its numbers "
            f"and the sentences built from them say nothing about the method; the book's results are from profile "
            f"`cpu`.**\n\n{line}")


#: Libraries whose versions a results file records beside Python's and torch's (those installed): the numerical and
#: bioinformatics libraries the chapters' numbers go through (all but esm are left unpinned by the install).
RECORDED_LIBRARIES = ("numpy", "scipy", "scikit-learn", "biotite", "pyhmmer", "transformers", "esm")


def library_versions() -> dict:
    """``{"python", "torch", and each installed library of `RECORDED_LIBRARIES`: version string}``."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in RECORDED_LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def write_results(chapter: str, values: dict, profile, device: str, results_dir: str | Path = "results",
                  record: bool = False, models: dict | None = None) -> Path:
    """Write a chapter's results (`results_path`) and return the path.

    Args:
        chapter: file stem, e.g. ``"ground_truth_mi"``.
        values: headline numbers (JSON-serialisable after converting tensors/numpy scalars;
            non-finite floats become null).
        profile: the `mimdm.app.profiles.Profile` used.
        device: the device the chapter ran on.
        record: write the book's record ``<results_dir>/<chapter>.json`` (what `mimdm book` asks for; honoured
            only under `RECORD_PROFILES`); otherwise the run's own ``<results_dir>/<profile>/<chapter>.json``.
        models: ``{name: torch.nn.Module}`` the chapter used; the file records the sha256 of each one's weights
            (`mimdm.core.artifacts.module_sha256`) under ``"models"``.
    """
    path = results_path(chapter, profile.name, results_dir, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {
        "chapter": chapter,
        "profile": profile.name,
        "values": _clean(values),
        "config": _clean(profile.to_dict()),
        "device": str(device),
        "commit": git_commit(),
        "models": {k: module_sha256(m) for k, m in (models or {}).items()},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": library_versions(),
    }
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
