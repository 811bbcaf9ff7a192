"""Which trained artifacts a profile ships (`mimdm.core.shipped`), what each slot's evaluation is, and how to reproduce it.

Every slot's record holds ``evaluation = {"reproduce": {...}, "measured": {...}}``: ``reproduce`` is recomputed by
`reproduce` from the shipped files alone in seconds (a test checks it on every shipped slot); ``measured`` holds
numbers measured when shipping that need more than the slot (e.g. the head's test Pearson on probed labels).

Protein slots (the default family, chapter 4): ``protein_potts`` and ``protein_potts_selection`` (the aligned-column
Potts MDM with the L2 chosen on validation CE, and that choice), ``protein_plm`` and ``protein_plm_selection`` (the
pseudo-likelihood baseline), ``protein_mi_head`` and ``protein_contact_head`` (the MI heads on probed ``mi`` and
``mi_aa`` labels).

``sudoku_evals`` and ``protein_evals``: the stored decodes and NLL scores of chapters 1, 5 and 6 (Sudoku) and 4
(DHFR) on the shipped models (`mimdm.evaluation.evalcache`; a fresh clone's chapters load them instead of decoding again); the
reproduced evaluation re-decodes a few sequences of one stored argmax decode per kind of rule.

Sudoku slots: ``sudoku_mdm`` (the profile's Sudoku MDM; its reproduced evaluation is the solve rate on
`SUDOKU_EVAL_PUZZLES` fixed 30-35-clue puzzles by sequential decoding, exactly); with ``heads=True`` also
``sudoku_labels`` (the MI label set packed by `mimdm.pipelines.labels.pack_labels`; evaluation: context count and summed MI),
``sudoku_mi_head`` (chapter 2's head) and ``sudoku_head_<ablation>`` (its ablations; evaluation of a head: the
summed predicted MI on `SUDOKU_FINGERPRINT_CONTEXTS` fixed contexts).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import torch

from mimdm.core import shipped
from mimdm.core.artifacts import artifacts_root, git_commit, load_checkpoint, module_sha256
from mimdm.data import sudoku as sd
from mimdm.evaluation.evalcache import EvalCache, recheck
from mimdm.experiments import mi_head as mh
from mimdm.experiments import protein as xp
from mimdm.experiments.protein import aligned_head_study, aligned_positions, head_map
from mimdm.heads.mi_head import head_inputs, load_head
from mimdm.models.potts import held_out_ce, load_potts
from mimdm.pipelines.labels import PACKED, pack_labels
from mimdm.pipelines.protein_zoo import FamilySpec, load_family
from mimdm.pipelines.zoo import grids_to_tokens, load_sudoku_mdm, profile_sudoku_mdm, solve_rate

#: Puzzles of a shipped Sudoku MDM's reproduced solve rate (`mimdm.pipelines.zoo.solve_rate`: 30-35 clues, fixed seed).
SUDOKU_EVAL_PUZZLES = 100

#: Fixed contexts of a Sudoku head's fingerprint: this many random grids with 20 givens each (seed 0).
SUDOKU_FINGERPRINT_CONTEXTS = 8

#: Masking of the fixed contexts a head's fingerprint is computed on (the native row, this share masked, seed 0).
FINGERPRINT_RATES = (1.0, 0.5)


@functools.lru_cache(maxsize=1)
def _protein_fixture():
    fam = load_family(FamilySpec())
    return fam, aligned_positions(fam)


def potts_evaluation(model, family, positions) -> dict:
    """Held-out masked CE (nats per masked column) of the test-split rows at 15%, 50%, 100% masked (seed 0)."""

    t = family.split.test
    return held_out_ce(model, positions.values[t], positions.weights[t], (0.15, 0.5, 1.0))


def head_fingerprint(model, head, positions, layer: int = -1) -> dict:
    """Sum of the head's predicted MI (nats) on the reference row masked at each of `FINGERPRINT_RATES` (seed 0)."""

    rng = np.random.default_rng(0)
    out = {}
    for rate in FINGERPRINT_RATES:
        tok = torch.as_tensor(positions.values[positions.reference], dtype=torch.long)[None].clone()
        mask = rng.random(positions.length) < rate
        tok[0, torch.from_numpy(mask)] = model.mask_id
        out[f"mi_sum_{rate:g}"] = float(head_map(model, head, tok.to(model.device), layer).sum())
    return out


def protein_slots(prep: dict, head_study: dict | None = None) -> list[tuple[str, Path, list[str], dict]]:
    """``(slot, artifact folder, files, evaluation)`` of every protein artifact chapter 4 trains (Potts backbone).

    Args:
        prep: `mimdm.experiments.protein.prepare` output for the default family with ``"potts"``.
        head_study: optional `mimdm.experiments.protein.aligned_head_study` output (its test Pearson goes into
            ``measured``).

    Raises:
        ValueError: ``prep`` is not of the Potts backbone.
    """
    if "positions" not in prep:
        raise ValueError("only the aligned-column Potts backbone is shipped; prepare chapter 4 with model='potts'")
    fam, pos, model = prep["family"], prep["positions"], prep["model"]
    plm, plm_rec = prep["plm"]
    out = []
    for slot, m, rec in (("protein_potts", model, prep["record"]), ("protein_plm", plm, plm_rec)):
        out.append((slot, Path(rec["path"]).parent, ["model.pt"],
                    {"reproduce": {"test_ce": potts_evaluation(m, fam, pos)},
                     "measured": {"l2": rec["l2"], "val_ce": rec["val"], "train_ce": rec["train"]}}))
        out.append((slot + "_selection", Path(rec["selection_path"]).parent, ["selection.json"],
                    {"reproduce": {"l2": rec["l2"]}, "measured": {"l2_sweep": rec["l2_sweep"]}}))
    for slot, key, hs in (("protein_mi_head", "head", "decoding_head"), ("protein_contact_head", "contact_head",
                                                                         "contact_head")):
        rec = prep[key + "_record"]
        measured = {k: head_study[hs][k] for k in ("pearson", "spearman") if k in head_study[hs]} if head_study else {}
        out.append((slot, Path(rec["path"]).parent, ["head.pt"],
                    {"reproduce": {"fingerprint": head_fingerprint(model, prep[key], pos)}, "measured": measured}))
    return out


def sudoku_evaluation(model) -> dict:
    """Solve rate, valid rate and mean NFE on `SUDOKU_EVAL_PUZZLES` fixed 30-35-clue puzzles (sequential decoding)."""

    ev = solve_rate(model, SUDOKU_EVAL_PUZZLES)
    return {k: ev[k] for k in ("solve_rate", "valid_rate", "n_puzzles", "nfe_mean")}


def sudoku_head_fingerprint(model, head, layer: int) -> dict:
    """``{"mi_sum": summed predicted MI (nats), "n_contexts"}`` of ``head`` on `SUDOKU_FINGERPRINT_CONTEXTS` fixed
    contexts (random solution grids with 20 givens, seed 0)."""

    rng = np.random.default_rng(0)
    grids = np.stack([sd.random_partial(g, 20, rng) for g in sd.random_solutions(SUDOKU_FINGERPRINT_CONTEXTS, rng)])
    with torch.no_grad():
        mi = head(*head_inputs(model, grids_to_tokens(grids, model.device), layer))
    return {"mi_sum": float(mi.double().sum()), "n_contexts": SUDOKU_FINGERPRINT_CONTEXTS}


def labels_evaluation(path: Path) -> dict:
    """``{"n_contexts", "mi_sum"}`` (nats, upper triangles) of a packed label set."""
    pk = load_checkpoint(path)
    return {"n_contexts": int(pk["tokens"].shape[0]), "mi_sum": float(pk["mi_triu"].double().sum())}


def slot_name(name: str) -> str:
    """A folder-safe slot name: lower case, runs of characters other than letters, digits and ``-`` as one ``_``
    ("layer -1" -> "layer_-1", "loss mse" -> "loss_mse")."""
    import re

    return re.sub(r"[^a-z0-9-]+", "_", name.lower()).strip("_")


def ship_sudoku(profile, device="cpu", heads: bool = False, progress: bool = True) -> list[Path]:
    """Ship the profile's Sudoku MDM from the artifact cache (trained there by `mimdm.pipelines.zoo.profile_sudoku_mdm`,
    or adopted from the long run by `mimdm.pipelines.long_run.adopt`) as slot ``sudoku_mdm``; with ``heads`` also its
    label set, MI head and ablation heads (built now if missing: `mimdm.experiments.mi_head.prepare`).

    Raises:
        FileNotFoundError: the profile's Sudoku MDM is not in the cache.
    """

    model, rec = profile_sudoku_mdm(profile, device=device, progress=False, train=False, precision="fp32")
    src = Path(rec["path"]).parent
    log = rec.get("log") or []
    minutes = round(log[-1]["seconds"] / 60, 2) if log and "seconds" in log[-1] else None
    measured = {"eval": rec["eval"], "n_parameters": rec["n_parameters"]}
    curve = (rec.get("trained_on") or {}).get("curve")
    if curve:
        measured["curve_last"] = curve[-1]
        minutes = round(curve[-1]["seconds"] / 60, 2)  # the long run's training time over all its sessions
    dirs = [shipped.ship(src, profile.name, "sudoku_mdm", ["model.pt"],
                         {"reproduce": {"solve": sudoku_evaluation(model)}, "measured": measured}, minutes,
                         (rec.get("trained_on") or {}).get("long_run", {}).get("started_from_commit") or git_commit(),
                         extra={"torch": torch.__version__, "kind": "sudoku_mdm"})]
    if not heads:
        return dirs

    prep = mh.prepare(profile, model, rec["path"], progress=progress)
    packed = pack_labels(prep["labels"])
    man = json.loads((prep["labels"] / "manifest.json").read_text())
    probe_minutes = round(sum(v["seconds"] for v in man["shards"].values()) / 60, 2)
    dirs.append(shipped.ship(prep["labels"], profile.name, "sudoku_labels", [packed.name],
                             {"reproduce": labels_evaluation(packed), "measured": {"probing_nfe": sum(
                                 v["nfe"] for v in man["shards"].values())}}, probe_minutes, git_commit(),
                             extra={"torch": torch.__version__, "kind": "labels"}))
    todo = [("sudoku_mi_head", prep["head"], prep["head_record"])] + [
        (f"sudoku_head_{slot_name(name)}", h, r) for name, (h, r, _) in prep["ablations"].items()]
    for slot, head, hrec in todo:
        log = hrec.get("log") or []
        layer = hrec["train_config"]["layer"]
        dirs.append(shipped.ship(Path(hrec["path"]).parent, profile.name, slot, ["head.pt"],
                                 {"reproduce": {"fingerprint": sudoku_head_fingerprint(model, head, layer)},
                                  "measured": {"n_parameters": head.n_parameters()}},
                                 round(log[-1]["seconds"] / 60, 2) if log and "seconds" in log[-1] else None,
                                 git_commit(), extra={"torch": torch.__version__, "kind": "mi_head"}))
    return dirs


#: Sequences re-decoded per rechecked entry of a shipped evaluation cache (`mimdm.evaluation.evalcache.recheck`).
EVALS_RECHECK_ROWS = 8


def _evals_recheck(cache, model, head) -> dict:
    return recheck(cache, model, {module_sha256(head): head}, n_rows=EVALS_RECHECK_ROWS)


#: Evaluation caches a profile ships: cache name -> (slot of the MDM, slot of the MI head its MI-guided rules read).
EVAL_DOMAINS = {"sudoku": ("sudoku_mdm", "sudoku_mi_head"), "protein": ("protein_potts", "protein_mi_head")}


def _shipped_models(profile_name: str, domain: str, device="cpu"):
    """The installed shipped MDM and MI head of an evaluation domain (`EVAL_DOMAINS`)."""

    mdm_slot, head_slot = EVAL_DOMAINS[domain]
    recs = {r["slot"]: r for r in shipped.records(profile_name)}
    missing = [s for s in (mdm_slot, head_slot) if s not in recs]
    if missing:
        raise FileNotFoundError(f"profile {profile_name} ships no {', '.join(missing)}: ship the models first")
    load = load_sudoku_mdm if domain == "sudoku" else load_potts
    model, _ = load(artifacts_root() / recs[mdm_slot]["artifact"] / "model.pt", device)
    head, _ = load_head(artifacts_root() / recs[head_slot]["artifact"] / "head.pt", device)
    return model, head


def _shipped_head_shas(profile_name: str) -> set[str]:
    """The weights' sha256 (`mimdm.evaluation.evalcache.module_sha256`) of every installed shipped MI head of a
    profile."""
    return {module_sha256(load_head(artifacts_root() / r["artifact"] / "head.pt")[0])
            for r in shipped.records(profile_name) if r.get("kind") == "mi_head"}


def _of_shipped(key: dict, model_sha: str, head_shas: set[str]) -> bool:
    """Whether a stored evaluation's key is of the shipped MDM and, if its rule reads an MI head, of a shipped head
    (entries of earlier heads are left out)."""
    mi_fn = str((key.get("rule") or {}).get("mi_fn", ""))
    return key["model"] == model_sha and (not mi_fn.startswith("head:") or mi_fn.split(":")[1] in head_shas)


def ship_evals(profile, device="cpu", domain: str = "sudoku") -> list[Path]:
    """Ship the stored decodes and NLL scores of a domain's shipped MDM (`mimdm.evaluation.evalcache`, folder
    ``evals/<domain>-*``, filled by running the chapters: 1, 5 and 6 for ``"sudoku"``, 4 for ``"protein"``) as slot
    ``<domain>_evals``.

    Only entries computed on the shipped MDM of the domain (its weights' sha256), and with a shipped MI head where a
    rule reads one, are shipped. The slot's reproduced
    evaluation re-decodes the first `EVALS_RECHECK_ROWS` sequences of one argmax decode per kind of rule with the
    shipped MDM and MI head (`mimdm.evaluation.evalcache.recheck`).

    Raises:
        KeyError: an unknown domain (`EVAL_DOMAINS`).
        FileNotFoundError: the domain's shipped MDM or MI head is not installed, or no entry is stored for it.
        ValueError: a stored decode does not reproduce.
    """

    model, head = _shipped_models(profile.name, domain, device)
    cache = EvalCache(domain)
    sha = module_sha256(model)
    heads = _shipped_head_shas(profile.name)
    files = [f for f in cache.files() if _of_shipped(json.loads(load_checkpoint(cache.dir / f)["key"]), sha, heads)]
    if not files:
        raise FileNotFoundError(f"no stored evaluation of the shipped {domain} MDM in {cache.dir}: run its chapters first")
    ev = _evals_recheck(cache, model, head)
    if not all(ev["rechecked"].values()):
        raise ValueError(f"stored decodes do not reproduce with the shipped models: {ev['rechecked']}")
    ev["entries"] = len(files)  # a fresh cache holds just the shipped entries
    return [shipped.ship(cache.dir, profile.name, f"{domain}_evals", files, {"reproduce": ev, "measured": {}}, None,
                         git_commit(), extra={"torch": torch.__version__, "kind": "evals"})]


def reproduce(record: dict, device="cpu") -> dict:
    """Recompute a shipped slot's ``evaluation["reproduce"]`` from the installed checkpoints.

    Raises:
        KeyError: a slot this module does not know.
        FileNotFoundError: a checkpoint it needs is not installed (`mimdm.core.shipped.install`).
    """

    slot = record["slot"]
    path = artifacts_root() / record["artifact"]
    if slot.endswith("_evals"):
        domain = slot[:-len("_evals")]
        model, head = _shipped_models(record["profile"], domain, device)
        return _evals_recheck(EvalCache(domain), model, head)
    if slot == "sudoku_mdm":
        model, _ = load_sudoku_mdm(path / "model.pt", device)
        return {"solve": sudoku_evaluation(model)}
    if slot == "sudoku_labels":
        return labels_evaluation(path / PACKED)
    if slot.startswith("sudoku_"):  # a Sudoku head: its fingerprint on the shipped Sudoku MDM

        mdm = next(r for r in shipped.records(record["profile"]) if r["slot"] == "sudoku_mdm")
        model, _ = load_sudoku_mdm(artifacts_root() / mdm["artifact"] / "model.pt", device)
        head, hrec = load_head(path / "head.pt", device)
        return {"fingerprint": sudoku_head_fingerprint(model, head, hrec["train_config"]["layer"])}
    if slot.endswith("_selection"):
        return {"l2": json.loads((path / "selection.json").read_text())["l2"]}
    fam, pos = _protein_fixture()
    if slot in ("protein_potts", "protein_plm"):
        model, _ = load_potts(path / "model.pt", device)
        return {"test_ce": potts_evaluation(model, fam, pos)}
    if slot in ("protein_mi_head", "protein_contact_head"):
        potts = next(r for r in shipped.records(record["profile"]) if r["slot"] == "protein_potts")
        model, _ = load_potts(artifacts_root() / potts["artifact"] / "model.pt", device)
        head, _ = load_head(path / "head.pt", device)
        return {"fingerprint": head_fingerprint(model, head, pos)}
    raise KeyError(f"no evaluation known for shipped slot {slot!r}")


def ship_protein(profile, device="cpu", progress: bool = True) -> list[Path]:
    """Train (or find) chapter 4's artifacts of ``profile`` for the default family and ship them.

    Returns:
        The slot folders written under ``checkpoints/<profile.name>/``.
    """

    prep = xp.prepare(profile, FamilySpec(), "potts", device=device, progress=progress)
    study = aligned_head_study(prep)
    dirs = []
    for slot, src, files, ev in protein_slots(prep, study):
        cfg = json.loads((src / "config.json").read_text())
        minutes = None
        if slot in ("protein_potts", "protein_plm"):
            rec = prep["record"] if slot == "protein_potts" else prep["plm"][1]
            minutes = round(rec["train_seconds"] / 60, 2)
        elif "head" in slot:
            log = prep[("head" if slot == "protein_mi_head" else "contact_head") + "_record"].get("log") or []
            minutes = round(log[-1]["seconds"] / 60, 2) if log and "seconds" in log[-1] else None
        dirs.append(shipped.ship(src, profile.name, slot, files, ev, minutes, git_commit(),
                                 extra={"torch": torch.__version__, "kind": cfg.get("arch") or src.parent.name}))
    return dirs


__all__ = ["FINGERPRINT_RATES", "SUDOKU_EVAL_PUZZLES", "SUDOKU_FINGERPRINT_CONTEXTS", "head_fingerprint",
           "labels_evaluation", "potts_evaluation", "protein_slots", "reproduce", "ship_evals", "EVAL_DOMAINS", "ship_protein", "ship_sudoku",
           "slot_name", "sudoku_evaluation", "sudoku_head_fingerprint"]
