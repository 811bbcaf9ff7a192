"""Metrics over MI maps: pair extraction, AUROC / average precision against a known graph, correlations.

Ranking metrics come from scikit-learn, correlations from SciPy.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score


def as_numpy(x) -> np.ndarray:
    """A tensor (any device, detached) or array-like as a numpy array."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def masked_pairs(masked_L) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays ``(i, j)`` with i < j of all pairs of masked positions (``masked_L``: ``[L]`` bool).

    Raises:
        ValueError: ``masked_L`` not one-dimensional.
    """
    m = as_numpy(masked_L).astype(bool)
    if m.ndim != 1:
        raise ValueError(f"masked_L must be [L], got shape {m.shape}")
    i, j = np.triu_indices(len(m), k=1)
    keep = m[i] & m[j]
    return i[keep], j[keep]


def pair_values(mat_LL, masked_L) -> np.ndarray:
    """Upper-triangle values of an ``[L, L]`` matrix over pairs of masked positions, ``[n_pairs]``.

    Raises:
        ValueError: ``mat_LL`` not ``[L, L]`` for the ``L`` of ``masked_L``.
    """
    i, j = masked_pairs(masked_L)
    mat = as_numpy(mat_LL)
    L = len(as_numpy(masked_L))
    if mat.shape != (L, L):
        raise ValueError(f"matrix must be [L, L] = [{L}, {L}] to match the mask, got shape {mat.shape}")
    return mat[i, j]


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

    Raises:
        ValueError: ``mi_LL`` or ``graph_LL`` not ``[L, L]`` for the ``L`` of ``masked_L``.
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
    """Pearson and Spearman correlation, MAE and max absolute error (units of the inputs) between two arrays.

    Both are flattened. Returns ``{"pearson", "spearman", "mae", "max_abs_error", "n"}`` (scipy.stats for the
    correlations; NaN with fewer than 3 values or when either array is constant, where a correlation is undefined;
    NaN errors with no values).

    Raises:
        ValueError: the arrays hold different numbers of values.
    """
    x, y = as_numpy(x).ravel().astype(float), as_numpy(y).ravel().astype(float)
    if len(x) != len(y):
        raise ValueError(f"arrays differ in length: {len(x)} vs {len(y)}")
    defined = len(x) > 2 and np.ptp(x) > 0 and np.ptp(y) > 0
    return {
        "pearson": float(stats.pearsonr(x, y).statistic) if defined else float("nan"),
        "spearman": float(stats.spearmanr(x, y).statistic) if defined else float("nan"),
        "mae": float(np.abs(x - y).mean()) if len(x) else float("nan"),
        "max_abs_error": float(np.abs(x - y).max()) if len(x) else float("nan"),
        "n": int(len(x)),
    }


def precision_at(scores_LL, contacts_LL, k: int, min_sep: int = 6, max_sep: int | None = None,
                 evaluable_LL=None) -> float:
    """Precision of the top-``k`` scored pairs against a contact map (contact-prediction P@k).

    Pairs considered: upper triangle ``i < j`` with ``j - i >= min_sep`` (and ``< max_sep`` if
    given) and, if ``evaluable_LL`` is given, only where it is True (e.g. pairs mapped to the
    structure). They are ranked by descending score (ties broken by position, row-major) and the
    fraction of contacts among the first ``k`` is returned.

    Args:
        scores_LL: ``[L, L]`` scores (e.g. MI in nats, APC-corrected MI); only the upper triangle is read.
        contacts_LL: ``[L, L]`` bool true contacts.
        k: number of top pairs, >= 1 (L, L/2, L/5 conventionally; see `precision_at_L`).
        min_sep: smallest sequence separation (6: short range and beyond; 24: long range), >= 1.
        max_sep: exclusive largest separation, or None.
        evaluable_LL: optional ``[L, L]`` bool.

    Returns:
        precision in [0, 1].

    Raises:
        ValueError: shapes differ or are not square; ``k < 1``; ``min_sep < 1``; NaN scores
            among the pairs; fewer than ``k`` eligible pairs.
    """
    s, c = as_numpy(scores_LL).astype(np.float64), as_numpy(contacts_LL).astype(bool)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or c.shape != s.shape:
        raise ValueError(f"scores and contacts must be the same [L, L] shape, got {s.shape} and {c.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if min_sep < 1:
        raise ValueError(f"min_sep must be >= 1, got {min_sep}")
    i, j = np.triu_indices(s.shape[0], k=min_sep)
    keep = np.ones(len(i), dtype=bool)
    if max_sep is not None:
        keep &= (j - i) < max_sep
    if evaluable_LL is not None:
        e = as_numpy(evaluable_LL).astype(bool)
        if e.shape != s.shape:
            raise ValueError(f"evaluable must have shape {s.shape}, got {e.shape}")
        keep &= e[i, j]
    i, j = i[keep], j[keep]
    if len(i) < k:
        raise ValueError(f"only {len(i)} eligible pairs (min_sep={min_sep}, max_sep={max_sep}) for k={k}")
    v = s[i, j]
    if np.isnan(v).any():
        raise ValueError("scores contain NaN among the eligible pairs")
    top = np.argsort(-v, kind="stable")[:k]
    return float(c[i[top], j[top]].mean())


def precision_at_L(scores_LL, contacts_LL, min_sep: int = 6, max_sep: int | None = None,
                   evaluable_LL=None, divisors=(1, 2, 5), length: int | None = None) -> dict:
    """``{"P@L": ..., "P@L/2": ..., "P@L/5": ...}`` (`precision_at` with k = L // d, at least 1).

    L is ``length`` if given (e.g. the number of residues with a structure), else the side of
    ``scores_LL``. Arguments otherwise as `precision_at`.
    """
    L = int(length) if length is not None else as_numpy(scores_LL).shape[0]
    return {("P@L" if d == 1 else f"P@L/{d}"): precision_at(scores_LL, contacts_LL, max(1, L // d), min_sep,
                                                            max_sep, evaluable_LL)
            for d in divisors}
