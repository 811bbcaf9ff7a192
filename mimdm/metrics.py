"""Metrics over MI maps: pair extraction, AUROC / average precision against a known graph, correlations.

Ranking metrics come from scikit-learn, correlations from SciPy.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def masked_pairs(masked_L) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays ``(i, j)`` with i < j of all pairs of masked positions (``masked_L``: ``[L]`` bool)."""
    m = _np(masked_L).astype(bool)
    i, j = np.triu_indices(len(m), k=1)
    keep = m[i] & m[j]
    return i[keep], j[keep]


def pair_values(mat_LL, masked_L) -> np.ndarray:
    """Upper-triangle values of an ``[L, L]`` matrix over pairs of masked positions, ``[n_pairs]``."""
    i, j = masked_pairs(masked_L)
    return _np(mat_LL)[i, j]


def graph_recovery(mi_LL, masked_L, graph_LL) -> dict:
    """How well an MI map ranks the edges of a known dependency graph, over masked pairs.

    Args:
        mi_LL: ``[L, L]`` MI (nats), symmetric.
        masked_L: ``[L]`` bool, the pairs scored are those of two masked positions.
        graph_LL: ``[L, L]`` bool, True for pairs that are dependent by construction (e.g. Sudoku
            cells sharing a row, column or box).

    Returns:
        ``{"auroc", "average_precision", "mean_mi_edge", "mean_mi_non_edge", "n_pairs",
        "edge_fraction"}``; AUROC/AP are NaN when only one class is present.
    """
    s = pair_values(mi_LL, masked_L)
    y = pair_values(graph_LL, masked_L).astype(bool)
    both = 0 < y.sum() < len(y)
    return {
        "auroc": float(roc_auc_score(y, s)) if both else float("nan"),
        "average_precision": float(average_precision_score(y, s)) if both else float("nan"),
        "mean_mi_edge": float(s[y].mean()) if y.any() else float("nan"),
        "mean_mi_non_edge": float(s[~y].mean()) if (~y).any() else float("nan"),
        "n_pairs": int(len(y)),
        "edge_fraction": float(y.mean()) if len(y) else float("nan"),
    }


def correlation(x, y) -> dict:
    """Pearson and Spearman correlation, MAE and max absolute error between two flat arrays."""
    x, y = _np(x).ravel().astype(float), _np(y).ravel().astype(float)
    if len(x) != len(y):
        raise ValueError(f"arrays differ in length: {len(x)} vs {len(y)}")
    return {
        "pearson": float(stats.pearsonr(x, y).statistic) if len(x) > 2 else float("nan"),
        "spearman": float(stats.spearmanr(x, y).statistic) if len(x) > 2 else float("nan"),
        "mae": float(np.abs(x - y).mean()) if len(x) else float("nan"),
        "max_abs_error": float(np.abs(x - y).max()) if len(x) else float("nan"),
        "n": int(len(x)),
    }
