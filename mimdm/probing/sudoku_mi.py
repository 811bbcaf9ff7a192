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

import functools
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


@functools.lru_cache(maxsize=8)
def _unit_tables(device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(member [27, 81], peer [81, 81], unit_cells [243], unit_peer [27, 9, 81])``: unit membership, the constraint
    graph, the units' cells (unit-major), and [u, q, j] = 1 if the q-th cell of unit u is a peer of j. Cached."""
    cells = torch.from_numpy(sd.UNITS.copy()).to(device)  # [27, 9]
    member = torch.zeros(len(sd.UNITS), sd.N_CELLS, dtype=dtype, device=device)
    member[torch.arange(len(sd.UNITS), device=device)[:, None], cells] = 1
    peer = torch.from_numpy(sd.constraint_graph()).to(device, dtype)
    return member, peer, cells.reshape(-1), peer[cells]


def constraint_mi_among(p_BLV: torch.Tensor, masked_BL: torch.Tensor, positions_BK: torch.Tensor,
                        valid_BK: torch.Tensor, top_k: int | None = None, chunk: int = 16,
                        min_z: float = 1e-6) -> torch.Tensor:
    """`constraint_mi` among K chosen cells of each grid: ``[B, K, K]`` nats, in ``p_BLV``'s dtype.

    The same values as ``constraint_mi(p_BLV, masked_BL, top_k)[b][positions_BK[b]][:, positions_BK[b]]`` (up to
    float rounding) at about (K/81)² of its cost: the unit masses m_Ujv use every masked cell, the pair terms only the
    K cells. An MI head computes it among a grid's masked cells, or among a decoding step's candidates.

    Args:
        p_BLV: ``[B, 81, 9]`` marginals (rows of unmasked cells are ignored).
        masked_BL: ``[B, 81]`` bool.
        positions_BK: ``[B, K]`` long, cell indices (repeats allowed: padding).
        valid_BK: ``[B, K]`` bool, the entries of ``positions_BK`` to fill; a pair is non-zero only if both ends
            are valid, masked and distinct cells.
        top_k: as `constraint_mi`.
        chunk: grids per step (bounds the ``[chunk, K, top_k, K]`` temporaries).
        min_z: as `constraint_mi`.

    Raises:
        ValueError: shapes other than ``[B, 81, 9]``, ``[B, 81]`` and two equal ``[B, K]``; non-finite marginals;
            ``top_k`` outside 1..9.
    """
    B = p_BLV.shape[0]
    if p_BLV.dim() != 3 or p_BLV.shape[1:] != (sd.N_CELLS, 9) or tuple(masked_BL.shape) != (B, sd.N_CELLS):
        raise ValueError(f"constraint_mi needs p [B, 81, 9] and masked [B, 81]; got {tuple(p_BLV.shape)} and "
                         f"{tuple(masked_BL.shape)}")
    if positions_BK.dim() != 2 or positions_BK.shape[0] != B or valid_BK.shape != positions_BK.shape:
        raise ValueError(f"positions and valid must both have shape [B={B}, K]; got {tuple(positions_BK.shape)} and "
                         f"{tuple(valid_BK.shape)}")
    if top_k is not None and not 1 <= top_k <= 9:
        raise ValueError(f"top_k must be in 1..9 (or None), got {top_k}")
    if not torch.isfinite(p_BLV).all():
        raise ValueError("constraint_mi got non-finite marginals")
    dev, dt, K, V = p_BLV.device, p_BLV.dtype, positions_BK.shape[1], 9
    T = V if top_k is None else top_k  # the conditioning cell's digits v kept
    member, peer, unit_cells, unit_peer = _unit_tables(dev, dt)
    p = p_BLV * masked_BL[..., None].to(dt)
    pos = positions_BK.long()
    ok = valid_BK.bool() & masked_BL.gather(1, pos)
    out = []
    for s in range(0, B, chunk):
        pb, ib, b = p[s:s + chunk], pos[s:s + chunk], min(chunk, B - s)
        arb = torch.arange(b, device=dev)[:, None, None]
        ps = pb[arb[:, 0], ib]  # [b, K, V]
        # m_Ujv: v's mass on the cells of U that are peers of j, unit by unit over its 9 cells: [b, j, v, u]
        m = torch.einsum("uqj,buqv->bjvu", unit_peer, pb[:, unit_cells].view(b, 27, 9, V))
        pi = ps.transpose(1, 2)[:, None]  # p_i(a) [b, 1, a, i]
        if T < V:  # j's T most likely digits, renormalised
            w, top = ps.topk(T, dim=-1)  # [b, j, T]
            w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
            m = m[arb, ib[:, :, None], top]  # [b, j, T, u]
            pi = pi[:, 0][arb, top]  # p_i(v) for j's digits v: [b, j, T, i]
        else:
            w, m = ps, m[arb[:, 0], ib]
        lg = (1 - m).clamp_min_(1e-3).log_().neg_()
        t = (lg.reshape(b, K * T, 27) @ member[:, ib].permute(1, 0, 2)).view(b, K, T, K)  # Δ_ij(v) [b, j, v, i]
        nonpeer = (1 - peer[ib[:, :, None], ib[:, None, :]])[:, :, None, :]  # [b, j, 1, i]; exclusion for peers
        rho = torch.exp(t).mul_(nonpeer)  # e^Δ
        first = rho * t
        e = rho.sub_(1)
        w = w[..., None]  # p_j(v) [b, j, v, 1]
        inv_z = (e * pi).add_(1).clamp_min_(min_z).reciprocal_()  # 1 / Z_ij(v)
        wz = inv_z * w
        S = wz.sum(2, keepdim=True)
        g = torch.addcmul(S, e, wz).clamp_min_(min_z)  # mix_i(a) / p_i(a) at j's digits a
        kl = g.log().mul_(g).mul_(pi).sum(2)  # KL(mix_i ‖ p_i) [b, j, i] ...
        if T < V:  # ... plus i's digits that j cannot take, where mix_i / p_i = S
            S = S.squeeze(2).clamp_min(min_z)
            kl = kl + (1 - pi.sum(2)).clamp_min(0) * S * S.log()
        # Σ_v p_j(v) KL(p(x_i | x_j = v) ‖ p_i) = Σ_v p_j(v) (q_v(v) Δ_v − log Z_v), q_v(v) = p_i(v) e^Δ / Z
        d = first.mul_(pi).mul_(inv_z).add_(inv_z.log_()).mul_(w).sum(2).sub_(kl).clamp_min_(0)
        okb = ok[s:s + chunk]
        d = d * (okb[:, :, None] & okb[:, None, :] & (ib[:, :, None] != ib[:, None, :]))
        out.append((d + d.transpose(1, 2)) / 2)
    return torch.cat(out) if out else p.new_zeros(0, K, K)


def constraint_mi(p_BLV: torch.Tensor, masked_BL: torch.Tensor, top_k: int | None = None,
                  min_z: float = 1e-6) -> torch.Tensor:
    """MI ``[B, 81, 81]`` (nats) of a constraint model built from an MDM's Sudoku marginals alone.

    The model's conditionals, for masked cells i != j and digits a, v:
    log p(x_i = a | x_j = v) = log p_i(a) + Δ_ij(v) [a = v] − log Z, with Δ = −∞ if i and j share a unit
    (exclusion) and otherwise Δ_ij(v) = Σ_U −log(1 − m_Ujv) over the units U of i that do not hold j, where
    m_Ujv = Σ p_k(v) over the masked cells k of U that are peers of j (clamped at 1 − 1e-3): setting x_j = v takes
    v from j's peers, and within U its mass moves to the other cells (a hidden-single effect). The MI is
    probing's formula on these conditionals (`mimdm.probing.exact.probe_mi`: the directed
    Σ_v p_j(v) KL(p(x_i | x_j = v) ‖ Σ_v' p_j(v') p(x_i | x_j = v')), then the mean of the two directions).
    Since Δ acts only at a = v, this costs O(L² V) (elementwise on ``[B, L, L, V]``), not O(L² V²).
    It is a feature for an MI head, not a substitute for probing. With ``top_k``, each direction conditions on the
    ``top_k`` most likely digits of the conditioning cell j only (its marginal truncated there and renormalised; the
    mixture of i then equals p_i on the other digits): the same formula on top_k/9 of the terms.

    Args:
        p_BLV: ``[B, 81, 9]`` marginals p(x_i = v | c) of each cell (rows of unmasked cells are ignored).
        masked_BL: ``[B, 81]`` bool, the masked cells.
        top_k: None (all 9 digits) or 1..9: see above.
        min_z: floor of the normaliser Z (a peer that holds v with probability ~1).

    Returns:
        ``[B, 81, 81]`` in ``p_BLV``'s dtype, symmetric, ≥ 0, zero on the diagonal and at unmasked cells.

    Raises:
        ValueError: shapes other than ``[B, 81, 9]`` and ``[B, 81]``, non-finite marginals, ``top_k`` outside 1..9.
    """
    if p_BLV.dim() != 3 or p_BLV.shape[1:] != (sd.N_CELLS, 9) or tuple(masked_BL.shape) != tuple(p_BLV.shape[:2]):
        raise ValueError(f"constraint_mi needs p [B, 81, 9] and masked [B, 81]; got {tuple(p_BLV.shape)} and "
                         f"{tuple(masked_BL.shape)}")
    B, L = masked_BL.shape
    masked_BL = masked_BL.bool()
    K = int(masked_BL.sum(1).max()) if B else 0
    pos = torch.argsort((~masked_BL).to(torch.int8), dim=1, stable=True)[:, :K]  # masked cells first
    sub = constraint_mi_among(p_BLV, masked_BL, pos, masked_BL.gather(1, pos), top_k=top_k, min_z=min_z)
    out = torch.zeros(B, L, L, dtype=p_BLV.dtype, device=p_BLV.device)
    ar = torch.arange(B, device=p_BLV.device)[:, None, None]
    return out.index_put((ar, pos[:, :, None], pos[:, None, :]), sub)


def _peer_sum(d: torch.Tensor) -> torch.Tensor:
    """``[..., 81, V]`` → for each cell the sum of ``d`` over its 20 peers: row + column + box sums, less the cell's
    row and column segments within its box (each counted twice), less the cell itself (three times, then twice)."""
    x = d.reshape(*d.shape[:-2], 3, 3, 3, 3, d.shape[-1])  # [..., band, row in band, stack, column in stack, V]
    row = x.sum((-3, -2), keepdim=True)
    col = x.sum((-5, -4), keepdim=True)
    mini_row = x.sum(-2, keepdim=True)  # the cell's row within its box
    mini_col = x.sum(-4, keepdim=True)
    box = mini_row.sum(-4, keepdim=True)
    return (row + col + box - mini_row - mini_col - x).reshape(d.shape)


def propagated_mi(p_BLV: torch.Tensor, masked_BL: torch.Tensor, rounds: int = 5, damping: float = 0.7,
                  top_k: int | None = None, chunk: int = 4, eps: float = 1e-6) -> torch.Tensor:
    """MI ``[B, 81, 81]`` (nats) of Sudoku's exclusion constraints propagated from an MDM's marginals alone.

    For every masked cell j and digit v, x_j = v is fixed and the marginals q of the other masked cells are updated
    ``rounds`` times, all at once, by a damped mean-field form of the all-different constraints (naive mean field on
    a constraint-satisfaction problem, e.g. Mézard & Montanari, *Information, Physics, and Computation*, 2009,
    ch. 14), starting from q = p:

        q_k ← (1 − λ) q_k + λ softmax_a(log p_k(a) + Σ_{l ∈ peers(k)} [log(1 − q_l(a)) − log(1 − p_l(a))]),

    λ = ``damping``, the factor of peer l being how much likelier "l does not hold a" has become than in the context
    (1 − q and 1 − p clamped at ``eps``). The first update moves j's peers (for them v is excluded), the next ones
    the peers of those (cells that share no unit with j), and so on: a chain of forced cells couples cells that no
    single unit links, as in a context with few completions. The MI is probing's formula on the conditionals
    q_i^(j,v) (`mimdm.probing.exact.probe_mi`: the directed Σ_v p_j(v) KL(q_i^(j,v) ‖ Σ_v' p_j(v') q_i^(j,v')), then
    the mean of the two directions). The updates need not converge to the probed values: many rounds make every
    coupled cell forced, so ``rounds`` and ``damping`` are settings to choose (`propagated_mi_rounds` gives several
    rounds from one run). `constraint_mi` is a closed form of about one undamped round (with a hidden-single shift
    instead of peer factors). This costs |M|·V'·``rounds`` updates of a whole ``[81, 9]`` grid per context (|M|
    masked cells, V' = ``top_k`` or 9 digits): a reference estimator, many MDM forwards of the `cpu` model in
    cost, not a feature of the one-pass head.

    Args:
        p_BLV: ``[B, 81, 9]`` marginals p(x_i = v | c) of each cell (rows of unmasked cells are ignored; zeros are
            floored at 1e-12 and the rows renormalised).
        masked_BL: ``[B, 81]`` bool, the masked cells.
        rounds: number of updates (an integer ≥ 1).
        damping: λ in (0, 1] (1: undamped).
        top_k: None (all 9 digits) or 1..9: each direction conditions on j's ``top_k`` most likely digits only (its
            marginal truncated there and renormalised).
        chunk: grids per step (bounds the ``[chunk, |M|·V', 81, 9]`` temporaries).
        eps: floor of 1 − q and 1 − p.

    Returns:
        ``[B, 81, 81]`` float32, symmetric, ≥ 0, zero on the diagonal and at unmasked cells.

    Raises:
        ValueError: shapes other than ``[B, 81, 9]`` and ``[B, 81]``; a mask that is not bool; marginals that are
            non-finite, negative or whose masked rows do not sum to 1 (within 1e-3); ``rounds`` not an integer ≥ 1;
            ``damping`` outside (0, 1]; ``top_k`` outside 1..9; ``chunk`` < 1; ``eps`` outside (0, 1).
    """
    return propagated_mi_rounds(p_BLV, masked_BL, (rounds,), damping, top_k, chunk, eps)[rounds]


def propagated_mi_rounds(p_BLV: torch.Tensor, masked_BL: torch.Tensor, rounds, damping: float = 0.7,
                         top_k: int | None = None, chunk: int = 4, eps: float = 1e-6) -> dict[int, torch.Tensor]:
    """`propagated_mi` after each of several numbers of rounds, from one run: ``{r: [B, 81, 81]}`` for each ``r`` in
    ``rounds`` (a non-empty collection of integers ≥ 1). Arguments and errors as `propagated_mi`."""
    try:
        rounds = sorted({r.__index__() for r in rounds})
    except (TypeError, AttributeError):
        raise ValueError(f"rounds must be a collection of integers >= 1, got {rounds!r}") from None
    if p_BLV.dim() != 3 or p_BLV.shape[1:] != (sd.N_CELLS, 9) or tuple(masked_BL.shape) != tuple(p_BLV.shape[:2]):
        raise ValueError(f"propagated_mi needs p [B, 81, 9] and masked [B, 81]; got {tuple(p_BLV.shape)} and "
                         f"{tuple(masked_BL.shape)}")
    if masked_BL.dtype != torch.bool:
        raise ValueError(f"masked must be a bool tensor, got {masked_BL.dtype}")
    if not rounds or rounds[0] < 1:
        raise ValueError(f"rounds must be integers >= 1, got {rounds}")
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    if top_k is not None and not 1 <= top_k <= 9:
        raise ValueError(f"top_k must be in 1..9 (or None), got {top_k}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if not torch.isfinite(p_BLV).all():
        raise ValueError("propagated_mi got non-finite marginals")
    B, L, V = p_BLV.shape
    dev = p_BLV.device
    masked_BL = masked_BL.to(dev)
    rows = p_BLV[masked_BL].double()
    if (rows < 0).any() or ((rows.sum(-1) - 1).abs() > 1e-3).any():
        raise ValueError("propagated_mi needs marginals: the rows of masked cells must be >= 0 and sum to 1")
    T = V if top_k is None else top_k
    K = int(masked_BL.sum(1).max()) if B else 0
    out = {r: torch.zeros(B, L, L, device=dev) for r in rounds}
    if K < 2:
        return out
    p = p_BLV.float().clamp_min(1e-12)
    p = p / p.sum(-1, keepdim=True)
    pos = torch.argsort((~masked_BL).to(torch.int8), dim=1, stable=True)[:, :K]  # masked cells first
    ok = masked_BL.gather(1, pos)  # [B, K]: real masked cells, not padding
    log_p, log_not_p = p.log(), torch.log1p(-p.clamp_max(1 - eps))
    cells = torch.arange(L, device=dev)
    for s in range(0, B, chunk):
        b = min(chunk, B - s)
        pb, ib, mb = p[s:s + b], pos[s:s + b], masked_BL[s:s + b]
        w, v = pb.gather(1, ib[..., None].expand(b, K, V)).topk(T, dim=-1)  # j's digits and weights [b, K, T]
        wv = (w / w.sum(-1, keepdim=True))[..., None, None]  # [b, j, v, 1, 1]
        j_S = ib[:, :, None].expand(b, K, T).reshape(b, K * T)  # the fixed cell of each scenario S = (j, v)
        fixed = cells[None, None, :] == j_S[:, :, None]  # [b, S, L]
        free = (~fixed & mb[:, None, :])[..., None]
        onehot = torch.nn.functional.one_hot(v.reshape(b, K * T), V).float()[:, :, None, :]  # [b, S, 1, V]
        q = torch.where(fixed[..., None], onehot, pb[:, None])  # [b, S, L, V]
        changes = mb[:, None, :, None].float()  # unmasked cells never change
        okb = ok[s:s + b]
        pair = okb[:, :, None] & okb[:, None, :] & (ib[:, :, None] != ib[:, None, :])
        ar = torch.arange(b, device=dev)[:, None, None]
        for r in range(1, rounds[-1] + 1):
            delta = (torch.log1p(-q.clamp_max(1 - eps)) - log_not_p[s:s + b, None]) * changes
            new = torch.softmax(log_p[s:s + b, None] + _peer_sum(delta), -1)
            q = torch.where(free, new if damping == 1 else torch.lerp(q, new, damping), q)
            if r not in out:
                continue
            qi = q.gather(2, ib[:, None, :, None].expand(b, K * T, K, V)).view(b, K, T, K, V)  # q_i^(j,v)
            mix = (wv * qi).sum(2, keepdim=True)
            kl = (wv * qi * (qi.clamp_min(1e-12).log() - mix.clamp_min(1e-12).log())).sum((2, 4))  # [b, j, i]
            d = kl.transpose(1, 2).clamp_min(0) * pair  # [b, i, j]: I(x_i; x_j) read at i
            out[r][s:s + b] = out[r][s:s + b].index_put((ar, ib[:, :, None], ib[:, None, :]), (d + d.transpose(1, 2)) / 2)
    return out
