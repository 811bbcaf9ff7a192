"""Sudoku-specific MI references: closed forms, true data MI from enumerated completions, contexts.

The *true data MI* of a partial grid is the MI between two blank cells under the uniform
distribution over all valid completions of the grid (every completion is equally likely under
uniformly random solution grids conditioned on the givens). The trained MDM's probed MI measures
the model's belief; comparing the two needs under-determined grids (several completions): a
puzzle with a unique solution has zero true MI everywhere.

"True" means true for the distribution of all valid grids, not for the training sample: the
training grids (`mimdm.data.sudoku.random_solutions`) come from 1024 of the ~5.5e9 equivalence
classes, so under the exact training distribution most completions of a partial grid would have
probability zero. The uniform reference is what a model that learned the rules, rather than the
pool, would give.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from mimdm.core.information import pairwise_mi
from mimdm.data import sudoku as sd

#: MI (nats) of two cells sharing a row, column or box in a uniformly random solution grid:
#: p(a, b) = 1/72 for a != b, so I = 2 ln 9 − ln 72 = ln(81/72).
EMPTY_GRID_UNIT_MI = math.log(81 / 72)


def data_mi(grid, max_completions: int = 200_000) -> tuple[torch.Tensor, int]:
    """True data MI ``[81, 81]`` (nats) between blank cells of a partial grid, and the number of completions.

    Raises:
        SudokuError: bad grid, no completion, or more than ``max_completions`` completions.
    """
    comps = sd.enumerate_completions(grid, max_solutions=max_completions)
    if len(comps) == 0:
        raise sd.SudokuError("the grid has no valid completion")
    states = torch.from_numpy(comps.astype(np.int64) - 1)
    mi = pairwise_mi(states, torch.ones(len(comps), dtype=torch.float64), 9)
    blank = torch.from_numpy(np.asarray(grid) == 0)
    mi = mi * (blank[:, None] & blank[None, :])
    return mi, len(comps)


def underdetermined_grids(clues: tuple[int, int], rng: np.random.Generator, max_completions: int,
                          max_attempts: int, stats: dict | None = None):
    """Yield ``(grid, data_mi, n_completions, n_clues)`` for random under-determined partial grids.

    Each attempt keeps a uniformly random subset of a random solution with a clue count uniform in
    ``clues`` (inclusive); grids with a unique completion or more than ``max_completions`` are
    skipped (counted in ``stats["unique"]`` / ``stats["too_many"]``). Stops after ``max_attempts``
    attempts (``stats["attempts"]``).

    Yields:
        ``grid`` ``[81]`` int8 (0 = blank), ``data_mi`` ``[81, 81]`` float64 nats (the exact MI
        under the uniform distribution over its completions, `data_mi`), ``n_completions`` and ``n_clues``.

    Raises:
        SudokuError: as `mimdm.data.sudoku.random_partial` (a clue count outside 0..81).
    """
    stats = stats if stats is not None else {}
    stats.update(attempts=0, unique=0, too_many=0)
    while stats["attempts"] < max_attempts:
        stats["attempts"] += 1
        n = int(rng.integers(clues[0], clues[1] + 1))
        grid = sd.random_partial(sd.random_solutions(1, rng)[0], n, rng)
        try:
            dmi, k = data_mi(grid, max_completions)
        except sd.TooManyCompletions:
            stats["too_many"] += 1
            continue
        if k < 2:
            stats["unique"] += 1
            continue
        yield grid, dmi, k, n


def sample_data_mi(n_grids: int, rng) -> torch.Tensor:
    """Monte Carlo estimate ``[81, 81]`` float64 (nats) of the empty-grid MI from ``n_grids`` random solution grids.

    The plug-in MI of the empirical pair frequencies (`mimdm.probing.exact.pairwise_mi` with uniform
    weights); it is biased upward by about (V-1)²/(2·n_grids) nats per pair for independent cells.

    Raises:
        SudokuError: ``n_grids`` not an integer (as `mimdm.data.sudoku.random_solutions`).
        ValueError: ``n_grids`` < 1.
    """
    if not n_grids >= 1:
        raise ValueError(f"n_grids must be >= 1, got {n_grids}")
    g = sd.random_solutions(n_grids, rng)
    return pairwise_mi(torch.from_numpy(g.astype(np.int64) - 1), torch.ones(n_grids, dtype=torch.float64), 9)


def masked_contexts(solutions: np.ndarray, mask_rate: float, rng) -> np.ndarray:
    """Blank a uniformly random ``round(81·mask_rate)`` cells of each solution: ``[N, 81]`` int8 grids.

    Raises:
        ValueError: ``mask_rate`` outside [0, 1].
    """
    if not 0 <= mask_rate <= 1:
        raise ValueError(f"mask_rate must be in [0, 1], got {mask_rate}")
    rng = np.random.default_rng(rng)
    n_clues = 81 - int(round(81 * mask_rate))
    return np.stack([sd.random_partial(s, n_clues, rng) for s in solutions])


def band_stack_pairs() -> np.ndarray:
    """``[81, 81]`` bool: distinct cells in the same band or stack that share no unit."""
    idx = np.arange(81)
    r, c = idx // 9, idx % 9
    same_band = (r[:, None] // 3) == (r[None] // 3)
    same_stack = (c[:, None] // 3) == (c[None] // 3)
    return (same_band | same_stack) & ~sd.constraint_graph() & ~np.eye(81, dtype=bool)


def constraint_mi(p_BLV: torch.Tensor, masked_BL: torch.Tensor, min_z: float = 1e-6) -> torch.Tensor:
    """MI ``[B, 81, 81]`` (nats) of a constraint model built from an MDM's Sudoku marginals alone.

    The model's conditionals, for masked cells i != j and digits a, v:
    log p(x_i = a | x_j = v) = log p_i(a) + Δ_ij(v) [a = v] − log Z, with Δ = −∞ if i and j share a unit
    (exclusion) and otherwise Δ_ij(v) = Σ_U −log(1 − m_Ujv) over the units U of i that do not hold j, where
    m_Ujv = Σ p_k(v) over the masked cells k of U that are peers of j (clamped at 1 − 1e-3): setting x_j = v takes
    v from j's peers, and within U its mass moves to the other cells (a hidden-single effect). The MI is
    probing's formula on these conditionals (`mimdm.probing.exact.probe_mi`: the directed
    Σ_v p_j(v) KL(p(x_i | x_j = v) ‖ Σ_v' p_j(v') p(x_i | x_j = v')), then the mean of the two directions).
    Since Δ acts only at a = v, this costs O(L² V) (elementwise on ``[B, L, L, V]``), not O(L² V²).
    It is a feature for an MI head, not a substitute for probing.

    Args:
        p_BLV: ``[B, 81, 9]`` marginals p(x_i = v | c) of each cell (rows of unmasked cells are ignored).
        masked_BL: ``[B, 81]`` bool, the masked cells.
        min_z: floor of the normaliser Z (a peer that holds v with probability ~1).

    Returns:
        ``[B, 81, 81]`` in ``p_BLV``'s dtype, symmetric, ≥ 0, zero on the diagonal and at unmasked cells.

    Raises:
        ValueError: shapes other than ``[B, 81, 9]`` and ``[B, 81]``, or non-finite marginals.
    """
    if p_BLV.dim() != 3 or p_BLV.shape[1:] != (sd.N_CELLS, 9) or tuple(masked_BL.shape) != tuple(p_BLV.shape[:2]):
        raise ValueError(f"constraint_mi needs p [B, 81, 9] and masked [B, 81]; got {tuple(p_BLV.shape)} and "
                         f"{tuple(masked_BL.shape)}")
    if not torch.isfinite(p_BLV).all():
        raise ValueError("constraint_mi got non-finite marginals")
    L, dt, dev = sd.N_CELLS, p_BLV.dtype, p_BLV.device
    U = torch.zeros(len(sd.UNITS), L, dtype=dt, device=dev)
    U[torch.arange(len(sd.UNITS))[:, None], torch.tensor(sd.UNITS, device=dev)] = 1  # [27, 81] membership
    peer = torch.from_numpy(sd.constraint_graph()).to(dev, dt)  # [81, 81]
    p = p_BLV * masked_BL[..., None].to(dt)
    m = torch.einsum("uk,kj,bkv->bujv", U, peer, p)  # v's mass on the cells of U that are peers of j
    t = torch.einsum("ui,uj,bujv->bjiv", U, 1 - U, -torch.log((1 - m).clamp_min(1e-3)))  # Δ_ij(v) [B, j, i, v]
    nonpeer = (1 - peer)[None, :, :, None]
    rho = torch.exp(t) * nonpeer  # e^Δ: 0 for peers (exclusion)
    w, pi = p[:, :, None, :], p[:, None, :, :]  # p_j(v) [B, j, 1, v], p_i(a) [B, 1, i, a]
    Z = (1 + pi * (rho - 1)).clamp_min(min_z)  # [B, j, i, v]
    S = (w / Z).sum(-1, keepdim=True)
    r = -torch.log((S + w * (rho - 1) / Z).clamp_min(min_z))  # log(p_i(a) / mix_i(a)), a in the last axis
    R = (pi * r).sum(-1, keepdim=True)
    d = ((w / Z) * R + w * pi * (rho - 1) * r / Z + w * (pi * t * rho / Z - torch.log(Z))).sum(-1)  # [B, j, i]
    mk = masked_BL.to(dt)
    d = d.clamp_min(0) * (mk[:, :, None] * mk[:, None, :]) * (1 - torch.eye(L, dtype=dt, device=dev))
    return (d + d.transpose(1, 2)) / 2
