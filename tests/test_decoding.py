import math

import numpy as np
import pytest
import torch

from mimdm.data import sudoku as sd
from mimdm.heads.mi_head import MIHead, MIHeadConfig, head_inputs
from mimdm.models.oracle import TableJointMDM, potts_chain_log_joint
from mimdm.pipelines.zoo import grids_to_tokens
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


@pytest.fixture(scope="module")
def puzzles():
    ps = sd.make_puzzles(3, (30, 32), np.random.default_rng(0))
    return grids_to_tokens(np.stack([p.puzzle for p in ps]))


def _check(out, x):
    masked = x == 9
    assert not (out.tokens == 9).any()
    assert torch.equal(out.tokens[~masked], x[~masked])  # givens kept, never re-masked
    assert ((out.step_of >= 0) == masked).all()
    assert torch.equal(out.nfe, out.step_of.max(1).values + 1)  # one pass per step


@pytest.mark.parametrize("order", ["confidence", "entropy", "margin", "random"])
def test_sequential_uses_exactly_one_pass_per_masked_cell(tiny, puzzles, order):
    out = decode(tiny, puzzles, Sequential(order))
    _check(out, puzzles)
    assert torch.equal(out.nfe, (puzzles == 9).sum(1))


@pytest.mark.parametrize("rule", [TopK(3), Threshold(0.5), EBSampler(0.5)])
def test_parallel_rules_unmask_at_least_one_and_finish(tiny, puzzles, rule):
    out = decode(tiny, puzzles, rule)
    _check(out, puzzles)
    assert (out.nfe <= (puzzles == 9).sum(1)).all()


def test_topk_step_count(tiny, puzzles):
    out = decode(tiny, puzzles, TopK(4))
    assert torch.equal(out.nfe, ((puzzles == 9).sum(1) + 3) // 4)


def test_threshold_one_is_sequential_and_zero_is_one_step(tiny, puzzles):
    assert torch.equal(decode(tiny, puzzles, Threshold(1.01)).nfe, (puzzles == 9).sum(1))
    assert (decode(tiny, puzzles, Threshold(0.0)).nfe == 1).all()


def test_mi_guided_limits(tiny, puzzles):
    torch.manual_seed(0)
    head = MIHead(MIHeadConfig(32, d_hidden=16, rank=8)).eval()
    inf = decode(tiny, puzzles, MIGuided(head_mi_fn(head), eps=math.inf))
    assert (inf.nfe == 1).all()  # no MI limit, no entropy cap: everything at once
    zero = decode(tiny, puzzles, MIGuided(head_mi_fn(head), eps=0.0))
    assert torch.equal(zero.nfe, (puzzles == 9).sum(1))  # positive MI everywhere: sequential
    assert zero.extra_passes["head_passes"] == int(zero.nfe.sum())


@pytest.mark.parametrize("cap_quantile", [0.5, None])  # cap at the median masked entropy / no cap
def test_mi_guided_head_on_candidates_decides_as_the_full_mi_matrix(tiny, puzzles, cap_quantile):
    torch.manual_seed(0)
    head = MIHead(MIHeadConfig(32, d_hidden=16, rank=8)).eval()
    f = head_mi_fn(head)
    assert f.takes_candidates

    def full(info, model):  # the same head, asked for the whole matrix
        return f(info, model)

    full.layer = f.layer
    x = puzzles.clone()
    x[:, :40] = 9  # more masked cells: several candidates per step
    with torch.no_grad():
        hid, masked, ent, _ = head_inputs(tiny, x)
        mi = head(hid, masked, ent)
    eps = float(mi[mi > 0].median())  # MI decides some admissions
    cap = math.inf if cap_quantile is None else float(ent[masked].quantile(cap_quantile))
    a = decode(tiny, x, MIGuided(f, eps=eps, entropy_cap=cap))
    b = decode(tiny, x, MIGuided(full, eps=eps, entropy_cap=cap))
    _check(a, x)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.step_of, b.step_of) and torch.equal(a.nfe, b.nfe)
    assert a.extra_passes == b.extra_passes
    capped = decode(tiny, x, MIGuided(zero_mi_fn(), eps=0.0, entropy_cap=cap))  # the cap alone
    assert (capped.nfe < (x == 9).sum(1)).any()  # some step had several candidates ...
    assert (a.nfe > capped.nfe).any()  # ... and the MI kept some of them apart


def test_mi_guided_oracle_on_exact_model_unmasks_independent_positions_together():
    """X0 = X1 (coupled), X2 independent: with eps small the oracle rule unmasks {lowest entropy, X2}-style
    independent sets and never the coupled pair together."""
    V = 3
    states = torch.tensor([[a, a, c] for a in range(V) for c in range(V)])
    model = TableJointMDM.from_samples(states, V)
    x = torch.full((1, 3), V)
    out = decode(model, x, MIGuided(oracle_mi_fn(), eps=1e-6))
    s = out.step_of[0]
    assert s[0] != s[1]  # the coupled pair is never unmasked in the same step
    # step 1 probes the 3 values of each of the 3 masked positions (its first pass is the step's own forward
    # pass, counted in NFE); step 2 has one masked position left, a lone candidate: no probing
    assert out.nfe.item() == 2 and out.extra_passes["probe_passes"] == 9
    # sampled at T=1 the result is always a state of the support: X0 = X1 even though each is uniform
    # on its own (independent parallel sampling of X0 and X1 would disagree 2/3 of the time)
    xs = torch.full((300, 3), V)
    mi = decode(model, xs, MIGuided(oracle_mi_fn(), eps=1e-6), temperature=1.0, seed=1)
    assert (mi.tokens[:, 0] == mi.tokens[:, 1]).all() and len(set(mi.tokens[:, 0].tolist())) == V
    par = decode(model, xs, MIGuided(oracle_mi_fn(), eps=math.inf), temperature=1.0, seed=1)
    assert (par.nfe == 1).all() and 0.5 < (par.tokens[:, 0] != par.tokens[:, 1]).float().mean() < 0.8


def test_mi_oracle_passes_counted_are_the_passes_run():
    """Every row the model sees is counted once: in NFE (the step's own pass, reused as probing's first pass) or
    in the probing passes; under autocast the first pass is rerun in fp32 and counted as probing."""
    model = TableJointMDM.from_table(potts_chain_log_joint(7, 3, coupling=1.5, generator=torch.Generator().manual_seed(2)))
    seen = []
    forward = model._forward

    def counting(tokens_BL, layer):
        seen.append(len(tokens_BL))
        return forward(tokens_BL, layer)

    model._forward = counting
    x = torch.full((12, 7), model.mask_id)
    out = decode(model, x, MIGuided(oracle_mi_fn(), eps=0.02, entropy_cap=1.0), temperature=1.0, seed=3)
    assert sum(seen) == out.nfe.sum().item() + out.extra_passes["probe_passes"]
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rerun = decode(model, x, MIGuided(oracle_mi_fn(), eps=0.02, entropy_cap=1.0), temperature=1.0, seed=3)
    assert sum(seen) == rerun.nfe.sum().item() + rerun.extra_passes["probe_passes"]
    assert torch.equal(rerun.tokens, out.tokens) and rerun.extra_passes["probe_passes"] > out.extra_passes["probe_passes"]

    class OwnLogProbs(TableJointMDM):  # log-probabilities not computed the base class's way: never reused
        def log_probs(self, tokens_BL):
            return super().log_probs(tokens_BL)

    own = OwnLogProbs.from_table(potts_chain_log_joint(7, 3, coupling=1.5, generator=torch.Generator().manual_seed(2)))
    again = decode(own, x, MIGuided(oracle_mi_fn(), eps=0.02, entropy_cap=1.0), temperature=1.0, seed=3)
    assert torch.equal(again.tokens, out.tokens)
    assert again.extra_passes["probe_passes"] == rerun.extra_passes["probe_passes"]


@pytest.mark.parametrize("cap", [1.0, math.inf])
def test_mi_oracle_probes_only_candidates_and_decides_as_probing_every_masked_position(cap):
    """A Potts chain (exact MI): the oracle given the step's candidates probes only those, and decodes exactly
    as the oracle that probes every masked position, with strictly fewer probing passes."""
    model = TableJointMDM.from_table(potts_chain_log_joint(7, 3, coupling=1.5, generator=torch.Generator().manual_seed(2)))
    f = oracle_mi_fn()
    assert f.takes_candidates

    def full(info, m):  # the same oracle, probing every masked position
        return f(info, m)

    full.layer = f.layer
    x = torch.full((12, 7), model.mask_id)
    a = decode(model, x, MIGuided(f, eps=0.02, entropy_cap=cap), temperature=1.0, seed=3)
    b = decode(model, x, MIGuided(full, eps=0.02, entropy_cap=cap), temperature=1.0, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.step_of, b.step_of) and torch.equal(a.nfe, b.nfe)
    assert (a.nfe > 1).any() and (a.nfe < 7).any()  # MI and cap both shape the steps
    # without a cap every masked position is a candidate, except in a row with one masked position left, which
    # needs no MI: this seeded run reaches such a step (a row whose last step unmasks one position), so the count
    # is strictly lower; with a cap fewer positions still are candidates
    last = a.step_of.max(1, keepdim=True).values
    assert ((a.step_of == last).sum(1) == 1).any()
    assert a.extra_passes["probe_passes"] < b.extra_passes["probe_passes"]


def test_same_seed_same_result_and_temperature_sampling(tiny, puzzles):
    a = decode(tiny, puzzles, EBSampler(0.3), temperature=1.0, seed=7)
    b = decode(tiny, puzzles, EBSampler(0.3), temperature=1.0, seed=7)
    c = decode(tiny, puzzles, EBSampler(0.3), temperature=1.0, seed=8)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    for bad in (-1, math.nan, math.inf):
        with pytest.raises(ValueError, match="temperature"):
            decode(tiny, puzzles, Sequential(), temperature=bad)
    with pytest.raises(ValueError, match="batch_size"):
        decode(tiny, puzzles, Sequential(), batch_size=0)
    tiny.train()
    decode(tiny, puzzles, Sequential())
    assert tiny.training  # the caller's mode is restored
    tiny.eval()


def _step_info(probs, masked):
    from mimdm.sampling.decoding import StepInfo

    ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1) * masked
    return StepInfo(probs=probs, entropy=ent, masked=masked, tokens=torch.zeros(masked.shape, dtype=torch.long),
                    hidden=torch.zeros(*masked.shape, 1), generator=torch.Generator().manual_seed(0))


def test_sequential_orders_topk_and_threshold_pick_the_documented_positions():
    """Position 0 is the most confident (0.60), 1 has the lowest entropy (0.69 nats), 2 the largest top-2
    margin (0.44); position 3 is certain but already given, so no rule may pick it."""
    probs = torch.tensor([[[0.60, 0.20, 0.20, 0.00], [0.55, 0.45, 0.00, 0.00], [0.58, 0.14, 0.14, 0.14],
                           [1.00, 0.00, 0.00, 0.00]]])
    info = _step_info(probs, torch.tensor([[True, True, True, False]]))
    pick = lambda rule: rule.select(info, None)[0].nonzero().flatten().tolist()  # noqa: E731
    assert pick(Sequential("confidence")) == [0]
    assert pick(Sequential("entropy")) == [1]
    assert pick(Sequential("margin")) == [2]
    assert len(pick(Sequential("random"))) == 1 and pick(Sequential("random"))[0] in (0, 1, 2)
    assert pick(TopK(2)) == [0, 2] and pick(TopK(5)) == [0, 1, 2]
    assert pick(Threshold(0.56)) == [0, 2] and pick(Threshold(0.59)) == [0]
    assert pick(Threshold(0.9)) == [0]  # nothing above tau: the most confident one alone
    assert pick(Threshold(0.0)) == [0, 1, 2]


def test_temperature_sampling_follows_the_model_marginal():
    """One masked position of an exact joint with p = (0.7, 0.2, 0.1): sampled values at T=1 follow it,
    at T -> 0 (argmax) always value 0."""
    model = TableJointMDM.from_table(torch.tensor([0.7, 0.2, 0.1]).log())
    x = torch.full((4000, 1), 3)
    out = decode(model, x, Sequential(), temperature=1.0, seed=5)
    freq = torch.bincount(out.tokens[:, 0], minlength=3).double() / len(x)
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.025)
    assert (decode(model, x[:10], Sequential()).tokens == 0).all()


def test_eb_sampler_prefix_rule():
    """Entropies 0.1, 0.2, 0.3 (+unmasked): gamma=0.25 admits the prefix {0.1, 0.2} (0.3 - 0.2 = 0.1),
    not {0.1, 0.2, 0.3} (0.6 - 0.3 = 0.3)."""
    from mimdm.sampling.decoding import StepInfo

    ent = torch.tensor([[0.3, 0.1, 0.0, 0.2]])
    masked = torch.tensor([[True, True, False, True]])
    info = StepInfo(probs=torch.full((1, 4, 2), 0.5), entropy=ent, masked=masked, tokens=torch.zeros(1, 4, dtype=torch.long),
                    hidden=torch.zeros(1, 4, 1), generator=torch.Generator())
    assert EBSampler(0.25).select(info, None).tolist() == [[False, True, False, True]]
    assert EBSampler(0.35).select(info, None).tolist() == [[True, True, False, True]]
    assert EBSampler(0.0).select(info, None).tolist() == [[False, True, False, False]]


def _greedy_one_by_one(mi, ent, masked, eps, budget, cap):
    """The sequential greedy pass, position by position (the definition `greedy_admission` must reproduce)."""
    B, L = masked.shape
    e = ent.masked_fill(~masked, math.inf)
    order = e.argsort(1)
    sel = torch.zeros_like(masked)
    for b in range(B):
        total, chosen = 0.0, []
        for i in order[b].tolist():
            if not masked[b, i]:
                continue
            row = [float(mi[b, i, j]) for j in chosen]
            if not chosen or (e[b, i] <= cap and max(row) <= eps and total + sum(row) <= budget):
                chosen.append(i)
                total += sum(row)
        sel[b, chosen] = True
    return sel


@pytest.mark.parametrize("budget", [math.inf, 51 / 1024])
@pytest.mark.parametrize("cap", [math.inf, 0.5])
def test_greedy_admission_equals_the_one_by_one_pass(budget, cap):
    from mimdm.sampling.decoding import greedy_admission

    g = torch.Generator().manual_seed(0)
    B, L = 64, 30
    ent = torch.rand(B, L, generator=g).round(decimals=1)  # ties in entropy
    masked = torch.rand(B, L, generator=g) < 0.7
    masked[0] = False  # a row without masked positions admits nothing
    # asymmetric, many pairs at or near eps; multiples of 1/1024, so that sums are exact and ties are real
    mi = (torch.rand(B, L, L, generator=g) ** 6 * 200).round() / 1024
    n_admitted = 0
    for eps in (0.0, 1 / 1024, 10 / 1024, 50 / 1024):
        e = ent.masked_fill(~masked, math.inf)
        got = greedy_admission(mi, e.argsort(1), masked, masked & (e <= cap), eps, budget)
        want = _greedy_one_by_one(mi, ent, masked, eps, budget, cap)
        assert torch.equal(got, want), eps
        n_admitted += int(got.sum())
    assert not got[0].any() and got[1:].any(1).all()
    assert n_admitted > 4 * (B - 1)  # sets of more than one position occur


def test_greedy_admission_on_a_chain_of_conflicts_admits_every_other_position():
    from mimdm.sampling.decoding import greedy_admission

    L = 9
    mi = torch.zeros(1, L, L)
    k = torch.arange(L - 1)
    mi[0, k + 1, k] = mi[0, k, k + 1] = 1.0  # each position conflicts with the one visited before it
    masked = torch.ones(1, L, dtype=torch.bool)
    got = greedy_admission(mi, torch.arange(L)[None], masked, masked, 0.5)
    assert got[0].tolist() == [i % 2 == 0 for i in range(L)]
    mi[0, 1, 0] = mi[0, 0, 1] = 0.0  # 1 now joins 0; 2 conflicts with 1, and the alternation shifts by one
    got = greedy_admission(mi, torch.arange(L)[None], masked, masked, 0.5)
    assert got[0].tolist() == [True, True, False, True, False, True, False, True, False]


def test_greedy_admission_rejects_non_finite_mi():
    from mimdm.core.contract import NonFiniteOutputError
    from mimdm.sampling.decoding import greedy_admission

    mi = torch.zeros(1, 3, 3)
    mi[0, 1, 0] = math.nan
    masked = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(NonFiniteOutputError, match="NaN or infinite MI"):
        greedy_admission(mi, torch.arange(3)[None], masked, masked, 0.1)


def test_mi_guided_greedy_admission_eps_budget_and_cap():
    from mimdm.sampling.decoding import StepInfo

    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0]])
    masked = torch.tensor([[True, True, True, True, False]])
    mi = torch.zeros(1, 5, 5)
    mi[0, 0, 1] = mi[0, 1, 0] = 0.5  # 0 and 1 strongly dependent
    mi[0, 2, 3] = mi[0, 3, 2] = 0.004
    mi[0, 0, 3] = mi[0, 3, 0] = 0.004
    info = StepInfo(probs=torch.full((1, 5, 2), 0.5), entropy=ent, masked=masked, tokens=torch.zeros(1, 5, dtype=torch.long),
                    hidden=torch.zeros(1, 5, 1), generator=torch.Generator())
    fn = lambda info, model: (mi, {})  # noqa: E731
    assert MIGuided(fn, eps=0.01).select(info, None).tolist() == [[True, False, True, True, False]]
    assert MIGuided(fn, eps=0.001).select(info, None).tolist() == [[True, False, True, False, False]]
    # budget: admitting 3 would bring the summed MI of the set to 0.008 > 0.005
    assert MIGuided(fn, eps=0.01, budget=0.005).select(info, None).tolist() == [[True, False, True, False, False]]
    assert MIGuided(fn, eps=1.0, entropy_cap=0.25).select(info, None).tolist() == [[True, True, False, False, False]]


@pytest.mark.parametrize("make, match", [
    (lambda: Sequential("bogus"), "unknown order 'bogus'"),
    (lambda: TopK(0), "k must be an integer >= 1"),
    (lambda: TopK(2.5), "k must be an integer >= 1"),
    (lambda: Threshold(math.nan), "tau must be a number"),
    (lambda: EBSampler(-0.1), "gamma must be >= 0"),
    (lambda: MIGuided(None), "mi_fn must be a callable"),
    (lambda: MIGuided(zero_mi_fn(), eps=-1e-3), "eps must be >= 0"),
    (lambda: MIGuided(zero_mi_fn(), entropy_cap=math.nan), "entropy_cap must be >= 0"),
    (lambda: MIGuided(zero_mi_fn(), budget=-1.0), "budget must be >= 0"),
])
def test_rules_reject_bad_settings_when_built(make, match):
    with pytest.raises(ValueError, match=match):
        make()
