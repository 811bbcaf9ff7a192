"""Command line of the study: ``mimdm <command> --help`` documents each command.

Commands, in pipeline order:

    mimdm train     train the Sudoku and/or protein MDM (and, by default, their MI labels and MI heads)
    mimdm probe     MI labels: ground-truth pairwise MI of sampled contexts by probing (resumable shards)
    mimdm fit-head  train (or load) the MI head on those labels
    mimdm decode    decode Sudoku puzzles (or masked proteins) with an unmasking rule
    mimdm nll       time-free I-MDCE negative log-likelihood of complete Sudoku grids
    mimdm book      the main job: train what is missing, execute every chapter, build the HTML book

Everything trained is cached by configuration under ``$MIMDM_ARTIFACTS`` (default ``<repo>/artifacts``,
see `mimdm.artifacts`): a command finds what an earlier command of the same profile made, and an
interrupted training or labelling run resumes where it stopped when the same command is run again.

Units: NFE = forward passes of the MDM; MI and NLL in nats; times are wall-clock seconds.
Errors in the input (malformed puzzle, non-amino-acid letter, bad device, unknown profile) and
missing artifacts end the command with a one-line message on stderr (exit status 2 for bad
input, 1 for a missing artifact), not a traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

#: Names of the run profiles (`mimdm.profiles.PROFILES`), listed here so that ``--help`` and input errors
#: answer without importing torch (tests/test_cli.py checks that the two agree).
PROFILE_NAMES = ("cpu", "paper", "smoke")
RULES = ("sequential", "top-k", "threshold", "eb", "mi")
#: Default knob of each rule (the `mimdm.decoding` defaults).
DEFAULT_KNOBS = {"top-k": 2, "threshold": 0.9, "eb": 0.1, "mi": 0.01}


class CLIError(Exception):
    """A user-facing error: printed as ``mimdm <command>: error: <message>``, exit status ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------------------ helpers
def _n(count: int, unit: str) -> str:
    """``"1 forward pass"``, ``"3 forward passes"``."""
    plural = unit + ("es" if unit.endswith("s") else "s")
    return f"{count:,} {unit if count == 1 else plural}"


def _seed(text: str) -> int:
    """argparse type of ``--seed``: an integer torch's generators accept (0 to 2^63 - 1)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2^63-1, got {text}")
    return v


def _log(msg: str) -> None:
    print(f"[mimdm] {msg}", flush=True)


def _device(name: str):
    from .device import resolve_device

    try:
        return resolve_device(name)
    except (ValueError, RuntimeError) as e:
        raise CLIError(f"bad --device {name!r}: {e}") from None


def _profile(name: str):
    from .profiles import get_profile

    try:
        return get_profile(name)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _load_sudoku(p, dev):
    """The profile's trained Sudoku MDM; `CLIError` (code 1) telling to run ``mimdm train`` when missing."""
    from .artifacts import artifacts_root
    from .models.zoo import profile_sudoku_mdm, sudoku_mdm_dir

    try:
        return profile_sudoku_mdm(p, device=dev, progress=False, train=False)
    except FileNotFoundError:
        d = sudoku_mdm_dir(p.sudoku_model, p.sudoku_train, curriculum=p.sudoku_curriculum)
        partial = " (a training run was interrupted; `mimdm train` resumes it)" if (d / "train_state.pt").exists() else ""
        raise CLIError(f"no trained Sudoku MDM for profile {p.name!r} under {artifacts_root()} (looked for "
                       f"{d / 'model.pt'}){partial}; run `mimdm train --profile {p.name} --what sudoku` first "
                       "(or set MIMDM_ARTIFACTS to the folder that holds it)", code=1) from None


def _load_family(p):
    """The chapter-4 protein family (DHFR), with the dropped-row warnings turned into one note."""
    from .models.protein_zoo import FamilySpec, load_family

    with warnings.catch_warnings():  # only the dropped-rows warning, which the note below restates
        warnings.filterwarnings("ignore", message=".*non-standard letters", category=UserWarning)
        fam = load_family(FamilySpec(), max_len=p.protein_model.max_len)
    if fam.dropped:
        _log(f"protein family: {len(fam.seqs)} sequences ({len(fam.dropped)} rows with non-standard letters dropped)")
    return fam


def _load_protein(p, dev, fam):
    """The profile's protein MDM (never trained here) and its cache key, as `mimdm.experiments.protein.prepare`."""
    from .artifacts import artifacts_root
    from .device import apply_precision
    from .models.esmc import ESMCMDM
    from .models.protein_zoo import load_or_train_protein_mdm, protein_mdm_dir

    name = p.protein_backbone
    if name == "potts":
        from .experiments.protein import aligned_positions
        from .models.protein_zoo import load_or_select_potts

        try:
            model, rec = load_or_select_potts(fam, aligned_positions(fam), p.potts, p.potts_l2_grid, p.potts_train,
                                              device=dev, progress=False, train=False)
        except FileNotFoundError as e:
            raise CLIError(f"no trained Potts MDM for profile {p.name!r} under {artifacts_root()} ({e}); run "
                           f"`mimdm train --profile {p.name} --what protein` first", code=1) from None
        return model, rec, Path(rec["path"]).parent.name
    if name == "offline":
        try:
            model, rec = load_or_train_protein_mdm(p.protein_model, p.protein_train, fam, device=dev, progress=False,
                                                   train=False)
        except FileNotFoundError:
            d = protein_mdm_dir(p.protein_model, p.protein_train, fam.data_id)
            raise CLIError(f"no trained protein MDM for profile {p.name!r} under {artifacts_root()} (looked for "
                           f"{d / 'model.pt'}); run `mimdm train --profile {p.name} --what protein` first",
                           code=1) from None
        return apply_precision(model), rec, Path(rec["path"]).parent.name
    model = apply_precision(ESMCMDM.load(name, device=dev))  # FileNotFoundError says where and how to provide the weights
    return model, {"path": str(name), "n_parameters": model.n_parameters()}, Path(str(name)).name


def _protein_label_dir(key: str, fam, p) -> Path:
    """Folder of the protein label set (the key of `mimdm.experiments.protein.load_or_build_protein_labels`, or of
    `load_or_build_aligned_labels` for the Potts MDM)."""
    from .artifacts import artifact_dir

    if p.protein_backbone == "potts":
        cfg = p.aligned_labels
        return artifact_dir("protein_labels", key, {"model": key, "data": fam.data_id, "kind": "aligned", **cfg.to_dict()})
    return artifact_dir("protein_labels", key, {"model": key, "data": fam.data_id, **p.protein_labels.to_dict()})


def _protein_labels(model, key: str, fam, p, progress: bool) -> Path:
    """The profile's protein label set (built now where missing)."""
    from .experiments.protein import aligned_positions, load_or_build_aligned_labels, load_or_build_protein_labels

    if p.protein_backbone == "potts":
        return load_or_build_aligned_labels(model, key, aligned_positions(fam), fam, p.aligned_labels, progress)
    return load_or_build_protein_labels(model, key, fam, p.protein_labels, progress=progress)


def _manifest_summary(d: Path, n_shards: int) -> str:
    man = Path(d) / "manifest.json"
    if not man.exists():
        return f"0 of {n_shards} shards"
    shards = json.loads(man.read_text())["shards"].values()
    n_ctx = sum(s["n_contexts"] for s in shards)
    nfe = sum(s["nfe"] for s in shards)
    secs = sum(s["seconds"] for s in shards)
    rate = f", {nfe / secs:,.0f} passes/s" if secs > 0 else ""
    return (f"{len(shards)} of {n_shards} shards, {n_ctx:,} contexts; probing NFE {nfe:,} forward passes "
            f"({nfe / max(1, n_ctx):,.0f} per context) in {secs:,.1f} s{rate}")


def _head_path(labels: Path, hcfg, train_cfg) -> Path:
    """Cache path of the head of `mimdm.experiments.mi_head.load_or_train_head` (single process)."""
    from .distributed import head_artifact_path

    return head_artifact_path(labels, hcfg, train_cfg, 1)


def _head_summary(head, rec, path: Path, cached: bool) -> str:
    log = rec.get("log") or []
    vals = [(e["val_loss"], e["epoch"]) for e in log if math.isfinite(e.get("val_loss", math.nan))]
    tc = rec.get("train_config", {})
    best = (f"best validation loss {min(vals)[0]:.5f} ({tc.get('loss', '?')} loss, epoch {min(vals)[1]} of "
            f"{len(log)} run)") if vals else "no validation loss recorded"
    hc = head.config
    return (f"MI head: {head.n_parameters():,} parameters (d_in {hc.d_in}, d_hidden {hc.d_hidden}, rank {hc.rank}; "
            f"reads MDM layer {tc.get('layer', -1)}); {best}; {'loaded from the cache' if cached else 'trained now'} -> {path}")


# ------------------------------------------------------------------------------------------ train
def _train_sudoku(p, dev, heads: bool, ablations: bool, progress: bool) -> None:
    from .experiments import mi_head
    from .models.zoo import profile_sudoku_mdm

    model, rec = profile_sudoku_mdm(p, device=dev, progress=progress)
    ev = rec["eval"]
    _log(f"Sudoku MDM ({rec['n_parameters']:,} parameters): solve rate {ev['solve_rate']:.3f} on {ev['n_puzzles']} "
         f"{ev['clues'][0]}-{ev['clues'][1]}-clue puzzles (sequential decoding, {ev['nfe_mean']:.1f} NFE per puzzle) "
         f"-> {rec['path']}")
    if heads:
        prep = mi_head.prepare(p, model, rec["path"], progress=progress, ablations=ablations)
        _log(f"MI labels ({_manifest_summary(prep['labels'], p.labels.n_shards)}) -> {prep['labels']}")
        _log(f"MI head ({prep['head'].n_parameters():,} parameters) and ablations ({len(prep['ablations'])} settings) ready")


def _train_protein(p, dev, heads: bool, progress: bool) -> None:
    from .experiments import protein
    from .models.protein_zoo import FamilySpec, load_protein_model

    if heads:
        pp = protein.prepare(p, FamilySpec(), device=dev, progress=progress)
        rec, head = pp["record"], pp["head"]
        val = rec["val"]["ce"] if "val" in rec else rec["eval"]["val_ce"]
        n = p.aligned_labels.n_shards if "positions" in pp else p.protein_labels.n_shards
        _log(f"protein MDM {pp['model_name']} ({rec['n_parameters']:,} parameters, validation CE "
             f"{val:.3f} nats per masked position) -> {rec['path']}")
        _log(f"protein MI labels ({_manifest_summary(pp['labels'], n)}) -> {pp['labels']}")
        _log(f"protein MI head ({head.n_parameters():,} parameters) ready")
        return
    fam = _load_family(p)
    if p.protein_backbone == "potts":
        from .experiments.protein import aligned_positions
        from .models.protein_zoo import load_or_select_potts

        model, rec = load_or_select_potts(fam, aligned_positions(fam), p.potts, p.potts_l2_grid, p.potts_train,
                                          device=dev, progress=progress)
        val = rec["val"]["ce"]
    else:
        model, rec = load_protein_model(p.protein_backbone, p.protein_model, p.protein_train, fam, device=dev,
                                        progress=progress)
        val = rec["eval"]["val_ce"]
    _log(f"protein MDM {p.protein_backbone} ({rec['n_parameters']:,} parameters, validation CE "
         f"{val:.3f} nats per masked position) -> {rec['path']}")


def cmd_train(args) -> int:
    """`mimdm train`: train (or load from the cache) the profile's MDMs, MI labels and heads. Returns 0."""
    p, dev = _profile(args.profile), _device(args.device)
    heads = not args.no_heads
    if args.what == "all" and heads and not args.no_ablations:
        from .book import prepare_artifacts

        prepare_artifacts(p.name, str(dev), progress=not args.no_progress)  # exactly what `mimdm book` trains
        return 0
    if args.what in ("sudoku", "all"):
        _train_sudoku(p, dev, heads, not args.no_ablations, not args.no_progress)
    if args.what in ("protein", "all"):
        _train_protein(p, dev, heads, not args.no_progress)
    return 0


# ------------------------------------------------------------------------------------------ probe
def cmd_probe(args) -> int:
    """`mimdm probe`: brute-force MI labels of the profile's Sudoku or protein MDM (resumable). Returns 0.

    Raises:
        CLIError: ``--max-new-shards`` with the protein labels; a missing model (exit code 1).
    """
    p, dev = _profile(args.profile), _device(args.device)
    progress = not args.no_progress
    if args.what == "sudoku":
        from .experiments.mi_head import load_or_build_labels
        from .labels import generate_labels, label_dir

        model, rec = _load_sudoku(p, dev)
        if args.max_new_shards is None:
            d = load_or_build_labels(model, rec["path"], p.labels, progress=progress)
        else:
            d = generate_labels(model, p.labels, label_dir(Path(rec["path"]).parent, p.labels), progress=progress,
                                max_new_shards=args.max_new_shards)
        _log(f"Sudoku MI labels: {_manifest_summary(d, p.labels.n_shards)} -> {d}")
    else:
        if args.max_new_shards is not None:
            raise CLIError("--max-new-shards applies to the Sudoku labels only")
        fam = _load_family(p)
        model, rec, key = _load_protein(p, dev, fam)
        d = _protein_labels(model, key, fam, p, progress)
        n = p.aligned_labels.n_shards if p.protein_backbone == "potts" else p.protein_labels.n_shards
        _log(f"protein MI labels: {_manifest_summary(d, n)} -> {d}")
    return 0


# ------------------------------------------------------------------------------------------ fit-head
def cmd_fit_head(args) -> int:
    """`mimdm fit-head`: train the MI head on the profile's labels, probing missing shards first. Returns 0."""
    from .experiments.mi_head import load_or_train_head

    p, dev = _profile(args.profile), _device(args.device)
    progress = not args.no_progress
    if args.what == "sudoku":
        from .experiments.mi_head import head_config_for, load_or_build_labels
        from .labels import is_complete, label_dir

        model, rec = _load_sudoku(p, dev)
        d = label_dir(Path(rec["path"]).parent, p.labels)
        if not is_complete(d, p.labels):
            _log(f"the MI label set is incomplete ({_manifest_summary(d, p.labels.n_shards)}): probing the rest "
                 "first (what `mimdm probe` does)")
        labels = load_or_build_labels(model, rec["path"], p.labels, progress=progress)
        hcfg, tcfg = head_config_for(p, model), p.head_train
    else:
        from .experiments.mi_head import protein_head_config_for

        fam = _load_family(p)
        model, rec, key = _load_protein(p, dev, fam)
        labels = _protein_labels(model, key, fam, p, progress)
        hcfg = protein_head_config_for(p, model)
        tcfg = p.aligned_head_train if p.protein_backbone == "potts" else p.protein_head_train
    path = _head_path(labels, hcfg, tcfg)
    cached = path.exists()
    head, hrec = load_or_train_head(labels, hcfg, tcfg, model.mask_id, progress=progress, device=dev)
    _log(_head_summary(head, hrec, path, cached))
    return 0


# ------------------------------------------------------------------------------------------ decode
def _check_knob(rule: str, knob: float | None):
    """The rule's knob (its default when None), validated; None for sequential. No torch import."""
    if rule == "sequential":
        if knob is not None:
            raise CLIError("--rule sequential has no knob (one position per forward pass, by confidence); drop --knob")
        return None
    k = DEFAULT_KNOBS[rule] if knob is None else knob
    if math.isnan(k) or (math.isinf(k) and not (rule == "mi" and k > 0)):
        raise CLIError(f"--knob must be a finite number, got {k}")
    if rule == "top-k":
        if k != int(k) or k < 1:
            raise CLIError(f"--rule top-k needs an integer --knob k >= 1 (positions per forward pass), got {k:g}")
        return int(k)
    if rule == "threshold" and not 0 < k <= 1:
        raise CLIError(f"--rule threshold needs --knob tau in (0, 1] (a probability), got {k:g}")
    if rule == "eb" and k < 0:
        raise CLIError(f"--rule eb needs --knob gamma >= 0 (nats), got {k:g}")
    if rule == "mi" and k < 0:
        raise CLIError(f"--rule mi needs --knob eps >= 0 (nats), got {k:g}")
    return k


def _check_cap(args) -> float:
    """The validated ``--entropy-cap`` (inf when not given)."""
    cap = getattr(args, "entropy_cap", None)
    if cap is None:
        return math.inf
    if args.rule != "mi":
        raise CLIError(f"--entropy-cap belongs to --rule mi, not --rule {args.rule}; drop it")
    if not cap >= 0:
        raise CLIError(f"--entropy-cap must be >= 0 nats, got {cap:g}")
    return cap


def _make_rule(rule: str, knob, head=None, layer: int = -1, entropy_cap: float = math.inf):
    """A `mimdm.decoding.Rule` from a validated knob (`_check_knob`); ``head`` and ``entropy_cap`` for the MI-guided rule."""
    from .decoding import EBSampler, MIGuided, Sequential, Threshold, TopK, head_mi_fn

    if rule == "sequential":
        return Sequential("confidence")
    if rule == "top-k":
        return TopK(knob)
    if rule == "threshold":
        return Threshold(knob)
    if rule == "eb":
        return EBSampler(knob)
    return MIGuided(head_mi_fn(head, layer), eps=knob, entropy_cap=entropy_cap)


def _parse_puzzles(strings: list[str]):
    import numpy as np

    from .data import sudoku as sd

    grids = []
    for i, s in enumerate(strings, 1):
        try:
            grids.append(sd.parse_grid(s))
        except sd.SudokuError as e:
            shown = s if len(s) <= 30 else s[:27] + "..."
            raise CLIError(f"puzzle {i} ({shown!r}) is not a valid Sudoku string: {e}") from None
    return np.stack(grids)


def _sudoku_head(p, model, rec, dev):
    from .experiments.mi_head import head_config_for
    from .heads import load_head
    from .labels import label_dir

    labels = label_dir(Path(rec["path"]).parent, p.labels)
    path = _head_path(labels, head_config_for(p, model), p.head_train)
    if not path.exists():
        raise CLIError(f"--rule mi needs the profile's MI head, which is not trained (looked for {path}); run "
                       f"`mimdm fit-head --profile {p.name}` (or `mimdm train --profile {p.name}`) first", code=1)
    return load_head(path, dev)[0]


def _decode_sudoku(args) -> dict:
    import numpy as np

    from .data import sudoku as sd
    from .decoding import decode
    from .models.zoo import grids_to_tokens, tokens_to_grids

    grids = _parse_puzzles(args.puzzles)
    knob, cap = _check_knob(args.rule, args.knob), _check_cap(args)
    p, dev = _profile(args.profile), _device(args.device)
    model, rec = _load_sudoku(p, dev)
    head = _sudoku_head(p, model, rec, dev) if args.rule == "mi" else None
    rule = _make_rule(args.rule, knob, head, p.head_train.layer, cap)
    out = decode(model, grids_to_tokens(grids, dev), rule, temperature=args.temperature, seed=args.seed)
    dec = tokens_to_grids(out.tokens)
    rows = []
    for i, (g, o) in enumerate(zip(grids, dec)):
        keeps = bool(np.all((g == 0) | (o == g)))
        nfe = int(out.nfe[i])
        rows.append({"puzzle": sd.format_grid(g), "grid": sd.format_grid(o), "blanks": int((g == 0).sum()),
                     "nfe": nfe, "head_passes": nfe if args.rule == "mi" else 0,
                     "valid": bool(sd.is_valid_solution(o)) and keeps, "keeps_givens": keeps,
                     "violations": sd.rule_violations(o)[:3]})
    return {"model": "sudoku", "model_path": rec["path"], "rule": args.rule, "knob": knob,
            "temperature": args.temperature, "seed": args.seed, "seconds": out.seconds,
            "head_passes_total": int(out.extra_passes.get("head_passes", 0)), "results": rows}


def _decode_protein(args) -> dict:
    from .data.protein import validate_sequence
    from .experiments.protein import decode_grouped

    p0 = _profile(args.profile)
    for i, s in enumerate(args.protein, 1):
        try:
            # the Potts MDM reads aligned rows (gaps allowed; the length is checked once the model is loaded)
            validate_sequence(s, allow_mask=True, allow_gaps=p0.protein_backbone == "potts")
        except (TypeError, ValueError) as e:
            raise CLIError(f"--protein sequence {i}: {e} (use the 20 upper-case amino-acid letters and '_' for a "
                           "masked position)") from None
    knob, cap = _check_knob(args.rule, args.knob), _check_cap(args)
    p, dev = _profile(args.profile), _device(args.device)
    longest = max(map(len, args.protein))
    if longest > p.protein_model.max_len:
        raise CLIError(f"a --protein sequence has {longest} residues, more than the model's maximum "
                       f"{p.protein_model.max_len}; nothing is truncated")
    fam = _load_family(p)
    model, rec, key = _load_protein(p, dev, fam)
    head = None
    if args.rule == "mi":
        from .experiments.mi_head import protein_head_config_for
        from .heads import load_head

        hcfg = protein_head_config_for(p, model)
        tcfg = p.aligned_head_train if p.protein_backbone == "potts" else p.protein_head_train
        path = _head_path(_protein_label_dir(key, fam, p), hcfg, tcfg)
        if not path.exists():
            raise CLIError(f"--rule mi needs the profile's protein MI head, which is not trained (looked for {path}); "
                           f"run `mimdm fit-head --profile {p.name} --what protein` first", code=1)
        head = load_head(path, dev)[0]
    rule = _make_rule(args.rule, knob, head, p.protein_head_train.layer, cap)
    try:
        toks = [model.encode(s)[0] for s in args.protein]
    except ValueError as e:
        raise CLIError(f"--protein: {e}" + (f" (the Potts MDM reads aligned rows of {model.length} columns: the 20 "
                                            "amino acids, '-' for a gap, '_' for a masked column)"
                                            if p.protein_backbone == "potts" else "")) from None
    out, nfe, extra, secs = decode_grouped(model, toks, rule, args.temperature, args.seed)
    rows = []
    for s, o, n in zip(args.protein, out, nfe):
        seq = model.decode(o)[0]
        keeps = all(a == "_" or a == b for a, b in zip(s, seq))
        rows.append({"input": s, "sequence": seq, "masked": s.count("_"), "nfe": int(n),
                     "head_passes": int(n) if args.rule == "mi" else 0, "keeps_unmasked": keeps})
    return {"model": "protein", "model_path": rec["path"], "rule": args.rule, "knob": knob,
            "temperature": args.temperature, "seed": args.seed, "seconds": secs,
            "head_passes_total": int(extra.get("head_passes", 0)), "results": rows}


def cmd_decode(args) -> int:
    """`mimdm decode`: decode Sudoku puzzles or a masked protein with one rule; prints NFE and validity.

    Returns 0.

    Raises:
        CLIError: neither or both of puzzles and ``--protein``, a negative temperature, bad puzzles or
            sequences, a bad knob, a missing model or head.
    """
    if bool(args.puzzles) == bool(args.protein):
        raise CLIError("give Sudoku PUZZLE strings or --protein SEQ (not both, not neither)")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise CLIError(f"--temperature must be a finite number >= 0 (0: argmax), got {args.temperature}")
    res = _decode_sudoku(args) if args.puzzles else _decode_protein(args)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    from .data import sudoku as sd

    knob = "" if res["knob"] is None else f", knob {res['knob']:g}"
    n = len(res["results"])
    for i, r in enumerate(res["results"], 1):
        if res["model"] == "sudoku":
            print(f"puzzle {i}/{n} ({r['blanks']} blanks), rule {res['rule']}{knob}:")
            print(sd.format_grid(sd.parse_grid(r["grid"], check=False), pretty=True) if args.pretty else r["grid"])
            why = "" if r["valid"] else f" ({'; '.join(r['violations']) or 'givens changed'})"
            print(f"  NFE {_n(r['nfe'], 'forward pass')}, {_n(r['head_passes'], 'MI-head pass')}; valid solution keeping the "
                  f"givens: {'yes' if r['valid'] else 'no'}{why}")
        else:
            print(f"protein {i}/{n} ({r['masked']} masked of {len(r['input'])}), rule {res['rule']}{knob}:")
            print(r["sequence"])
            print(f"  NFE {_n(r['nfe'], 'forward pass')}, {_n(r['head_passes'], 'MI-head pass')}")
    mean = sum(r["nfe"] for r in res["results"]) / max(1, n)
    print(f"{n} decoded in {res['seconds']:.3f} s wall-clock (one batched call); mean NFE {mean:.2f} forward passes")
    return 0


# ------------------------------------------------------------------------------------------ nll
def cmd_nll(args) -> int:
    """`mimdm nll`: time-free I-MDCE NLL (nats) of complete Sudoku grids, ``--samples`` passes per grid.

    Returns 0.

    Raises:
        CLIError: ``--samples`` < 1, a malformed or incomplete grid, a missing model.
    """
    import numpy as np

    from .data import sudoku as sd
    from .experiments.likelihood import reference_nll
    from .likelihood import time_free_nll
    from .models.zoo import grids_to_tokens

    if args.samples is not None and args.samples < 1:
        raise CLIError(f"--samples must be >= 1, got {args.samples}")
    grids = []
    for i, s in enumerate(args.grids, 1):
        try:
            g = sd.parse_grid(s, check=False)
        except sd.SudokuError as e:
            raise CLIError(f"grid {i} is not a valid Sudoku string: {e}") from None
        if (g == 0).any():
            raise CLIError(f"grid {i} has {int((g == 0).sum())} blank cells; `mimdm nll` scores complete grids "
                           "(81 digits 1-9)")
        grids.append(g)
    p, dev = _profile(args.profile), _device(args.device)
    K = args.samples or p.nll_draws
    model, rec = _load_sudoku(p, dev)
    est = time_free_nll(model, grids_to_tokens(np.stack(grids), dev), n_samples=K, seed=args.seed, sizes=args.sizes)
    ref = reference_nll()["uniform_valid_grids"]
    rows = [{"grid": sd.format_grid(g), "nll_nats": float(v), "stderr_nats": float(se), "nfe": int(n),
             "valid": bool(sd.is_valid_solution(g))}
            for g, v, se, n in zip(grids, est.value.cpu(), est.stderr.cpu(), est.nfe.cpu())]
    if args.json:
        print(json.dumps({"model_path": rec["path"], "samples": K, "sizes": args.sizes, "seed": args.seed,
                          "reference_uniform_valid_grids_nats": ref, "results": rows}, indent=1))
        return 0
    for i, r in enumerate(rows, 1):
        print(f"grid {i}: NLL {r['nll_nats']:.3f} ± {r['stderr_nats']:.3f} nats (± = standard error over {K} mask "
              f"draws), NFE {r['nfe']} forward passes; valid grid: {'yes' if r['valid'] else 'no'}")
    print(f"time-free I-MDCE estimate ({args.sizes} mask sizes, seed {args.seed}); reference: uniform over all valid "
          f"grids = {ref:.2f} nats")
    return 0


# ------------------------------------------------------------------------------------------ book
def cmd_book(args) -> int:
    """`mimdm book`: run the chapters with papermill under a profile and build the HTML book. Returns 0."""
    from .book import run_book

    run_book(args.profile, args.device, chapters=args.chapter, execute=not args.no_execute, build=not args.no_build,
             retrain=args.retrain)
    return 0


# ------------------------------------------------------------------------------------------ parser
def _desc(*paragraphs: str) -> str:
    """Paragraphs wrapped to 88 columns (for `argparse.RawDescriptionHelpFormatter`)."""
    import textwrap

    return "\n\n".join(textwrap.fill(p, 88) for p in paragraphs)


def _common(sp, device_help: str = "cpu | cuda | cuda:N | auto (default: cpu)") -> None:
    sp.add_argument("--profile", default="cpu", choices=PROFILE_NAMES,
                    help="run profile of mimdm/profiles.py: smoke (tiny, CI), cpu (default), paper (GPU scale)")
    sp.add_argument("--device", default="cpu", help=device_help)


def build_parser() -> argparse.ArgumentParser:
    """The ``mimdm`` argument parser: sub-commands train, probe, fit-head, decode, nll, book."""
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(prog="mimdm", formatter_class=fmt, description=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    b = sub.add_parser("book", help="train what is missing, execute every chapter with papermill, build the HTML book",
                       description="The main job: train what is missing, execute every chapter with papermill, "
                                   "build the HTML book.")
    b.add_argument("--profile", default="cpu", choices=PROFILE_NAMES, help="run profile (default: cpu)")
    b.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default: cpu)")
    b.add_argument("--chapter", action="append", help="only this chapter notebook (repeatable), e.g. book/01_ground_truth_mi.ipynb")
    b.add_argument("--no-execute", action="store_true", help="only build the HTML from the notebooks as they are")
    b.add_argument("--retrain", action="store_true",
                   help="ignore the shipped checkpoints (checkpoints/<profile>/) and train everything from scratch")
    b.add_argument("--no-build", action="store_true", help="only execute the chapters")
    b.set_defaults(func=cmd_book)

    t = sub.add_parser("train", formatter_class=fmt, help="train (or resume training of) the models of a profile",
                       description=_desc(
                           "Train (or find in the cache, or resume) the models of a profile, with progress bars.",
                           "--what all (default) trains what `mimdm book` needs: the Sudoku MDM, its MI labels, MI "
                           "head and ablation heads, and the protein MDM with its labels and head. A rerun loads "
                           "everything from the cache; an interrupted MDM training resumes from its last checkpoint, "
                           "a labelling run from its last finished shard."))
    _common(t)
    t.add_argument("--what", choices=["all", "sudoku", "protein"], default="all",
                   help="which models (default: all)")
    t.add_argument("--no-heads", action="store_true",
                   help="train the MDM(s) only; MI labels and heads later with `mimdm probe` / `mimdm fit-head`")
    t.add_argument("--no-ablations", action="store_true", help="skip the Sudoku ablation heads (chapter 3)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.set_defaults(func=cmd_train)

    pr = sub.add_parser("probe", formatter_class=fmt, help="generate the MI-head labels by probing (resumable)",
                        description=_desc(
                            "Ground-truth MI labels (nats) of the profile's trained MDM by probing "
                            "(mimdm.probing.probe_mi: 1 + |masked| x V forward passes per context, V = 9 digits or "
                            "20 amino acids). Prints shards, contexts, probing NFE (forward passes) and seconds.",
                            "The label set is written in shards to its cache folder; a rerun skips finished shards, "
                            "so an interrupted run resumes. Needs the trained MDM (`mimdm train`)."))
    _common(pr)
    pr.add_argument("--what", choices=["sudoku", "protein"], default="sudoku", help="which model's labels (default: sudoku)")
    pr.add_argument("--max-new-shards", type=int, default=None, metavar="N",
                    help="Sudoku: compute at most N new shards now (a later call continues)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")
    pr.set_defaults(func=cmd_probe)

    f = sub.add_parser("fit-head", formatter_class=fmt, help="train (or load) the MI head on the labels",
                       description=_desc(
                           "Train the profile's MI head on its labels (probing missing label shards first, as "
                           "`mimdm probe`), or load it from the cache. Prints its parameter count, best validation "
                           "loss (the head's training loss, mimdm.heads.mi_loss, on the validation split) and path.",
                           "Head training runs on the CPU from the stored hidden states; --device places the MDM "
                           "for any probing and the loaded head."))
    _common(f)
    f.add_argument("--what", choices=["sudoku", "protein"], default="sudoku", help="which model's head (default: sudoku)")
    f.add_argument("--no-progress", action="store_true", help="no progress bars")
    f.set_defaults(func=cmd_fit_head)

    d = sub.add_parser("decode", formatter_class=fmt, help="decode Sudoku puzzles (or masked proteins) with an unmasking rule",
                       description=_desc(
                           "Decode with the profile's trained MDM (`mimdm train` first) and an unmasking rule.",
                           "Rules and --knob: sequential (no knob: one position per forward pass, by confidence); "
                           "top-k (k positions per forward pass, default 2); threshold (every position with max "
                           "probability >= tau, default 0.9); eb (entropy-bounded sampler, gamma in nats, default "
                           "0.1); mi (MI-guided: admit a position only if its predicted MI with every position chosen "
                           "in the step is <= eps nats, default 0.01, and, with --entropy-cap, only if its entropy is "
                           "at most the cap; needs the MI head, `mimdm fit-head`).",
                           "Prints each decoded grid, its NFE (forward passes of the MDM), MI-head passes, whether it "
                           "is a valid solution keeping the givens, and the wall-clock seconds of the batched call."),
                       epilog="example:\n  mimdm decode --profile cpu --rule mi --knob 0.01 \\\n    "
                              "'53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79'")
    _common(d)
    d.add_argument("puzzles", nargs="*", metavar="PUZZLE",
                   help="81-character Sudoku string, row by row: digits 1-9, '.' or '0' for blanks (whitespace ignored)")
    d.add_argument("--protein", action="append", metavar="SEQ",
                   help="instead of puzzles: a protein over the 20 amino-acid letters with '_' at the positions to "
                        "generate (repeatable), decoded with the profile's protein MDM")
    d.add_argument("--rule", choices=RULES, default="sequential", help="unmasking rule (default: sequential)")
    d.add_argument("--knob", type=float, default=None, help="the rule's parameter (see above; default per rule)")
    d.add_argument("--entropy-cap", type=float, default=None, metavar="NATS",
                   help="mi rule only: admit a position (after the step's first) only if its entropy is <= NATS (default: no cap)")
    d.add_argument("--temperature", type=float, default=0.0, help="0: argmax values (default); > 0: sample at this temperature")
    d.add_argument("--seed", type=_seed, default=0, help="seed of the sampling, 0 to 2^63-1 (default 0)")
    d.add_argument("--pretty", action="store_true", help="print grids as 9 rows instead of one 81-character line")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    d.set_defaults(func=cmd_decode)

    n = sub.add_parser("nll", formatter_class=fmt, help="time-free I-MDCE NLL (nats) of complete Sudoku grids",
                       description=_desc(
                           "Negative log-likelihood -log p(x) in nats of complete grids under the profile's trained "
                           "Sudoku MDM, estimated without a time variable by the I-MDCE identity "
                           "(mimdm.likelihood.time_free_nll): K mask draws per grid, one forward pass each, so "
                           "NFE = K per grid. Prints the estimate +- its standard error (over the K draws)."))
    _common(n)
    n.add_argument("grids", nargs="+", metavar="GRID", help="complete 81-digit Sudoku grid (digits 1-9, row by row)")
    n.add_argument("--samples", type=int, default=None, metavar="K",
                   help="mask draws per grid = NFE per grid (default: the profile's nll_draws)")
    n.add_argument("--sizes", choices=["harmonic", "uniform"], default="uniform",
                   help="mask-size distribution, both unbiased for the I-MDCE identity's harmonic sum: uniform "
                        "(m uniform, weight n/m; lower variance on Sudoku, the library's default) or harmonic "
                        "(m ~ 1/m, weight H_n) (default: uniform)")
    n.add_argument("--seed", type=_seed, default=0, help="seed of the mask draws, 0 to 2^63-1 (default 0)")
    n.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    n.set_defaults(func=cmd_nll)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run ``mimdm`` with ``argv`` (default: ``sys.argv[1:]``); returns 0 or raises `SystemExit` on error."""
    args = build_parser().parse_args(argv)
    from .models.base import NonFiniteOutputError
    from .shipped import ShippedCheckpointError

    try:
        return args.func(args)
    except CLIError as e:
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(e.code) from None
    except FileNotFoundError as e:  # missing weights/checkpoints: the messages say how to produce them
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except ShippedCheckpointError as e:  # a shipped checkpoint altered or not matching the profile: says how to retrain
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ValueError, NonFiniteOutputError) as e:  # bad input or checkpoints (2), non-finite model output (1)
        if os.environ.get("MIMDM_DEBUG"):
            raise
        first = str(e).strip().partition("\n")[0]
        print(f"mimdm {args.cmd}: error: {first} (MIMDM_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(1 if isinstance(e, NonFiniteOutputError) else 2) from None
    except KeyboardInterrupt:
        print(f"\nmimdm {args.cmd}: interrupted; run the same command again to resume from the last checkpoint/shard",
              file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
