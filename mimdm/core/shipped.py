"""Shipped checkpoints: trained artifacts committed under ``checkpoints/<profile>/`` so the book rebuilds without training.

A *slot* ``checkpoints/<profile>/<slot>/`` is a verified copy of one artifact folder of the cache
(`mimdm.core.artifacts`, ``<kind>/<name>-<config hash>``): its files plus ``record.json`` with

- ``artifact``: the cache path ``<kind>/<name>-<hash>`` it was copied from, and ``config``: that
  folder's ``config.json`` (the hash is recomputed from it when the slot is checked);
- ``files``: ``{file: {"sha256", "bytes"}}``, every file at most `MAX_FILE_BYTES`;
- ``evaluation``: what was measured on the shipped file (a test reproduces it), ``train_minutes``,
  ``trained_by_commit``, ``profile``, ``shipped`` (UTC date).

`install` checks every slot of a profile (sha256 of each file, config hash) and copies it into the
cache, where the usual ``load_or_train_*`` functions find it. While `shipped_only` is on (``mimdm
book`` without ``--retrain``: environment variable ``MIMDM_SHIPPED_ONLY=<profile>``, inherited by
the chapters' kernels), `refuse_training` stops any training of an artifact kind the profile ships
with a one-line message naming the configuration keys that differ from the shipped slot and the
command that retrains (`RETRAIN_COMMAND`); it never retrains silently.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path

from mimdm.core.artifacts import REPO_ROOT, artifacts_root, atomic_write_text, config_hash, file_sha256, sidecar_path

#: Where the shipped checkpoints live (one folder per profile).
SHIPPED_ROOT = REPO_ROOT / "checkpoints"
#: Largest file a slot may hold (the repository's limit for a committed file).
MAX_FILE_BYTES = 20_000_000
#: The documented command that retrains everything from scratch instead of using the shipped checkpoints.
RETRAIN_COMMAND = "make book RETRAIN=1"
#: Environment variable that turns `shipped_only` on (its value is the profile name).
ENV = "MIMDM_SHIPPED_ONLY"
RECORD = "record.json"


class ShippedCheckpointError(ValueError):
    """A shipped checkpoint is corrupt, or the profile asks for an artifact that is neither shipped nor cached."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (`mimdm.core.artifacts.file_sha256`)."""
    return file_sha256(path)


def profile_dir(profile: str, root: Path | None = None) -> Path:
    """``<root>/<profile>``: the shipped slots of a profile (``root`` defaults to `SHIPPED_ROOT`)."""
    return Path(root or SHIPPED_ROOT) / profile


def ship(src: Path, profile: str, slot: str, files: list[str], evaluation: dict, train_minutes: float | None,
         trained_by_commit: str | None, root: Path | None = None, extra: dict | None = None) -> Path:
    """Copy ``files`` of the artifact folder ``src`` into slot ``<root>/<profile>/<slot>`` and write its record.

    Args:
        src: an artifact folder ``<cache>/<kind>/<name>-<hash>`` holding ``config.json`` and ``files``.
        evaluation: numbers measured on these files (reproduced by the tests).
        train_minutes: wall-clock minutes the training took; ``trained_by_commit``: the commit that trained it.
        extra: more JSON fields for the record (e.g. the hardware it trained on).

    Returns:
        The slot folder (an existing slot is replaced).

    Raises:
        FileNotFoundError: ``src`` lacks ``config.json`` or a listed file.
        ValueError: a file exceeds `MAX_FILE_BYTES`, or ``src``'s name does not end in its config's hash.
    """
    src = Path(src)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{src} is not an artifact folder (no config.json)")
    config = json.loads(cfg_path.read_text())
    if not src.name.endswith("-" + config_hash(config)):
        raise ValueError(f"{src.name} does not end in the hash of its config.json ({config_hash(config)})")
    for f in files:
        p = src / f
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{p} has {p.stat().st_size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit of a shipped file")
    dst = profile_dir(profile, root) / slot
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in files:
        shutil.copy2(src / f, dst / f)
    record = {"slot": slot, "profile": profile, "artifact": f"{src.parent.name}/{src.name}", "config": config,
              "files": {f: {"sha256": sha256_file(dst / f), "bytes": (dst / f).stat().st_size} for f in files},
              "evaluation": evaluation, "train_minutes": train_minutes, "trained_by_commit": trained_by_commit,
              "shipped": _dt.date.today().isoformat(), **(extra or {})}
    (dst / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return dst


def records(profile: str, root: Path | None = None) -> list[dict]:
    """The records of every slot of ``profile`` (each with ``dir`` added), sorted by slot; empty if none."""
    d = profile_dir(profile, root)
    out = []
    for p in sorted(d.glob(f"*/{RECORD}")) if d.is_dir() else []:
        rec = json.loads(p.read_text())
        rec["dir"] = str(p.parent)
        out.append(rec)
    return out


def verify(slot_dir: Path) -> dict:
    """Check a slot: its record, every file's sha256 and size, and the config hash of its artifact path.

    Returns:
        The record.

    Raises:
        ShippedCheckpointError: a file is missing, differs from its recorded sha256 (e.g. a Git LFS
            pointer or a partial checkout), or the record's config does not hash to its artifact name.
    """
    slot_dir = Path(slot_dir)
    rec_path = slot_dir / RECORD
    if not rec_path.is_file():
        raise ShippedCheckpointError(f"{slot_dir} is not a shipped checkpoint (no {RECORD})")
    rec = json.loads(rec_path.read_text())
    kind_name = rec["artifact"]
    if not kind_name.endswith("-" + config_hash(rec["config"])):
        raise ShippedCheckpointError(f"{rec_path}: config does not hash to the artifact name {kind_name}")
    for f, meta in rec["files"].items():
        p = slot_dir / f
        if not p.is_file():
            raise ShippedCheckpointError(f"shipped file {p} is missing; restore it with `git checkout -- {p}` "
                                         f"or retrain with `{RETRAIN_COMMAND}`")
        digest = sha256_file(p)
        if digest != meta["sha256"]:
            raise ShippedCheckpointError(f"shipped file {p} has sha256 {digest[:12]}..., not the recorded "
                                         f"{meta['sha256'][:12]}... (changed, truncated or a Git LFS pointer); "
                                         f"restore it with `git checkout -- {p}` or retrain with `{RETRAIN_COMMAND}`")
    return rec


def install(profile: str, root: Path | None = None, cache: Path | None = None) -> list[Path]:
    """Verify every slot of ``profile`` and copy its files into the artifact cache.

    A file already in the cache with the recorded sha256 is left alone; one that differs is replaced
    (the shipped file is the reference), and its sha256 record (`mimdm.core.artifacts.sidecar_path`, e.g. left by a local
    training) is set to the shipped digest. Returns the cache folders filled, in slot order.

    Raises:
        ShippedCheckpointError: as `verify`.
    """
    out = []
    for rec in records(profile, root):
        verify(rec["dir"])
        dst = Path(cache or artifacts_root()) / rec["artifact"]
        dst.mkdir(parents=True, exist_ok=True)
        cfg = dst / "config.json"
        if not cfg.exists():
            cfg.write_text(json.dumps(rec["config"], indent=2, sort_keys=True, default=str))
        for f, meta in rec["files"].items():
            target = dst / f
            if not (target.is_file() and sha256_file(target) == meta["sha256"]):
                tmp = target.with_suffix(target.suffix + ".tmp")
                shutil.copy2(Path(rec["dir"]) / f, tmp)
                os.replace(tmp, target)
            side = sidecar_path(target)  # the digest loaders check (`mimdm.core.artifacts.verify_file`): the shipped one
            if not side.is_file() or side.read_text().split()[:1] != [meta["sha256"]]:
                atomic_write_text(side, f"{meta['sha256']}  {target.name}\n")
        out.append(dst)
    return out


def readme(profile: str, root: Path | None = None) -> str:
    """Markdown describing the slots of ``profile`` (what `scripts/ship_checkpoints.py` writes to ``README.md``)."""
    lines = [f"# Shipped checkpoints of profile `{profile}`", "",
             "Written by `scripts/ship_checkpoints.py` (see `mimdm.core.shipped` for the format and the checks `make book` "
             f"runs; `{RETRAIN_COMMAND}` ignores them and trains from scratch). Each slot's `record.json` holds the "
             "configuration, the sha256 of every file, the evaluation a test reproduces and the commit that trained it.",
             "", "| slot | cache artifact | files | trained | commit | reproduced evaluation |", "|---|---|---|---|---|---|"]
    for r in records(profile, root):
        files = ", ".join(f"`{f}` {m['bytes'] / 1e6:.1f} MB (sha256 {m['sha256'][:12]})" for f, m in r["files"].items())
        ev = json.dumps(r["evaluation"].get("reproduce", {}), sort_keys=True)
        ev = ev if len(ev) <= 160 else ev[:157] + "..."
        mins = "" if r.get("train_minutes") is None else f"{r['train_minutes']:.1f} min"
        lines.append(f"| {r['slot']} | `{r['artifact']}` | {files} | {mins} | {(r.get('trained_by_commit') or '')[:7]} "
                     f"| `{ev}` |")
    return "\n".join(lines) + "\n"


def shipped_only() -> str | None:
    """The profile whose shipped checkpoints must be used (``$MIMDM_SHIPPED_ONLY``), or None."""
    return os.environ.get(ENV) or None


def _diff(a, b, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like configs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(prefix + str(k))
            else:
                out += _diff(a[k], b[k], f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "(value)"]


def refuse_training(artifact: Path, what: str, root: Path | None = None) -> None:
    """Stop before training ``artifact`` (a cache folder with ``config.json``) while `shipped_only` is on.

    Does nothing when `shipped_only` is off, or when the profile ships nothing of this artifact's kind
    (the kind's first path part), so kinds not yet shipped train as before.

    Raises:
        ShippedCheckpointError: the profile ships this kind but not this configuration; the message
            names the closest shipped slot, the configuration keys that differ, and `RETRAIN_COMMAND`.
    """
    profile = shipped_only()
    if profile is None:
        return
    artifact = Path(artifact)
    kind = artifact.parent.name
    same_kind = [r for r in records(profile, root) if r["artifact"].split("/")[0] == kind]
    if not same_kind:
        return
    mine = json.loads((artifact / "config.json").read_text()) if (artifact / "config.json").is_file() else {}
    diffs = sorted(((_diff(r["config"], mine), r) for r in same_kind), key=lambda t: len(t[0]))
    keys, rec = diffs[0]
    raise ShippedCheckpointError(
        f"{what}: profile {profile!r} needs {kind}/{artifact.name}, which no shipped checkpoint holds (closest: "
        f"{Path(rec['dir']).relative_to(Path(rec['dir']).parents[1])}, differing in {', '.join(keys[:6]) or 'nothing'}"
        f"{' ...' if len(keys) > 6 else ''}); retrain everything with `{RETRAIN_COMMAND}` or restore the configuration")


__all__ = ["ENV", "MAX_FILE_BYTES", "RETRAIN_COMMAND", "SHIPPED_ROOT", "ShippedCheckpointError", "install",
           "profile_dir", "readme", "records", "refuse_training", "sha256_file", "ship", "shipped_only", "verify"]
