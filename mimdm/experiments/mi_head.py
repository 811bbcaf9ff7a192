"""Chapters 2 (estimator accuracy) and 3 (Sudoku constraint recovery): the measurements.

Label sets and heads are cached by configuration next to the MDM they belong to
(`load_or_build_labels`, `load_or_train_head`), so the chapters share them and a rerun is fast.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..artifacts import artifact_dir
from ..data import sudoku as sd
from ..heads import HeadTrainConfig, MIHead, MIHeadConfig, load_head, predict_mi, save_head, train_head
from ..labels import LabelConfig, generate_labels, is_complete, label_dir, load_labels
from ..metrics import correlation, graph_recovery, pair_values
from ..models.base import MaskedModel
from ..models.zoo import grids_to_tokens
from ..probing import probe_mi
from ..sudoku_mi import data_mi


def load_or_build_labels(model: MaskedModel, model_path: str | Path, cfg: LabelConfig, progress: bool = True) -> Path:
    """The label set of ``cfg`` for the MDM saved at ``model_path``: generated (resumably) if incomplete."""
    d = label_dir(Path(model_path).parent, cfg)
    if not is_complete(d, cfg):
        generate_labels(model, cfg, d, progress=progress)
    return d


def load_or_train_head(labels: Path, head_cfg: MIHeadConfig, train_cfg: HeadTrainConfig, mask_id: int,
                       progress: bool = True, device="cpu") -> tuple[MIHead, dict]:
    """The head of these configs trained on ``labels`` (cached in the artifacts by config), loaded on ``device``.

    Training runs on the CPU from the stored hidden states.
    """
    d = artifact_dir("mi_head", Path(labels).name, {"labels": Path(labels).name, "head": head_cfg.to_dict(),
                                                     "train": train_cfg.to_dict()})
    path = d / "head.pt"
    if not path.exists():
        head, log = train_head(load_labels(labels, "train"), load_labels(labels, "val"), head_cfg, train_cfg,
                               mask_id, progress=progress)
        save_head(head, path, train_cfg, log)
    return load_head(path, device)


def _pairs(mat, masked):
    return np.concatenate([pair_values(mat[b], masked[b]) for b in range(len(masked))])


@torch.no_grad()
def predict_from_labels(head: MIHead, data: dict, layer: int, mask_id: int, batch_size: int = 64) -> torch.Tensor:
    """Head predictions ``[N, L, L]`` from the stored hidden states of a label split."""
    dev = next(head.parameters()).device
    out = []
    for s in range(0, len(data["tokens"]), batch_size):
        tok = data["tokens"][s:s + batch_size].to(dev)
        h, e = data[f"hidden_{layer}"][s:s + batch_size].to(dev), data["entropy"][s:s + batch_size].to(dev)
        out.append(head(h, tok == mask_id, e).cpu())
    return torch.cat(out)


def accuracy(pred: torch.Tensor, data: dict, mask_id: int, rate_bins=(0.0, 0.25, 0.5, 0.75, 1.0001)) -> dict:
    """Predicted vs ground-truth MI over masked pairs: overall and by masking-rate bin.

    Top-k recall per context: k = number of masked cells; the fraction of the k pairs with the
    largest ground-truth MI that are also among the k largest predicted.
    """
    masked = data["tokens"] == mask_id
    rates = masked.float().mean(1).numpy()
    p, t = _pairs(pred, masked), _pairs(data["mi"], masked)
    recalls = []
    for b in range(len(masked)):
        pv, tv = pair_values(pred[b], masked[b]), pair_values(data["mi"][b], masked[b])
        k = int(masked[b].sum())
        if k < 2 or len(tv) < k:
            recalls.append(np.nan)
            continue
        recalls.append(len(set(np.argsort(-pv)[:k]) & set(np.argsort(-tv)[:k])) / k)
    recalls = np.array(recalls)
    by_rate = []
    for lo, hi in zip(rate_bins[:-1], rate_bins[1:]):
        sel = (rates >= lo) & (rates < hi)
        if sel.sum() == 0:
            continue
        c = correlation(_pairs(pred[sel], masked[sel]), _pairs(data["mi"][sel], masked[sel]))
        by_rate.append({"mask_rate_lo": lo, "mask_rate_hi": min(hi, 1.0), "n_contexts": int(sel.sum()),
                        **c, "topk_recall": float(np.nanmean(recalls[sel]))})
    return {"overall": {**correlation(p, t), "topk_recall": float(np.nanmean(recalls))}, "by_rate": by_rate,
            "pred_pairs": p, "true_pairs": t}


def calibration(pred_pairs: np.ndarray, true_pairs: np.ndarray, n_bins: int = 12) -> list[dict]:
    """Mean true MI in quantile bins of predicted MI (nats)."""
    order = np.argsort(pred_pairs)
    out = []
    for chunk in np.array_split(order, n_bins):
        if len(chunk):
            out.append({"pred_mean": float(pred_pairs[chunk].mean()), "true_mean": float(true_pairs[chunk].mean()),
                        "n": int(len(chunk))})
    return out


@torch.no_grad()
def head_cost(model: MaskedModel, head: MIHead, batch: int = 64, repeats: int = 3, layer: int = -1) -> dict:
    """Seconds per context of one MDM forward, of the head pass, and of probing (same contexts: 75% masked)."""
    rng = np.random.default_rng(0)
    sols = sd.random_solutions(batch, rng)
    grids = np.stack([sd.random_partial(s, 20, rng) for s in sols])
    x = grids_to_tokens(grids, model.device)
    from ..heads import head_inputs

    h, m, e = head_inputs(model, x, layer)
    head(h, m, e)
    t0 = time.perf_counter()
    for _ in range(repeats):
        h, m, e = head_inputs(model, x, layer)
    t_fwd = (time.perf_counter() - t0) / repeats / batch
    t0 = time.perf_counter()
    for _ in range(repeats):
        head(h, m, e)
    t_head = (time.perf_counter() - t0) / repeats / batch
    n_probe = min(8, batch)
    res = probe_mi(model, x[:n_probe])
    return {"mdm_forward_s": t_fwd, "head_s": t_head, "head_over_forward": t_head / t_fwd,
            "probing_s": res.seconds / n_probe, "probing_nfe": float(res.nfe.float().mean()),
            "speedup_vs_probing": (res.seconds / n_probe) / (t_fwd + t_head), "n_masked": int(m[0].sum())}


def constraint_recovery(mi: torch.Tensor, masked: torch.Tensor) -> list[dict]:
    """`graph_recovery` against the Sudoku constraint graph for each context of ``mi [N, 81, 81]``."""
    g = sd.constraint_graph()
    return [graph_recovery(mi[b], masked[b], g) for b in range(len(mi))]


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
    attempts = 0
    while len(rows) < n_contexts and attempts < 20 * n_contexts:
        attempts += 1
        n = int(rng.integers(clues[0], clues[1] + 1))
        grid = sd.random_partial(sd.random_solutions(1, rng)[0], n, rng)
        try:
            dmi, k = data_mi(grid, max_completions)
        except sd.SudokuError:
            continue
        if k < 2:
            continue
        x = grids_to_tokens(grid[None], model.device)
        blank = torch.from_numpy(grid == 0)
        gt = pair_values(probe_mi(model, x).mi[0].cpu(), blank)
        pr = pair_values(predict_mi(model, head, x, layer)[0].cpu(), blank)
        dv = pair_values(dmi, blank)
        gts.append(gt), preds.append(pr), datas.append(dv)
        rows.append({"n_clues": n, "n_completions": k, "pearson_gt_vs_data": correlation(gt, dv)["pearson"],
                     "pearson_pred_vs_data": correlation(pr, dv)["pearson"],
                     "pearson_pred_vs_gt": correlation(pr, gt)["pearson"]})
    cat = np.concatenate
    return {"contexts": rows,
            "pooled": {"gt_vs_data": correlation(cat(gts), cat(datas)), "pred_vs_data": correlation(cat(preds), cat(datas)),
                       "pred_vs_gt": correlation(cat(preds), cat(gts))} if rows else {}}


def head_config_for(profile, model: MaskedModel) -> MIHeadConfig:
    """The profile's MI head architecture for ``model``'s hidden size."""
    return MIHeadConfig(model.hidden_dim, d_hidden=profile.head_hidden, rank=profile.head_rank)


def ablation_configs(profile) -> dict[str, HeadTrainConfig]:
    """Training configs of the ablation heads: one per layer (default loss) and one per loss (default layer)."""
    from dataclasses import replace

    base = replace(profile.head_train, epochs=profile.ablation_epochs)
    out = {f"layer {layer}": replace(base, layer=layer) for layer in profile.ablation_layers}
    for loss in ("mse", "log1p", "log1p_weighted"):
        out[f"loss {loss}"] = replace(base, loss=loss)
    return out


def prepare(profile, model: MaskedModel, model_path: str | Path, progress: bool = True, ablations: bool = True) -> dict:
    """Labels, the main head and (optionally) the ablation heads of a profile, from the cache or built now.

    Returns ``{"labels": Path, "head": MIHead, "head_record": dict, "ablations": {name: (MIHead, record, cfg)}}``.
    """
    labels = load_or_build_labels(model, model_path, profile.labels, progress)
    hcfg = head_config_for(profile, model)
    head, rec = load_or_train_head(labels, hcfg, profile.head_train, model.mask_id, progress, model.device)
    out = {"labels": labels, "head": head, "head_record": rec, "ablations": {}}
    if ablations:
        for name, cfg in ablation_configs(profile).items():
            h, r = load_or_train_head(labels, hcfg, cfg, model.mask_id, progress, model.device)
            out["ablations"][name] = (h, r, cfg)
    return out
