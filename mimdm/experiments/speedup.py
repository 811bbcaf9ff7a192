"""Chapter 5 (speedup analysis): quality against forward passes for every unmasking rule.

Two evaluation sets: (a) hard puzzles with a unique solution (few clues, the highest solver
difficulty among candidates), scored by exact solve rate; (b) generation from under-constrained
grids (few or no clues, many solutions) with temperature sampling, scored by validity and
diversity. Each rule's knob is swept; `matched_quality` picks, per rule, the cheapest setting
whose quality is within a tolerance of one-at-a-time decoding.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from mimdm.core.artifacts import artifact_dir
from mimdm.core.contract import MaskedModel
from mimdm.core.results import results_name  # noqa: F401  (chapter 5 calls sp.results_name)
from mimdm.data import sudoku as sd
from mimdm.evaluation.evalcache import EvalCache, cached_decode
from mimdm.pipelines.zoo import grids_to_tokens, tokens_to_grids
from mimdm.sampling.decoding import (
    EBSampler,
    MIGuided,
    Sequential,
    Threshold,
    TopK,
    decode,
    head_mi_fn,
    oracle_mi_fn,
    zero_mi_fn,
)


def hard_puzzles(n: int, clues: tuple[int, int], rng, oversample: int = 2) -> list[sd.Puzzle]:
    """``n`` unique puzzles with clue counts in ``clues``: the most difficult of ``oversample·n`` candidates."""
    cands = sd.make_puzzles(n * oversample, clues, rng)
    cands.sort(key=lambda p: -p.difficulty)
    return cands[:n]


def hard_puzzle_split(n_dev: int, n_test: int, clues: tuple[int, int], rng,
                      oversample: int = 2) -> tuple[list[sd.Puzzle], list[sd.Puzzle]]:
    """A development set and a held-out test set of hard puzzles, disjoint and equally hard.

    The ``n_dev + n_test`` most difficult of ``oversample·(n_dev + n_test)`` candidates (`hard_puzzles`), without
    repeated grids, are split at random: knobs are chosen on the development set (`select_on_dev`) and reported on
    the test set (`report_held_out`), so selection and reporting never see the same puzzle.

    Returns:
        ``(dev, test)`` lists of `mimdm.data.sudoku.Puzzle` of lengths ``n_dev`` and ``n_test``.

    Raises:
        ValueError: ``n_dev`` or ``n_test`` < 1, or fewer distinct candidates than ``n_dev + n_test``.
    """
    if n_dev < 1 or n_test < 1:
        raise ValueError(f"n_dev and n_test must be >= 1, got {n_dev} and {n_test}")
    rng = np.random.default_rng(rng)
    n = n_dev + n_test
    cands, seen = [], set()
    for p in hard_puzzles(n, clues, rng, oversample=oversample):
        key = p.puzzle.tobytes()
        if key not in seen:
            seen.add(key)
            cands.append(p)
    if len(cands) < n:
        raise ValueError(f"only {len(cands)} distinct puzzles for {n_dev} + {n_test}; raise oversample")
    order = rng.permutation(n)
    return [cands[i] for i in order[:n_dev]], [cands[i] for i in order[n_dev:]]


def generation_contexts(n: int, max_clues: int, rng) -> np.ndarray:
    """``[n, 81]`` under-constrained grids: random subsets of 0..``max_clues`` cells of random solutions."""
    rng = np.random.default_rng(rng)
    sols = sd.random_solutions(n, rng)
    return np.stack([sd.random_partial(s, int(rng.integers(0, max_clues + 1)), rng) for s in sols])


def chapter_sets(profile, seed: int = 0, root=None, puzzle_file: str | Path | None = None,
                 ) -> tuple[list[sd.Puzzle], list[sd.Puzzle], np.ndarray]:
    """Chapter 5's evaluation sets for a profile and seed: development and held-out hard puzzles, generation contexts.

    With ``puzzle_file`` (`mimdm.data.sudoku.read_puzzles`: a reader's own set) the held-out puzzles are the file's;
    the development puzzles, on which the rules' settings are chosen, stay the profile's, so selection and report
    stay on different puzzles.

    ``hard_puzzle_split(profile.dev_puzzles, profile.hard_puzzles, profile.hard_clues)`` then
    ``generation_contexts(profile.generation_contexts, profile.generation_max_clues)``, both from one generator
    seeded with ``seed + 50``: chapter 1 measures the sequential solve rate on the same held-out puzzles. Making
    1,200 hard puzzles takes about a minute, so the sets are cached in the artifact folder (``puzzle_sets/``, keyed
    by these settings and the grid generator's id; ``root`` overrides the artifact root).

    Returns:
        ``(dev_puzzles, test_puzzles, generation_contexts [n, 81])``.

    Raises:
        FileNotFoundError, mimdm.data.sudoku.SudokuError: as `mimdm.data.sudoku.read_puzzles`.
    """
    if puzzle_file is not None:
        dev, _, gen = chapter_sets(profile, seed, root)
        return dev, sd.read_puzzles(puzzle_file), gen

    key = {"n_dev": profile.dev_puzzles, "n_test": profile.hard_puzzles, "clues": list(profile.hard_clues),
           "seed": seed + 50, "oversample": 2, "generation": [profile.generation_contexts, profile.generation_max_clues],
           "data": sd.GENERATOR_ID}
    path = artifact_dir("puzzle_sets", "chapter5", key, root) / "sets.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            def puzzles(tag):
                out = []
                for p, s, c, d in zip(z[f"{tag}_puzzle"], z[f"{tag}_solution"], z[f"{tag}_clues"], z[f"{tag}_difficulty"]):
                    p.flags.writeable = s.flags.writeable = False
                    out.append(sd.Puzzle(p, s, int(c), int(d)))
                return out
            return puzzles("dev"), puzzles("test"), z["generation"].copy()
    rng = np.random.default_rng(seed + 50)
    dev, test = hard_puzzle_split(profile.dev_puzzles, profile.hard_puzzles, profile.hard_clues, rng)
    gen = generation_contexts(profile.generation_contexts, profile.generation_max_clues, rng)
    arrays = {"generation": gen}
    for tag, ps in (("dev", dev), ("test", test)):
        arrays.update({f"{tag}_puzzle": np.stack([p.puzzle for p in ps]), f"{tag}_solution": np.stack([p.solution for p in ps]),
                       f"{tag}_clues": np.array([p.n_clues for p in ps]), f"{tag}_difficulty": np.array([p.difficulty for p in ps])})
    tmp = path.with_name(f"sets.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return dev, test, gen


def sequential_solve_rate(model: MaskedModel, puzzles: list[sd.Puzzle], confidence: float = 0.95,
                          cache: EvalCache | None = None) -> dict:
    """Sequential (confidence-ordered, argmax) decoding of ``puzzles``: ``{"n", "solve_rate", "ci_low", "ci_high"
    (Wilson, `rate_interval`), "nfe" (mean passes per puzzle)}``; ``cache``: reuse a stored decode of the same
    model and puzzles (`mimdm.evaluation.evalcache`; chapter 5's held-out sequential row is the same decode)."""
    out, _ = cached_decode(cache, model, grids_to_tokens(np.stack([p.puzzle for p in puzzles]), model.device),
                           Sequential("confidence"))
    res = score_solving(out.tokens, puzzles)
    lo, hi = rate_interval(res["solve_rate"], len(puzzles), confidence)
    return {"n": len(puzzles), "solve_rate": res["solve_rate"], "ci_low": lo, "ci_high": hi,
            "nfe": float(out.nfe.float().mean())}


def items_key(metric: str) -> str:
    """Row key of the per-item outcomes of ``metric`` (0/1 per puzzle or grid, in input order):
    ``"solve_rate_items"`` from `score_solving`, ``"valid_rate_items"`` from `score_generation` (with
    ``per_item=True``). `matched_quality` and `oracle_gap` use them for paired comparisons;
    `drop_items` removes them before rows are written to a results file."""
    return f"{metric}_items"


def score_solving(out_tokens: torch.Tensor, puzzles: list[sd.Puzzle], per_item: bool = False) -> dict:
    """Exact solve rate and validity (valid grid keeping the givens) of decoded puzzles.

    Args:
        out_tokens: ``[N, 81]`` decoded grids as tokens.
        puzzles: the ``N`` puzzles, in the same order.
        per_item: also return ``items_key("solve_rate")``: ``[N]`` int8, 1 where the puzzle was solved exactly.

    Returns:
        ``{"solve_rate", "valid_rate"}`` as fractions (and the per-item outcomes).
    """
    out = tokens_to_grids(out_tokens)
    givens = np.stack([p.puzzle for p in puzzles])
    solved = np.array([np.array_equal(o, p.solution) for o, p in zip(out, puzzles)])
    valid = sd.is_valid_solution_batch(out) & np.all((givens == 0) | (out == givens), axis=1)
    res = {"solve_rate": float(solved.mean()), "valid_rate": float(valid.mean())}
    return {**res, items_key("solve_rate"): solved.astype(np.int8)} if per_item else res


def score_generation(out_tokens: torch.Tensor, contexts: np.ndarray, per_item: bool = False) -> dict:
    """Validity (valid grid keeping the givens), and among the valid grids the fraction of distinct ones and
    their mean pairwise Hamming distance / 81 (diversity).

    Args:
        out_tokens: ``[N, 81]`` decoded grids as tokens.
        contexts: ``[N, 81]`` the grids they were decoded from (0 = empty).
        per_item: also return ``items_key("valid_rate")``: ``[N]`` int8, 1 where the grid is valid.
    """
    out = tokens_to_grids(out_tokens)
    valid = sd.is_valid_solution_batch(out) & np.all((contexts == 0) | (out == contexts), axis=1)
    distinct = len({o.tobytes() for o in out[valid]}) / max(1, valid.sum())
    o = out[valid].astype(np.int16)
    ham = (o[:, None, :] != o[None, :, :]).mean(-1)
    iu = np.triu_indices(len(o), 1)
    res = {"valid_rate": float(valid.mean()), "distinct_valid": float(distinct),
           "mean_hamming": float(ham[iu].mean()) if len(iu[0]) else float("nan")}
    return {**res, items_key("valid_rate"): valid.astype(np.int8)} if per_item else res


def drop_items(rows: list[dict]) -> list[dict]:
    """``rows`` without their per-item outcomes and per-round timings (keys ending in ``_items`` or ``_rounds``), e.g.
    before writing them to a results file or showing them as a table."""
    return [{k: v for k, v in r.items() if not str(k).endswith(("_items", "_rounds"))} for r in rows]


def paired_comparison(a, b, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                      interval: bool = True) -> dict:
    """Paired comparison of two rules' 0/1 outcomes on the same items (e.g. puzzles solved by each).

    Both rules decoded the same items, so their rates are compared item by item: the difference of
    the rates with a paired percentile-bootstrap interval (`scipy.stats.bootstrap` over items), and
    McNemar's exact test (McNemar 1947): a two-sided binomial test with p = 1/2 of the discordant
    items, those only one rule got right (`scipy.stats.binomtest`). With no discordant item the
    difference is 0, its interval (0, 0) and p = 1; with a single item the interval is NaN.

    When ``a`` is a setting chosen on these same items (e.g. the cheapest one within a tolerance of
    ``b``, `matched_quality`), the interval and p-value are conditional on that choice and lean
    towards "no difference"; a held-out set of items would be needed for an unconditional test.

    Args:
        a, b: ``[N]`` 0/1 outcomes (arrays or lists), item ``n`` of each on the same input.
        confidence: level of the interval.
        n_resamples: bootstrap resamples; ``seed`` seeds them (same seed, same interval).
        interval: False skips the bootstrap (``ci_low``/``ci_high`` NaN) when only the test is needed.

    Returns:
        ``{"difference", "ci_low", "ci_high"}`` (rate of ``a`` minus rate of ``b``, fractions),
        ``"a_only"``, ``"b_only"`` (discordant counts), ``"n"`` and ``"mcnemar_p"``.

    Raises:
        ValueError: different lengths, no items, values other than 0/1, or ``confidence`` outside (0, 1).
    """
    from scipy.stats import binomtest, bootstrap

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"need two non-empty 1-D outcome vectors of one length, got shapes {a.shape} and {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("outcomes must be 0/1 per item")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    d = a.astype(np.float64) - b.astype(np.float64)
    a_only, b_only = int((d > 0).sum()), int((d < 0).sum())
    out = {"difference": float(d.mean()), "n": len(d), "a_only": a_only, "b_only": b_only}
    if a_only + b_only == 0:
        return {**out, "ci_low": 0.0, "ci_high": 0.0, "mcnemar_p": 1.0}
    p = float(binomtest(a_only, a_only + b_only, 0.5).pvalue)
    if not interval or len(d) < 2:
        return {**out, "ci_low": math.nan, "ci_high": math.nan, "mcnemar_p": p}
    ci = bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                   rng=np.random.default_rng(seed)).confidence_interval
    return {**out, "ci_low": float(ci.low), "ci_high": float(ci.high), "mcnemar_p": p}


MI_SETTINGS = ([(e, c) for c in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0) for e in (0.003, 0.01, 0.03)]
               + [(e, math.inf) for e in (3e-4, 1e-3, 3e-3, 1e-2)])
"""Default (ε nats, entropy cap nats) grid of the MI-guided sweep."""

GENERATION_MI_SETTINGS = [(0.01, c) for c in (0.1, 0.3, 1.0)] + [(e, math.inf) for e in (3e-4, 1e-3, 3e-3, 1e-2)]
"""(ε, entropy cap) grid of the MI-guided sweep in generation (chapter 5), a subset of `MI_SETTINGS`: every
uncapped ε (where MI does the work) and ε = 0.01 at the caps 0.1, 0.3 and 1.0. In generation from near-empty grids
the capped settings cost far more passes than the uncapped ones and differ little in ε, so one ε per cap samples
that region at a third of the cost (chapter 5 shows the sweep)."""


def rule_grid(head=None, layer: int = -1, oracle: bool = False, knobs: dict | None = None) -> list[tuple[str, float, object]]:
    """``(rule name, knob value, rule)`` for every rule and knob value of the sweep.

    ``knobs`` overrides the default values per rule name: lists of k, τ, γ; for ``"MI-guided"`` and
    ``"MI-oracle"`` lists of ``(ε, entropy cap)`` pairs or ``(ε, entropy cap, budget)`` triples (the
    summed-MI budget of `mimdm.sampling.decoding.MIGuided`; the knob reported is ε; cap and budget are read
    from the rule, see `sweep`); for ``"entropy cap"`` (the MI-guided rule with zero MI at no cost,
    `mimdm.sampling.decoding.zero_mi_fn`: the cap alone, a control for what the MI adds) a list of caps, the knob.

    Raises:
        ValueError: an MI-guided/oracle knob value that is not an ``(ε, cap)`` pair.
    """
    k = {"top-k": [2, 3, 4, 6, 8], "threshold": [0.999, 0.99, 0.95, 0.9, 0.8, 0.7, 0.5],
         "EB-sampler": [0.001, 0.01, 0.05, 0.1, 0.3, 1.0], "MI-guided": MI_SETTINGS,
         "entropy cap": [0.05, 0.1, 0.2, 0.3, 0.5, 1.0],
         "MI-oracle": [(1e-2, 0.3), (1e-2, 0.5), (1e-2, math.inf)], **(knobs or {})}
    out = [("sequential", math.nan, Sequential("confidence"))]
    out += [("top-k", v, TopK(int(v))) for v in k["top-k"]]
    out += [("threshold", v, Threshold(v)) for v in k["threshold"]]
    out += [("EB-sampler", v, EBSampler(v)) for v in k["EB-sampler"]]
    for name in ("MI-guided", "MI-oracle"):
        bad = [v for v in k[name] if not (isinstance(v, (tuple, list)) and len(v) in (2, 3))]
        if bad:
            raise ValueError(f"{name} knobs must be (eps, entropy cap) pairs or (eps, cap, budget) triples (use "
                             f"math.inf for none), got {bad}")
    out += [("entropy cap", c, MIGuided(zero_mi_fn(), eps=0.0, entropy_cap=c)) for c in k["entropy cap"]]
    if head is not None:
        f = head_mi_fn(head, layer)
        out += [("MI-guided", v[0], MIGuided(f, eps=v[0], entropy_cap=v[1], budget=v[2] if len(v) == 3 else math.inf))
                for v in k["MI-guided"]]
    if oracle:
        out += [("MI-oracle", v[0], MIGuided(oracle_mi_fn(delta=0.01), eps=v[0], entropy_cap=v[1],
                                             budget=v[2] if len(v) == 3 else math.inf)) for v in k["MI-oracle"]]
    return out


def entropy_cap_of(rule) -> float | None:
    """A rule's entropy cap in nats for the sweep tables: None when it has none or it is infinite."""
    c = getattr(rule, "entropy_cap", None)
    return None if c is None or math.isinf(c) else float(c)


def mi_budget_of(rule) -> float | None:
    """An MI-guided rule's summed-MI budget in nats for the sweep tables: None when it has none or it is infinite."""
    c = getattr(rule, "budget", None)
    return None if c is None or math.isinf(c) else float(c)


#: Sequences a cached `sweep` times each rule on in the current run (`sweep`, ``timing_items``).
TIMING_ITEMS = 32
#: Interleaved timing rounds (`sweep`, ``timing_repeats``; the median round is kept) of the held-out hard-set sweep,
#: whose wall-clock reductions chapter 5 reports (generation: 3 rounds on half the sequences, for time). One round
#: varied the held-out MI-guided reduction between 3.1x and 4.7x across quiet reruns of the same decodes.
TIMING_REPEATS = 5


def sweep(model: MaskedModel, tokens: torch.Tensor, rules, score, temperature: float = 0.0, seed: int = 0,
          progress: bool = False, cache: EvalCache | None = None, timing_items: int = TIMING_ITEMS,
          warmup: bool = True, timing_repeats: int = 1) -> list[dict]:
    """Decode ``tokens`` with every rule; ``score(out_tokens) -> dict`` of quality numbers.

    With a ``cache`` (`mimdm.evaluation.evalcache`), decodes come from it when stored and wall-clock is measured in this run,
    for every rule on the same first ``timing_items`` sequences (an uncached decode of those, after one untimed
    warm-up; a decode computed now on no more sequences is its own timing), so that the seconds of all rows of a sweep are comparable whatever run computed their outcomes.
    Without a cache, seconds are those of the full decode. ``warmup``: one untimed decode of two sequences first (False
    when the caller has just run one, e.g. sweeping rule by rule). ``timing_repeats`` (with a cache): the timed decodes
    run that many rounds, each round timing every rule once in order (interleaved, so that a slow spell of the machine
    falls on all rules alike), and a row's seconds are its median round; with 1, one round after the outcomes.

    Returns rows ``{"rule", "knob", "entropy_cap", "mi_budget", "nfe", "nfe_items", "head_passes", "probe_passes",
    "seconds", "seconds_rounds", "timed_items", "timing_repeats", "computed", **quality}`` (NFE and extra passes per
    sequence, seconds per sequence over the ``timed_items`` sequences timed (``seconds_rounds``: each round's); ``nfe_items`` the ``[N]`` NFE of each sequence, dropped by `drop_items`;
    ``entropy_cap`` and ``mi_budget`` in nats for MI-guided rules, None when unlimited or not applicable;
    ``computed``: ``"now"``, or the commit and date of the run that computed the cached decode).

    Raises:
        ValueError: ``timing_items`` or ``timing_repeats`` < 1.
    """
    from tqdm.auto import tqdm

    if timing_items < 1:
        raise ValueError(f"timing_items must be >= 1, got {timing_items}")
    if timing_repeats < 1:
        raise ValueError(f"timing_repeats must be >= 1, got {timing_repeats}")
    rows = []
    n = len(tokens)
    n_time = n if cache is None else min(n, timing_items)
    if warmup:
        decode(model, tokens[:2], rules[0][2], temperature=temperature, seed=seed)  # warm-up, untimed
    decoded = [cached_decode(cache, model, tokens, rule, temperature=temperature, seed=seed)
               for _, _, rule in tqdm(rules, desc="decode sweep", disable=not progress)]
    times = [[] for _ in rules]  # seconds of each rule's timed decodes
    for rnd in range(1 if cache is None else timing_repeats):
        for k, (_, _, rule) in enumerate(rules):
            out, prov = decoded[k]
            fresh = cache is None or (rnd == 0 and prov is None and n_time == n)  # decoded now, on the timed sequences
            times[k].append(out.seconds if fresh else
                            decode(model, tokens[:n_time], rule, temperature=temperature, seed=seed).seconds)
    for (name, knob, rule), (out, prov), secs in zip(rules, decoded, times):
        rows.append({"rule": name, "knob": knob, "entropy_cap": entropy_cap_of(rule), "mi_budget": mi_budget_of(rule),
                     "nfe": float(out.nfe.float().mean()), "nfe_items": out.nfe.cpu().numpy(),
                     "head_passes": out.extra_passes.get("head_passes", 0) / n,
                     "probe_passes": out.extra_passes.get("probe_passes", 0) / n,
                     "seconds": float(np.median(secs)) / n_time, "seconds_rounds": [t / n_time for t in secs],
                     "timed_items": n_time, "timing_repeats": len(secs),
                     "computed": "now" if prov is None else f"{(prov['commit'] or 'unknown')[:7]} {prov['date']}",
                     **score(out.tokens)})
    return rows


def rate_interval(rate: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (solve rate, validity) measured on ``n`` independent items.

    Uses `scipy.stats.binomtest` (Wilson 1927). ``rate · n`` is rounded to the nearest count.

    Returns:
        ``(low, high)`` as fractions.

    Raises:
        ValueError: ``n`` < 1, ``rate`` outside [0, 1], or ``confidence`` outside (0, 1).
    """
    from scipy.stats import binomtest

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    ci = binomtest(int(round(rate * n)), n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def matched_quality(rows: list[dict], metric: str, tolerance: float = 0.01) -> list[dict]:
    """Per rule, the lowest-NFE setting whose ``metric`` is within ``tolerance`` of sequential decoding.

    Returns rows ``{"rule", "knob", "entropy_cap", metric, "nfe", "nfe_reduction", "wallclock_reduction"}``
    (reductions are sequential / rule); rules that never reach the quality are listed with NaN. When
    the rows carry per-item outcomes of ``metric`` (`items_key`, from a score function with
    ``per_item=True``), each row also gets the paired comparison of that setting with sequential
    decoding on the same items (`paired_comparison`, the rule minus sequential): ``"paired_difference"``,
    ``"paired_ci_low"``, ``"paired_ci_high"`` (fractions) and ``"mcnemar_p"`` (NaN where the chosen
    row has no per-item outcomes). The setting is chosen on these same items, so the comparison is
    conditional on that choice (see `paired_comparison`).
    """
    seq = next(r for r in rows if r["rule"] == "sequential")
    ik = items_key(metric)
    paired = ik in seq
    out = []
    for name in dict.fromkeys(r["rule"] for r in rows):
        if name == "sequential":
            continue
        ok = [r for r in rows if r["rule"] == name and r[metric] >= seq[metric] - tolerance - 1e-9]
        if not ok:
            row = {"rule": name, "knob": math.nan, "entropy_cap": None, metric: math.nan, "nfe": math.nan,
                   "nfe_reduction": math.nan, "wallclock_reduction": math.nan}
            if paired:
                row.update(paired_difference=math.nan, paired_ci_low=math.nan, paired_ci_high=math.nan, mcnemar_p=math.nan)
            out.append(row)
            continue
        best = min(ok, key=lambda r: r["nfe"])
        row = {"rule": name, "knob": best["knob"], "entropy_cap": best.get("entropy_cap"), metric: best[metric], "nfe": best["nfe"],
               "nfe_reduction": seq["nfe"] / best["nfe"], "wallclock_reduction": seq["seconds"] / best["seconds"]}
        if paired and ik not in best:
            row.update(paired_difference=math.nan, paired_ci_low=math.nan, paired_ci_high=math.nan, mcnemar_p=math.nan)
        elif paired:
            c = paired_comparison(best[ik], seq[ik])
            row.update(paired_difference=c["difference"], paired_ci_low=c["ci_low"], paired_ci_high=c["ci_high"],
                       mcnemar_p=c["mcnemar_p"])
        out.append(row)
    return out


def nfe_budgets(rows: list[dict], factors=(8, 5, 4, 3, 2)) -> list[float]:
    """NFE budgets = sequential NFE / each factor (unrounded)."""
    seq = next(r for r in rows if r["rule"] == "sequential")
    return [seq["nfe"] / f for f in factors]


def quality_at_budget(rows: list[dict], metric: str, budgets) -> list[dict]:
    """Best ``metric`` each rule reaches with at most each NFE budget (NaN if no setting fits)."""
    out = []
    for b in budgets:
        row = {"nfe_budget": b}
        for name in dict.fromkeys(r["rule"] for r in rows):
            fit = [r[metric] for r in rows if r["rule"] == name and r["nfe"] <= b + 1e-9]
            row[name] = max(fit) if fit else math.nan
        out.append(row)
    return out


def oracle_gap(rows: list[dict], metric: str) -> list[dict]:
    """Head against probed-MI oracle at the same (ε, entropy cap) on the same contexts: quality and NFE of each, and the differences.

    With per-item outcomes of ``metric`` in the rows (`items_key`), each entry also gets McNemar's exact p-value of the
    oracle against the head on the same items (``"mcnemar_p"``, `paired_comparison`).
    """
    key = lambda r: (r["knob"], r.get("entropy_cap"))  # noqa: E731
    head = {key(r): r for r in rows if r["rule"] == "MI-guided"}
    orc = {key(r): r for r in rows if r["rule"] == "MI-oracle"}
    both = sorted(set(head) & set(orc), key=lambda t: (t[1] is None, t[1] or 0, t[0]))
    out = []
    for e, c in both:
        h, o = head[e, c], orc[e, c]
        row = {"eps": e, "entropy_cap": c, f"head_{metric}": h[metric], f"oracle_{metric}": o[metric],
               "head_nfe": h["nfe"], "oracle_nfe": o["nfe"], f"{metric}_gap": o[metric] - h[metric], "nfe_gap": h["nfe"] - o["nfe"]}
        ik = items_key(metric)
        if ik in h and ik in o:
            row["mcnemar_p"] = paired_comparison(o[ik], h[ik], interval=False)["mcnemar_p"]
        out.append(row)
    return out


def pareto_front(rows: list[dict], metric: str, higher_is_better: bool = True) -> list[dict]:
    """The settings of ``rows`` (one rule's sweep) that no other setting beats: fewer-or-equal NFE and a better ``metric``.

    ``higher_is_better=False`` for metrics such as NLL. Settings whose metric is NaN are left out.

    Returns:
        the settings sorted by NFE, each strictly better in ``metric`` than the one before.
    """
    sign = 1.0 if higher_is_better else -1.0
    out, best = [], -math.inf
    for r in sorted(rows, key=lambda r: (r["nfe"], -sign * r[metric])):
        if sign * r[metric] > best:
            out.append(r)
            best = sign * r[metric]
    return out


def compare_at_budget(budget_rows: list[dict], a: str = "MI-guided", b: str = "EB-sampler") -> dict:
    """How often rule ``a`` is at least as good as rule ``b`` across NFE budgets where both have a setting."""
    both = [r for r in budget_rows if not (math.isnan(r.get(a, math.nan)) or math.isnan(r.get(b, math.nan)))]
    return {"n_budgets": len(both), "a_at_least_b": sum(r[a] >= r[b] - 1e-9 for r in both),
            "mean_difference": float(np.mean([r[a] - r[b] for r in both])) if both else math.nan}


def _setting(row: dict) -> tuple:
    """Identity of one rule setting in sweep rows: (rule, knob, entropy cap, summed-MI budget); NaN knobs compare equal."""
    knob = row["knob"]
    knob = None if knob is None or (isinstance(knob, float) and math.isnan(knob)) else float(knob)
    return row["rule"], knob, row.get("entropy_cap"), row.get("mi_budget")


def select_on_dev(dev_rows: list[dict], metric: str, tolerance: float = 0.01) -> list[dict]:
    """The setting of each rule chosen on a development set: its cheapest one within ``tolerance`` of sequential.

    The same rule as `matched_quality`, applied to sweep rows of development items only, so that the chosen
    settings can be reported on other items (`report_held_out`) without the selection bias that choosing and
    reporting on the same items carries. Rules that never match on the development set are left out.

    Returns:
        Rows ``{"rule", "knob", "entropy_cap", "mi_budget", "dev_nfe", "dev_<metric>"}``, sequential first.
    """
    seq = next(r for r in dev_rows if r["rule"] == "sequential")
    out = [{"rule": "sequential", "knob": math.nan, "entropy_cap": None, "mi_budget": None, "dev_nfe": seq["nfe"],
            f"dev_{metric}": seq[metric]}]
    for m in matched_quality(dev_rows, metric, tolerance):
        if math.isnan(m["nfe"]):
            continue
        row = next(r for r in dev_rows if r["rule"] == m["rule"] and r["nfe"] == m["nfe"] and r[metric] == m[metric])
        out.append({"rule": row["rule"], "knob": row["knob"], "entropy_cap": row.get("entropy_cap"),
                    "mi_budget": row.get("mi_budget"), "dev_nfe": row["nfe"], f"dev_{metric}": row[metric]})
    return out


def chosen_rules(selected: list[dict], rules: list[tuple[str, float, object]]) -> list[tuple[str, float, object]]:
    """The entries of a `rule_grid` that are the `select_on_dev` settings (in the order of ``selected``).

    Raises:
        ValueError: a selected setting is not in ``rules``.
    """
    by = {}
    for name, knob, rule in rules:
        by[_setting({"rule": name, "knob": knob, "entropy_cap": entropy_cap_of(rule), "mi_budget": mi_budget_of(rule)})] = \
            (name, knob, rule)
    out = []
    for s in selected:
        key = _setting(s)
        if key not in by:
            raise ValueError(f"setting {key} chosen on the development set is not in the rule grid")
        out.append(by[key])
    return out


def nfe_reduction_interval(reference_nfe, rule_nfe, confidence: float = 0.95, n_resamples: int = 9999,
                           seed: int = 0) -> tuple[float, float]:
    """Paired percentile-bootstrap interval of an NFE reduction, mean(reference NFE) / mean(rule NFE).

    Both rules decoded the same items, so items are resampled together (`scipy.stats.bootstrap`, ``paired=True``).

    Args:
        reference_nfe, rule_nfe: ``[N]`` forward passes per item of the reference (sequential) and of the rule.

    Returns:
        ``(low, high)``; both equal the reduction when every resample gives the same ratio; NaN for one item.

    Raises:
        ValueError: different lengths, no items, or a non-positive NFE.
    """
    from scipy.stats import bootstrap

    a, b = np.asarray(reference_nfe, np.float64), np.asarray(rule_nfe, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"need two non-empty 1-D NFE vectors of one length, got shapes {a.shape} and {b.shape}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("NFE must be positive for every item")
    if len(a) < 2:
        return math.nan, math.nan
    ratio = a.mean() / b.mean()
    if np.all(a == a[0]) and np.all(b == b[0]):
        return float(ratio), float(ratio)
    ci = bootstrap((a, b), lambda x, y: x.mean() / y.mean(), paired=True, vectorized=False,
                   confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                   rng=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


def report_held_out(test_rows: list[dict], metric: str, confidence: float = 0.95) -> list[dict]:
    """Each chosen setting on held-out items against sequential decoding on the same items.

    Args:
        test_rows: `sweep` rows of the `chosen_rules` on the test items, with per-item outcomes of ``metric``
            (`items_key`), sequential among them.

    Returns:
        Rows ``{"rule", "knob", "entropy_cap", "mi_budget", metric, "<metric>_ci_low", "<metric>_ci_high" (Wilson),
        "nfe", "nfe_reduction", "nfe_reduction_ci_low", "nfe_reduction_ci_high", "wallclock_reduction",
        "wallclock_reduction_low", "wallclock_reduction_high", "paired_difference", "paired_ci_low", "paired_ci_high",
        "mcnemar_p"}`` (reductions: sequential over the rule, the NFE reduction's interval paired over items
        (`nfe_reduction_interval`; NaN without ``nfe_items``), the wall-clock one from `sweep`'s timed decodes (median
        round), with the least and greatest ratio of one timing round's seconds (sequential's over the rule's in the
        same round; NaN without ``seconds_rounds``); the paired comparison is the rule minus sequential, now
        unconditional since the setting was chosen on other items).

    Raises:
        ValueError: no sequential row, or rows without per-item outcomes.
    """
    ik = items_key(metric)
    seq = next((r for r in test_rows if r["rule"] == "sequential"), None)
    if seq is None:
        raise ValueError("the held-out rows need sequential decoding as the reference")
    if any(ik not in r for r in test_rows):
        raise ValueError(f"held-out rows need per-item outcomes ({ik}): score with per_item=True")
    out = []
    for r in test_rows:
        n = len(r[ik])
        lo, hi = rate_interval(r[metric], n, confidence)
        c = paired_comparison(r[ik], seq[ik], confidence) if r is not seq else \
            {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0, "mcnemar_p": 1.0}
        nlo, nhi = (nfe_reduction_interval(seq["nfe_items"], r["nfe_items"], confidence)
                    if "nfe_items" in r and "nfe_items" in seq else (math.nan, math.nan))
        rounds = [a / b for a, b in zip(seq.get("seconds_rounds", ()), r.get("seconds_rounds", ()))]
        if len(rounds) != len(seq.get("seconds_rounds", ())) or not rounds:
            rounds = [math.nan]
        out.append({"rule": r["rule"], "knob": r["knob"], "entropy_cap": r.get("entropy_cap"),
                    "mi_budget": r.get("mi_budget"), metric: r[metric], f"{metric}_ci_low": lo, f"{metric}_ci_high": hi,
                    "n": n, "nfe": r["nfe"], "nfe_reduction": seq["nfe"] / r["nfe"], "nfe_reduction_ci_low": nlo,
                    "nfe_reduction_ci_high": nhi,
                    "wallclock_reduction": seq["seconds"] / r["seconds"], "wallclock_reduction_low": min(rounds),
                    "wallclock_reduction_high": max(rounds), "paired_difference": c["difference"],
                    "paired_ci_low": c["ci_low"], "paired_ci_high": c["ci_high"], "mcnemar_p": c["mcnemar_p"]})
    return out


#: `speedup_headline` keys: ``values.headline`` of ``book/results/speedup.json``.
HEADLINE_KEYS = ("n_hard", "sequential_hard_solve_rate", "mi_guided_nfe_reduction_hard",
                 "entropy_cap_nfe_reduction_hard", "mi_guided_wallclock_reduction_hard",
                 "mi_guided_nfe_reduction_generation", "mi_guided_wallclock_reduction_generation")


def speedup_headline(held_out: list[dict], matched_generation: list[dict]) -> dict:
    """Chapter 5's headline numbers (`HEADLINE_KEYS`).

    Hard puzzles: from `report_held_out` rows (the settings chosen on the development set, decoded on the held-out
    test puzzles); generation: from `matched_quality` rows at matched validity. Reductions are sequential over the
    rule (NFE, wall-clock with the head's passes); NaN where the rule had no setting chosen or never matched.

    Raises:
        ValueError: ``held_out`` has no sequential row.
    """
    seq = next((r for r in held_out if r["rule"] == "sequential"), None)
    if seq is None:
        raise ValueError("held-out rows need sequential decoding as the reference")
    held = {r["rule"]: r for r in held_out}
    gen = {r["rule"]: r for r in matched_generation}
    nan = {"nfe_reduction": math.nan, "wallclock_reduction": math.nan}
    mg, cap, mg_gen = held.get("MI-guided", nan), held.get("entropy cap", nan), gen.get("MI-guided", nan)
    return {"n_hard": seq["n"], "sequential_hard_solve_rate": seq["solve_rate"],
            "mi_guided_nfe_reduction_hard": mg["nfe_reduction"],
            "entropy_cap_nfe_reduction_hard": cap["nfe_reduction"],
            "mi_guided_wallclock_reduction_hard": mg["wallclock_reduction"],
            "mi_guided_nfe_reduction_generation": mg_gen["nfe_reduction"],
            "mi_guided_wallclock_reduction_generation": mg_gen["wallclock_reduction"]}


def puzzle_set_summary(puzzles: list[sd.Puzzle]) -> dict:
    """``{"n", "clues" (min, max), "mean_difficulty" (solver backtracks), "mean_masked" (blank cells)}``."""
    clues = [p.n_clues for p in puzzles]
    return {"n": len(puzzles), "clues": [min(clues), max(clues)],
            "mean_difficulty": float(np.mean([p.difficulty for p in puzzles])), "mean_masked": 81 - float(np.mean(clues))}


def held_out_verdict(held_out: list[dict], claim: tuple[float, float] = (3.0, 5.0), tolerance: float = 0.01,
                     puzzles: str = "held-out hard puzzles") -> str:
    """Chapter 5's answer on held-out hard puzzles (``puzzles`` names them in the text, e.g. a reader's file), as one
    Markdown paragraph.

    Reads `report_held_out` rows (settings chosen on the development set) and states: MI-guided decoding's NFE
    reduction against the paper's ``claim`` range; whether its solve rate held (the 95% paired interval of its
    difference from sequential decoding reaches 0 or above) or fell; whether its wall-clock reduction is at least
    0.8× its NFE reduction (the head's cost); and, against each other rule's chosen setting, whether it *beats* it
    (fewer passes at a solve rate no more than ``tolerance`` below), *is beaten* (the reverse) or trades passes for
    solve rate.
    """
    held = {r["rule"]: r for r in held_out}
    mg = held.get("MI-guided")
    if mg is None:
        return ("MI-guided decoding had no setting within the tolerance of sequential decoding on the development "
                "set, so no setting was carried to the held-out puzzles.")
    lo, hi = claim
    red = mg["nfe_reduction"]
    vs_claim = (f"within the paper's {lo:g}-{hi:g}×" if lo <= red <= hi else f"above the paper's {lo:g}-{hi:g}×"
                if red > hi else f"short of the paper's {lo:g}-{hi:g}×")
    held_q = mg["paired_ci_high"] >= 0
    quality = (f"its solve rate {100 * mg['solve_rate']:.1f}% against sequential's "
               f"{100 * held['sequential']['solve_rate']:.1f}% ({100 * mg['paired_difference']:+.1f} points, paired 95% "
               f"interval {100 * mg['paired_ci_low']:+.1f} to {100 * mg['paired_ci_high']:+.1f}: "
               + ("not detectably lower" if held_q else "lower") + ")")
    wc, wlo, whi = mg["wallclock_reduction"], mg.get("wallclock_reduction_low", math.nan), \
        mg.get("wallclock_reduction_high", math.nan)
    spread = "" if math.isnan(wlo) else f" (median timing round; rounds {wlo:.2f}-{whi:.2f}×)"
    wall = (f"wall-clock {wc:.2f}×{spread}, " + ("at least" if wc >= 0.8 * red else "less than")
            + " 0.8 of the NFE reduction")
    parts = []
    for name in ("entropy cap", "EB-sampler", "threshold", "top-k"):
        x = held.get(name)
        if x is None:
            parts.append(f"{name} had no matched setting on the development set")
            continue
        if mg["nfe"] < x["nfe"] and mg["solve_rate"] >= x["solve_rate"] - tolerance:
            word = "beats"
        elif x["nfe"] < mg["nfe"] and x["solve_rate"] >= mg["solve_rate"] - tolerance:
            word = "is beaten by"
        elif mg["nfe"] == x["nfe"] and abs(mg["solve_rate"] - x["solve_rate"]) <= tolerance:
            word = "ties with"
        else:
            word = "trades passes for solve rate against"
        parts.append(f"{word} {name} ({mg['nfe']:.1f} vs {x['nfe']:.1f} passes, "
                     f"{100 * mg['solve_rate']:.1f}% vs {100 * x['solve_rate']:.1f}% solved)")
    ci = ("" if math.isnan(mg.get("nfe_reduction_ci_low", math.nan)) else
          f" (paired 95% interval {mg['nfe_reduction_ci_low']:.2f}-{mg['nfe_reduction_ci_high']:.2f}×)")
    return (f"On {mg['n']:,} {puzzles}, MI-guided decoding at the setting chosen on the development set "
            f"needs {red:.2f}× fewer passes than sequential decoding{ci}, {vs_claim}, with {quality}; {wall}. "
            f"Against the other rules' chosen settings it " + "; ".join(parts) + ".")


def _has_cap(cap) -> bool:
    """None or NaN (pandas turns None into NaN) mean "no entropy cap"."""
    return cap is not None and not (isinstance(cap, float) and math.isnan(cap))


def _missing(x) -> bool:
    """None (how results files store NaN) or NaN."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def _p_value(p: float) -> str:
    return f"p = {p:.2f}" if p >= 0.01 else "p < 0.01"


def describe_setting(r: dict) -> str:
    """One rule's row of `matched_quality` or `report_held_out` in words: passes (NFE), its setting, the NFE and
    wall-clock reductions against sequential decoding and, where paired, the difference in quality with its 95%
    interval and McNemar p-value; "does not reach it" when no setting reaches the matched quality."""
    if _missing(r["nfe"]):
        return "does not reach it"
    cap = f', cap {r["entropy_cap"]:g}' if _has_cap(r.get("entropy_cap")) else ""
    knob = f' (ε={r["knob"]:g}{cap})' if r["rule"] == "MI-guided" else ""
    wc = r["wallclock_reduction"]
    wall = (f"wall-clock {wc:.1f}x" if wc >= 1.05 else
            f"wall-clock {wc:.2f}x, {'slower than' if wc < 1 else 'about as fast as'} sequential")
    paired = ""
    if not _missing(r.get("mcnemar_p")):
        paired = (f'; {100 * r["paired_difference"]:+.1f} points (rule minus sequential, same items), 95% CI '
                  f'{100 * r["paired_ci_low"]:+.1f} to {100 * r["paired_ci_high"]:+.1f}, McNemar {_p_value(r["mcnemar_p"])}')
    return f'{r["nfe"]:.1f} passes{knob} ({r["nfe_reduction"]:.1f}x fewer, {wall}{paired})'


def findings_markdown(values: dict, oracle_puzzles: int) -> str:
    """Chapter 5's findings as a Markdown list, from its results (``values`` of ``speedup.json``: held-out report,
    matched-quality tables, equal-NFE comparisons, oracle gap) and the size of the oracle subset."""
    held = values["held_out"]
    seq = next(r for r in held if r["rule"] == "sequential")
    m = {r["rule"]: r for r in values["matched_hard_dev"]}
    ho = {r["rule"]: r for r in held}
    g = {r["rule"]: r for r in values["matched_generation"]}
    gn = {r["rule"]: r for r in values["matched_generation_nll"]}
    seq_gen = next(r for r in values["generation"] if r["rule"] == "sequential")
    n_test, n_dev = values["hard_set"]["n"], values["dev_set"]["n"]
    fmt = describe_setting

    def held_rule(name):
        return fmt(ho[name]) if name in ho else "no setting chosen"

    eb, thr, cap, gen = (values[k] for k in ("mi_vs_eb_hard", "mi_vs_threshold_hard", "mi_vs_cap_hard",
                                              "mi_vs_eb_generation"))
    gaps = values["oracle_gap"]
    return f'''
- **Reference.** Sequential decoding solves {100 * seq["solve_rate"]:.1f}% of the {n_test:,} held-out hard puzzles
  (95% Wilson interval {100 * seq["solve_rate_ci_low"]:.1f}-{100 * seq["solve_rate_ci_high"]:.1f}%) with {seq["nfe"]:.1f} passes per puzzle.
- **Held out** (settings chosen on the {n_dev} development puzzles): {held_out_verdict(held)}
- **Held out, each rule**: MI-guided {held_rule("MI-guided")}; the entropy cap alone {held_rule("entropy cap")};
  EB-sampler {held_rule("EB-sampler")}; threshold {held_rule("threshold")}; top-k {held_rule("top-k")}.
- **Development set, matched solve rate** (within 1 point, chosen and measured on the same {n_dev} puzzles): MI-guided {fmt(m["MI-guided"])}; the entropy cap alone {fmt(m["entropy cap"])};
  EB-sampler {fmt(m["EB-sampler"])}; threshold {fmt(m["threshold"])}; top-k {fmt(m["top-k"])}.
- **Generation** (matched validity): MI-guided {fmt(g["MI-guided"])}; the entropy cap alone {fmt(g["entropy cap"])};
  EB-sampler {fmt(g["EB-sampler"])}; threshold {fmt(g["threshold"])}; top-k {fmt(g["top-k"])}.
- **Generation, NLL** (sequential: {seq_gen["nll"]:.1f} ± {seq_gen["nll_stderr"]:.1f} nats per grid; matched within two standard errors):
  MI-guided {fmt(gn["MI-guided"])}; the entropy cap alone {fmt(gn["entropy cap"])}; EB-sampler {fmt(gn["EB-sampler"])};
  threshold {fmt(gn["threshold"])}; top-k {fmt(gn["top-k"])}.
- **Equal NFE** (budgets of sequential NFE / 8, 5, 4, 3, 2): on the development puzzles MI-guided is at least as good as EB-sampler at
  {eb["a_at_least_b"]} of {eb["n_budgets"]} budgets where both have a setting
  (mean difference {eb["mean_difference"]:+.3f}) and as the threshold rule at
  {thr["a_at_least_b"]} of {thr["n_budgets"]}, but as the entropy cap alone only at
  {cap["a_at_least_b"]} of {cap["n_budgets"]} (mean difference {cap["mean_difference"]:+.3f}); in generation it matches or beats
  EB at {gen["a_at_least_b"]} of {gen["n_budgets"]}.
- **Oracle.** On a {oracle_puzzles}-puzzle subset of the development set, probed MI changes the solve rate by
  {", ".join(f"{r['solve_rate_gap']:+.2f}" for r in gaps)} and the NFE by
  {", ".join(f"{-r['nfe_gap']:+.1f}" for r in gaps)} against the head at (ε, cap) =
  {", ".join(f"({r['eps']:g}, {r['entropy_cap'] if _has_cap(r['entropy_cap']) else '∞'})" for r in gaps)}
  (McNemar {", ".join(_p_value(r['mcnemar_p']) for r in gaps)}; same puzzles).
'''

