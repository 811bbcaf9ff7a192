"""Chapters 2 (estimator accuracy) and 3 (Sudoku constraint recovery): the measurements.

Label sets and heads are cached by configuration next to the MDM they belong to
(`load_or_build_labels`, `load_or_train_head`), so the chapters share them and a rerun is fast.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mimdm.core.contract import MaskedModel
from mimdm.core.keys import mi_head_dir
from mimdm.core.shipped import refuse_training
from mimdm.data import sudoku as sd
from mimdm.evaluation.metrics import correlation, graph_recovery, pair_values
from mimdm.heads.mi_head import (
    HeadTrainConfig,
    MIHead,
    MIHeadConfig,
    forward_and_head_seconds,
    head_inputs,
    load_head,
    predict_mi,
    save_head,
    train_head,
)
from mimdm.models.potts import PottsMDM
from mimdm.pipelines.labels import (
    PACKED,
    LabelConfig,
    generate_labels,
    is_complete,
    label_dir,
    load_labels,
    unpack_labels,
)
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.probing.exact import probe_mi
from mimdm.core.timing import seconds_per_call
from mimdm.probing.sudoku_mi import propagated_mi, propagated_mi_rounds, underdetermined_grids


def load_or_build_labels(model: MaskedModel, model_path: str | Path, cfg: LabelConfig, progress: bool = True) -> Path:
    """The label set of ``cfg`` for the MDM saved at ``model_path``: unpacked from a shipped ``labels.pt``
    (`mimdm.pipelines.labels.unpack_labels`) or generated (resumably) if incomplete."""
    d = label_dir(Path(model_path).parent, cfg)
    if not is_complete(d, cfg) and (d / PACKED).is_file():
        unpack_labels(model, cfg, d)
    if not is_complete(d, cfg):
        generate_labels(model, cfg, d, progress=progress)
    return d


def with_target(data: dict, target: str = "mi") -> dict:
    """Label dict whose ``"mi"`` is the ``target`` labels (e.g. ``"mi_aa"``, the amino-acid-only MI of
    aligned-model labels), so heads and metrics written for ``"mi"`` read them.

    Raises:
        KeyError: the labels hold no ``target``.
    """
    if target == "mi":
        return data
    if target not in data:
        raise KeyError(f"the labels hold no {target!r} (have: {sorted(k for k in data if k.startswith('mi'))})")
    return {**data, "mi": data[target]}


def sudoku_symmetry_augment(model: MaskedModel, split: dict, layer: int, rng: np.random.Generator,
                            batch_size: int = 256) -> dict:
    """A label split moved by one random Sudoku symmetry per context (the `HeadTrainConfig` ``augment`` of
    ``"sudoku_symmetry"``).

    Each context gets a validity-preserving symmetry (`mimdm.data.sudoku.random_symmetry_maps`: cells permuted
    within the row/column/box structure, digits relabelled); its MI matrix is permuted with the cells and its hidden
    states and entropies are recomputed by ``model`` on the new tokens (`mimdm.heads.mi_head.head_inputs`), so the
    head sees the inputs it would see at test time. The MI label is exact for an MDM equivariant under these
    symmetries (the true conditionals are) and approximate for a learned one; the MDM never learns anything here.

    Args:
        model: the Sudoku MDM (81 positions, 9 values) whose labels these are.
        split: from `mimdm.pipelines.labels.load_labels`: ``tokens [N, 81]``, ``mi [N, 81, 81]`` nats.
        layer: the hidden-state layer the head reads.
        rng: the symmetries' generator.
        batch_size: contexts per MDM pass.

    Returns:
        ``{"tokens" [N, 81] long, "mi" [N, 81, 81] (the split's dtype), "entropy" [N, 81] float32 nats,
        "probs" [N, 81, 9] float32 (the marginals), f"hidden_{layer}" [N, 81, D] (the split's hidden dtype, or
        float32)}`` on the CPU.

    Raises:
        ValueError: not an 81-position, 9-value model, or a non-finite MDM output.
    """
    if model.n_values != 9 or split["tokens"].shape[-1] != sd.N_CELLS:
        raise ValueError(f"sudoku_symmetry_augment needs 81 positions and 9 values, got "
                         f"{split['tokens'].shape[-1]} and {model.n_values}")
    tok = split["tokens"].long()
    n = len(tok)
    cells, digits = random_symmetry_tensors(n, rng)
    values = model.value_token_ids.cpu().long()  # value v (digit v + 1) -> token
    vocab = torch.arange(max(int(values.max()), int(model.mask_id), int(tok.max())) + 1)
    table = vocab.repeat(n, 1)  # [N, vocab]: every context's token relabelling
    table[:, values] = values[digits[:, 1:] - 1]
    moved = tok.gather(1, cells)
    new = table.gather(1, moved)
    ar = torch.arange(n)[:, None, None]
    mi = split["mi"][ar, cells[:, :, None], cells[:, None, :]]
    key = f"hidden_{layer}"
    dtype = split[key].dtype if key in split else torch.float32
    hs, es, ps = [], [], []
    with torch.no_grad():
        for s in range(0, n, batch_size):
            h, _, e, p = head_inputs(model, new[s:s + batch_size].to(model.device), layer)
            if not (torch.isfinite(h).all() and torch.isfinite(e).all() and torch.isfinite(p).all()):
                raise ValueError("the MDM gave a non-finite output on an augmented context")
            hs.append(h.to(dtype).cpu())
            es.append(e.float().cpu())
            ps.append(p.float().cpu())
    return {"tokens": new, "mi": mi, "entropy": torch.cat(es), "probs": torch.cat(ps), key: torch.cat(hs)}


def with_marginals(model: MaskedModel, split: dict, batch_size: int = 256) -> dict:
    """The label split with the MDM's marginals ``"probs" [N, L, V]`` (float32, CPU) added, from one forward per
    context (what a ``constraint_feature`` head reads besides the stored hidden states); unchanged if it has them.

    Raises:
        ValueError: a non-finite MDM output; as `mimdm.core.contract.MaskedModel.check_tokens`.
    """
    if "probs" in split:
        return split
    tok = split["tokens"].long()
    ps = []
    with torch.no_grad():
        for s in range(0, len(tok), batch_size):
            p = head_inputs(model, tok[s:s + batch_size].to(model.device)).probs
            if not torch.isfinite(p).all():
                raise ValueError("the MDM gave non-finite marginals on a label context")
            ps.append(p.float().cpu())
    probs = torch.cat(ps) if ps else torch.zeros(0, tok.shape[1], model.n_values)
    return {**split, "probs": probs}


def random_symmetry_tensors(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`mimdm.data.sudoku.random_symmetry_maps` as long tensors: ``(cells [n, 81], digits [n, 10])``."""
    cells, digits = sd.random_symmetry_maps(n, rng)
    return torch.from_numpy(cells).long(), torch.from_numpy(digits.astype(np.int64))


def load_or_train_head(labels: Path, head_cfg: MIHeadConfig, train_cfg: HeadTrainConfig, mask_id: int,
                       progress: bool = True, device="cpu", target: str = "mi",
                       model: MaskedModel | None = None) -> tuple[MIHead, dict]:
    """The head of these configs trained on ``labels`` (cached in the artifacts by config), loaded on ``device``.

    Training runs on the CPU from the stored hidden states. ``target``: which labels it learns
    (`with_target`; default the probed MI ``"mi"``). ``model``: the MDM of the labels, needed (and used) only when
    ``train_cfg.augment`` is ``"sudoku_symmetry"`` (`sudoku_symmetry_augment`) or the head reads the marginals
    (``head_cfg.constraint_feature``, `with_marginals`).

    Raises:
        ValueError: an augmenting ``train_cfg`` or a ``constraint_feature`` head without ``model``.
    """
    d = mi_head_dir(labels, head_cfg.to_dict(), train_cfg.to_dict(), target)
    path = d / "head.pt"
    if not path.exists():
        refuse_training(d, "MI head")
        augment = None
        if train_cfg.augment == "sudoku_symmetry":
            if model is None:
                raise ValueError("augment='sudoku_symmetry' needs the MDM: load_or_train_head(..., model=model)")
            augment = lambda split, rng: sudoku_symmetry_augment(model, split, train_cfg.layer, rng)  # noqa: E731
        train, val = (with_target(load_labels(labels, s), target) for s in ("train", "val"))
        if head_cfg.constraint_feature:
            if model is None:
                raise ValueError("a constraint_feature head reads the MDM's marginals: "
                                 "load_or_train_head(..., model=model)")
            train, val = with_marginals(model, train), with_marginals(model, val)
        head, log = train_head(train, val, head_cfg, train_cfg, mask_id, progress=progress, augment=augment)
        save_head(head, path, train_cfg, log)
    return load_head(path, device)


def _pairs(mat, masked):
    return np.concatenate([pair_values(mat[b], masked[b]) for b in range(len(masked))])


@torch.no_grad()
def predict_from_labels(head: MIHead, data: dict, layer: int, mask_id: int, batch_size: int = 64,
                        model: MaskedModel | None = None) -> torch.Tensor:
    """Head predictions ``[N, L, L]`` from the stored hidden states of a label split.

    A ``constraint_feature`` head also reads the marginals: the split's ``probs``, or else one forward of ``model`` per
    context (`with_marginals`).

    Raises:
        ValueError: a ``constraint_feature`` head, a split without ``probs`` and no ``model``.
    """
    if head.config.constraint_feature and "probs" not in data:
        if model is None:
            raise ValueError("this head reads the MDM's marginals: pass model= (or a split with 'probs')")
        data = with_marginals(model, data)
    dev = next(head.parameters()).device
    out = []
    for s in range(0, len(data["tokens"]), batch_size):
        tok = data["tokens"][s:s + batch_size].to(dev)
        h, e = data[f"hidden_{layer}"][s:s + batch_size].to(dev), data["entropy"][s:s + batch_size].to(dev)
        p = data["probs"][s:s + batch_size].to(dev) if "probs" in data else None
        out.append(head(h, tok == mask_id, e, p).cpu())
    return torch.cat(out)


def _nanmean(x, stat=np.nanmean) -> float:
    """``stat`` (default the mean) of the non-NaN values of ``x``; NaN, without numpy's empty-slice warning, when there
    are none."""
    x = np.asarray(x, dtype=float)
    return float(stat(x)) if (~np.isnan(x)).any() else float("nan")


def accuracy(pred: torch.Tensor, data: dict, mask_id: int, rate_bins=(0.0, 0.25, 0.5, 0.75, 1.0001),
             min_mi: float = 1e-3) -> dict:
    """Predicted vs ground-truth MI over masked pairs: overall (pooled pairs, and the median of
    per-context Pearson), and by masking-rate bin.

    Top-k recall per context: k = min(number of masked cells, number of pairs with ground-truth MI
    above ``min_mi`` nats); the fraction of the k pairs with the largest ground-truth MI that are
    also among the k largest predicted. Contexts with k = 0 (no real dependence to rank) are
    excluded and counted in ``"n_contexts_without_dependence"``.
    """
    masked = data["tokens"] == mask_id
    rates = masked.float().mean(1).numpy()
    p, t = _pairs(pred, masked), _pairs(data["mi"], masked)
    recalls = []
    for b in range(len(masked)):
        pv, tv = pair_values(pred[b], masked[b]), pair_values(data["mi"][b], masked[b])
        k = min(int(masked[b].sum()), int((tv > min_mi).sum()))
        if k == 0:
            recalls.append(np.nan)
            continue
        recalls.append(len(set(np.argsort(-pv, kind="stable")[:k]) & set(np.argsort(-tv, kind="stable")[:k])) / k)
    recalls = np.array(recalls)
    per_ctx = [correlation(pair_values(pred[b], masked[b]), pair_values(data["mi"][b], masked[b]))["pearson"]
               for b in range(len(masked)) if masked[b].sum() >= 3]
    by_rate = []
    for lo, hi in zip(rate_bins[:-1], rate_bins[1:]):
        sel = (rates >= lo) & (rates < hi)
        if sel.sum() == 0:
            continue
        c = correlation(_pairs(pred[sel], masked[sel]), _pairs(data["mi"][sel], masked[sel]))
        by_rate.append({"mask_rate_lo": lo, "mask_rate_hi": min(hi, 1.0), "n_contexts": int(sel.sum()),
                        **c, "topk_recall": _nanmean(recalls[sel])})
    return {"overall": {**correlation(p, t), "median_context_pearson": _nanmean(per_ctx, np.nanmedian),
                        "topk_recall": _nanmean(recalls),
                        "n_contexts_without_dependence": int(np.isnan(recalls).sum())},
            "by_rate": by_rate, "pred_pairs": p, "true_pairs": t}


def _share(part: float, whole: float) -> float:
    """``part / whole``, NaN when ``whole`` is 0 (nothing to share)."""
    return float(part / whole) if whole > 0 else float("nan")


def error_by_pair_class(pred_BLL: torch.Tensor, data: dict, mask_id: int, classes: dict[str, np.ndarray]) -> list[dict]:
    """Where the head's error lies: the masked pairs (i < j) of a label split, grouped by fixed pair classes.

    Args:
        pred_BLL: ``[N, L, L]`` predicted MI (nats), e.g. `predict_from_labels`.
        data: the label split (``tokens [N, L]``, ``mi [N, L, L]`` probed MI in nats).
        mask_id: the MDM's mask token id.
        classes: ``{name: [L, L] bool}``, symmetric; a pair belongs to every class whose entry is True (on Sudoku,
            e.g., the constraint graph `mimdm.data.sudoku.constraint_graph` and its complement). The chapter's
            findings read a name as a verb phrase ("pairs that <name>": "share a unit").

    Returns:
        One row per class: ``{"pair_class", "share_of_pairs", "share_of_mi" (of the probed MI summed over masked
        pairs), "share_of_squared_error", "pearson" (within the class), "pearson_if_exact"}``. ``pearson_if_exact`` is
        the pooled Pearson over all masked pairs when the class's predictions are replaced by the probed values: the
        accuracy the head would reach if it made no error on that class and the same errors elsewhere (1 for a class
        holding every pair). A share whose total is 0 (no probed MI, an exact head) is NaN, and so is a Pearson that is
        undefined (`mimdm.evaluation.metrics.correlation`: fewer than 3 pairs, or constant values).

    Raises:
        ValueError: ``pred_BLL`` and ``data["mi"]`` of different shapes; no masked pair at all; a class matrix that is
            not ``[L, L]`` bool or not symmetric.
    """
    tokens_BL, mi_BLL = data["tokens"], data["mi"]
    if tuple(pred_BLL.shape) != tuple(mi_BLL.shape):
        raise ValueError(f"pred {tuple(pred_BLL.shape)} and labels {tuple(mi_BLL.shape)} differ in shape")
    L = tokens_BL.shape[1]
    masked_BL = tokens_BL == mask_id
    if len(masked_BL) == 0 or int((masked_BL.sum(1) >= 2).sum()) == 0:
        raise ValueError("the label split holds no pair of masked positions")
    p, t = _pairs(pred_BLL, masked_BL).astype(float), _pairs(mi_BLL, masked_BL).astype(float)
    rows = []
    for name, cls_LL in classes.items():
        cls_LL = np.asarray(cls_LL)
        if cls_LL.shape != (L, L) or cls_LL.dtype != bool:
            raise ValueError(f"pair class {name!r} must be an [{L}, {L}] bool matrix, got {cls_LL.dtype} {cls_LL.shape}")
        if not np.array_equal(cls_LL, cls_LL.T):
            raise ValueError(f"pair class {name!r} is not symmetric")
        sel = np.concatenate([pair_values(cls_LL, masked_BL[b]) for b in range(len(masked_BL))])
        rows.append({"pair_class": name, **_class_error(p, t, sel)})
    return rows


def _class_error(p: np.ndarray, t: np.ndarray, sel: np.ndarray) -> dict:
    """The error statistics of `error_by_pair_class` for the pairs ``sel`` (bool) of predictions ``p`` and labels ``t``."""
    se = (p - t) ** 2
    return {"share_of_pairs": float(sel.mean()), "share_of_mi": _share(t[sel].sum(), t.sum()),
            "share_of_squared_error": _share(se[sel].sum(), se.sum()), "pearson": correlation(p[sel], t[sel])["pearson"],
            "pearson_if_exact": correlation(np.where(sel, t, p), t)["pearson"]}


#: Classes of `error_by_completions`: inclusive ranges of a context's number of completions (None: no upper end).
COMPLETION_CLASSES = ((0, 0), (1, 1), (2, 32), (33, 999), (1000, None))


def error_by_completions(pred_BLL: torch.Tensor, data: dict, mask_id: int, classes=COMPLETION_CLASSES,
                         limit: int = 1000) -> list[dict]:
    """Where the head's error lies by how far each context determines the grid: the masked pairs (i < j) of a Sudoku
    label split, grouped by their context's number of completions (`mimdm.data.sudoku.count_solutions`, counted up to
    ``limit``; 0 for givens that break a rule, as a decoding-trajectory state can hold).

    A context with few completions couples cells that share no unit through the choice among them (on two
    completions, every cell that differs between them determines the others): dependence that no pair of cells'
    own constraints shows.

    Args:
        pred_BLL: ``[N, 81, 81]`` predicted MI (nats), e.g. `predict_from_labels`.
        data: the label split (``tokens [N, 81]``: values 0..8 for digits 1..9 and ``mask_id``; ``mi [N, 81, 81]``
            probed MI in nats).
        mask_id: the MDM's mask token id.
        classes: inclusive ``(lo, hi)`` ranges of the count (``hi`` None: no upper end); a context goes to the first
            range holding its count.
        limit: counting stops here, so the count is ``min(true count, limit)``; a range above ``limit`` holds nothing.

    Returns:
        One row per range that holds a context, in the order given: ``{"completions"`` (e.g. ``"2-32"``, ``"1000+"``),
        ``"n_contexts"`` and the statistics of `error_by_pair_class` (``"share_of_pairs"``, ``"share_of_mi"``,
        ``"share_of_squared_error"``, ``"pearson"``, ``"pearson_if_exact"``)``}``.

    Raises:
        ValueError: ``pred_BLL`` and ``data["mi"]`` of different shapes, or ``data["tokens"]`` not ``[N, 81]`` for
            them; non-finite predictions; not Sudoku tokens (values 0..8 and ``mask_id``); no masked pair at all; a
            context whose count no range holds; ``limit`` < 1, or a range that straddles it (its counts are capped
            there).
    """
    tokens_BL, mi_BLL = data["tokens"], data["mi"]
    if tuple(pred_BLL.shape) != tuple(mi_BLL.shape):
        raise ValueError(f"pred {tuple(pred_BLL.shape)} and labels {tuple(mi_BLL.shape)} differ in shape")
    if tuple(tokens_BL.shape) != tuple(mi_BLL.shape[:2]):
        raise ValueError(f"tokens {tuple(tokens_BL.shape)} do not match labels {tuple(mi_BLL.shape)}")
    if not torch.isfinite(torch.as_tensor(pred_BLL)).all():
        raise ValueError("error_by_completions got non-finite predictions")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    for lo, hi in classes:
        if lo < limit and hi is not None and hi >= limit:
            raise ValueError(f"completion class {(lo, hi)} straddles limit={limit}: counts stop there")
    masked_BL = tokens_BL == mask_id
    if tokens_BL.shape[-1] != sd.N_CELLS or bool(((tokens_BL < 0) | (tokens_BL > 8))[~masked_BL].any()):
        raise ValueError(f"error_by_completions needs Sudoku tokens: {sd.N_CELLS} cells of values 0..8 or the mask "
                         f"{mask_id}")
    if len(masked_BL) == 0 or int((masked_BL.sum(1) >= 2).sum()) == 0:
        raise ValueError("the label split holds no pair of masked positions")
    grids = np.where(masked_BL.numpy(), 0, tokens_BL.numpy() + 1).astype(np.int8)
    counts = np.array([sd.count_solutions(g, limit) for g in grids])
    which = np.full(len(counts), -1)
    for k, (lo, hi) in reversed(list(enumerate(classes))):
        which[(counts >= lo) & (counts <= (np.inf if hi is None else hi))] = k
    if (which < 0).any():
        raise ValueError(f"no completion class holds {int(counts[which < 0][0])} completions: classes {classes}")
    p, t = _pairs(pred_BLL, masked_BL).astype(float), _pairs(mi_BLL, masked_BL).astype(float)
    n_pairs_B = masked_BL.sum(1).numpy().astype(np.int64)
    pair_class = np.repeat(which, n_pairs_B * (n_pairs_B - 1) // 2)
    rows = []
    for k, (lo, hi) in enumerate(classes):
        if (which == k).any():
            name = f"{lo}+" if hi is None else str(lo) if lo == hi else f"{lo}-{hi}"
            rows.append({"completions": name, "n_contexts": int((which == k).sum()), **_class_error(p, t, pair_class == k)})
    return rows


def direction_agreement(data: dict, mask_id: int) -> dict:
    """How far the two probing directions of the label's MI agree, over the masked pairs (i < j) of a label split.

    Probing gives two MI values per pair: I_{i→j} (fill j, read the change of p(x_i)) and I_{j→i}; the label is their
    mean T and the set stores A = |I_{j→i} − I_{i→j}| (`mimdm.probing.exact.probe_mi`), so the two directions are
    T ± A/2. An MDM whose conditionals were those of one joint distribution would give A = 0. Both statistics are
    Pearson correlations over the pairs entered in both orders (Fisher's double-entry intraclass correlation), so
    they do not depend on which direction is called first. Label sets store A in float16
    (`mimdm.pipelines.labels`), so the rebuilt directions carry its rounding (about 1e-3 relative).

    Args:
        data: the label split (``tokens [N, L]``, ``mi [N, L, L]`` and ``asymmetry [N, L, L]`` in nats).
        mask_id: the MDM's mask token id.

    Returns:
        ``{"directions_pearson"`` (one direction against the other), ``"one_direction_pearson"`` (one direction
        against the label T), ``"n_pairs"}``; a Pearson is NaN when undefined (`mimdm.evaluation.metrics.correlation`).

    Raises:
        ValueError: no pair of masked positions; ``mi`` and ``asymmetry`` of different shapes.
    """
    if tuple(data["mi"].shape) != tuple(data["asymmetry"].shape):
        raise ValueError(f"mi {tuple(data['mi'].shape)} and asymmetry {tuple(data['asymmetry'].shape)} differ in shape")
    masked_BL = data["tokens"] == mask_id
    if len(masked_BL) == 0 or int((masked_BL.sum(1) >= 2).sum()) == 0:
        raise ValueError("the label split holds no pair of masked positions")
    mi_P = _pairs(data["mi"], masked_BL).astype(float)
    half_P = _pairs(data["asymmetry"], masked_BL).astype(float) / 2
    first_2P, second_2P = np.concatenate([mi_P + half_P, mi_P - half_P]), np.concatenate([mi_P - half_P, mi_P + half_P])
    return {"directions_pearson": correlation(first_2P, second_2P)["pearson"],
            "one_direction_pearson": correlation(first_2P, np.concatenate([mi_P, mi_P]))["pearson"], "n_pairs": int(len(mi_P))}


def calibration(pred_pairs: np.ndarray, true_pairs: np.ndarray, n_bins: int = 12, floor: float = 1e-4) -> list[dict]:
    """Mean true MI in log-spaced bins of predicted MI (nats), plus one bin for predictions below ``floor``.

    Log spacing keeps the rare large values (those decoding depends on) visible; each row has its
    pair count ``n``.
    """
    top = max(float(pred_pairs.max()), floor * 10)
    edges = np.concatenate([[-np.inf], np.geomspace(floor, top, n_bins), [np.inf]])
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (pred_pairs >= lo) & (pred_pairs < hi)
        if sel.any():
            out.append({"pred_lo": float(max(lo, 0.0)), "pred_mean": float(pred_pairs[sel].mean()),
                        "true_mean": float(true_pairs[sel].mean()), "n": int(sel.sum())})
    return out


@torch.no_grad()
def head_cost(model: MaskedModel, head: MIHead, batch: int = 64, repeats: int = 3, layer: int = -1,
              probing: bool = True) -> dict:
    """Seconds per context of one MDM forward, of the head pass, and of probing (same contexts: 75% masked).

    Returns ``{"mdm_forward_s", "head_s", "head_over_forward", "n_masked"}``, and with ``probing`` also
    ``"probing_s", "probing_nfe", "speedup_vs_probing"`` (probing the first 8 contexts). Forward and head are timed
    in the same call, one after the other, so their ratio comes from one run.
    """
    x = _cost_contexts(model, batch)
    t_fwd, t_head = (s / batch for s in forward_and_head_seconds(model, head, x, layer, repeats))
    out = {"mdm_forward_s": t_fwd, "head_s": t_head, "head_over_forward": t_head / t_fwd,
           "n_masked": int(model.is_masked(x[0]).sum())}
    if not probing:
        return out
    n_probe = min(8, batch)
    res = probe_mi(model, x[:n_probe])
    return {**out, "probing_s": res.seconds / n_probe, "probing_nfe": float(res.nfe.float().mean()),
            "speedup_vs_probing": (res.seconds / n_probe) / (t_fwd + t_head)}


def _cost_contexts(model: MaskedModel, batch: int) -> torch.Tensor:
    """The contexts on which costs are timed: ``batch`` random solution grids with 20 clues kept (75% masked), as
    ``[batch, 81]`` tokens on the model's device (seed 0)."""
    rng = np.random.default_rng(0)
    sols = sd.random_solutions(batch, rng)
    return grids_to_tokens(np.stack([sd.random_partial(s, 20, rng) for s in sols]), model.device)


#: The propagated-constraint reference (`propagation_reference`): the dampings and rounds tried on the validation
#: split, and j's digits each direction conditions on.
PROPAGATION_DAMPINGS = (0.5, 0.7, 1.0)
PROPAGATION_ROUNDS = tuple(range(1, 11))
PROPAGATION_TOP_K = 4


def propagation_reference(val: dict, test: dict, mask_id: int, head_val_BLL: torch.Tensor,
                          head_test_BLL: torch.Tensor, dampings=PROPAGATION_DAMPINGS, rounds=PROPAGATION_ROUNDS,
                          top_k: int | None = PROPAGATION_TOP_K) -> tuple[dict, torch.Tensor]:
    """A training-free reference for the head: Sudoku's exclusion constraints propagated from the MDM's marginals
    (`mimdm.probing.sudoku_mi.propagated_mi`), its settings chosen on the validation split, and its combination with
    the head.

    Every (damping, rounds) pair of the grid is scored by Pearson with the probed MI over the validation pairs; the
    best one is evaluated on test (`accuracy`). Combined: the least-squares fit of the probed MI on
    ``[head, reference, 1]`` over the validation pairs, its weights then applied to the test pairs.

    Args:
        val, test: label splits with the marginals (``tokens [N, 81]``, ``mi [N, 81, 81]`` nats, ``probs [N, 81, 9]``;
            `with_marginals`).
        mask_id: the MDM's mask token id.
        head_val_BLL, head_test_BLL: the head's predictions on the two splits (`predict_from_labels`).
        dampings, rounds: the grid (rounds: integers ≥ 1, all computed from one run per damping).
        top_k: as `mimdm.probing.sudoku_mi.propagated_mi`.

    Returns:
        ``(summary, mi_test [N, 81, 81])``: ``summary`` = ``{"grid": [{"damping", "rounds", "val_pearson"}],
        "damping", "rounds", "top_k", "val_pearson", "test"`` (`accuracy`'s overall statistics), ``"combined":
        {"weights": [head, reference, intercept], "val_pearson", "pearson"}}``, and the chosen setting's test MI.

    Raises:
        ValueError: a split without ``probs``; predictions of another shape than the split's labels, or non-finite;
            an empty grid, or one where no setting gives a defined validation Pearson; as `propagated_mi`.
    """
    for name, split, pred in (("validation", val, head_val_BLL), ("test", test, head_test_BLL)):
        if "probs" not in split:
            raise ValueError(f"the {name} split has no marginals 'probs': add them with with_marginals")
        if tuple(pred.shape) != tuple(split["mi"].shape):
            raise ValueError(f"{name} predictions {tuple(pred.shape)} and labels {tuple(split['mi'].shape)} differ in shape")
        if not torch.isfinite(pred).all():
            raise ValueError(f"the head's {name} predictions are not all finite")
    if not dampings or not rounds:
        raise ValueError("propagation_reference needs at least one damping and one number of rounds")
    masked_val = val["tokens"] == mask_id
    t_val = _pairs(val["mi"], masked_val)
    grid, best, best_mi_val = [], None, None
    for lam in dampings:
        by_round = propagated_mi_rounds(val["probs"], masked_val, rounds, damping=lam, top_k=top_k)
        for r, mi in by_round.items():
            pearson = correlation(_pairs(mi, masked_val), t_val)["pearson"]
            grid.append({"damping": float(lam), "rounds": r, "val_pearson": pearson})
            if not np.isnan(pearson) and (best is None or pearson > best["val_pearson"]):
                best, best_mi_val = grid[-1], mi
    if best is None:
        raise ValueError("no setting of the grid gave a defined validation Pearson")
    mi_test = propagated_mi(test["probs"], test["tokens"] == mask_id, best["rounds"], best["damping"], top_k)
    acc = accuracy(mi_test, test, mask_id)["overall"]

    def design(head_BLL, ref_BLL, split):
        m = split["tokens"] == mask_id
        head_P = _pairs(head_BLL, m)
        return np.stack([head_P, _pairs(ref_BLL, m), np.ones_like(head_P)], 1), _pairs(split["mi"], m)

    x_val, t_val = design(head_val_BLL, best_mi_val, val)
    weights = np.linalg.lstsq(x_val.astype(float), t_val.astype(float), rcond=None)[0]
    x_test, t_test = design(head_test_BLL, mi_test, test)
    combined = {"weights": [float(w) for w in weights],
                "val_pearson": correlation(x_val @ weights, t_val)["pearson"],
                "pearson": correlation(x_test @ weights, t_test)["pearson"]}
    return ({"grid": grid, "damping": best["damping"], "rounds": best["rounds"], "top_k": top_k,
             "val_pearson": best["val_pearson"], "test": acc, "combined": combined}, mi_test)


@torch.no_grad()
def propagation_cost(model: MaskedModel, damping: float, rounds: int, top_k: int | None = PROPAGATION_TOP_K,
                     batch: int = 64, repeats: int = 1) -> dict:
    """Seconds per context of one MDM forward (`mimdm.heads.mi_head.head_inputs`) and of `propagated_mi` on its
    marginals, on the contexts `head_cost` times (75% masked), one after the other in this call.

    Args:
        model: a Sudoku MDM (81 positions, 9 values).
        damping, rounds, top_k: the `propagated_mi` settings timed.
        batch: contexts per call.
        repeats: timed calls of `propagated_mi` after one warm-up (the forward, which is much faster, is timed over
            ``max(3, repeats)`` calls; `mimdm.core.timing.seconds_per_call`).

    Returns:
        ``{"mdm_forward_s", "reference_s", "reference_over_forward"}``.

    Raises:
        ValueError: as `propagated_mi` (settings, or a model without 81 positions and 9 values).
    """
    x = _cost_contexts(model, batch)
    inputs = head_inputs(model, x)
    t_fwd = seconds_per_call(lambda: head_inputs(model, x), model.device, max(3, repeats)) / batch
    t_ref = seconds_per_call(lambda: propagated_mi(inputs.probs, inputs.masked, rounds, damping, top_k), model.device,
                             repeats) / batch
    return {"mdm_forward_s": t_fwd, "reference_s": t_ref, "reference_over_forward": t_ref / t_fwd}


def constraint_recovery(mi: torch.Tensor, masked: torch.Tensor) -> list[dict]:
    """`graph_recovery` against the Sudoku constraint graph for each context of ``mi [N, 81, 81]``."""
    g = sd.constraint_graph()
    return [graph_recovery(mi[b], masked[b], g) for b in range(len(mi))]


def heavily_masked(gt_rec: list[dict], pred_rec: list[dict], rates: np.ndarray, min_rate: float = 0.75) -> dict:
    """Mean AUROC / average precision over contexts with masking rate >= ``min_rate``."""
    idx = np.nonzero(rates >= min_rate)[0]
    mean = lambda rec, k: float(np.nanmean([rec[i][k] for i in idx])) if len(idx) else float("nan")  # noqa: E731
    return {"min_rate": min_rate, "n_contexts": int(len(idx)), "gt_auroc": mean(gt_rec, "auroc"),
            "pred_auroc": mean(pred_rec, "auroc"), "gt_average_precision": mean(gt_rec, "average_precision"),
            "pred_average_precision": mean(pred_rec, "average_precision")}


def puzzle_recovery(model: MaskedModel, head: MIHead, puzzles: list[sd.Puzzle], layer: int = -1,
                    batch_tokens: int = 81 * 512) -> dict:
    """Constraint recovery on real puzzles (chapter 3's puzzle section; a reader's puzzle file goes here): probed
    and head-predicted MI of each puzzle's blanks against the Sudoku constraint graph, and their agreement.

    Returns:
        ``{"n_puzzles", "mean_blanks", "gt_auroc", "pred_auroc", "gt_average_precision", "pred_average_precision",
        "pearson_pred_vs_gt" (pooled over blank pairs), "probing_nfe_per_puzzle"}``; AUROC/AP are means over puzzles
        (NaN-skipping: a puzzle whose blanks hold no constrained or no unconstrained pair has none).

    Raises:
        ValueError: no puzzle.
    """
    if not puzzles:
        raise ValueError("no puzzle")
    grids = np.stack([p.puzzle for p in puzzles]).reshape(len(puzzles), 81)
    x = grids_to_tokens(grids, model.device)
    res = probe_mi(model, x, batch_tokens=batch_tokens)
    gt, masked = res.mi.cpu().float(), res.masked.cpu()
    pred = predict_mi(model, head, x, layer).cpu().float()
    gt_rec, pr_rec = constraint_recovery(gt, masked), constraint_recovery(pred, masked)
    mean = lambda rec, k: float(np.nanmean([r[k] for r in rec]))  # noqa: E731
    pooled = correlation(np.concatenate([pair_values(pred[b], masked[b]) for b in range(len(grids))]),
                         np.concatenate([pair_values(gt[b], masked[b]) for b in range(len(grids))]))
    return {"n_puzzles": len(grids), "mean_blanks": float(masked.sum(1).double().mean()),
            "gt_auroc": mean(gt_rec, "auroc"), "pred_auroc": mean(pr_rec, "auroc"),
            "gt_average_precision": mean(gt_rec, "average_precision"),
            "pred_average_precision": mean(pr_rec, "average_precision"),
            "pearson_pred_vs_gt": pooled["pearson"], "probing_nfe_per_puzzle": float(res.nfe.double().mean())}


def select_on_validation(ablations: dict, val: dict, mask_id: int, model: MaskedModel | None = None) -> dict:
    """Validation Pearson of each ablation head (``{name: (head, record, cfg)}``), for choosing without the test split
    (``model``: as `predict_from_labels`)."""
    out = {}
    for name, (h, r, cfg) in ablations.items():
        pred = predict_from_labels(h, val, cfg.layer, mask_id, model=model)
        out[name] = accuracy(pred, val, mask_id)["overall"]["pearson"]
    return out


def recovery_by_rate(gt_rec: list[dict], pred_rec: list[dict], rates: np.ndarray,
                     bins=(0.0, 0.25, 0.5, 0.75, 0.9, 1.0001)) -> list[dict]:
    """Mean AUROC / AP / constrained and unconstrained MI (ground truth and predicted) per masking-rate bin."""
    out = []
    for lo, hi in zip(bins[:-1], bins[1:]):
        sel = np.nonzero((rates >= lo) & (rates < hi))[0]
        if len(sel) == 0:
            continue
        row = {"mask_rate_lo": lo, "mask_rate_hi": min(hi, 1.0), "n_contexts": int(len(sel))}
        for name, rec in (("gt", gt_rec), ("pred", pred_rec)):
            for k in ("auroc", "average_precision", "mean_mi_edge", "mean_mi_non_edge"):
                row[f"{name}_{k}"] = float(np.nanmean([rec[i][k] for i in sel]))
        out.append(row)
    return out


def agreement_with_data(model: MaskedModel, head: MIHead, n_contexts: int, clues: tuple[int, int], seed: int = 3,
                        max_completions: int = 100_000, layer: int = -1) -> dict:
    """True data MI (enumerated completions) against probed and predicted MI on under-determined grids."""
    rng = np.random.default_rng(seed)
    rows, gts, preds, datas = [], [], [], []
    for grid, dmi, k, n in underdetermined_grids(clues, rng, max_completions, 20 * n_contexts):
        x = grids_to_tokens(grid[None], model.device)
        blank = torch.from_numpy(grid == 0)
        gt = pair_values(probe_mi(model, x).mi[0].cpu(), blank)
        pr = pair_values(predict_mi(model, head, x, layer)[0].cpu(), blank)
        dv = pair_values(dmi, blank)
        gts.append(gt), preds.append(pr), datas.append(dv)
        rows.append({"n_clues": n, "n_completions": k, "pearson_gt_vs_data": correlation(gt, dv)["pearson"],
                     "pearson_pred_vs_data": correlation(pr, dv)["pearson"],
                     "pearson_pred_vs_gt": correlation(pr, gt)["pearson"]})
        if len(rows) == n_contexts:
            break
    if not rows:
        raise RuntimeError(f"no partial grid with {clues} clues had between 2 and {max_completions} completions; "
                           "widen the clue range or raise max_completions")
    cat = np.concatenate
    return {"contexts": rows,
            "pooled": {"gt_vs_data": correlation(cat(gts), cat(datas)), "pred_vs_data": correlation(cat(preds), cat(datas)),
                       "pred_vs_gt": correlation(cat(preds), cat(gts))} if rows else {}}


def head_config_for(profile, model: MaskedModel) -> MIHeadConfig:
    """The profile's Sudoku MI head architecture for ``model``'s hidden size (absolute positions, 81 cells; other
    fields from ``profile.head_arch``)."""
    return MIHeadConfig(model.hidden_dim, d_hidden=profile.head_hidden, rank=profile.head_rank, max_len=81,
                        **profile.head_arch)


def protein_head_config_for(profile, model: MaskedModel) -> MIHeadConfig:
    """The profile's protein MI head architecture for ``model``'s hidden size.

    On raw sequences position pairs are *relative* (an embedding of the sequence separation |i − j|, separations above
    127 sharing the last one): the head is trained on crops of family members of different lengths, where absolute
    positions do not line up, and it must accept any length at inference. On aligned columns (`PottsMDM`) every
    row has the same L columns, so position pairs are absolute (``max_len`` = L); its probed MI is small (median
    0.001 nats per masked pair), so the output starts lower (``out_bias`` -7: bound · 0.0009).
    """
    if isinstance(model, PottsMDM):  # aligned columns: one length, absolute positions line up across rows
        return MIHeadConfig(model.hidden_dim, d_hidden=profile.protein_head_hidden, rank=profile.protein_head_rank,
                            positions="absolute", max_len=model.length, out_bias=-7.0)
    return MIHeadConfig(model.hidden_dim, d_hidden=profile.protein_head_hidden, rank=profile.protein_head_rank,
                        positions="relative", max_len=128)


def ablation_configs(profile) -> dict[str, tuple[dict, HeadTrainConfig]]:
    """The ablation heads: ``{name: (head-config overrides, training config)}``.

    All train for ``profile.ablation_epochs`` on the stored contexts (no augmentation, whatever the main head's
    ``augment``, so the ablations compare architectures and losses under one cheap training): one per input layer
    (default loss), one per loss
    (default layer), and one per architecture component removed (`mimdm.heads.mi_head` docstring):
    position pairs, the two-hop update, the mean-entropy bound (replaced by the strict min), and
    all three (hidden-state features a_i ⊙ a_j only); with a ``constraint_feature`` head, also that feature (the
    gathered network below never has it). When the profile's head is the bilinear one
    (``head_arch["pairs"] == "bilinear"``) the earlier gathered pair network (widths 224/64, learning rate
    5e-3) is added as ``"gathered pair network (earlier head)"``, to compare accuracy and cost.
    """
    from dataclasses import replace

    base = replace(profile.head_train, epochs=profile.ablation_epochs, augment="none")
    out = {f"layer {layer}": ({}, replace(base, layer=layer)) for layer in profile.ablation_layers}
    for loss in ("mse", "log1p", "log1p_weighted"):
        out[f"loss {loss}"] = ({}, replace(base, loss=loss))
    if profile.head_arch.get("pairs") == "bilinear":  # the earlier head, for accuracy and cost side by side
        out["gathered pair network (earlier head)"] = (
            {"pairs": "gather", "channels": 8, "mix_channels": 0, "tri_channels": 8, "d_hidden": 224, "rank": 64,
             "constraint_feature": False},
            replace(base, lr=HeadTrainConfig.lr))
    if profile.head_arch.get("constraint_feature"):
        out["no constraint feature"] = ({"constraint_feature": False}, base)
    out["no position pairs"] = ({"pos_dim": 0}, base)
    out["no two-hop update"] = ({"tri_channels": 0}, base)
    out["min-entropy bound"] = ({"bound": "min"}, base)
    out["hidden-state pairs only"] = ({"pos_dim": 0, "tri_channels": 0, "bound": "min"}, base)
    return out


def prepare(profile, model: MaskedModel, model_path: str | Path, progress: bool = True, ablations: bool = True) -> dict:
    """Labels, the main head and (optionally) the ablation heads of a profile, from the cache or built now.

    Returns ``{"labels": Path, "head": MIHead, "head_record": dict, "ablations": {name: (MIHead, record, cfg)}}``
    (``cfg`` the ablation's `HeadTrainConfig`; its head config is ``record["head_config"]``).
    """
    from dataclasses import replace

    labels = load_or_build_labels(model, model_path, profile.labels, progress)
    hcfg = head_config_for(profile, model)
    head, rec = load_or_train_head(labels, hcfg, profile.head_train, model.mask_id, progress, model.device,
                                   model=model)
    out = {"labels": labels, "head": head, "head_record": rec, "ablations": {}}
    if ablations:
        for name, (over, cfg) in ablation_configs(profile).items():
            h, r = load_or_train_head(labels, replace(hcfg, **over), cfg, model.mask_id, progress, model.device,
                                      model=model)
            out["ablations"][name] = (h, r, cfg)
    return out


#: The head targets of issue 20: test Pearson at least this with probed MI ...
HEAD_PEARSON_TARGET = 0.95
#: ... at a head pass of at most this fraction of one MDM forward.
HEAD_COST_TARGET = 0.25


def estimator_findings_markdown(values: dict) -> str:
    """Chapter 2's findings as a Markdown list, from its results (``values`` of ``estimator_accuracy.json``); the
    head targets of issue 20 (`HEAD_COST_TARGET`, `HEAD_PEARSON_TARGET`) are stated as met or not; with an
    ``error_by_pair_class`` entry (`error_by_pair_class`) a bullet says where the error lies, and with a
    ``direction_agreement`` entry (`direction_agreement`) one compares the labels' two probing directions."""
    a, h = values["accuracy"], values["head"]
    heavy = [r for r in values["by_mask_rate"] if r["mask_rate_lo"] >= 0.75]
    best_layer = max((r for r in values["ablations"] if r["ablation"].startswith("layer")), key=lambda r: r["val_pearson"])
    best_loss = max((r for r in values["ablations"] if r["ablation"].startswith("loss")), key=lambda r: r["val_pearson"])
    comp = {r["ablation"]: r for r in values["ablations"]}
    full = comp["layer -1"]
    hc_name = "bilinear" if h.get("pairs") == "bilinear" else "gathered"
    g = comp.get("gathered pair network (earlier head)")
    earlier = ("" if g is None else f' The earlier head (gathered pair network, {g["parameters"]:,} parameters), trained the '
               f'same short way, reaches test Pearson {g["pearson"]:.3f} at {g["head_over_forward"]:.2f}x a forward; this '
               f'head at the same budget {full["pearson"]:.3f} at {full["head_over_forward"]:.2f}x (same run, same contexts).')
    cost_ok, acc_ok = h["head_over_forward"] <= HEAD_COST_TARGET, a["pearson"] >= HEAD_PEARSON_TARGET
    targets = "both met" if cost_ok and acc_ok else f"cost {'met' if cost_ok else 'missed'}, accuracy {'met' if acc_ok else 'missed'}"
    heavy_text = f" At masking rates of 75% and more: Pearson {heavy[0]['pearson']:.3f}." if heavy else ""
    nf = comp.get("no constraint feature")
    alone = "hidden-state pairs alone" if nf is None else "hidden-state pairs and the constraint feature alone"
    no_feature = ("" if nf is None else f' without the constraint feature {nf["pearson"]:.3f} (its pass '
                  f'{nf["head_over_forward"]:.2f}x a forward, against {full["head_over_forward"]:.2f}x),')
    return f'''
- **Accuracy.** On held-out sources the one-pass head's MI has Pearson {a["pearson"]:.3f} (pooled over all masked pairs;
  median per context {a["median_context_pearson"]:.3f}) and Spearman {a["spearman"]:.3f} with probed ground truth
  (MAE {a["mae"]:.4f} nats); of the top-k pairs by ground truth (k = |M|, counting only pairs above 0.001 nats),
  {100 * a["topk_recall"]:.0f}% are also in the head's top-k.{heavy_text}
- **Cost.** {h["n_parameters"]:,} parameters ({hc_name} pairs); its pass costs {h["head_over_forward"]:.2f}x one MDM forward
  (targets: at most 0.25x at test Pearson at least 0.95; {targets}), and MDM forward + head is
  {h["speedup_vs_probing"]:.0f}x faster than probing the same {h["n_masked"]}-masked contexts ({h["probing_nfe"]:.0f} passes).{earlier}
- **Ablations** (chosen on validation): best layer {best_layer["layer"]} (test Pearson {best_layer["pearson"]:.3f});
  best loss {best_loss["loss"]} (test Pearson {best_loss["pearson"]:.3f}, top-k recall {best_loss["topk_recall"]:.2f}).
  Components, at the same short budget (full head: test Pearson {full["pearson"]:.3f}):{no_feature} without position
  pairs {comp["no position pairs"]["pearson"]:.3f}, without the two-hop update
  {comp["no two-hop update"]["pearson"]:.3f}, with the strict min-entropy bound
  {comp["min-entropy bound"]["pearson"]:.3f}, {alone} {comp["hidden-state pairs only"]["pearson"]:.3f}.
''' + _error_class_findings(values.get("error_by_pair_class", []), a["pearson"]) + _completions_findings(
        values.get("error_by_completions", [])) + _direction_findings(values.get("direction_agreement"), a["pearson"]) \
        + _propagation_findings(values.get("propagation_reference"), a["pearson"], h)


def _num(x, spec: str) -> str:
    """``x`` formatted with ``spec``, "n/a" for a missing (None, NaN) value."""
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def _pct(x) -> str:
    """A fraction as a whole percentage, "n/a" for a missing (None, NaN) value."""
    return _num(x, ".0%")


def _error_class_findings(rows: list[dict], pearson: float) -> str:
    """The "where the error is" bullet of chapter 2 from `error_by_pair_class` rows and the head's pooled Pearson."""
    if not rows:
        return ""
    parts = "; ".join(f'pairs that {r["pair_class"]}: {_pct(r["share_of_pairs"])} of the masked pairs, '
                      f'{_pct(r["share_of_mi"])} of the probed MI, {_pct(r["share_of_squared_error"])} of the '
                      f'squared error, Pearson {_num(r["pearson"], ".3f")} within them' for r in rows)
    exact = ", ".join(f'exact on the pairs that {r["pair_class"]}, {_num(r["pearson_if_exact"], ".4f")}' for r in rows)
    target = HEAD_PEARSON_TARGET
    if pearson >= target:
        verdict = f"the head already reaches {target}"
    else:
        enough = [r["pair_class"] for r in rows if r["pearson_if_exact"] is not None and r["pearson_if_exact"] >= target]
        verdict = (f"no single class, made exact, reaches {target} on its own: the head must improve on more than one"
                   if not enough else "made exact, the pairs that " + " or those that ".join(enough)
                   + f" would bring it to {target}")
    return f'''- **Where the error is** (test pairs): {parts}. Pooled Pearson if the head were {exact}
  (against {pearson:.4f} as it is): {verdict}.
'''


def _completions_findings(rows: list[dict]) -> str:
    """The bullet of chapter 2 on the head's error by the contexts' number of completions (`error_by_completions`):
    each class's share of the contexts, pairs and squared error, and the class where the error per pair is heaviest."""
    if not rows:
        return ""
    parts = "; ".join(f'{_completions(r["completions"])}: {r["n_contexts"]} context{"" if r["n_contexts"] == 1 else "s"}, '
                      f'{_pct(r["share_of_pairs"])} of the pairs, {_pct(r["share_of_squared_error"])} of the squared '
                      'error' for r in rows)
    dense = [r for r in rows if r["share_of_pairs"] and r["share_of_squared_error"] is not None
             and not np.isnan(r["share_of_squared_error"])]
    heavy = ""
    if dense:
        r = max(dense, key=lambda r: r["share_of_squared_error"] / r["share_of_pairs"])
        heavy = (f' Per pair the error is heaviest in contexts with {_completions(r["completions"])} '
                 f'({_pct(r["share_of_squared_error"])} of the squared error on {_pct(r["share_of_pairs"])} of the '
                 f'pairs); were the head exact there, its Pearson would be {_num(r["pearson_if_exact"], ".3f")}.')
    return f'''- **Where the error is, by context** (test contexts by their number of completions, counted up to 1,000):
  {parts}.{heavy}
'''


def _completions(name: str) -> str:
    """An `error_by_completions` class name with its noun: "1 completion", "2-32 completions"."""
    return f"{name} completion{'' if name == '1' else 's'}"


def _propagation_findings(ref: dict | None, pearson: float, head: dict) -> str:
    """The bullet of chapter 2 on the propagated-constraint reference (`propagation_reference`, with its
    `propagation_cost` under ``"cost"``) beside the head's test Pearson and cost (``head``: the chapter's head row)."""
    if not ref:
        return ""
    t, c, cost = ref["test"]["pearson"], ref["combined"]["pearson"], ref["cost"]
    than = "above" if t > pearson else "below" if t < pearson else "equal to"
    probing = head.get("probing_s", float("nan")) / head["mdm_forward_s"]
    target = HEAD_PEARSON_TARGET
    both = ("reach" if c >= target else "stay below") + f" the {target} target"
    return f'''- **A training-free reference.** Propagating Sudoku's exclusion constraints over the marginals of the same
  forward (`propagated_mi`: damped mean field; damping {ref["damping"]:g} and {ref["rounds"]} rounds chosen on
  validation among {len(ref["grid"])} settings, validation Pearson {ref["val_pearson"]:.3f}) gives test Pearson {t:.3f},
  {than} the head's {pearson:.3f}, with nothing trained, at {cost["reference_over_forward"]:.0f}x one MDM forward per
  context (the head: {head["head_over_forward"]:.2f}x; probing: {_num(probing, ".0f")}x). Fitted on validation, head and
  reference together give test Pearson {c:.3f} and {both}. Propagation over the model's own marginals (dependence
  carried by chains of forced cells) is what the head's one pass does not reproduce; done explicitly it costs
  {cost["reference_over_forward"]:.0f}x the forward where the head may spend {HEAD_COST_TARGET}x.
'''


def _direction_findings(agreement: dict | None, pearson: float) -> str:
    """The bullet of chapter 2 on the labels' two probing directions (`direction_agreement`), beside the head's Pearson;
    an undefined agreement (NaN, or None as read back from JSON) is said to be undefined."""
    if not agreement:
        return ""
    d, o = agreement["directions_pearson"], agreement["one_direction_pearson"]
    target = HEAD_PEARSON_TARGET
    undefined = d is None or np.isnan(d)
    intro = ("Probing measures each pair twice (fill j and read i; fill i and read j) and the\n  label is the mean"
             + ("." if undefined else "; the model's conditionals are not those of one joint distribution, so the two differ."
                if d < 1 else ", and here the two agree exactly."))
    if undefined:
        verdict = "the agreement of the model's own two probes is undefined here (too few pairs, or constant values)"
    else:
        verdict = f"the agreement of the model's own two probes is {'above' if d > target else 'below' if d < target else 'at'} the {target} target"
    return f'''- **The labels' own consistency.** {intro} Over the
  {agreement["n_pairs"]:,} test pairs one direction has Pearson {_num(d, ".3f")} with the other and {_num(o, ".3f")} with the
  label, against the head's {pearson:.3f}: {verdict}.
'''


def constraint_findings_markdown(values: dict) -> str:
    """Chapter 3's findings as a Markdown list, from its results (``values`` of ``sudoku_constraints.json``)."""
    e, hm, ag = values["empty_grid"], values["heavily_masked"], values["agreement_with_data"]["pooled"]
    bins = "; ".join(f'{100 * b["mask_rate_lo"]:.0f}-{100 * b["mask_rate_hi"]:.0f}% masked: head {b["pred_auroc"]:.2f}, '
                     f'probed {b["gt_auroc"]:.2f}' for b in values["by_mask_rate"])
    return f'''
- **Empty grid.** Against the constraint graph, AUROC {e["ground_truth"]["auroc"]:.3f} from probing and {e["predicted"]["auroc"]:.3f}
  from the head; constrained pairs carry {e["predicted"]["mean_mi_edge"]:.4f} nats of predicted MI against
  {e["predicted"]["mean_mi_non_edge"]:.4f} for the others.
- **Heavily masked grids** (≥ 75% masked, {hm["n_contexts"]} held-out contexts): AUROC {hm["gt_auroc"]:.3f} (probed) and
  {hm["pred_auroc"]:.3f} (predicted), average precision {hm["gt_average_precision"]:.3f} (probed) and {hm["pred_average_precision"]:.3f} (predicted).
- **Partially filled grids.** Chains of constraints make unconstrained cells dependent, so the graph is a weaker
  reference there, but it is the same one for both maps, and by it the head falls behind probing as cells fill in:
  AUROC {bins}.
  Against the true data MI from enumerated completions the probed map reaches Pearson
  {ag["gt_vs_data"]["pearson"]:.2f} and the head's {ag["pred_vs_data"]["pearson"]:.2f} (head vs probed: {ag["pred_vs_gt"]["pearson"]:.2f}).
''' + (_puzzle_findings(values["puzzles"]) if "puzzles" in values else "")


def _puzzle_findings(p: dict) -> str:
    return f'''- **Real puzzles** ({p["n_puzzles"]} {p.get("source", "puzzles")}, {p["mean_blanks"]:.0f} blanks on average): AUROC
  {p["gt_auroc"]:.3f} (probed) and {p["pred_auroc"]:.3f} (predicted), head vs probed Pearson {p["pearson_pred_vs_gt"]:.2f}
  over blank pairs. A puzzle with one solution has no true MI: these maps are the model's belief before it has
  solved the puzzle, and the constraints still order it.
'''
