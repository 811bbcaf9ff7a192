"""Ground-truth pairwise conditional mutual information of an MDM by brute-force probing.

For a context c (a sequence with masked set M) the model gives marginals p(x_i | c) but not the
joint over masked positions. Probing recovers the model's pairwise dependence from its own
conditionals: for every j in M and value v, fill j with v and run the model again, reading
p(x_i | c, x_j = v) for every other masked i. Then (the study's Eq. for ground-truth MI)

    I_{j→i} = Σ_v p(x_j=v | c) · KL( p(x_i | c, x_j=v) ‖ Σ_{v'} p(x_j=v' | c) p(x_i | c, x_j=v') )

in nats. The mixture in the KL is built from the probed conditionals, so I_{j→i} is exactly the
mutual information of the joint q(x_j, x_i) = p(x_j | c) p(x_i | c, x_j), finite and >= 0. For
a model whose conditionals come from one joint distribution I_{j→i} = I_{i→j} = I(X_i; X_j | c);
a learned MDM is not exactly consistent, so the study reports the symmetrised value
(I_{j→i} + I_{i→j}) / 2 and keeps |I_{j→i} − I_{i→j}| as a measure of the model's inconsistency.

Top-value pruning (``delta > 0``): only the most probable values of x_j whose mass reaches
1 − delta are probed, with p(x_j | c) renormalised over them; this trades a small error for
fewer forward passes (NFE). Cost: one pass for the context plus one per probed (j, v), i.e.
1 + |M|·V passes without pruning (451 for 50 masked Sudoku cells).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from mimdm.core.contract import MaskedModel
from mimdm.core.device import auto_batch_tokens
from mimdm.core.timing import sync


@dataclass
class ProbeResult:
    """Ground-truth MI of a batch of contexts (B contexts of length L, V values).

    Attributes:
        mi: ``[B, L, L]`` float64, symmetrised conditional MI in nats; zero on the diagonal and
            in every row/column of an unmasked position (and of a masked position left out by
            ``positions_BL``).
        directed: ``[B, L, L]`` float64, ``directed[b, j, i] = I_{j→i}`` (row: probed position).
        asymmetry: ``[B, L, L]`` float64, ``|I_{j→i} − I_{i→j}|`` in nats: the model's
            inconsistency when ``delta = 0``; with pruning the two directions renormalise over
            different value sets, so it also holds pruning error.
        marginals: ``[B, L, V]`` float64, p(x_i | c) (one-hot-free: rows of unmasked positions are 0).
        entropy: ``[B, L]`` float64, H(X_i | c) in nats (0 at unmasked positions).
        masked: ``[B, L]`` bool.
        n_values: ``[B, L]`` long, values probed per position (0 at unmasked positions and at
            those left out by ``positions_BL``).
        nfe: ``[B]`` long, forward passes spent on each context (1 + Σ_j n_values[j]; Σ_j n_values[j]
            when ``base_log_probs`` is given).
        seconds: wall-clock of the whole call.
    """

    mi: Tensor
    directed: Tensor
    asymmetry: Tensor
    marginals: Tensor
    entropy: Tensor
    masked: Tensor
    n_values: Tensor
    nfe: Tensor
    seconds: float


def _kept_values(p_mV: Tensor, delta: float) -> Tensor:
    """``[m, V]`` bool: the values to probe (all with p > 0, or the top ones covering 1 − delta)."""
    keep = p_mV > 0
    if delta > 0:
        sp, idx = p_mV.sort(-1, descending=True)
        before = sp.cumsum(-1) - sp  # mass strictly before each sorted value
        k_sorted = before < (1 - delta)
        keep = torch.zeros_like(keep).scatter(-1, idx, k_sorted) & keep
    return keep


RESTRICTED_MIN_MASS = 1e-6
"""Least probability of a value in ``values_V`` for a position to take part in restricted MI (`probe_mi`)."""


@torch.no_grad()
def probe_mi(model: MaskedModel, tokens_BL: Tensor, delta: float = 0.0, batch_tokens: int | str = 81 * 512,
             positions_BL: Tensor | None = None, precision: str | None = "fp32",
             base_log_probs: Tensor | None = None, values_V: Tensor | None = None) -> ProbeResult:
    """Ground-truth pairwise conditional MI between the masked positions of each context.

    Args:
        model: any `MaskedModel`, on CPU or CUDA; probed in eval mode.
        tokens_BL: ``[B, L]`` (or ``[L]``) long contexts; masked positions hold ``model.mask_id``.
        delta: top-value pruning threshold in [0, 1): probe the most probable values of each x_j
            covering at least 1 − delta of its mass (0: probe every value with p > 0).
        batch_tokens: memory budget of one forward pass, in tokens (rows per pass =
            ``max(1, batch_tokens // L)``). Probes of several contexts share passes. ``"auto"``:
            from free GPU memory on CUDA (`mimdm.core.device.auto_batch_tokens`), 512 rows on the CPU.
        positions_BL: optional ``[B, L]`` (or ``[L]``) bool, a subset of the masked positions: only
            these are probed and read, so MI is computed between them alone (the other masked
            positions stay masked in every probe, so the values are the same as in the full
            probe) and is 0 in the rows and columns of every other position; ``n_values`` counts
            only these. Costs 1 + Σ_{j in subset} n_values[j] passes instead of 1 + Σ_{j in M} (without
            the 1 when ``base_log_probs`` is given).
            `mimdm.sampling.decoding.oracle_mi_fn` passes a decoding step's candidates here.
        precision: precision of probing's forward passes: ``"fp32"`` (default) whatever the
            model's own setting (`MaskedModel.set_precision`, restored afterwards) or an enclosing
            autocast context; ``"bf16"`` (CUDA); ``None`` keeps the model's and the context's.
            Probed MI is built from small differences between conditionals, and bf16 rounding
            puts a floor under it: on the `cpu` Sudoku MDM (8 contexts, 50 masked cells,
            bf16 autocast on the CPU) the mean error was 5e-4 nats (max 0.02), and 1.6-1.9% of pairs
            fell on the other side of ε = 3e-4 or 1e-3 nats.
        base_log_probs: optional ``[B, L, V]`` (or ``[L, V]``) log-probabilities of ``tokens_BL`` from
            this model, already computed (a decoding step's own forward pass: `mimdm.sampling.decoding.oracle_mi_fn`
            passes them), used instead of probing's first pass, which is then not run and not counted
            in ``nfe``. The caller vouches that they come from this model, in the precision probing runs in.
        values_V: optional ``[V]`` bool, a subset S of the values: the MI is that of the pair's joint
            restricted to S × S and renormalised, i.e. I(X_i; X_j | c, X_i ∈ S, X_j ∈ S) (proteins on
            aligned columns: S = the 20 amino acids, the gap left out of contact scores). Only values
            in S are probed (fewer passes); j's probe weights become p(x_j = v | c)·p(X_i ∈ S | c, x_j = v),
            normalised over v ∈ S, which makes the directed form exact for the restricted joint.
            ``marginals`` and ``entropy`` stay those of the full value set. A position whose probability
            of a value in S is below `RESTRICTED_MIN_MASS` (e.g. a terminal column that is almost surely
            a gap) has restricted MI 0 with every other: its restricted joint is not defined numerically.

    Returns:
        `ProbeResult` (MI in nats, NFE per context, seconds). ``marginals``, ``entropy`` and
        ``masked`` cover every masked position whether or not ``positions_BL`` is given.

    Raises:
        ValueError: ``delta`` outside [0, 1), ``batch_tokens < 1`` or not ``"auto"``; ``values_V`` not a
            ``[V]`` bool with at least two True; ``positions_BL``
            of another shape than ``tokens_BL`` or holding an unmasked position; ``precision`` not
            ``"fp32"``, ``"bf16"`` or None; ``base_log_probs`` of another shape than ``[B, L, V]``;
            and whatever
            `MaskedModel.check_tokens` raises (bad shape, ids, length, device).
        RuntimeError: ``precision="bf16"`` on a model that is not on a CUDA device with bf16.
    """
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if precision not in ("fp32", "bf16", None):
        raise ValueError(f"precision must be 'fp32', 'bf16' or None (the model's), got {precision!r}")
    if isinstance(batch_tokens, str) and batch_tokens != "auto" or not isinstance(batch_tokens, str) and batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1 or 'auto', got {batch_tokens!r}")
    if tokens_BL.dim() == 1:
        tokens_BL = tokens_BL[None]
        positions_BL = None if positions_BL is None else positions_BL[None]
        base_log_probs = None if base_log_probs is None else base_log_probs[None]
    model.check_tokens(tokens_BL)
    if values_V is not None:
        values_V = torch.as_tensor(values_V, device=tokens_BL.device)
        if values_V.dtype != torch.bool or values_V.shape != (model.n_values,) or int(values_V.sum()) < 2:
            raise ValueError(f"values_V must be a [{model.n_values}] bool tensor with at least two True values, got "
                             f"{values_V.dtype} {tuple(values_V.shape)}")
    if base_log_probs is not None and base_log_probs.shape != (*tokens_BL.shape, model.n_values):
        raise ValueError(f"base_log_probs has shape {tuple(base_log_probs.shape)}; expected "
                         f"{(*tokens_BL.shape, model.n_values)} ([B, L, V] for tokens_BL of shape {tuple(tokens_BL.shape)})")
    if positions_BL is not None:
        if positions_BL.shape != tokens_BL.shape:
            raise ValueError(f"positions_BL has shape {tuple(positions_BL.shape)}, tokens_BL {tuple(tokens_BL.shape)}; "
                             "they must match")
        positions_BL = positions_BL.to(device=tokens_BL.device, dtype=torch.bool)
        bad = positions_BL & ~model.is_masked(tokens_BL)
        if bad.any():
            b, i = (int(v) for v in torch.nonzero(bad)[0])
            raise ValueError(f"positions_BL selects position {i} of context {b}, which is not masked: only masked "
                             "positions can be probed")
    was_training, was_precision = model.training, model.precision
    model.eval()
    try:
        if precision is not None and precision != was_precision:
            model.set_precision(precision)  # raises for bf16 off CUDA
        with torch.autocast(tokens_BL.device.type, enabled=False) if precision == "fp32" else contextlib.nullcontext():
            if batch_tokens == "auto":  # sized in the precision probing runs in

                batch_tokens = auto_batch_tokens(model, tokens_BL.shape[1], default=512 * tokens_BL.shape[1])
            return _probe(model, tokens_BL, delta, max(1, batch_tokens // tokens_BL.shape[1]), positions_BL,
                          base_log_probs, values_V)
    finally:
        model.train(was_training)
        model.precision = was_precision


def _probe(model: MaskedModel, tokens_BL: Tensor, delta: float, rows: int, positions_BL: Tensor | None = None,
           base_log_probs: Tensor | None = None, values_V: Tensor | None = None) -> ProbeResult:
    dev = tokens_BL.device
    sync(dev)
    t0 = time.perf_counter()
    B, L = tokens_BL.shape
    V = model.n_values
    if base_log_probs is None:
        base = torch.cat([model.log_probs(tokens_BL[s:s + rows]).double() for s in range(0, B, rows)])  # [B, L, V]
    else:
        base = base_log_probs.to(device=dev, dtype=torch.float64)
    masked = model.is_masked(tokens_BL)
    marg = base.exp() * masked[..., None]
    if torch.isnan(marg).any():
        raise ValueError("the model gave NaN probabilities (a position with no legal value?)")

    # probes of each context: (j, v) for every probed masked j and kept value v
    probed = masked if positions_BL is None else positions_BL
    meta = []
    for b in range(B):
        M = torch.nonzero(probed[b]).squeeze(1)
        keep = _kept_values(marg[b, M], delta)  # [m, V]
        if values_V is not None:
            keep = keep & values_V
        jj, vv = torch.nonzero(keep, as_tuple=True)
        meta.append((M, keep, jj, vv))

    mi_d = torch.zeros(B, L, L, dtype=torch.float64, device=dev)
    n_values = torch.zeros(B, L, dtype=torch.long, device=dev)
    nfe = torch.full((B,), int(base_log_probs is None), dtype=torch.long, device=dev)
    # contexts are processed in groups of about 4 passes' worth of probes; only the masked
    # positions' conditionals are kept, so memory stays bounded by the budget, not by B
    b = 0
    while b < B:
        group, n_rows = [], 0
        while b < B and (not group or n_rows + len(meta[b][2]) <= 4 * rows):
            group.append(b)
            n_rows += len(meta[b][2])
            b += 1
        xs = []
        for g in group:
            M, _, jj, vv = meta[g]
            x = tokens_BL[g].repeat(len(jj), 1)
            x[torch.arange(len(jj), device=dev), M[jj]] = model.value_token_ids[vv]
            xs.append(x)
        allx = torch.cat(xs)
        probs = torch.cat([model.log_probs(allx[s:s + rows]).double().exp() for s in range(0, len(allx), rows)]) \
            if len(allx) else allx.new_zeros(0, L, V, dtype=torch.float64)
        off = 0
        for g in group:
            M, keep, jj, vv = meta[g]
            m, n = len(M), len(jj)
            cond = probs[off:off + n][:, M, :]  # [n, m(i), V(x)]
            off += n
            nfe[g] += n
            if m == 0:
                continue
            n_values[g, M] = keep.sum(-1)
            w = marg[g, M] * keep
            w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)  # renormalised p(x_j = v | c) over the probed values  [m, V]
            P = torch.zeros(m, V, m, V, dtype=torch.float64, device=dev)
            P[jj, vv] = cond
            if values_V is None:
                mix = torch.einsum("jv,jvix->jix", w, P)  # [m(j), m(i), V]
                ratio = torch.where(P > 0, P / mix[:, None].clamp_min(1e-300), torch.ones_like(P))
                kl = (P * ratio.log()).sum(-1)  # [m(j), V, m(i)]
                d = torch.einsum("jv,jvi->ji", w, kl).clamp_min(0.0)
            else:  # the joint restricted to S x S: p(x_i | x_j = v) renormalised on S, v weighted by p(v) p(X_i in S | v)
                low = (marg[g, M] * values_V).sum(-1) < RESTRICTED_MIN_MASS  # [m]: (almost) never in S
                P = P * values_V
                in_s = P.sum(-1)  # [m(j), V, m(i)]: p(X_i in S | c, x_j = v)
                P = P / in_s.clamp_min(1e-300)[..., None]
                wi = w[:, :, None] * in_s
                wi = wi / wi.sum(1, keepdim=True).clamp_min(1e-300)  # [m(j), V, m(i)]
                mix = torch.einsum("jvi,jvix->jix", wi, P)
                ratio = torch.where(P > 0, P / mix[:, None].clamp_min(1e-300), torch.ones_like(P))
                kl = (P * ratio.log()).sum(-1)
                d = (wi * kl).sum(1).clamp_min(0.0)
                d[low, :] = 0.0
                d[:, low] = 0.0
            d.fill_diagonal_(0.0)
            mi_d[g][M[:, None], M[None, :]] = d

    ent = -(marg * torch.where(marg > 0, marg.log(), torch.zeros_like(marg))).sum(-1)
    sync(dev)
    return ProbeResult(
        mi=(mi_d + mi_d.transpose(1, 2)) / 2, directed=mi_d, asymmetry=(mi_d - mi_d.transpose(1, 2)).abs(),
        marginals=marg, entropy=ent, masked=masked, n_values=n_values, nfe=nfe,
        seconds=time.perf_counter() - t0,
    )
