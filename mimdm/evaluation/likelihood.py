"""Information-theoretic likelihood estimators for masked diffusion models (I-MDCE).

Source: *Information-Theoretic Discrete Diffusion* (NeurIPS 2025). For masked (absorbing)
diffusion, the I-MDCE identity turns the denoising cross-entropy into an exact decomposition of
the log-likelihood, not a bound. Write, for a sequence x and a set M of masked positions,

    f(M) = Σ_{i∈M} −log p(x_i | x_{M^c})        (one forward pass of the MDM on x with M masked).

Then, for a model whose conditionals are those of one joint distribution p (exactly so for an
oracle, approximately for a trained MDM), with n = |S| maskable positions:

    −log p(x_S | x_{S^c}) = Σ_{m=1}^{n} (1/m) · E_{M⊂S, |M|=m} [ f(M) ]               (time-free, eq. I-MDCE)
                          = E_{λ~U(0,1)} E_{M: i∈M w.p. λ} [ f(M) / λ ]                  (time-integral DCE)

(the second form is the first after integrating the Beta(m, n−m+1) density of |M| over λ). The
time-free form is what any-order autoregression gives when the order is uniform: at the step where
m positions are still masked, M is a uniform m-subset and the position unmasked is uniform in M.

For a trained MDM whose conditionals are not exactly those of one joint, the same sum is the
order-averaged any-order autoregressive NLL E_σ[−log p_σ(x)] (an upper bound on −log E_σ p_σ(x));
every estimator here targets that same quantity, so their comparisons hold for any model.

Estimators here draw K masks per sequence, spend one forward pass per non-empty mask, and return
the mean, its standard error and the NFE. With S the whole sequence they estimate −log p(x); with
S a subset they estimate the conditional (infilling) NLL −log p(x_S | x_{S^c}); positions outside
S that hold the mask id stay masked throughout (they are marginalised, not observed).

All values are in nats. Tensor names carry their shape: ``tokens_BL`` is ``[B, L]``.
"""
from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from mimdm.core.contract import MaskedModel

#: Names of the Monte Carlo estimators (see `time_free_nll`, `time_integral_nll`).
ESTIMATORS = ("time_free_harmonic", "time_free_uniform", "time_integral")

__all__ = [
    "ESTIMATORS", "Estimate", "harmonic", "masked_nll_terms", "time_free_nll", "time_integral_nll",
    "exhaustive_nll", "log_likelihood_ratio",
]


@dataclass
class Estimate:
    """A Monte Carlo estimate per sequence.

    Attributes:
        value: ``[B]`` float64, the estimate (nats): mean of the per-draw values.
        stderr: ``[B]`` float64, standard error of the mean (sample std / sqrt(K)); NaN for K = 1.
        nfe: ``[B]`` long, model forward passes spent on each sequence (one per non-empty mask).
        draws: ``[B, K]`` float64, the per-draw values (for variance studies).
    """

    value: Tensor
    stderr: Tensor
    nfe: Tensor
    draws: Tensor

    @property
    def variance(self) -> Tensor:
        """``[B]`` sample variance of a single draw (nats²)."""
        return self.draws.var(dim=1, unbiased=True)


def harmonic(n: int | Tensor) -> Tensor:
    """H_n = Σ_{m=1}^{n} 1/m, float64 (``n`` an int or a long tensor; H_0 = 0).

    Raises:
        ValueError: a negative ``n``.
    """
    n_t = torch.as_tensor(n, dtype=torch.long).cpu()
    if n_t.numel() and int(n_t.min()) < 0:
        raise ValueError(f"harmonic numbers need n >= 0, got {int(n_t.min())}")
    top = int(n_t.max()) if n_t.numel() else 0
    cum = torch.cat([torch.zeros(1, dtype=torch.float64),
                     torch.cumsum(1.0 / torch.arange(1, top + 1, dtype=torch.float64), 0)])
    return cum[n_t]


def _value_index(model: MaskedModel, tokens_BL: Tensor, maskable_BL: Tensor) -> Tensor:
    """``[B, L]`` value index of each token (-1 where the token is not a value).

    Raises:
        ValueError: a maskable position holds the mask id or another non-value token.
    """
    lookup = torch.full((model.n_tokens,), -1, dtype=torch.long, device=tokens_BL.device)
    lookup[model.value_token_ids.to(tokens_BL.device)] = torch.arange(model.n_values, device=tokens_BL.device)
    vidx = lookup[tokens_BL.long()]
    bad = maskable_BL & (vidx < 0)
    if bad.any():
        b, i = (int(t) for t in bad.nonzero()[0])
        raise ValueError(
            f"sequence {b}, position {i}: a maskable position holds token {int(tokens_BL[b, i])}, "
            "which is not a value (the likelihood of x needs every scored position filled)"
        )
    return vidx


def _prepare(model: MaskedModel, tokens_BL: Tensor, maskable_BL: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    model.check_tokens(tokens_BL)
    tokens_BL = tokens_BL.long()
    if maskable_BL is None:
        maskable_BL = ~model.is_masked(tokens_BL)
    else:
        maskable_BL = torch.as_tensor(maskable_BL, dtype=torch.bool, device=tokens_BL.device)
        if maskable_BL.shape != tokens_BL.shape:
            raise ValueError(f"maskable must have the shape of tokens {tuple(tokens_BL.shape)}, got {tuple(maskable_BL.shape)}")
    n_B = maskable_BL.sum(1)
    if (n_B == 0).any():
        raise ValueError(f"sequence {int((n_B == 0).nonzero()[0])} has no maskable position: nothing to score")
    vidx = _value_index(model, tokens_BL, maskable_BL)
    return tokens_BL, maskable_BL, vidx


@torch.no_grad()
def masked_nll_terms(model: MaskedModel, tokens_NL: Tensor, mask_NL: Tensor, vidx_NL: Tensor,
                     batch_size: int = 512) -> Tensor:
    """f(M) = Σ_{i∈M} −log p(x_i | x_{M^c}) for N (sequence, mask) pairs: ``[N]`` float64 nats.

    Args:
        tokens_NL: ``[N, L]`` the sequences (every position in M holds a value token).
        mask_NL: ``[N, L]`` bool, the set M to mask (rows may be empty: f = 0, no forward run).
        vidx_NL: ``[N, L]`` value index of each token (see `_value_index`).
        batch_size: sequences per forward pass batch.

    Cost: one forward per non-empty row.

    Raises:
        ValueError: the model gives probability 0 to a scored value (infinite NLL).
    """
    out = torch.zeros(tokens_NL.shape[0], dtype=torch.float64, device=tokens_NL.device)
    rows = mask_NL.any(1).nonzero().squeeze(1)
    for s in range(0, rows.numel(), batch_size):
        r = rows[s:s + batch_size]
        t = tokens_NL[r].masked_fill(mask_NL[r], model.mask_id)
        lp = model.log_probs(t).double()                               # [n, L, V]
        ll = lp.gather(2, vidx_NL[r].clamp_min(0).unsqueeze(2)).squeeze(2)  # [n, L]
        # positions outside M are not scored: zero them (a -inf there must not turn into NaN)
        out[r] = -torch.where(mask_NL[r], ll, torch.zeros_like(ll)).sum(1)
    if torch.isinf(out).any() or torch.isnan(out).any():
        raise ValueError("the model gives probability 0 to a scored value: the NLL is infinite")
    return out


def _uniform_subsets(maskable_NL: Tensor, size_N: Tensor, g: torch.Generator) -> Tensor:
    """``[N, L]`` bool: for each row a uniformly random subset of the maskable positions of the given size."""
    keys = torch.rand(maskable_NL.shape, generator=g, dtype=torch.float64).to(maskable_NL.device)
    keys = keys.masked_fill(~maskable_NL, 2.0)
    rank = keys.argsort(1).argsort(1)
    return rank < size_N.unsqueeze(1)


def _summarise(draws_BK: Tensor, nonempty_BK: Tensor) -> Estimate:
    K = draws_BK.shape[1]
    se = draws_BK.std(dim=1, unbiased=True) / math.sqrt(K) if K > 1 else torch.full_like(draws_BK[:, 0], float("nan"))
    return Estimate(value=draws_BK.mean(1), stderr=se, nfe=nonempty_BK.sum(1).long(), draws=draws_BK)


def _draw_masks(kind: str, maskable_BL: Tensor, K: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Masks ``[B, K, L]`` and per-draw weights ``[B, K]`` for the time-free or time-integral estimator."""
    B, L = maskable_BL.shape
    n_B = maskable_BL.sum(1).cpu()
    rep = maskable_BL.unsqueeze(1).expand(B, K, L).reshape(B * K, L)
    if kind == "time_free_harmonic":
        # m ~ (1/m) / H_n over 1..n by inverse CDF on the cumulative harmonic numbers
        H = harmonic(torch.arange(0, L + 1))                           # [L+1], H[0] = 0
        n_N = n_B.repeat_interleave(K)
        u = torch.rand(B * K, generator=g, dtype=torch.float64) * H[n_N]
        m_N = torch.searchsorted(H[1:].contiguous(), u, right=False) + 1
        m_N = torch.minimum(m_N, n_N)
        masks = _uniform_subsets(rep, m_N.to(rep.device), g)
        weights = H[n_N]
    elif kind == "time_free_uniform":
        # m ~ U{1..n}, weight n/m: the same sum Σ_m (1/m) E f, sampled with uniform sizes
        n_N = n_B.repeat_interleave(K)
        u = torch.rand(B * K, generator=g, dtype=torch.float64)
        m_N = torch.minimum((u * n_N).long() + 1, n_N)
        masks = _uniform_subsets(rep, m_N.to(rep.device), g)
        weights = n_N.double() / m_N.double()
    elif kind == "time_integral":
        lam = torch.rand(B * K, generator=g, dtype=torch.float64)
        coin = torch.rand(B * K, L, generator=g, dtype=torch.float64)
        masks = (coin < lam.unsqueeze(1)).to(rep.device) & rep
        weights = 1.0 / lam
    else:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {kind!r}")
    return masks.reshape(B, K, L), weights.reshape(B, K).to(maskable_BL.device)


def _check_counts(n_samples, batch_size) -> None:
    for name, v in (("n_samples", n_samples), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, got {v!r}")


#: Largest number of mask-draw cells (sequences × draws × length) drawn at once: the draws' float64 keys then take at
#: most 2 GiB. Larger requests are refused (they would also need that many forward passes).
MAX_DRAW_CELLS = 1 << 28


def _check_draw_size(B: int, K: int, L: int) -> None:
    if B * K * L > MAX_DRAW_CELLS:
        raise ValueError(f"{B:,} sequences x {K:,} mask draws x {L} positions need {B * K * L * 8 / 2**30:.1f} GiB of "
                         f"mask keys and {B * K:,} forward passes; the limit is {MAX_DRAW_CELLS:,} cells: lower the "
                         "number of draws or score fewer sequences per call")


def _estimate(kind: str, model, tokens_BL, n_samples, maskable_BL, seed, batch_size) -> Estimate:
    _check_counts(n_samples, batch_size)
    tokens_BL, maskable_BL, vidx = _prepare(model, tokens_BL, maskable_BL)
    g = torch.Generator().manual_seed(seed)
    B, L = tokens_BL.shape
    _check_draw_size(B, n_samples, L)
    masks, w = _draw_masks(kind, maskable_BL, n_samples, g)
    f = masked_nll_terms(model, tokens_BL.repeat_interleave(n_samples, 0), masks.reshape(B * n_samples, L),
                         vidx.repeat_interleave(n_samples, 0), batch_size)
    return _summarise(w * f.reshape(B, n_samples), masks.any(2))


def time_free_nll(model: MaskedModel, tokens_BL: Tensor, n_samples: int = 64, maskable_BL: Tensor | None = None,
                  seed: int = 0, batch_size: int = 512, sizes: str = "uniform") -> Estimate:
    """Time-free I-MDCE estimate of −log p(x_S | x_{S^c}) in nats, one forward pass per draw.

    Both variants are unbiased estimates of Σ_{m=1}^{n} (1/m) E_{|M|=m} f(M) (I-MDCE identity,
    *Information-Theoretic Discrete Diffusion*, NeurIPS 2025; n = |S|, M a uniform m-subset of S):

    * ``sizes="uniform"`` (default): m uniform on 1..n, value (n/m) · f(M) — the any-order
      autoregressive form the paper's released code uses (``k_DCE_loss``);
    * ``sizes="harmonic"``: m with probability (1/m)/H_n over all of 1..n, value H_n · f(M).

    They differ only in variance: per-draw second moments n Σ_m E[f²|m]/m² (uniform) and
    H_n Σ_m E[f²|m]/m (harmonic). With a per-position loss that does not fall steeply with m the
    uniform form is lower (by about H_n (n+1)/(2n) for a constant loss); chapter 6 measures both.

    Args:
        model: any `MaskedModel`.
        tokens_BL: ``[B, L]`` sequences; positions in S must hold values.
        n_samples: K draws per sequence.
        maskable_BL: ``[B, L]`` bool, the scored set S (default: every unmasked position, i.e. the
            unconditional NLL of the sequence, or of the filled part if some positions hold the mask).
        seed: seed of the mask draws (same seed, same draws).
        batch_size: sequences per forward batch.
        sizes: ``"uniform"`` (m uniform, weight n/m) or ``"harmonic"`` (m ∝ 1/m, weight H_n).

    Returns:
        `Estimate` (value ``[B]`` nats, stderr, nfe = K per sequence, draws ``[B, K]``).

    Raises:
        ValueError: a scored position holds no value, a sequence has nothing to score, the model
            assigns probability 0 to a scored value; ``n_samples`` or ``batch_size`` not an integer
            >= 1; more than `MAX_DRAW_CELLS` draw cells (B·K·L). See also `MaskedModel.check_tokens`.
    """
    if sizes not in ("harmonic", "uniform"):
        raise ValueError(f"sizes must be 'harmonic' or 'uniform', got {sizes!r}")
    kind = "time_free_harmonic" if sizes == "harmonic" else "time_free_uniform"
    return _estimate(kind, model, tokens_BL, n_samples, maskable_BL, seed, batch_size)


def time_integral_nll(model: MaskedModel, tokens_BL: Tensor, n_samples: int = 64, maskable_BL: Tensor | None = None,
                      seed: int = 0, batch_size: int = 512) -> Estimate:
    """Time-integral DCE estimate of −log p(x_S | x_{S^c}) in nats: λ ~ U(0,1), mask each i∈S w.p. λ, value f(M)/λ.

    This is the masked-diffusion (MDLM) denoising cross-entropy with the linear schedule, which the
    I-MDCE identity shows is exact in expectation. A draw with M empty costs no forward pass and
    contributes 0. Its second moment diverges (logarithmically, from |M| = 1 at small λ): its
    standard error is not a reliable measure of its spread, and where the loss of single-position
    masks is not negligible the time-free estimators are far less variable at equal NFE.

    Args/Returns/Raises: as `time_free_nll` (nfe counts only non-empty masks).
    """
    return _estimate("time_integral", model, tokens_BL, n_samples, maskable_BL, seed, batch_size)


@torch.no_grad()
def exhaustive_nll(model: MaskedModel, tokens_L: Tensor, maskable_L: Tensor | None = None,
                   batch_size: int = 512, max_positions: int = 16) -> float:
    """The time-free sum computed exactly: Σ_{m=1}^{n} (1/m) · mean over all m-subsets M of S of f(M), in nats.

    Equals −log p(x_S | x_{S^c}) exactly for a model whose conditionals come from one joint (e.g.
    `TableJointMDM`); costs 2^n − 1 forward passes.

    Args:
        tokens_L: ``[L]`` one sequence.
        maskable_L: ``[L]`` bool, the scored set S (default: every unmasked position).
        max_positions: refuse |S| above this (2^n passes).

    Raises:
        ValueError: ``tokens_L`` or ``maskable_L`` not one-dimensional (a batch: call once per
            sequence); |S| > ``max_positions``; as `time_free_nll` otherwise.
    """
    for name, t in (("tokens_L", tokens_L), ("maskable_L", maskable_L)):
        if t is not None and t.dim() != 1:
            raise ValueError(f"exhaustive_nll scores one sequence: {name} must be [L], got shape {tuple(t.shape)}")
    tokens_BL = tokens_L.reshape(1, -1)
    tokens_BL, maskable_BL, vidx = _prepare(model, tokens_BL, None if maskable_L is None else maskable_L.reshape(1, -1))
    S = maskable_BL[0].nonzero().squeeze(1).tolist()
    n = len(S)
    if n > max_positions:
        raise ValueError(f"{n} scored positions: the exhaustive sum needs 2^{n} - 1 passes (limit max_positions={max_positions})")
    L = tokens_BL.shape[1]
    subsets = [c for m in range(1, n + 1) for c in itertools.combinations(S, m)]
    masks = torch.zeros(len(subsets), L, dtype=torch.bool, device=tokens_BL.device)
    for r, c in enumerate(subsets):
        masks[r, list(c)] = True
    f = masked_nll_terms(model, tokens_BL.expand(len(subsets), L), masks, vidx.expand(len(subsets), L), batch_size)
    sizes = masks.sum(1)
    total = 0.0
    for m in range(1, n + 1):
        total += float(f[sizes == m].mean()) / m
    return total


def log_likelihood_ratio(model: MaskedModel, x_BL: Tensor, y_BL: Tensor, n_samples: int = 64, coupled: bool = True,
                         estimator: str = "time_free_uniform", maskable_BL: Tensor | None = None, seed: int = 0,
                         batch_size: int = 512) -> Estimate:
    """Estimate log p(x_S | ·) − log p(y_S | ·) in nats for pairs of equal-length sequences.

    Coupled (*Information-Theoretic Discrete Diffusion*, NeurIPS 2025): the same mask draws (m, M,
    or λ, M) score both sequences and each draw returns the difference w·(f_y(M) − f_x(M)); the
    shared randomness cancels, so the variance is far below the decoupled version, which draws
    masks independently for x and y. Either way up to 2K forward passes per pair (the
    time-integral estimator skips empty masks).

    Positions masked in x or y are marginalised in both, so the two are scored in the same context.

    Args:
        x_BL, y_BL: ``[B, L]`` the two sequences of each pair (same shape).
        coupled: share mask draws between x and y (True) or not (False).
        estimator: one of `ESTIMATORS`: ``"time_free_uniform"`` (default), ``"time_free_harmonic"`` (harmonic
            sizes) or ``"time_integral"``.
        maskable_BL: ``[B, L]`` bool scored set, shared by x and y (default: positions unmasked in both).
        Other arguments as `time_free_nll`.

    Returns:
        `Estimate` of the log-ratio per pair (nfe = passes on both sequences).

    Raises:
        ValueError: shapes differ, unknown estimator; as `time_free_nll` otherwise.
    """
    if x_BL.shape != y_BL.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x_BL.shape)} and {tuple(y_BL.shape)}")
    if not torch.equal(model.is_masked(x_BL), model.is_masked(y_BL)):
        raise ValueError("x and y hold the mask at different positions: they would be scored in different contexts")
    if maskable_BL is None:
        maskable_BL = ~model.is_masked(x_BL)
    if not coupled:
        ex = _estimate(estimator, model, x_BL, n_samples, maskable_BL, seed, batch_size)
        ey = _estimate(estimator, model, y_BL, n_samples, maskable_BL, seed + 1_000_003, batch_size)
        # independent draws: the per-draw differences are as good as any pairing of them
        return Estimate(value=ey.value - ex.value, stderr=(ex.stderr ** 2 + ey.stderr ** 2).sqrt(),
                        nfe=ex.nfe + ey.nfe, draws=ey.draws - ex.draws)
    _check_counts(n_samples, batch_size)
    x_BL, maskable_BL, vx = _prepare(model, x_BL, maskable_BL)
    y_BL, _, vy = _prepare(model, y_BL, maskable_BL)
    g = torch.Generator().manual_seed(seed)
    B, L = x_BL.shape
    K = n_samples
    _check_draw_size(B, K, L)
    masks, w = _draw_masks(estimator, maskable_BL, K, g)
    flat = masks.reshape(B * K, L)
    fx = masked_nll_terms(model, x_BL.repeat_interleave(K, 0), flat, vx.repeat_interleave(K, 0), batch_size)
    fy = masked_nll_terms(model, y_BL.repeat_interleave(K, 0), flat, vy.repeat_interleave(K, 0), batch_size)
    est = _summarise(w * (fy - fx).reshape(B, K), masks.any(2))
    est.nfe = 2 * est.nfe
    return est
