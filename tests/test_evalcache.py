import math

import numpy as np
import pytest
import torch

from mimdm.core.artifacts import atomic_save, load_checkpoint, module_sha256, tensor_sha256
from mimdm.data import sudoku as sd
from mimdm.evaluation.evalcache import (
    EvalCache,
    cached_conditional_nll,
    cached_decode,
    decode_key,
    recheck,
    same_decode,
    rule_from_key,
    rule_key,
)
from mimdm.experiments import likelihood as lk
from mimdm.experiments import speedup as sp
from mimdm.heads.mi_head import MIHead, MIHeadConfig
from mimdm.models.sudoku import SudokuMDM
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.sampling.decoding import EBSampler, MIGuided, Sequential, decode, head_mi_fn, zero_mi_fn


@pytest.fixture(scope="module")
def puzzles():
    return sd.make_puzzles(4, (30, 32), np.random.default_rng(0))


@pytest.fixture
def x(puzzles):
    return grids_to_tokens(np.stack([p.puzzle for p in puzzles]))


def test_hashes_see_dtype_shape_values_and_weights(tiny):
    a = torch.arange(6)
    assert tensor_sha256(a) == tensor_sha256(a.clone()) == tensor_sha256(a.numpy())
    assert len({tensor_sha256(a), tensor_sha256(a.int()), tensor_sha256(a.view(2, 3)),
                tensor_sha256(a + (a == 5).long())}) == 4
    m = SudokuMDM(tiny.config)
    m.load_state_dict(tiny.state_dict())
    assert module_sha256(m) == module_sha256(tiny)
    with torch.no_grad():
        m.out.bias[3] += 1e-6
    assert module_sha256(m) != module_sha256(tiny)


def test_rule_key_names_settings_and_mi_source(tiny):
    assert rule_key(Sequential("entropy")) == {"class": "Sequential", "order": "entropy"}
    assert rule_key(EBSampler(0.5)) == {"class": "EBSampler", "gamma": "0.5"}
    head = MIHead(MIHeadConfig(d_in=32))
    k = rule_key(MIGuided(head_mi_fn(head, -1), eps=0.01, entropy_cap=math.inf))
    assert k["mi_fn"] == f"head:{module_sha256(head)}:layer-1" and k["entropy_cap"] == "inf" and k["eps"] == "0.01"
    assert rule_key(MIGuided(zero_mi_fn(), eps=0.0))["mi_fn"] == "zero"

    def anonymous(info, model):
        return torch.zeros(info.masked.shape[0], 81, 81), {}

    assert rule_key(MIGuided(anonymous)) is None  # an MI source without cache_id is never cached


def test_cached_decode_returns_the_same_decode_and_misses_on_any_change(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    ref = decode(tiny, x, Sequential("confidence"))
    first, prov = cached_decode(cache, tiny, x, Sequential("confidence"))
    assert prov is None and (cache.hits, cache.misses) == (0, 1)
    again, prov = cached_decode(cache, tiny, x, Sequential("confidence"))
    assert (cache.hits, cache.misses) == (1, 1) and prov["date"] and prov["torch"] == torch.__version__
    for out in (first, again):
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.nfe, ref.nfe)
        assert torch.equal(out.step_of, ref.step_of) and out.extra_passes == ref.extra_passes
    assert again.seconds == first.seconds  # the wall-clock of the run that computed it
    # a changed seed, temperature, rule, input or weight is a different computation
    cached_decode(cache, tiny, x, Sequential("confidence"), temperature=1.0)
    cached_decode(cache, tiny, x, Sequential("confidence"), temperature=1.0, seed=1)
    cached_decode(cache, tiny, x, Sequential("entropy"))
    cached_decode(cache, tiny, x[:3], Sequential("confidence"))
    other = SudokuMDM(tiny.config)
    cached_decode(cache, other, x, Sequential("confidence"))
    assert (cache.hits, cache.misses) == (1, 6) and len(cache.files()) == 6


def test_a_file_holding_another_key_is_refused(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    cached_decode(cache, tiny, x, Sequential("confidence"))
    k1 = decode_key(tiny, x, Sequential("confidence"))
    k2 = decode_key(tiny, x, Sequential("entropy"))
    cache.path(k1).rename(cache.path(k2))
    with pytest.raises(ValueError, match="another computation"):
        cached_decode(cache, tiny, x, Sequential("entropy"))


def test_disabled_cache_writes_nothing(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path, enabled=False)
    out, prov = cached_decode(cache, tiny, x, Sequential("confidence"))
    assert prov is None and cache.files() == [] and not (tmp_path / "evals").exists()


def test_cached_nll_equals_the_estimator(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    out = decode(tiny, x, Sequential("confidence")).tokens
    ref = lk.conditional_nll(tiny, out, x, 4, seed=3).value
    v1 = cached_conditional_nll(cache, tiny, out, x, 4, seed=3)
    v2 = cached_conditional_nll(cache, tiny, out, x, 4, seed=3)
    assert torch.equal(v1, ref) and torch.equal(v2, ref) and cache.hits == 1
    assert not torch.equal(cached_conditional_nll(cache, tiny, out, x, 4, seed=4), ref)


def test_estimator_and_ratio_spread_through_the_cache_equal_the_computation(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    y = grids_to_tokens(sd.random_solutions(4, np.random.default_rng(1)))
    ref = lk.estimator_spread(tiny, y, 3, 2, seed=5)
    assert lk.estimator_spread(tiny, y, 3, 2, seed=5, cache=cache) == ref and (cache.hits, cache.misses) == (0, 1)
    assert lk.estimator_spread(tiny, y, 3, 2, seed=5, cache=cache) == ref and (cache.hits, cache.misses) == (1, 1)
    assert lk.estimator_spread(tiny, y, 3, 2, seed=6, cache=cache) != ref and cache.misses == 2  # the seed is in the key
    z = grids_to_tokens(sd.random_solutions(4, np.random.default_rng(2)))
    r = lk.ratio_spread(tiny, y, z, 3, 2, seed=5)
    assert lk.ratio_spread(tiny, y, z, 3, 2, seed=5, cache=cache) == r and cache.misses == 3
    assert lk.ratio_spread(tiny, y, z, 3, 2, seed=5, cache=cache) == r and cache.hits == 2
    lk.ratio_spread(tiny, z, y, 3, 2, seed=5, cache=cache)
    assert cache.misses == 4  # the pairs swapped: another key


def test_sweep_through_the_cache_gives_the_same_rows(tiny, x, puzzles, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    rules = [("sequential", math.nan, Sequential("confidence")), ("EB-sampler", 1.0, EBSampler(1.0)),
             ("entropy cap", 0.5, MIGuided(zero_mi_fn(), eps=0.0, entropy_cap=0.5))]
    score = lambda t: sp.score_solving(t, puzzles, per_item=True)  # noqa: E731
    plain = sp.sweep(tiny, x, rules, score)
    a = sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2)
    b = sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2)
    assert [r["computed"] for r in plain + a] == ["now"] * 6
    assert all(r["computed"] != "now" for r in b) and cache.hits == 3
    assert [r["timed_items"] for r in plain + a] == [4] * 3 + [2] * 3  # a cached sweep times every rule now
    for p, q, r in zip(plain, a, b):
        for k in p:
            if k not in ("seconds", "seconds_rounds", "computed", "timed_items"):
                same = (lambda u, v: np.array_equal(u, v, equal_nan=True)) if isinstance(p[k], (float, np.ndarray)) \
                    else (lambda u, v: u == v)
                assert same(p[k], q[k]) and same(q[k], r[k]), k
    seq = sp.sequential_solve_rate(tiny, puzzles, cache=cache)
    assert cache.hits == 4 and seq["nfe"] == a[0]["nfe"]


def test_sweep_without_warmup_decodes_only_to_time(tiny, x, puzzles, tmp_path, monkeypatch):
    cache = EvalCache("t", root=tmp_path)
    rules = [("sequential", math.nan, Sequential("confidence")), ("EB-sampler", 1.0, EBSampler(1.0))]
    score = lambda t: sp.score_solving(t, puzzles, per_item=True)  # noqa: E731
    sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2)  # fills the cache
    calls = []
    real = sp.decode
    monkeypatch.setattr(sp, "decode", lambda m, t, *a, **k: calls.append(len(t)) or real(m, t, *a, **k))
    sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2)
    assert calls == [2, 2, 2]  # warm-up, then each rule timed on 2 of 4 (outcomes from the cache)
    calls.clear()
    rows = sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2, warmup=False)
    assert calls == [2, 2] and [r["timed_items"] for r in rows] == [2, 2]


def test_sweep_times_in_interleaved_rounds_and_keeps_the_median(tiny, x, puzzles, tmp_path, monkeypatch):
    cache = EvalCache("t", root=tmp_path)
    rules = [("sequential", math.nan, Sequential("confidence")), ("EB-sampler", 1.0, EBSampler(1.0))]
    score = lambda t: sp.score_solving(t, puzzles, per_item=True)  # noqa: E731
    sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2)  # fills the cache
    clock = iter([5.0, 1.0, 3.0, 2.0, 4.0, 6.0])  # rounds: (seq 5, EB 1), (seq 3, EB 2), (seq 4, EB 6)
    calls, real = [], sp.decode

    def timed(m, t, rule, **k):
        out = real(m, t, rule, **k)
        calls.append(type(rule).__name__)
        out.seconds = next(clock)
        return out

    monkeypatch.setattr(sp, "decode", timed)
    rows = sp.sweep(tiny, x, rules, score, cache=cache, timing_items=2, warmup=False, timing_repeats=3)
    assert calls == ["Sequential", "EBSampler"] * 3  # interleaved rounds, outcomes from the cache
    assert [r["seconds"] for r in rows] == [4.0 / 2, 2.0 / 2]  # median round per rule, per timed sequence
    assert [r["timing_repeats"] for r in rows] == [3, 3]
    assert [r["seconds_rounds"] for r in rows] == [[2.5, 1.5, 2.0], [0.5, 1.0, 3.0]]
    with pytest.raises(ValueError, match="timing_repeats"):
        sp.sweep(tiny, x, rules, score, cache=cache, timing_repeats=0)


def test_rule_from_key_inverts_rule_key():
    from mimdm.sampling.decoding import Threshold, TopK

    head = MIHead(MIHeadConfig(d_in=32))
    sha = module_sha256(head)
    for rule in (Sequential("margin"), TopK(3), Threshold(0.9), EBSampler(0.25),
                 MIGuided(zero_mi_fn(), eps=0.0, entropy_cap=0.5), MIGuided(head_mi_fn(head, -1), eps=0.01)):
        assert rule_key(rule_from_key(rule_key(rule), {sha: head})) == rule_key(rule)
    with pytest.raises(KeyError, match="not among the given heads"):
        rule_from_key(rule_key(MIGuided(head_mi_fn(head, -1))), {})
    with pytest.raises(KeyError, match="no decoding rule named"):
        rule_from_key({"class": "decode"})


def test_same_decode_ignores_which_tied_cells_went_first_but_not_the_rest():
    tok = torch.tensor([[1, 2, 3, 4]])
    st = torch.tensor([[-1, 0, 1, 1]])  # a given, then one cell, then two together
    nfe = torch.tensor([2])
    assert same_decode(tok, st, nfe, tok, st, nfe)
    assert same_decode(tok, torch.tensor([[-1, 1, 0, 1]]), nfe, tok, st, nfe)  # another cell first, same counts
    assert not same_decode(tok, torch.tensor([[-1, 0, 0, 1]]), nfe, tok, st, nfe)  # two cells at step 0: other counts
    assert not same_decode(tok, torch.tensor([[0, 0, 1, 1]]), nfe, tok, st, nfe)  # a given decoded
    assert not same_decode(torch.tensor([[1, 2, 4, 3]]), st, nfe, tok, st, nfe)
    assert not same_decode(tok, st, torch.tensor([3]), tok, st, nfe)


def test_recheck_redecodes_stored_argmax_runs(tiny, x, tmp_path):
    cache = EvalCache("t", root=tmp_path)
    head = MIHead(MIHeadConfig(d_in=32))
    for rule in (Sequential("confidence"), Sequential("entropy"), EBSampler(1.0), MIGuided(head_mi_fn(head, -1), eps=0.05)):
        cached_decode(cache, tiny, x, rule)
    cached_decode(cache, tiny, x, EBSampler(1.0), temperature=1.0)  # sampled: not rechecked
    got = recheck(cache, tiny, {module_sha256(head): head}, n_rows=2)
    assert got == {"entries": 5, "rechecked": {"EBSampler": True, "MIGuided/head": True, "Sequential": True}}
    assert recheck(cache, tiny, {}, n_rows=2)["rechecked"] == {"EBSampler": True, "Sequential": True}  # head unknown
    assert recheck(cache, SudokuMDM(tiny.config), {}, n_rows=2)["rechecked"] == {}  # nothing stored for other weights
    # a stored result that the model does not reproduce is reported
    p = cache.path(decode_key(tiny, x, EBSampler(1.0)))
    ck = load_checkpoint(p)
    ck["result"]["nfe"][0] += 1
    atomic_save(ck, p)
    assert recheck(cache, tiny, {}, n_rows=2)["rechecked"] == {"EBSampler": False, "Sequential": True}
