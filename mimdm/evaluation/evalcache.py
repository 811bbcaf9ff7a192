"""A content-keyed cache of decoding runs and NLL scores, so a chapter rerun on the same model reuses them.

The expensive part of chapters 1, 5 and 6 is decoding fixed puzzle sets with many rules and scoring the
results with the time-free NLL estimator. Both are deterministic functions of their inputs: the model's
weights, the input tokens, the rule and its settings (including the weights of the MI head it reads),
the temperature and the seed. `EvalCache` stores each result under a key built from exactly these
(weights and tokens by sha256, `module_sha256` and `tensor_sha256`), so

- a rerun with the same model and inputs loads the result instead of recomputing it;
- any change of weights, inputs, rule settings, temperature, seed or `CACHE_VERSION` misses the cache
  and recomputes (nothing stale is ever returned for a changed input);
- results made by one run can be shipped (`mimdm.core.shipped`, slot ``sudoku_evals``) and a fresh clone
  rebuilds the book from them: each entry records the commit, date and torch version that computed it,
  and its wall-clock (``seconds``) is the one measured then.

An entry is one file ``<folder>/<key hash>.pt`` (`mimdm.core.artifacts.atomic_save`, loaded with
``weights_only=True``) holding the key as JSON next to the result, checked on load. The folder is the
artifact ``evals/<name>-<hash of the cache version>`` (`mimdm.core.artifacts.artifact_dir`).

Bump `CACHE_VERSION` whenever decoding or NLL estimation changes what they compute.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from mimdm.core.artifacts import (
    artifact_dir,
    atomic_save,
    config_hash,
    git_commit,
    load_checkpoint,
    module_sha256,
    tensor_sha256,
)
from mimdm.evaluation.likelihood import time_free_nll
from mimdm.sampling import decoding
from mimdm.sampling.decoding import DecodeOutput, decode

#: Version of what cached computations mean; part of every key (bump on a change to decoding or NLL code).
CACHE_VERSION = "evalcache-v1"


def rule_key(rule) -> dict | None:
    """The settings of a decoding rule (`mimdm.sampling.decoding.Rule`) as a JSON-able dict, or None if not cacheable.

    A dataclass rule contributes its class and fields; a callable field (an MI source) contributes its
    ``cache_id`` (`mimdm.sampling.decoding.head_mi_fn` and friends set one). A rule that is not a dataclass, or whose MI
    source has no ``cache_id``, gives None: its runs are always recomputed.
    """
    if not is_dataclass(rule):
        return None
    out = {"class": type(rule).__name__}
    for f in fields(rule):
        if not f.init:
            continue
        v = getattr(rule, f.name)
        if callable(v):
            cid = getattr(v, "cache_id", None)
            if cid is None:
                return None
            v = cid
        out[f.name] = v if not isinstance(v, float) else repr(v)  # repr keeps inf and nan JSON-safe
    return out


def _to_store(v):
    return v.detach().cpu() if isinstance(v, Tensor) else torch.from_numpy(np.ascontiguousarray(v)) \
        if isinstance(v, np.ndarray) else v


class EvalCache:
    """Cached results in ``artifacts/evals/<name>-<hash>/`` (see module docstring).

    Args:
        name: the folder's name (e.g. the profile: ``"cpu"``).
        root: the artifact root (default `mimdm.core.artifacts.artifacts_root`).
        enabled: False: never read or write (every call computes).
    """

    def __init__(self, name: str, root: Path | None = None, enabled: bool = True):
        self.enabled = enabled
        self.dir = artifact_dir("evals", name, {"version": CACHE_VERSION}, root) if enabled else None
        self.hits = 0
        self.misses = 0

    def path(self, key: dict) -> Path:
        """The file of ``key``."""
        return self.dir / f"{config_hash({**key, 'version': CACHE_VERSION})}.pt"

    def get_or_compute(self, key: dict, compute: Callable[[], dict]) -> tuple[dict, dict | None]:
        """The result stored under ``key``, computing and storing it on a miss.

        Args:
            key: JSON-able description of everything the result depends on.
            compute: ``() -> dict`` of tensors, arrays, numbers, strings or JSON-able containers.

        Returns:
            ``(result, provenance)``: tensors come back on CPU (arrays as tensors); ``provenance`` is
            ``{"commit", "date", "torch"}`` of the run that computed a cached result, None when computed now.

        Raises:
            ValueError: a stored file is unreadable or changed since written (`mimdm.core.artifacts.load_checkpoint`),
                or holds another key (delete it to recompute).
        """
        if not self.enabled:
            return compute(), None
        p = self.path(key)
        want = json.dumps(key, sort_keys=True, default=str)
        if p.is_file():
            ck = load_checkpoint(p)
            if ck.get("key") != want:
                raise ValueError(f"{p} holds another computation than the one asked for; delete it to recompute")
            self.hits += 1
            return ck["result"], json.loads(ck["provenance"])
        result = compute()
        stored = {k: _to_store(v) for k, v in result.items()}
        prov = {"commit": git_commit(), "date": _dt.date.today().isoformat(), "torch": torch.__version__}
        atomic_save({"key": want, "result": stored, "provenance": json.dumps(prov)}, p)
        self.misses += 1
        return result, None

    def has(self, key: dict | None) -> bool:
        """Whether an entry for ``key`` is stored (False for None or a disabled cache)."""
        return self.enabled and key is not None and self.path(key).is_file()

    def files(self) -> list[str]:
        """Names of the stored entries (sorted)."""
        return sorted(p.name for p in self.dir.glob("*.pt")) if self.enabled else []


def rule_from_key(key: dict, heads: dict | None = None):
    """Rebuild a decoding rule from its `rule_key` (the inverse for the rules of `mimdm.sampling.decoding`).

    Args:
        key: a `rule_key` dict.
        heads: ``{head sha256: MI head}`` for MI-guided rules that read a head (`mimdm.sampling.decoding.head_mi_fn`).

    Raises:
        KeyError: an unknown rule class, or a head whose sha256 is not in ``heads``.
    """
    cls = getattr(decoding, key["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, decoding.Rule)):
        raise KeyError(f"no decoding rule named {key['class']!r}")
    kw = {}
    for name, v in key.items():
        if name == "class":
            continue
        if name == "mi_fn":
            kind, _, rest = v.partition(":")
            if kind == "zero":
                v = decoding.zero_mi_fn()
            elif kind == "head":
                sha, _, layer = rest.partition(":layer")
                if sha not in (heads or {}):
                    raise KeyError(f"the MI head {sha[:12]}... of this rule is not among the given heads")
                v = decoding.head_mi_fn(heads[sha], int(layer))
            else:
                raise KeyError(f"cannot rebuild the MI source {v!r}")
        elif isinstance(v, str) and name != "order":
            v = float(v)
        kw[name] = v
    return cls(**kw)


def decode_key(model, tokens_BL: Tensor, rule, temperature: float = 0.0, seed: int = 0) -> dict | None:
    """The cache key of a decode (None: the rule is not cacheable, `rule_key`)."""
    rk = rule_key(rule)
    if rk is None:
        return None
    return {"what": "decode", "model": module_sha256(model), "tokens": tensor_sha256(tokens_BL), "rule": rk,
            "temperature": repr(float(temperature)), "seed": int(seed)}


def cached_decode(cache: EvalCache | None, model, tokens_BL: Tensor, rule, temperature: float = 0.0, seed: int = 0):
    """`mimdm.sampling.decoding.decode` through ``cache`` (None, or a rule without `rule_key`: always decode).

    Returns:
        ``(DecodeOutput, provenance)``: a cached output has its tokens on ``tokens_BL``'s device and the
        ``seconds`` measured when it was computed; ``provenance`` as `EvalCache.get_or_compute`.

    Raises:
        What `mimdm.sampling.decoding.decode` raises.
    """
    key = None if cache is None or not cache.enabled else decode_key(model, tokens_BL, rule, temperature, seed)
    if key is None:
        return decode(model, tokens_BL, rule, temperature=temperature, seed=seed), None

    def compute():
        out = decode(model, tokens_BL, rule, temperature=temperature, seed=seed)
        return {"tokens": out.tokens.to(torch.int8), "step_of": out.step_of.to(torch.int16),
                "nfe": out.nfe.to(torch.int32), "extra_passes": json.dumps(out.extra_passes), "seconds": out.seconds}

    res, prov = cache.get_or_compute(key, compute)
    dev = tokens_BL.device
    return DecodeOutput(tokens=res["tokens"].to(dev, torch.long), step_of=res["step_of"].to(dev, torch.long),
                        nfe=res["nfe"].to(dev, torch.long), extra_passes=json.loads(res["extra_passes"]),
                        seconds=float(res["seconds"])), prov


def cached_conditional_nll(cache: EvalCache | None, model, tokens_BL: Tensor, context_BL: Tensor,
                           n_samples: int, seed: int = 0) -> Tensor:
    """NLL (nats, ``[B]``) of the cells filled in ``tokens_BL`` given ``context_BL`` (the masked cells of the
    context): `mimdm.evaluation.likelihood.time_free_nll` restricted to them, through ``cache`` (None: always compute).

    Raises:
        What `mimdm.evaluation.likelihood.time_free_nll` raises.
    """
    def nll():
        return time_free_nll(model, tokens_BL, n_samples=n_samples, maskable_BL=model.is_masked(context_BL),
                             seed=seed).value

    if cache is None or not cache.enabled:
        return nll()
    key = {"what": "conditional_nll", "model": module_sha256(model), "tokens": tensor_sha256(tokens_BL),
           "context": tensor_sha256(context_BL), "n_samples": int(n_samples), "seed": int(seed)}
    res, _ = cache.get_or_compute(key, lambda: {"value": nll()})
    return res["value"].to(tokens_BL.device)


def cached_record(cache: EvalCache | None, key: dict, compute: Callable[[], dict]) -> dict:
    """A JSON-able result (numbers, strings, lists, dicts) of ``compute`` through ``cache`` under ``key`` (None, or a
    disabled cache: always compute). Stored as JSON, so a result loaded equals the one computed (floats round-trip
    exactly).

    Raises:
        What ``compute`` raises; TypeError: its result is not JSON-able.
    """
    def run():
        return {"json": json.dumps(compute(), sort_keys=False)}

    if cache is None or not cache.enabled:
        return json.loads(run()["json"])
    res, _ = cache.get_or_compute(key, run)
    return json.loads(res["json"])


def cached_time_free_nll(cache: EvalCache | None, model, tokens_BL: Tensor, n_samples: int,
                         maskable_BL: Tensor | None = None, seed: int = 0) -> Tensor:
    """`mimdm.evaluation.likelihood.time_free_nll` (``.value``: ``[B]`` nats) of ``tokens_BL`` over the positions
    ``maskable_BL`` (None: all), through ``cache`` (None: always compute).

    Raises:
        What `mimdm.evaluation.likelihood.time_free_nll` raises.
    """
    def nll():
        return time_free_nll(model, tokens_BL, n_samples=n_samples, maskable_BL=maskable_BL, seed=seed).value

    if cache is None or not cache.enabled:
        return nll()
    key = {"what": "time_free_nll", "model": module_sha256(model), "tokens": tensor_sha256(tokens_BL),
           "maskable": None if maskable_BL is None else tensor_sha256(maskable_BL), "n_samples": int(n_samples),
           "seed": int(seed)}
    res, _ = cache.get_or_compute(key, lambda: {"value": nll()})
    return res["value"].to(tokens_BL.device)


def same_decode(tokens_BL: Tensor, step_of_BL: Tensor, nfe_B: Tensor, ref_tokens_BL: Tensor, ref_step_of_BL: Tensor,
                ref_nfe_B: Tensor) -> bool:
    """Whether two decodes of the same inputs agree: the same tokens ``[B, L]`` and NFE ``[B]``, and in each sequence
    the same number of cells unmasked at each step (``step_of [B, L]``: the step that unmasked a cell, -1 for a
    given), whichever cells those were (see `recheck`)."""
    if not (torch.equal(tokens_BL, ref_tokens_BL) and torch.equal(nfe_B, ref_nfe_B)):
        return False
    if step_of_BL.shape != ref_step_of_BL.shape:
        return False
    n_bins = int(max(step_of_BL.max(), ref_step_of_BL.max())) + 2

    def per_step(step_of):  # [B, n_bins]: givens in bin 0, step s in bin s + 1
        return torch.stack([torch.bincount(row.long() + 1, minlength=n_bins) for row in step_of])

    return bool(torch.equal(per_step(step_of_BL), per_step(ref_step_of_BL)))


def recheck(cache: EvalCache, model, heads: dict | None = None, n_rows: int = 8) -> dict:
    """Re-decode the first ``n_rows`` sequences of one stored argmax decode of ``model`` per kind of rule, and
    compare with the stored result.

    Inputs are rebuilt from the stored output (cells with ``step_of = -1`` are the givens). Only argmax decodes
    (temperature 0) with a deterministic order are rechecked: sampling draws depend on the batch. A kind is the
    rule class plus its MI source (``MIGuided/head``, ``MIGuided/zero``); rules whose head is not in ``heads`` or
    that probe (the oracle) are skipped.

    Agreement (`same_decode`) is of tokens, NFE and the number of cells each step unmasked, not of the step of each
    cell: late in a decode many cells' confidences saturate at 1 to float rounding, and which of those tied cells
    an order picks first follows the CPU's rounding (measured: a Sudoku MDM's stored sequential decodes re-decoded on
    another CPU gave the same tokens and NFE with cells unmasked in another order).

    Returns:
        ``{"entries": stored files, "rechecked": {kind: True if the re-decode agrees}}``.
    """
    msha = module_sha256(model)
    done = {}
    files = cache.files()
    for f in files:
        ck = load_checkpoint(cache.dir / f)
        key = json.loads(ck["key"])
        if key.get("what") != "decode" or key["model"] != msha or float(key["temperature"]) != 0.0:
            continue
        rk = key["rule"]
        kind = rk["class"] + ("/" + str(rk["mi_fn"]).partition(":")[0] if "mi_fn" in rk else "")
        if kind in done or rk.get("order") == "random":
            continue
        try:
            rule = rule_from_key(rk, heads)
        except KeyError:
            continue
        res = ck["result"]
        tok, st, nfe = (res[k][:n_rows].long() for k in ("tokens", "step_of", "nfe"))
        x = torch.where(st >= 0, torch.full_like(tok, model.mask_id), tok).to(model.device)
        out = decode(model, x, rule, seed=key["seed"])
        done[kind] = same_decode(out.tokens.cpu(), out.step_of.cpu(), out.nfe.cpu(), tok, st, nfe)
    return {"entries": len(files), "rechecked": dict(sorted(done.items()))}


__all__ = ["CACHE_VERSION", "EvalCache", "cached_conditional_nll", "cached_decode", "cached_record", "cached_time_free_nll", "decode_key", "module_sha256",
           "recheck", "rule_from_key", "rule_key", "same_decode", "tensor_sha256"]
