"""Chapter 6 (likelihood of decoded sequences): exactness, variance of the I-MDCE estimators, NLL as a quality axis.

Everything the chapter computes lives here; see `mimdm.evaluation.likelihood` for the estimators and their source.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from mimdm.core.contract import MaskedModel
from mimdm.data import sudoku as sd
from mimdm.core.artifacts import module_sha256, tensor_sha256
from mimdm.evaluation.evalcache import EvalCache, cached_conditional_nll, cached_record
from mimdm.evaluation.likelihood import Estimate, exhaustive_nll, log_likelihood_ratio, time_free_nll, time_integral_nll
from mimdm.experiments.speedup import generation_contexts
from mimdm.models.oracle import TableJointMDM, potts_chain_log_joint
from mimdm.pipelines.zoo import grids_to_tokens, tokens_to_grids

#: Number of valid 9×9 Sudoku grids (Felgenhauer & Jarvis 2006).
N_SUDOKU_GRIDS = 6_670_903_752_021_072_936_960
#: Order of the validity-preserving symmetry group used by the grid generator: digit relabelling (9!),
#: rows within bands and bands (3!^4), columns within stacks and stacks (3!^4), transpose (2).
SYMMETRY_GROUP_ORDER = math.factorial(9) * 6 ** 8 * 2


#: The three Monte Carlo estimators compared in the chapter, by display name.
ESTIMATOR_FNS = {
    "time-free (m uniform, n/m)": lambda *a, **k: time_free_nll(*a, sizes="uniform", **k),
    "time-free (m ∝ 1/m, H_n)": lambda *a, **k: time_free_nll(*a, sizes="harmonic", **k),
    "time-integral (λ ~ U, 1/λ)": time_integral_nll,
}


def reference_nll() -> dict:
    """Reference NLLs (nats) of a complete grid: uniform over all valid grids, and an upper bound on the
    entropy of the training distribution (a pool of 1024 grids times the symmetry group), and uniform over 9^81."""
    return {"uniform_valid_grids": math.log(N_SUDOKU_GRIDS),
            "training_entropy_upper_bound": math.log(1024 * SYMMETRY_GROUP_ORDER),
            "uniform_digits": 81 * math.log(9)}


def oracle_exactness(length: int = 6, n_values: int = 3, n_sequences: int = 5, draws=(16, 64, 256, 1024, 4096),
                     seed: int = 0) -> dict:
    """The estimators on an enumerable Potts chain (`TableJointMDM`), where −log p(x) is known.

    Returns:
        ``{"exhaustive_max_error"`` (nats, exhaustive time-free sum vs exact), ``"convergence"``: rows
        ``{"K", "estimator", "mean_abs_error", "mean_stderr"}`` over the sequences, ``"exact"``: [n] nats}.
    """
    g = torch.Generator().manual_seed(seed)
    log_joint = potts_chain_log_joint(length, n_values, coupling=1.2, generator=g)
    model = TableJointMDM.from_table(log_joint)
    x = torch.randint(0, n_values, (n_sequences, length), generator=g)
    exact = torch.tensor([-float(log_joint[tuple(r.tolist())]) for r in x], dtype=torch.float64)
    exh = torch.tensor([exhaustive_nll(model, r) for r in x], dtype=torch.float64)
    rows = []
    for K in draws:
        for name, fn in ESTIMATOR_FNS.items():
            e = fn(model, x, n_samples=K, seed=seed + K)
            rows.append({"K": K, "estimator": name, "mean_abs_error": float((e.value - exact).abs().mean()),
                         "mean_stderr": float(e.stderr.mean())})
    return {"exhaustive_max_error": float((exh - exact).abs().max()), "convergence": rows, "exact": exact.tolist()}


def estimator_spread(model: MaskedModel, tokens_BL: torch.Tensor, n_samples: int, repeats: int,
                     maskable_BL: torch.Tensor | None = None, seed: int = 0, cache: EvalCache | None = None) -> dict:
    """The estimators of `ESTIMATOR_FNS` at equal NFE on the same sequences.

    Each estimator is run ``repeats`` times with ``n_samples`` draws per sequence. Reported per estimator:
    the mean estimate (nats), the per-draw variance (nats², pooled over sequences and repeats) and the
    standard deviation of the K-draw estimate across repeats (nats, mean over sequences), the quantity a
    user of one estimate cares about; and the mean NFE per estimate. ``cache``: reuse the stored result of the same
    model, sequences, draws, repeats and seed (`mimdm.evaluation.evalcache.cached_record`).
    """
    def compute():
        out = {}
        for name, fn in ESTIMATOR_FNS.items():
            ests = [fn(model, tokens_BL, n_samples, maskable_BL, seed=seed + 7919 * r) for r in range(repeats)]
            vals = torch.stack([e.value for e in ests])                 # [R, B]
            draws = torch.cat([e.draws for e in ests], 1)               # [B, R*K]
            out[name] = {"mean_nll": float(vals.mean()), "per_draw_variance": float(draws.var(1).mean()),
                         "estimate_std": float(vals.std(0).mean()),
                         "nfe": float(torch.stack([e.nfe for e in ests]).float().mean()),
                         "per_sequence": vals.mean(0).tolist()}
        return out

    key = None if cache is None or not cache.enabled else {
        "what": "estimator_spread", "model": module_sha256(model), "tokens": tensor_sha256(tokens_BL),
        "maskable": None if maskable_BL is None else tensor_sha256(maskable_BL), "estimators": list(ESTIMATOR_FNS),
        "n_samples": int(n_samples), "repeats": int(repeats), "seed": int(seed)}
    return cached_record(cache, key, compute)


def perturb_grids(grids: np.ndarray, n_swaps: int, rng) -> np.ndarray:
    """Copies of ``[N, 81]`` grids with ``n_swaps`` random swaps of two cells of one row each.

    A swap of two different digits in a row keeps the row valid and breaks two columns (and a box
    unless both cells share one), so the result is an invalid grid close to a valid one.
    """
    rng = np.random.default_rng(rng)
    out = grids.copy()
    for g in out:
        for _ in range(n_swaps):
            r = int(rng.integers(9))
            a, b = rng.choice(9, 2, replace=False)
            g[9 * r + a], g[9 * r + b] = g[9 * r + b], g[9 * r + a]
    return out


def ratio_spread(model: MaskedModel, x_BL: torch.Tensor, y_BL: torch.Tensor, n_samples: int, repeats: int,
                 estimator: str = "time_free_harmonic", seed: int = 0, cache: EvalCache | None = None) -> dict:
    """Coupled vs decoupled estimates of log p(x) − log p(y) at equal NFE (2K passes per pair).

    ``estimator`` is one of `mimdm.evaluation.likelihood.ESTIMATORS` (default: time-free, harmonic mask sizes);
    ``cache``: reuse the stored result of the same model, pairs, draws, repeats and seed
    (`mimdm.evaluation.evalcache.cached_record`).

    Returns per version the mean log-ratio (nats), per-draw variance (nats²) and the std of the estimate
    across ``repeats`` (nats), and the variance ratio decoupled / coupled.
    """
    def compute():
        out = {}
        for name, coupled in (("coupled", True), ("decoupled", False)):
            ests = [log_likelihood_ratio(model, x_BL, y_BL, n_samples, coupled=coupled, estimator=estimator,
                                         seed=seed + 104729 * r) for r in range(repeats)]
            vals = torch.stack([e.value for e in ests])
            draws = torch.cat([e.draws for e in ests], 1)
            out[name] = {"mean_log_ratio": float(vals.mean()), "per_draw_variance": float(draws.var(1).mean()),
                         "estimate_std": float(vals.std(0).mean()), "nfe": float(ests[0].nfe.float().mean()),
                         "per_pair": vals.mean(0).tolist()}
        out["variance_ratio"] = out["decoupled"]["per_draw_variance"] / out["coupled"]["per_draw_variance"]
        return out

    key = None if cache is None or not cache.enabled else {
        "what": "ratio_spread", "model": module_sha256(model), "x": tensor_sha256(x_BL), "y": tensor_sha256(y_BL),
        "estimator": estimator, "n_samples": int(n_samples), "repeats": int(repeats), "seed": int(seed)}
    return cached_record(cache, key, compute)


def conditional_nll(model: MaskedModel, out_tokens: torch.Tensor, context_tokens: torch.Tensor, n_samples: int = 32,
                    seed: int = 0) -> Estimate:
    """NLL (nats) of the cells a decoder filled given the context: −log p(x_S | x_{S^c}), S = masked in the context.

    The time-free I-MDCE estimator restricted to S (`mimdm.evaluation.likelihood.time_free_nll`), ``n_samples`` passes per grid.

    Raises:
        ValueError: a decoded grid still holds masks where the context was masked, or a context has no masked cell.
    """
    S = model.is_masked(context_tokens)
    return time_free_nll(model, out_tokens, n_samples=n_samples, maskable_BL=S, seed=seed)


def nll_score(model: MaskedModel, context_tokens: torch.Tensor, n_samples: int = 32, seed: int = 0,
              cache: EvalCache | None = None):
    """A score function for `mimdm.experiments.speedup.sweep`: mean conditional NLL of the decoded cells (nats per
    grid); ``cache``: reuse stored estimates of the same model, grids, draws and seed (`mimdm.evaluation.evalcache`)."""
    def score(out_tokens):
        v = cached_conditional_nll(cache, model, out_tokens, context_tokens, n_samples, seed)
        return {"nll": float(v.mean()), "nll_stderr": float(v.std() / math.sqrt(len(v)))}
    return score


def nll_by_validity(model: MaskedModel, out_tokens: torch.Tensor, context_grids: np.ndarray, n_samples: int = 32,
                    seed: int = 0, cache: EvalCache | None = None) -> dict:
    """Per decoded grid: conditional NLL (nats) and validity; AUROC of NLL as a detector of invalid grids
    (``cache`` as in `nll_score`).

    Returns ``{"nll": [N], "valid": [N] bool, "auroc_invalid": float (NaN if one class is empty)}``.
    """
    from sklearn.metrics import roc_auc_score


    ctx = grids_to_tokens(context_grids, out_tokens.device)
    nll = cached_conditional_nll(cache, model, out_tokens, ctx, n_samples, seed).cpu().numpy()
    out = tokens_to_grids(out_tokens)
    valid = sd.is_valid_solution_batch(out) & np.all((context_grids == 0) | (out == context_grids), axis=1)
    auroc = float(roc_auc_score(~valid, nll)) if 0 < valid.sum() < len(valid) else math.nan
    return {"nll": nll.tolist(), "valid": valid.tolist(), "auroc_invalid": auroc}


def chapter_grids(profile, rng, puzzles: list[sd.Puzzle] | None = None) -> np.ndarray:
    """``[n, 81]`` complete grids whose NLL chapter 6 estimates: ``profile.likelihood_sequences`` random valid grids
    drawn from ``rng``, or the solutions of the first ``profile.likelihood_sequences`` of ``puzzles`` (a reader's
    puzzle file; ``rng`` is then not used)."""
    if puzzles is None:
        return sd.random_solutions(profile.likelihood_sequences, rng)
    return np.stack([p.solution.reshape(81) for p in puzzles[:profile.likelihood_sequences]])


def chapter_contexts(profile, rng, puzzles: list[sd.Puzzle] | None = None) -> np.ndarray:
    """``[n, 81]`` contexts chapter 6 decodes at temperature 1: ``profile.likelihood_contexts`` under-constrained
    grids (`mimdm.experiments.speedup.generation_contexts`, from ``rng``), or the first ``profile.likelihood_contexts``
    of ``puzzles`` (``rng`` is then not used)."""
    if puzzles is None:
        return generation_contexts(profile.likelihood_contexts, profile.generation_max_clues, rng)
    return np.stack([p.puzzle.reshape(81) for p in puzzles[:profile.likelihood_contexts]])


def findings_markdown(values: dict, likelihood_draws: int) -> str:
    """Chapter 6's findings as a Markdown list, from its results (``values`` of ``likelihood.json``) and the number
    of mask draws K of one estimate."""
    orc, spread, ratios, dec = (values[k] for k in ("oracle", "estimator_spread", "ratio_spread", "decoded_nll"))
    tu, tf, ti = (spread[n] for n in ESTIMATOR_FNS)
    near, other = ratios["valid vs one swap"], ratios["valid vs valid"]
    seqr = next(r for r in dec if r["rule"] == "sequential")
    conv = orc["convergence"]
    kmax = int(max(r["K"] for r in conv))
    err = [float(next(r["mean_abs_error"] for r in conv if r["K"] == kmax and r["estimator"] == n)) for n in ESTIMATOR_FNS]
    par = min((r for r in dec if r["rule"] != "sequential"), key=lambda r: r["nfe"])
    auroc_median = float(np.nanmedian([math.nan if r["auroc_invalid"] is None else r["auroc_invalid"] for r in dec]))
    ref = values["reference_nll"]["uniform_valid_grids"]
    K = likelihood_draws
    return f"""
- **Exactness.** On the Potts oracle the exhaustive time-free sum equals $-\\log p(x)$ to {orc['exhaustive_max_error']:.0e} nats, and the
  Monte Carlo estimates converge to it (tests assert both).
- **Time-free vs time-integral on the Sudoku MDM** (K = {K} passes): per-draw variance {tu['per_draw_variance']:.0f} (uniform m),
  {tf['per_draw_variance']:.0f} (m ∝ 1/m) and {ti['per_draw_variance']:.0f} (λ ~ U, a sample variance of an infinite-variance estimator) nats²;
  one estimate spreads by {tu['estimate_std']:.1f}, {tf['estimate_std']:.1f} and {ti['estimate_std']:.1f} nats. Drawing m ∝ 1/m is the worst here:
  this model is nearly certain once most cells are revealed, so the NLL comes from heavily masked grids, which it rarely draws.
  Uniform sizes and λ ~ U weight large masks almost alike (n/m² vs n/(m(m−1))), hence their similar spread on Sudoku; on the
  Potts oracle, where single-position masks carry loss, at the largest K ({kmax}) the mean |error| is {err[0]:.3f} (uniform m),
  {err[1]:.3f} (m ∝ 1/m) and {err[2]:.3f} nats (λ ~ U): the time-integral form, with no $1/\\sqrt K$ guarantee, is
  {"behind" if err[2] > min(err[:2]) else "level with or ahead of"} the best time-free form (table above).
  The mean NLL of valid grids, {tu['mean_nll']:.1f} nats, lies {"above" if tu["mean_nll"] > ref else "below"} the uniform-over-all-grids value ({ref:.2f}).
- **Coupled ratios.** Sharing the mask draws cuts the per-draw variance of $\\log p(x)-\\log p(y)$ by {near['variance_ratio']:.0f}× for a grid and its
  one-swap corruption and {other['variance_ratio']:.0f}× for two unrelated valid grids; the coupled estimate puts the corrupted grid
  {near['coupled']['mean_log_ratio']:.1f} nats below the valid one on average (one K = {K} estimate spreads by {near['coupled']['estimate_std']:.1f} nats).
- **Decoded sequences.** Sequential decoding gives a mean conditional NLL of {seqr['nll']:.1f} nats at {seqr['nfe']:.0f} passes ({100 * seqr['valid_rate']:.0f}% valid);
  the cheapest rule tried, {par['rule']} ({par['knob']:g}), gives {par['nll']:.1f} nats at {par['nfe']:.0f} passes ({100 * par['valid_rate']:.0f}% valid).
  Within a rule, NLL separates invalid from valid grids with AUROC {auroc_median:.2f} (median over the rules with both;
  pooled over rules {values['pooled_auroc_invalid']:.2f}, which also reflects that rules with no valid grid score far higher). It is a graded, noisy
  quality axis that needs no validity oracle — the reason chapters 4 and 5 report it beside task-specific measures.
"""
