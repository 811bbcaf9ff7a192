"""Information quantities every layer shares: entropy of a categorical marginal and exact pairwise MI.

All in nats. These are the one copy used by decoding (entropies of the rules), the MI head's inputs,
probing and the exact oracle models.
"""
from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_log_probs(log_probs_LV: Tensor) -> Tensor:
    """Entropy (nats) of categorical distributions over the last axis, from their log-probabilities.

    Args:
        log_probs_LV: ``[..., V]`` log-probabilities (each row sums to 1 in probability); -inf marks a value of
            probability 0 and contributes 0 (0 · log 0 = 0).

    Returns:
        ``[...]`` entropies in nats, same dtype as the input.
    """
    return -(log_probs_LV.exp() * log_probs_LV.clamp_min(-1e30)).sum(-1)


def pairwise_mi(states_SL: Tensor, weights_S: Tensor, n_values: int, chunk: int = 8192) -> Tensor:
    """Exact pairwise MI ``[L, L]`` (nats) of a distribution given by weighted states.

    Args:
        states_SL: ``[S, L]`` long values in ``[0, n_values)`` (e.g. all completions of a partial
            Sudoku, or all states of a small joint table).
        weights_S: ``[S]`` non-negative weights (normalised inside); uniform for completions.
        n_values: V.
        chunk: states per accumulation step (memory: chunk·L·V floats).

    Returns:
        ``[L, L]`` float64 MI with a zero diagonal: I(X_i; X_j) = Σ p(a,b) log p(a,b)/(p(a)p(b)).

    Raises:
        ValueError: shapes disagree, values out of range, weights negative, not finite or all zero.
    """
    if states_SL.dim() != 2 or weights_S.shape != (states_SL.shape[0],):
        raise ValueError(f"need states [S, L] and weights [S], got {tuple(states_SL.shape)} and {tuple(weights_S.shape)}")
    if states_SL.numel() and (int(states_SL.min()) < 0 or int(states_SL.max()) >= n_values):
        raise ValueError(f"state values must lie in [0, {n_values}), got range [{int(states_SL.min())}, {int(states_SL.max())}]")
    weights_S = weights_S.to(states_SL.device)
    w = weights_S.double()
    if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be finite and non-negative with a positive sum")
    w = w / w.sum()
    S, L = states_SL.shape
    LV = L * n_values
    P2 = torch.zeros(LV, LV, dtype=torch.float64, device=states_SL.device)
    for s in range(0, S, chunk):
        oh = torch.nn.functional.one_hot(states_SL[s:s + chunk], n_values).double().reshape(-1, LV)  # [s, L*V]
        P2 += (oh * w[s:s + chunk, None]).T @ oh
    P2 = P2.reshape(L, n_values, L, n_values).permute(0, 2, 1, 3)  # [L, L, V, V]
    idx = torch.arange(L, device=P2.device)
    P1 = P2[idx, idx].diagonal(dim1=-2, dim2=-1)  # [L, V]: P2[i, i, a, a] = p(x_i = a)
    denom = P1[:, None, :, None] * P1[None, :, None, :]
    terms = torch.where(P2 > 0, P2 * (P2 / denom.clamp_min(1e-300)).log(), torch.zeros_like(P2))
    mi = terms.sum((-1, -2)).clamp_min(0.0)
    mi.fill_diagonal_(0.0)
    return mi
