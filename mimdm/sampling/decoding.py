"""One decoding loop over any `MaskedModel`, with pluggable unmasking rules.

At every step the loop runs the MDM once on the batch (one NFE per unfinished sequence), asks the
rule which masked positions to unmask (at least one per sequence), fills them by argmax or by
sampling at a temperature, and records the step at which every position was unmasked. Positions
are never re-masked. Rules that need the pairwise MI get it from the MI head (one head pass per
step, counted separately) or, for the oracle, from probing (its passes counted separately).

Rules (`Rule` subclasses), with their sources:
    `Sequential`  one position per step by confidence (max probability; MaskGIT, Chang et al. 2022),
                  entropy, top-2 margin (Kim et al. 2025) or random order (the MDM's own ancestral order).
    `TopK`        k positions per step by confidence (fixed-step parallel decoding, e.g. LLaDA).
    `Threshold`   every position with max probability >= tau, at least one (Fast-dLLM, Wu et al. 2025).
    `EBSampler`   sort by entropy, take the largest prefix whose summed entropy minus its largest entropy
                  is <= gamma (entropy-bounded sampler, Ben-Hamu et al. 2025).
    `MIGuided`    by increasing entropy, admit a position only if its MI with every position already
                  chosen is <= eps (and the summed MI stays within ``budget``), with an entropy cap
                  (this study). ``source="head"`` uses the MI head, ``source="oracle"`` probing.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mimdm.core.artifacts import module_sha256
from mimdm.core.contract import MaskedModel, NonFiniteOutputError
from mimdm.core.information import entropy_from_log_probs
from mimdm.probing.exact import probe_mi


@dataclass
class StepInfo:
    """What a rule sees at one step (all for the B unfinished sequences)."""

    probs: Tensor  # [B, L, V]
    entropy: Tensor  # [B, L] nats, 0 at unmasked positions
    masked: Tensor  # [B, L] bool
    tokens: Tensor  # [B, L]
    hidden: Tensor  # [B, L, D]
    generator: torch.Generator
    log_probs: Tensor | None = None  # [B, L, V] as `MaskedModel.log_probs` gives them (float64 for float64 models)


class Rule:
    """Base class: ``select(info) -> [B, L] bool`` positions to unmask (subset of masked, >= 1 per row)."""

    name = "rule"
    knob: str | None = None

    def select(self, info: StepInfo, model: MaskedModel) -> Tensor:  # pragma: no cover
        """``[B, L]`` bool: the masked positions to unmask this step, at least one per unfinished row."""
        raise NotImplementedError

    def cost(self) -> dict:
        """Extra passes this rule spent (head passes, probing passes) since `reset`."""
        return {}

    def reset(self) -> None:
        """Forget the extra-pass counts (called by `decode` before a run)."""


ORDERS = ("confidence", "entropy", "margin", "random")


def _check_nonneg(value: float, name: str, rule: str) -> None:
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{rule}: {name} must be >= 0 (nats), got {value!r}")


def _score_order(info: StepInfo, by: str) -> Tensor:
    """``[B, L]`` score (higher = unmask first) for masked positions, -inf elsewhere."""
    p = info.probs
    if by == "confidence":
        s = p.max(-1).values
    elif by == "entropy":
        s = -info.entropy
    elif by == "margin":
        top2 = p.topk(2, dim=-1).values
        s = top2[..., 0] - top2[..., 1]
    elif by == "random":
        s = torch.rand(p.shape[:2], generator=info.generator, device=p.device)
    else:
        raise ValueError(f"unknown order {by!r}; use one of {ORDERS}")
    return s.masked_fill(~info.masked, float("-inf"))


def _at_least_one(sel: Tensor, info: StepInfo, by: str = "confidence") -> Tensor:
    """Add the best-scored masked position to rows with no selection."""
    empty = ~sel.any(1) & info.masked.any(1)
    if empty.any():
        best = _score_order(info, by).argmax(1)
        sel = sel.clone()
        sel[empty, best[empty]] = True
    return sel & info.masked


@dataclass
class Sequential(Rule):
    """One position per step, chosen by ``order``: confidence | entropy | margin | random.

    Raises:
        ValueError: an unknown ``order``.
    """

    order: str = "confidence"
    name = "sequential"

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}; use one of {ORDERS}")

    def select(self, info, model):
        best = _score_order(info, self.order).argmax(1)
        sel = torch.zeros_like(info.masked)
        sel[torch.arange(len(best), device=best.device), best] = True
        return sel & info.masked


@dataclass
class TopK(Rule):
    """The ``k`` most confident masked positions per step.

    Raises:
        ValueError: ``k`` is not an integer >= 1.
    """

    k: int = 2
    name = "top-k"
    knob = "k"

    def __post_init__(self):
        if isinstance(self.k, bool) or not float(self.k).is_integer() or self.k < 1:
            raise ValueError(f"top-k: k must be an integer >= 1, got {self.k!r}")
        self.k = int(self.k)

    def select(self, info, model):
        s = _score_order(info, "confidence")
        k = min(self.k, s.shape[1])
        idx = s.topk(k, dim=1).indices
        sel = torch.zeros_like(info.masked).scatter(1, idx, True)
        return _at_least_one(sel & info.masked, info)


@dataclass
class Threshold(Rule):
    """Fast-dLLM confidence threshold: every masked position with max probability >= ``tau``.

    ``tau > 1`` admits only the forced position (sequential by confidence); ``tau <= 0`` admits all.

    Raises:
        ValueError: a NaN ``tau``.
    """

    tau: float = 0.9
    name = "threshold"
    knob = "tau"

    def __post_init__(self):
        if self.tau != self.tau:
            raise ValueError("threshold: tau must be a number, got NaN")

    def select(self, info, model):
        sel = (info.probs.max(-1).values >= self.tau) & info.masked
        return _at_least_one(sel, info)


@dataclass
class EBSampler(Rule):
    """Entropy-bounded sampler: the largest entropy-sorted prefix with Σ H − max H <= ``gamma`` (nats).

    Raises:
        ValueError: negative or NaN ``gamma``.
    """

    gamma: float = 0.1
    name = "EB-sampler"
    knob = "gamma"

    def __post_init__(self):
        _check_nonneg(self.gamma, "gamma", self.name)

    def select(self, info, model):
        ent = info.entropy.masked_fill(~info.masked, float("inf"))
        sorted_e, idx = ent.sort(1)
        finite = torch.isfinite(sorted_e)
        e0 = torch.where(finite, sorted_e, torch.zeros_like(sorted_e))
        # prefix sums minus the prefix maximum (the last element, since sorted ascending)
        ok = (e0.cumsum(1) - e0 <= self.gamma) & finite
        ok = ok.int().cumprod(1).bool()  # prefix property
        sel = torch.zeros_like(info.masked).scatter(1, idx, ok)
        return _at_least_one(sel, info, "entropy")


@dataclass
class MIGuided(Rule):
    """MI-guided parallel unmasking (this study).

    Candidates are visited by increasing entropy (only those with entropy <= ``entropy_cap`` nats,
    the first always admitted); a candidate joins the set S if its MI with every member of S is
    <= ``eps`` nats and the summed MI of its pairs with S keeps the set's total within ``budget``.
    ``eps = inf`` unmasks every capped position at once; ``eps = 0`` with a model that gives
    positive MI everywhere unmasks one position per step.

    Args:
        mi_fn: ``(info, model) -> (MI [B, L, L] nats, extra passes dict)``; see `head_mi_fn`,
            `oracle_mi_fn` and `zero_mi_fn`. An ``mi_fn`` with ``takes_candidates = True`` is
            called with ``candidates=`` ``[B, L]`` bool, the masked positions within the entropy
            cap (the only ones that can join a set with another) in rows that have at least two of
            them (none elsewhere: a lone candidate is unmasked alone), and needs to give MI only
            between those (`head_mi_fn` and `oracle_mi_fn` do: a cheaper head pass, far fewer
            probing passes).
        eps: largest MI (nats) a candidate may have with any chosen position.
        budget: largest summed MI (nats) over the chosen set's pairs.
        entropy_cap: largest entropy (nats) of an admitted candidate after the first.

    Raises:
        ValueError: no ``mi_fn``, or a negative or NaN ``eps``, ``budget`` or ``entropy_cap``.
    """

    mi_fn: object = None
    eps: float = 0.01
    budget: float = float("inf")
    entropy_cap: float = float("inf")
    name = "MI-guided"
    knob = "eps"
    _cost: dict = field(default_factory=lambda: {"head_passes": 0, "probe_passes": 0}, init=False, repr=False,
                        compare=False)

    def __post_init__(self):
        if not callable(self.mi_fn):
            raise ValueError("MI-guided: mi_fn must be a callable MI source (head_mi_fn, oracle_mi_fn or zero_mi_fn), "
                             f"got {self.mi_fn!r}")
        for name in ("eps", "budget", "entropy_cap"):
            _check_nonneg(getattr(self, name), name, self.name)

    def reset(self):
        self._cost = {"head_passes": 0, "probe_passes": 0}

    def cost(self):
        return dict(self._cost)

    def select(self, info, model):
        ent = info.entropy.masked_fill(~info.masked, float("inf"))
        # after the first (lowest-entropy) position, only masked positions within the cap can be admitted
        within = info.masked & (ent <= self.entropy_cap)
        if getattr(self.mi_fn, "takes_candidates", False):
            # MI is read only between admitted positions; the first is within the cap whenever any other is, so a
            # row with fewer than two positions within the cap takes its first position alone and needs no MI
            cand = within & (within.sum(1, keepdim=True) >= 2)
            mi, extra = self.mi_fn(info, model, candidates=cand)
        else:
            mi, extra = self.mi_fn(info, model)
        for k, v in extra.items():
            self._cost[k] += v
        sel = greedy_admission(mi, ent.argsort(1), info.masked, within, self.eps, self.budget)
        return _at_least_one(sel, info, "entropy")


def greedy_admission(mi_BLL: Tensor, order_BL: Tensor, masked_BL: Tensor, within_BL: Tensor, eps: float,
                     budget: float = math.inf) -> Tensor:
    """`MIGuided`'s set: visit the positions in ``order`` and admit one if its MI with every position admitted
    before it is <= ``eps`` nats and the set's summed MI stays <= ``budget``; the first masked position visited is
    admitted unconditionally, each later one only if it is in ``within``.

    The result is the sequential greedy pass's; it is computed without visiting positions one by one. Only the
    first position and those in ``within`` can be admitted, and ``order`` must visit the ``within`` positions of a
    row before its other masked positions (`MIGuided` orders by increasing entropy and ``within`` is an entropy
    cap), so only the first K = max(1, most ``within`` in a row) visited positions are read. Without a budget,
    admission is resolved in rounds over all rows and positions at once (Blelloch, Fineman & Shun 2012, "Greedy
    sequential maximal independent set and matching are parallel on average"): a position is admitted once every
    earlier position it conflicts with (MI > ``eps``) is rejected, and rejected once one of them is admitted, which
    gives exactly the sequential result; each round decides at least the earliest undecided position of every row.
    With a finite budget (order-dependent sums) the K positions are visited one by one.

    Args:
        mi_BLL: ``[B, L, L]`` MI in nats; row i holds position i's MI with the others (``mi[b, i, j]`` is read when
            i is visited after j).
        order_BL: ``[B, L]`` long, the visiting order (a permutation of 0..L-1 per row).
        masked_BL, within_BL: ``[B, L]`` bool; ``within`` ⊆ ``masked``.
        eps, budget: nats, >= 0.

    Returns:
        ``[B, L]`` bool, the admitted positions (none in a row without masked positions).

    Raises:
        NonFiniteOutputError: NaN or infinite MI between positions that can be admitted.
    """
    B, L = masked_BL.shape
    dev = masked_BL.device
    K = max(1, int(within_BL.sum(1).max())) if B else 1
    idx = order_BL[:, :K]  # [B, K]: the positions that can be admitted, in visiting order
    ok = within_BL.gather(1, idx)
    ok[:, 0] = masked_BL.gather(1, idx[:, :1])[:, 0]  # the first visited is admitted whatever its entropy
    sub = mi_BLL[torch.arange(B, device=dev)[:, None, None], idx[:, :, None], idx[:, None, :]]  # [B, K, K]
    if K > 1 and not torch.isfinite(sub).all():
        raise NonFiniteOutputError("the MI source returned NaN or infinite MI between positions MI-guided "
                                   "decoding can admit")
    if math.isinf(budget):
        earlier = torch.ones(K, K, dtype=torch.bool, device=dev).tril(-1)  # [k, m]: m is visited before k
        conflict = (sub > eps) & earlier & ok[:, None, :]  # [B, K, K]: k may not join a set holding m
        admitted, rejected = torch.zeros_like(ok), ~ok
        while True:
            undecided = ~(admitted | rejected)
            if not undecided.any():
                break
            new = undecided & ~(conflict & ~rejected[:, None, :]).any(2)  # every earlier conflict rejected
            admitted |= new
            rejected |= undecided & ~new & (conflict & admitted[:, None, :]).any(2)
    else:
        admitted = torch.zeros_like(ok)
        total = torch.zeros(B, dtype=sub.dtype, device=dev)
        for k in range(K):
            row = sub[:, k] * admitted  # [B, K]: MI with the positions admitted so far
            add = row.sum(1)
            a = ok[:, k] & (~admitted.any(1) | ((row.max(1).values <= eps) & (total + add <= budget)))
            total = total + torch.where(a, add, torch.zeros_like(total))
            admitted[:, k] = a
    return torch.zeros_like(masked_BL).scatter(1, idx, admitted)


def head_mi_fn(head, layer: int = -1):
    """MI source for `MIGuided` from an MI head on the step's hidden states (one head pass per step).

    The hidden states must be those of ``layer`` (the loop passes the layer to the model). `MIGuided`
    passes the positions that can join a set with another (``candidates``: the masked positions
    within the entropy cap), and the head evaluates only the pairs it needs for MI between them
    (`mimdm.heads.mi_head.MIHead.forward`); the decisions are those of the full MI matrix up to float
    rounding (a value within ~1e-8 nats of ``eps`` or the budget could fall the other way).

    Args:
        head: a trained `mimdm.heads.mi_head.MIHead` whose input width is the MDM's hidden width.
        layer: the MDM layer whose hidden states the head reads (-1: the last).

    Returns:
        ``fn(info, model, candidates=None) -> (MI [B, L, L] float nats, {"head_passes": B})`` with
        ``fn.layer``, ``fn.takes_candidates = True`` and ``fn.cache_id`` (the head's weights' sha256 and the
        layer: the key of `mimdm.evaluation.evalcache`; only for a head that is a ``torch.nn.Module``). Errors of the head (a hidden width that
        does not match) surface as the head's own.
    """

    def fn(info: StepInfo, model: MaskedModel, candidates=None):
        with torch.no_grad():
            mi = head(info.hidden, info.masked, info.entropy, info.probs, candidates_BL=candidates)
        return mi, {"head_passes": int(info.masked.shape[0])}  # one head pass per unfinished sequence

    fn.layer = layer
    fn.takes_candidates = True
    if isinstance(head, torch.nn.Module):  # any other callable is not identified by weights: never cached
        fn.cache_id = f"head:{module_sha256(head)}:layer{layer}"
    return fn


def zero_mi_fn():
    """MI source for `MIGuided` that reports zero MI at no cost: the rule then reduces to its entropy cap.

    With ``eps`` ≥ 0 every capped candidate is admitted, so ``MIGuided(zero_mi_fn(), entropy_cap=c)``
    is the "entropy cap" control of chapter 5 (what the cap does without any MI).
    """

    def fn(info: StepInfo, model: MaskedModel):
        B, L = info.masked.shape
        return torch.zeros(B, L, L, device=info.masked.device), {}

    fn.layer = -1
    fn.cache_id = "zero"
    return fn


def oracle_mi_fn(delta: float = 0.0, batch_tokens: int = 81 * 512):
    """MI source for `MIGuided` from ground-truth probing at every step (its passes counted separately).

    `MIGuided` passes the positions it can admit (``candidates``); only those are probed
    (`mimdm.probing.exact.probe_mi` with ``positions_BL``), which gives the same MI between them as probing
    every masked position, for Σ_{j in candidates} (values probed at j) passes per sequence and step
    instead of Σ_{j masked}. Without a candidate set, every masked position is probed. Probing's first
    pass (the conditionals of the step's own context) is the decoding step's forward pass, already
    counted in NFE: the step's log-probabilities are reused (``base_log_probs`` of `probe_mi`) when the
    model runs in fp32 (its precision fp32 and no autocast around `decode`), the precision probing runs
    in; under bf16 that pass is rerun in fp32 and counted as one more probing pass per probed sequence
    and step. Sequences without candidates are not probed.
    ``delta`` and ``batch_tokens`` are those of `probe_mi` (the MI is the study's symmetrised
    probed MI, `mimdm.probing.exact`).

    Returns:
        ``fn(info, model, candidates=None) -> (MI [B, L, L] float nats, {"probe_passes": passes})``
        with ``fn.layer = -1``, ``fn.takes_candidates = True`` and ``fn.cache_id``; raises what `probe_mi` raises.
    """

    def fn(info: StepInfo, model: MaskedModel, candidates=None):
        B, L = info.masked.shape
        mi = torch.zeros(B, L, L, device=info.masked.device)
        rows = torch.arange(B, device=mi.device) if candidates is None else torch.nonzero(candidates.any(1)).squeeze(1)
        if len(rows) == 0:
            return mi, {"probe_passes": 0}
        # reuse the step's pass only where it is what probing would compute: fp32, no autocast, and the
        # model's log-probabilities are the base class's (logits -> `log_probs_from_logits`, as in decode)
        fp32 = (model.precision == "fp32" and not torch.is_autocast_enabled(info.tokens.device.type)
                and type(model).log_probs is MaskedModel.log_probs)
        base = info.log_probs[rows] if fp32 and info.log_probs is not None else None
        res = probe_mi(model, info.tokens[rows], delta=delta, batch_tokens=batch_tokens,
                       positions_BL=None if candidates is None else candidates[rows], base_log_probs=base)
        mi[rows] = res.mi.float()
        return mi, {"probe_passes": int(res.nfe.sum())}

    fn.layer = -1
    fn.takes_candidates = True
    fn.cache_id = f"oracle:delta={delta!r}:batch_tokens={batch_tokens}"
    return fn


@dataclass
class DecodeOutput:
    """Result of `decode`.

    Attributes:
        tokens: ``[B, L]`` long, fully unmasked.
        step_of: ``[B, L]`` long, step at which each position was unmasked (-1: given).
        nfe: ``[B]`` long, MDM forward passes each sequence took (= its number of steps).
        extra_passes: head passes and probing passes, totals over the batch (a head pass per unfinished sequence per step).
        seconds: wall-clock of the whole call.
    """

    tokens: Tensor
    step_of: Tensor
    nfe: Tensor
    extra_passes: dict
    seconds: float


@torch.no_grad()
def decode(model: MaskedModel, tokens_BL: Tensor, rule: Rule, temperature: float = 0.0, seed: int = 0,
           batch_size: int = 256) -> DecodeOutput:
    """Decode every masked position of ``tokens_BL`` with ``rule``.

    Args:
        model: the MDM.
        tokens_BL: ``[B, L]`` long with ``model.mask_id`` at the positions to generate.
        rule: a `Rule` instance.
        temperature: 0 for argmax values; > 0 samples from softmax(logits / temperature).
        seed: seed of the sampling and of random orders (same seed, same result).
        batch_size: sequences per forward pass.

    Returns:
        `DecodeOutput` (NFE per sequence; head/probing passes separately; seconds).

    Raises:
        ValueError: a temperature that is negative or not finite, ``batch_size < 1``; whatever
            `MaskedModel.check_tokens` raises.
    """
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: argmax), got {temperature}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.check_tokens(tokens_BL)
    was_training = model.training
    model.eval()
    try:
        return _decode(model, tokens_BL, rule, temperature, seed, batch_size)
    finally:
        model.train(was_training)


def _decode(model: MaskedModel, tokens_BL: Tensor, rule: Rule, temperature: float, seed: int,
            batch_size: int) -> DecodeOutput:
    rule.reset()
    layer = getattr(getattr(rule, "mi_fn", None), "layer", -1)
    gen = torch.Generator(device=tokens_BL.device).manual_seed(seed)
    legal = model.legal_values(tokens_BL.shape[1])
    t0 = time.perf_counter()
    outs = []
    for s in range(0, tokens_BL.shape[0], batch_size):
        x = tokens_BL[s:s + batch_size].clone()
        B, L = x.shape
        step_of = torch.full((B, L), -1, dtype=torch.long, device=x.device)
        nfe = torch.zeros(B, dtype=torch.long, device=x.device)
        step = 0
        while True:
            masked = model.is_masked(x)
            active = torch.nonzero(masked.any(1)).squeeze(1)
            if len(active) == 0:
                break
            xa = x[active]
            out = model(xa, layer=layer)
            logits = out.logits.float().masked_fill(~legal, float("-inf"))
            logp = model.log_probs_from_logits(out.logits.float())
            p = logp.exp()
            ma = masked[active]
            ent = entropy_from_log_probs(logp) * ma
            logp_model = logp if out.logits.dtype != torch.float64 else model.log_probs_from_logits(out.logits)
            info = StepInfo(probs=p, entropy=ent, masked=ma, tokens=xa, hidden=out.hidden, generator=gen,
                            log_probs=logp_model)
            sel = rule.select(info, model)
            if not (sel.any(1)).all() or (sel & ~ma).any():
                raise RuntimeError(f"rule {rule.name} selected no or unmasked positions")
            if temperature > 0:
                flat = torch.softmax(logits / temperature, -1).reshape(-1, p.shape[-1])
                vals = torch.multinomial(flat, 1, generator=gen).reshape(p.shape[:2])
            else:
                vals = p.argmax(-1)
            new = torch.where(sel, model.value_token_ids[vals], xa)
            x[active] = new
            so = step_of[active]
            so[sel] = step
            step_of[active] = so
            nfe[active] += 1
            step += 1
        outs.append((x, step_of, nfe))
    return DecodeOutput(tokens=torch.cat([o[0] for o in outs]), step_of=torch.cat([o[1] for o in outs]),
                        nfe=torch.cat([o[2] for o in outs]), extra_passes=rule.cost(),
                        seconds=time.perf_counter() - t0)
