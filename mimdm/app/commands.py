"""The ``mimdm`` commands (`mimdm.app.cli` parses the arguments and calls them): each takes the parsed arguments
and returns the exit status; user-facing errors are `CLIError`."""
from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

from mimdm.app.book import prepare_artifacts, run_book
from mimdm.app.cli import DEFAULT_KNOBS
from mimdm.app.profiles import get_profile
from mimdm.core.artifacts import artifacts_root
from mimdm.core.device import apply_precision, resolve_device
from mimdm.core.keys import mi_head_dir, protein_label_dir
from mimdm.data import sudoku as sd
from mimdm.data.protein import parse_sequences, validate_sequence
from mimdm.evaluation.likelihood import time_free_nll
from mimdm.experiments import mi_head, protein
from mimdm.experiments.likelihood import reference_nll
from mimdm.experiments.mi_head import (
    head_config_for,
    load_or_build_labels,
    load_or_train_head,
    protein_head_config_for,
)
from mimdm.experiments.protein import (
    aligned_positions,
    decode_grouped,
    load_or_build_aligned_labels,
    load_or_build_protein_labels,
)
from mimdm.heads.mi_head import load_head
from mimdm.models.esmc import ESMCMDM
from mimdm.pipelines.labels import generate_labels, is_complete, label_dir
from mimdm.pipelines.protein_zoo import (
    FamilySpec,
    load_family,
    load_or_select_potts,
    load_or_train_protein_mdm,
    load_protein_backbone,
    load_protein_model,
    protein_mdm_dir,
)
from mimdm.pipelines.zoo import (
    chapter_sudoku_mdm,
    grids_to_tokens,
    profile_sudoku_mdm,
    sudoku_mdm_dir,
    tokens_to_grids,
)
from mimdm.probing.exact import probe_mi
from mimdm.sampling.decoding import EBSampler, MIGuided, Sequential, Threshold, TopK, decode, head_mi_fn


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


def _log(msg: str) -> None:
    print(f"[mimdm] {msg}", flush=True)


def _device(name: str):
    try:
        return resolve_device(name)
    except (ValueError, RuntimeError) as e:
        raise CLIError(f"bad --device {name!r}: {e}") from None


def _profile(name: str):
    try:
        return get_profile(name)
    except ValueError as e:
        raise CLIError(str(e)) from None


# ------------------------------------------------------------------------------------------ inputs and models
def _read_text(path: str, option: str) -> tuple[str, str]:
    """``(text, name)`` of a file option; ``-`` reads standard input."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    f = Path(path)
    if not f.is_file():
        raise CLIError(f"{option} {path}: no such file")
    return f.read_text(), f.name


def _one_input(args, sources: dict) -> str:
    """The name of the one input source given (``sources``: name -> given?); `CLIError` for none or several."""
    given = [k for k, v in sources.items() if v]
    if len(given) != 1:
        raise CLIError(f"give exactly one input: {', '.join(sources)} (got {', '.join(given) or 'none'})")
    if getattr(args, "json", False) and args.jsonl:
        raise CLIError("--json and --jsonl: choose one")
    return given[0]


def _puzzles_from_file(path: str) -> np.ndarray:
    """``[N, 9, 9]`` puzzles of a puzzle file (`mimdm.data.sudoku.parse_puzzles`); left-out puzzles are noted."""
    text, name = _read_text(path, "--file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            puzzles = sd.parse_puzzles(text, name)
        except sd.SudokuError as e:
            raise CLIError(str(e)) from None
    for w in caught:
        _log(str(w.message))
    return np.stack([q.puzzle for q in puzzles])


def _grids_from_file(path: str) -> list[tuple[str, str]]:
    """Grid strings of an ``nll --file``: the first field of each line (``#`` comments, blank lines skipped)."""
    text, name = _read_text(path, "--file")
    rows = [(n, line.split("#", 1)[0].replace(",", " ").split()) for n, line in enumerate(text.splitlines(), 1)]
    rows = [(n, f[0]) for n, f in rows if f and f[0].lower() not in ("puzzle", "grid", "solution")]
    if not rows:
        raise CLIError(f"{name}: no grid in the file")
    return [(f"{name} line {n}", g) for n, g in rows]


def _sequences_from_file(path: str, allow_gaps: bool) -> list[str]:
    text, name = _read_text(path, "--protein-file")
    try:
        return parse_sequences(text, name, allow_gaps=allow_gaps)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _sudoku_model(args, p, dev):
    """The profile's Sudoku MDM, or the checkpoint of ``--model``."""
    if args.model is None:
        return _load_sudoku(p, dev)
    try:
        return chapter_sudoku_mdm(p, dev, model_path=args.model)
    except FileNotFoundError as e:
        raise CLIError(f"--model: {e}") from None
    except ValueError as e:
        raise CLIError(f"--model {args.model}: {e}") from None


def _protein_backbone(args, dev):
    """The protein model of ``--model`` (`mimdm.pipelines.protein_zoo.load_protein_backbone`)."""
    try:
        return load_protein_backbone(args.model, dev), {"path": args.model}
    except ValueError as e:
        raise CLIError(f"--model {args.model}: {e}") from None


def _head_of_option(args, model, dev):
    """``(head, layer)`` of ``--head`` for ``--rule mi`` with ``--model``; checks that it reads this model."""
    if args.head is None:
        raise CLIError("--rule mi with --model needs --head PATH: the MI head trained for that model (the profile's "
                       "head reads the profile's model only)")
    try:
        head, rec = load_head(Path(args.head), dev)
    except (FileNotFoundError, ValueError) as e:
        raise CLIError(f"--head: {e}") from None
    if head.config.d_in != model.hidden_dim:
        raise CLIError(f"--head {args.head} reads hidden states of width {head.config.d_in}, the model's are "
                       f"{model.hidden_dim}: it was trained for another model")
    return head, int(rec["train_config"].get("layer", -1))


def _load_sudoku(p, dev):
    """The profile's trained Sudoku MDM; `CLIError` (code 1) telling to run ``mimdm train`` when missing."""

    try:
        return profile_sudoku_mdm(p, device=dev, progress=False, train=False)
    except FileNotFoundError:
        d = sudoku_mdm_dir(p.sudoku_model, p.sudoku_train, curriculum=p.sudoku_curriculum, create=False,
                           first=getattr(p, "sudoku_first_stage", None))
        partial = " (a training run was interrupted; `mimdm train` resumes it)" if (d / "train_state.pt").exists() else ""
        raise CLIError(f"no trained Sudoku MDM for profile {p.name!r} under {artifacts_root()} (looked for "
                       f"{d / 'model.pt'}){partial}; run `mimdm train --profile {p.name} --what sudoku` first "
                       "(or set MIMDM_ARTIFACTS to the folder that holds it)", code=1) from None


def _load_family(p):
    """The chapter-4 protein family (DHFR), with the dropped-row warnings turned into one note."""

    with warnings.catch_warnings():  # only the dropped-rows warning, which the note below restates
        warnings.filterwarnings("ignore", message=".*non-standard letters", category=UserWarning)
        fam = load_family(FamilySpec(), max_len=p.protein_model.max_len)
    if fam.dropped:
        _log(f"protein family: {len(fam.seqs)} sequences ({len(fam.dropped)} rows with non-standard letters dropped)")
    return fam


def _load_protein(p, dev, fam):
    """The profile's protein MDM (never trained here) and its cache key, as `mimdm.experiments.protein.prepare`."""

    name = p.protein_backbone
    if name == "potts":
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
            d = protein_mdm_dir(p.protein_model, p.protein_train, fam.data_id, create=False)
            raise CLIError(f"no trained protein MDM for profile {p.name!r} under {artifacts_root()} (looked for "
                           f"{d / 'model.pt'}); run `mimdm train --profile {p.name} --what protein` first",
                           code=1) from None
        return apply_precision(model), rec, Path(rec["path"]).parent.name
    model = apply_precision(ESMCMDM.load(name, device=dev))  # FileNotFoundError says where and how to provide the weights
    return model, {"path": str(name), "n_parameters": model.n_parameters()}, Path(str(name)).name


def _protein_label_dir(key: str, fam, p) -> Path:
    """Folder of the protein label set (the key of `mimdm.experiments.protein.load_or_build_protein_labels`, or of
    `load_or_build_aligned_labels` for the Potts MDM)."""
    aligned = p.protein_backbone == "potts"
    cfg = p.aligned_labels if aligned else p.protein_labels
    return protein_label_dir(key, fam.data_id, cfg.to_dict(), aligned)


def _protein_labels(model, key: str, fam, p, progress: bool) -> Path:
    """The profile's protein label set (built now where missing)."""

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
    return mi_head_dir(labels, hcfg.to_dict(), train_cfg.to_dict(), create=False) / "head.pt"


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
    if args.file is not None or args.protein_file is not None:
        return _probe_inputs(args)
    if args.model is not None or args.jsonl:
        raise CLIError("--model and --jsonl go with an input (--file or --protein-file): the MI labels are made for "
                       "the profile's model")
    p, dev = _profile(args.profile), _device(args.device)
    progress = not args.no_progress
    if args.what == "sudoku":
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


def _probe_inputs(args) -> int:
    """`mimdm probe --file/--protein-file`: exact MI between the masked positions of each input, streamed."""
    src = _one_input(args, {"--file": args.file is not None, "--protein-file": args.protein_file is not None})
    if args.max_new_shards is not None:
        raise CLIError("--max-new-shards applies to the label set, not to probing an input file")
    p, dev = _profile(args.profile), _device(args.device)
    if src == "--file":
        grids = _puzzles_from_file(args.file)
        model, rec = _sudoku_model(args, p, dev)
        items = [(sd.format_grid(g), t) for g, t in zip(grids, grids_to_tokens(grids, dev))]
    else:
        aligned = p.protein_backbone == "potts" and args.model is None
        seqs = _sequences_from_file(args.protein_file, allow_gaps=aligned)
        if args.model is not None:
            model, rec = _protein_backbone(args, dev)
        else:
            model, rec, _ = _load_protein(p, dev, _load_family(p))
        items = list(zip(seqs, _encode_sequences(model, seqs, aligned)))
    for i, (text, tok_L) in enumerate(items, 1):
        res = probe_mi(model, tok_L.reshape(1, -1))
        idx = res.masked[0].nonzero().flatten()
        mi_MM = res.mi[0][idx][:, idx]
        row = {"input": text, "masked_positions": idx.tolist(), "entropy_nats": res.entropy[0, idx].tolist(),
               "mi_nats": mi_MM.tolist(), "nfe": int(res.nfe[0]), "seconds": res.seconds}
        if args.jsonl:
            print(json.dumps({"model_path": str(rec["path"]), **row}, allow_nan=False), flush=True)
            continue
        M = len(idx)
        iu, ju = np.triu_indices(M, 1)
        vals = mi_MM.numpy()[iu, ju]
        top = np.argsort(-vals, kind="stable")[:args.top]
        pairs = ", ".join(f"{int(idx[iu[k]])}-{int(idx[ju[k]])}: {vals[k]:.4f}" for k in top)
        print(f"input {i}/{len(items)}: {M} masked, probing NFE {_n(row['nfe'], 'forward pass')}, {res.seconds:.2f} s; "
              f"total MI over pairs {vals.sum():.4f} nats" + (f"; top pairs (0-based positions: nats) {pairs}" if pairs
                                                              else ""), flush=True)
    return 0


# ------------------------------------------------------------------------------------------ fit-head
def cmd_fit_head(args) -> int:
    """`mimdm fit-head`: train the MI head on the profile's labels, probing missing shards first. Returns 0."""

    p, dev = _profile(args.profile), _device(args.device)
    progress = not args.no_progress
    if args.what == "sudoku":
        model, rec = _load_sudoku(p, dev)
        d = label_dir(Path(rec["path"]).parent, p.labels)
        if not is_complete(d, p.labels):
            _log(f"the MI label set is incomplete ({_manifest_summary(d, p.labels.n_shards)}): probing the rest "
                 "first (what `mimdm probe` does)")
        labels = load_or_build_labels(model, rec["path"], p.labels, progress=progress)
        hcfg, tcfg = head_config_for(p, model), p.head_train
    else:
        fam = _load_family(p)
        model, rec, key = _load_protein(p, dev, fam)
        labels = _protein_labels(model, key, fam, p, progress)
        hcfg = protein_head_config_for(p, model)
        tcfg = p.aligned_head_train if p.protein_backbone == "potts" else p.protein_head_train
    path = _head_path(labels, hcfg, tcfg)
    cached = path.exists()
    head, hrec = load_or_train_head(labels, hcfg, tcfg, model.mask_id, progress=progress, device=dev, model=model)
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
    """A `mimdm.sampling.decoding.Rule` from a validated knob (`_check_knob`); ``head`` and ``entropy_cap`` for the MI-guided rule."""

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
    grids = []
    for i, s in enumerate(strings, 1):
        try:
            grids.append(sd.parse_grid(s))
        except sd.SudokuError as e:
            shown = s if len(s) <= 30 else s[:27] + "..."
            raise CLIError(f"puzzle {i} ({shown!r}) is not a valid Sudoku string: {e}") from None
        if sd.count_solutions(grids[-1], limit=1) == 0:
            shown = s if len(s) <= 30 else s[:27] + "..."
            raise CLIError(f"puzzle {i} ({shown!r}) has no solution: its givens break no rule, but no grid completes "
                           "them")
    return np.stack(grids)


def _sudoku_head(p, model, rec, dev):
    labels = label_dir(Path(rec["path"]).parent, p.labels, create=False)
    path = _head_path(labels, head_config_for(p, model), p.head_train)
    if not path.exists():
        raise CLIError(f"--rule mi needs the profile's MI head, which is not trained (looked for {path}); run "
                       f"`mimdm fit-head --profile {p.name}` (or `mimdm train --profile {p.name}`) first", code=1)
    return load_head(path, dev)[0]


def _decode_sudoku(args) -> dict:
    grids = _puzzles_from_file(args.file) if args.file is not None else _parse_puzzles(args.puzzles)
    knob, cap = _check_knob(args.rule, args.knob), _check_cap(args)
    p, dev = _profile(args.profile), _device(args.device)
    model, rec = _sudoku_model(args, p, dev)
    head, layer = None, p.head_train.layer
    if args.rule == "mi":
        head, layer = (_head_of_option(args, model, dev) if args.model is not None
                       else (_sudoku_head(p, model, rec, dev), layer))
    rule = _make_rule(args.rule, knob, head, layer, cap)
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
    p0 = _profile(args.profile)
    # the Potts MDM reads aligned rows (gaps allowed; the length is checked once the model is loaded)
    gaps = p0.protein_backbone == "potts" and args.model is None
    if args.protein_file is not None:
        seqs = _sequences_from_file(args.protein_file, allow_gaps=gaps)
    else:
        seqs = args.protein
        for i, s in enumerate(seqs, 1):
            try:
                validate_sequence(s, allow_mask=True, allow_gaps=gaps)
            except (TypeError, ValueError) as e:
                raise CLIError(f"--protein sequence {i}: {e} (use the 20 upper-case amino-acid letters and '_' for a "
                               "masked position)") from None
    knob, cap = _check_knob(args.rule, args.knob), _check_cap(args)
    p, dev = _profile(args.profile), _device(args.device)
    if args.model is not None:
        model, rec = _protein_backbone(args, dev)
        head, layer = _head_of_option(args, model, dev) if args.rule == "mi" else (None, -1)
        return _decode_sequences(args, model, rec, seqs, _make_rule(args.rule, knob, head, layer, cap), knob, gaps)
    longest = max(map(len, seqs))
    if longest > p.protein_model.max_len:
        raise CLIError(f"a --protein sequence has {longest} residues, more than the model's maximum "
                       f"{p.protein_model.max_len}; nothing is truncated")
    fam = _load_family(p)
    model, rec, key = _load_protein(p, dev, fam)
    head = None
    if args.rule == "mi":
        hcfg = protein_head_config_for(p, model)
        tcfg = p.aligned_head_train if p.protein_backbone == "potts" else p.protein_head_train
        path = _head_path(_protein_label_dir(key, fam, p), hcfg, tcfg)
        if not path.exists():
            raise CLIError(f"--rule mi needs the profile's protein MI head, which is not trained (looked for {path}); "
                           f"run `mimdm fit-head --profile {p.name} --what protein` first", code=1)
        head = load_head(path, dev)[0]
    rule = _make_rule(args.rule, knob, head, p.protein_head_train.layer, cap)
    return _decode_sequences(args, model, rec, seqs, rule, knob, gaps)


def _encode_sequences(model, seqs: list[str], aligned: bool) -> list:
    try:
        return [model.encode(s)[0] for s in seqs]
    except ValueError as e:
        raise CLIError(f"protein input: {e}" + (f" (the Potts MDM reads aligned rows of {model.length} columns: the 20 "
                                                "amino acids, '-' for a gap, '_' for a masked column)"
                                                if aligned else "")) from None


def _decode_sequences(args, model, rec, seqs: list[str], rule, knob, aligned: bool) -> dict:
    toks = _encode_sequences(model, seqs, aligned)
    out, nfe, extra, secs = decode_grouped(model, toks, rule, args.temperature, args.seed)
    rows = []
    for s, o, n in zip(seqs, out, nfe):
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
    src = _one_input(args, {"PUZZLE strings": bool(args.puzzles), "--file": args.file is not None,
                            "--protein SEQ": bool(args.protein), "--protein-file": args.protein_file is not None})
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise CLIError(f"--temperature must be a finite number >= 0 (0: argmax), got {args.temperature}")
    if args.head is not None and (args.model is None or args.rule != "mi"):
        raise CLIError("--head goes with --model and --rule mi (the profile's own head is found by itself)")
    res = _decode_sudoku(args) if src in ("PUZZLE strings", "--file") else _decode_protein(args)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    if args.jsonl:
        _print_jsonl(res)
        return 0

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


def _print_jsonl(res: dict) -> None:
    """One JSON line per input: the run's settings (``batch_seconds``: the one batched call) and the input's result."""
    head = {("batch_seconds" if k == "seconds" else k): v for k, v in res.items() if k != "results"}
    for r in res["results"]:
        print(json.dumps({**head, **r}, allow_nan=False), flush=True)


# ------------------------------------------------------------------------------------------ nll
def cmd_nll(args) -> int:
    """`mimdm nll`: time-free I-MDCE NLL (nats) of complete Sudoku grids, ``--samples`` passes per grid.

    Returns 0.

    Raises:
        CLIError: ``--samples`` < 1, a malformed or incomplete grid, a missing model.
    """
    _one_input(args, {"GRID strings": bool(args.grids), "--file": args.file is not None})
    if args.samples is not None and args.samples < 1:
        raise CLIError(f"--samples must be >= 1, got {args.samples}")
    named = (_grids_from_file(args.file) if args.file is not None
             else [(f"grid {i}", s) for i, s in enumerate(args.grids, 1)])
    grids = []
    for where, s in named:
        try:
            g = sd.parse_grid(s, check=False)
        except sd.SudokuError as e:
            raise CLIError(f"{where} is not a valid Sudoku string: {e}") from None
        if (g == 0).any():
            raise CLIError(f"{where} has {int((g == 0).sum())} blank cells; `mimdm nll` scores complete grids "
                           "(81 digits 1-9)")
        grids.append(g)
    p, dev = _profile(args.profile), _device(args.device)
    K = args.samples or p.nll_draws
    model, rec = _sudoku_model(args, p, dev)
    est = time_free_nll(model, grids_to_tokens(np.stack(grids), dev), n_samples=K, seed=args.seed, sizes=args.sizes)
    ref = reference_nll()["uniform_valid_grids"]
    # one draw has no standard error: None (JSON null; "n/a" in text), never NaN (not valid JSON)
    rows = [{"grid": sd.format_grid(g), "nll_nats": float(v), "stderr_nats": float(se) if math.isfinite(se) else None,
             "nfe": int(n), "valid": bool(sd.is_valid_solution(g))}
            for g, v, se, n in zip(grids, est.value.cpu(), est.stderr.cpu(), est.nfe.cpu())]
    res = {"model_path": rec["path"], "samples": K, "sizes": args.sizes, "seed": args.seed,
           "reference_uniform_valid_grids_nats": ref, "results": rows}
    if args.json:
        print(json.dumps(res, indent=1, allow_nan=False))
        return 0
    if args.jsonl:
        _print_jsonl(res)
        return 0
    for i, r in enumerate(rows, 1):
        se = "n/a" if r["stderr_nats"] is None else f"{r['stderr_nats']:.3f}"
        print(f"grid {i}: NLL {r['nll_nats']:.3f} ± {se} nats (± = standard error over {K} mask "
              f"draws), NFE {r['nfe']} forward passes; valid grid: {'yes' if r['valid'] else 'no'}")
    print(f"time-free I-MDCE estimate ({args.sizes} mask sizes, seed {args.seed}); reference: uniform over all valid "
          f"grids = {ref:.2f} nats")
    return 0


# ------------------------------------------------------------------------------------------ book
def cmd_book(args) -> int:
    """`mimdm book`: run the chapters with papermill under a profile and build the HTML book. Returns 0."""

    run_book(args.profile, args.device, chapters=args.chapter, execute=not args.no_execute, build=not args.no_build,
             retrain=args.retrain)
    return 0
