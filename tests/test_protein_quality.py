"""Tests of mimdm.evaluation.protein_quality: family HMM scores, identity / novelty / diversity, recovery, composition."""
import math
import warnings

import numpy as np
import pytest

pytest.importorskip("pyhmmer")

from mimdm.data import protein as pr  # noqa: E402
from mimdm.evaluation import protein_quality as pq  # noqa: E402

AA = pr.AMINO_ACIDS


@pytest.fixture(scope="module")
def dhfr_split():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the 10 rows with non-standard letters
        _, seqs = pr.load_alignment(pr.dhfr_paths()[0])
    sp = pr.split_by_cluster(seqs, (0.8, 0.1, 0.1), threshold=0.8, seed=0)
    rng = np.random.default_rng(0)
    train_rows = [seqs[i] for i in rng.choice(sp.train, size=300, replace=False)]
    val = [pr.degap(seqs[i]) for i in rng.choice(sp.val, size=80, replace=False)]
    test = [pr.degap(seqs[i]) for i in rng.choice(sp.test, size=60, replace=False)]
    return train_rows, val, test


@pytest.fixture(scope="module")
def family(dhfr_split):
    train_rows, _, _ = dhfr_split
    return pq.FamilyHMM.build(train_rows, name="DHFR")


def _shuffled(seqs, seed=1):
    rng = np.random.default_rng(seed)
    return ["".join(rng.permutation(list(s))) for s in seqs]


def _random(lengths, seed=2):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list(AA), size=n)) for n in lengths]


def test_hmm_separates_family_from_shuffled_and_random(family, dhfr_split):
    _, _, test = dhfr_split
    assert family.M == 160  # the DHFR match columns; all-gap insert columns of the subset excluded
    nat = family.score(test)
    shuf = family.score(_shuffled(test))
    rand = family.score(_random([len(s) for s in test]))
    for sc in (nat, shuf, rand):
        assert sc.shape == (len(test),) and sc.dtype == np.float64  # one score per input, none dropped
        assert np.all(np.isfinite(sc) | (sc == pq.NO_HIT_SCORE))
    assert np.all(np.isfinite(nat))
    assert np.median(nat) > 100  # bits
    assert np.median(nat) > shuf.max() + 50 and np.median(nat) > rand.max() + 50
    assert nat.min() > max(shuf.max(), rand.max())
    # input order is kept
    assert np.allclose(family.score(test[::-1]), nat[::-1])
    assert family.score(test[0])[0] == pytest.approx(nat[0])


def test_threshold_classification(family, dhfr_split):
    _, val, test = dhfr_split
    thr = family.threshold(val, quantile=0.05)
    assert np.isfinite(thr) and thr > 20
    assert pq.fraction_above(family.score(val), thr) == pytest.approx(0.95, abs=0.02)
    neg = _shuffled(test) + _random([len(s) for s in test])
    scores = np.concatenate([family.score(test), family.score(neg)])
    labels = np.r_[np.ones(len(test)), np.zeros(len(neg))]
    acc = np.mean((scores >= thr) == labels)
    assert acc >= 0.95
    assert pq.fraction_above(family.score(neg), thr) == 0.0
    assert pq.fraction_above(family.score(test), thr) >= 0.85
    with pytest.raises(ValueError, match="quantile"):
        family.threshold(val, quantile=1.5)
    with pytest.raises(ValueError, match="no hit"):  # unrelated "held-out" set: threshold would be -inf
        family.threshold(["W" * 50, "C" * 40, "WC" * 30], quantile=0.5)


def test_build_and_score_validate_inputs(family):
    with pytest.raises(ValueError, match=r"aligned_train_seqs\[1\].*'X'"):
        pq.FamilyHMM.build(["ACD-e", "ACX-e"])
    with pytest.raises(ValueError, match="'1'"):
        pq.FamilyHMM.build(["ACDE", "AC1E"])
    with pytest.raises(ValueError, match="equal lengths"):
        pq.FamilyHMM.build(["ACDE", "ACD"])
    with pytest.raises(ValueError, match="no aligned"):
        pq.FamilyHMM.build([])
    with pytest.raises(ValueError, match="no match column"):
        pq.FamilyHMM.build(["acd", "a-d"])
    small = pq.FamilyHMM.build(["ACDEFGhiKLMN", "ACDEFG--KLMN", "ACDQFG-.KLMW"], name="toy")
    assert small.M == 10 and small.name == "toy" and small.n_sequences == 3
    with pytest.warns(UserWarning, match="no residue"):
        s2 = pq.FamilyHMM.build(["ACDEFGKLMN", "----------", "ACDQFGKLMW"])
    assert s2.dropped_rows == [1] and s2.n_sequences == 2
    with pytest.raises(ValueError, match=r"seqs\[1\].*'X'"):
        family.score(["ACDE", "ACXE"])
    with pytest.raises(ValueError, match="lowercase"):
        family.score(["ACdE"])
    with pytest.raises(ValueError, match="gap"):
        family.score(["AC-E"])


def test_identity():
    rng = np.random.default_rng(0)
    s = "".join(rng.choice(list(AA), size=120))
    L = len(s)
    mut = s[:50] + ("A" if s[50] != "A" else "C") + s[51:]
    assert pq.identity(s, s) == 1.0
    assert pq.identity(s, mut) == pytest.approx((L - 1) / L)
    assert pq.position_identity(s, mut) == pytest.approx((L - 1) / L)
    assert pq.position_identity(s, s) == 1.0
    ins = s[:60] + "WWW" + s[60:]  # an insertion is aligned as a gap, not as 60 mismatches
    assert pq.identity(s, ins) == pytest.approx(1.0)  # shortest: all L residues of s identical
    assert pq.identity(ins, s, denominator="first") == pytest.approx(L / (L + 3))
    assert pq.identity(s, ins, denominator="longest") == pytest.approx(L / (L + 3))
    frag = s[30:90]
    assert pq.identity(frag, s) == pytest.approx(1.0)
    assert pq.identity(s, frag, denominator="first") == pytest.approx(60 / L)
    with pytest.raises(ValueError, match="equal lengths"):
        pq.position_identity(s, ins)
    with pytest.raises(ValueError, match="'B'"):
        pq.identity(s, "ACB")
    with pytest.raises(ValueError, match="denominator"):
        pq.identity(s, mut, denominator="mean")


def test_max_identity_and_novelty(dhfr_split):
    train_rows, _, test = dhfr_split
    train = [pr.degap(r) for r in train_rows]
    member = train[17]
    mut = member[:40] + ("A" if member[40] != "A" else "C") + member[41:]
    mx, idx = pq.max_identity_to([member, mut], train, return_index=True)
    assert mx[0] == 1.0 and train[idx[0]] == member
    assert mx[1] == pytest.approx((len(mut) - 1) / len(mut))
    assert pq.novelty(member, train)[0] == 0.0
    # prefilter vs exhaustive alignment against every reference
    refs = train[:100]
    q = test[:4]
    fast = pq.max_identity_to(q, refs, top_k=20)
    exact = pq.max_identity_to(q, refs, top_k=len(refs))
    assert np.all(fast <= exact + 1e-12) and np.max(exact - fast) <= 0.03
    assert np.all((exact > 0.2) & (exact < 1.0))
    # position method = brute-force position identity
    rng = np.random.default_rng(3)
    a = ["".join(rng.choice(list(AA), size=30)) for _ in range(5)]
    b = ["".join(rng.choice(list(AA), size=30)) for _ in range(7)] + [a[2]]
    pos = pq.max_identity_to(a, b, method="position")
    brute = np.array([max(pq.position_identity(x, y) for y in b) for x in a])
    assert np.allclose(pos, brute) and pos[2] == 1.0
    with pytest.raises(ValueError, match="common length"):
        pq.max_identity_to(["ACDE"], ["ACD"], method="position")
    with pytest.raises(ValueError, match="method"):
        pq.max_identity_to(["ACDE"], ["ACD"], method="blast")
    with pytest.raises(ValueError, match=r"reference_seqs\[0\]"):
        pq.max_identity_to(["ACDE"], ["AXD"])


def test_diversity(dhfr_split):
    _, _, test = dhfr_split
    s = test[0]
    assert pq.mean_pairwise_identity([s, s, s]) == 1.0
    assert pq.mean_pairwise_identity([s, s, s], method="position") == 1.0
    rng = np.random.default_rng(4)
    rand = ["".join(rng.choice(list(AA), size=100)) for _ in range(30)]
    assert pq.mean_pairwise_identity(rand, method="position") == pytest.approx(0.05, abs=0.01)
    ii, jj = np.triu_indices(8, k=1)
    ids = np.array([pq.identity(test[i], test[j]) for i, j in zip(ii, jj)])  # the 28 pairs, one by one
    nat = pq.mean_pairwise_identity(test[:8])
    assert nat == pytest.approx(ids.mean(), abs=1e-12) and 0.2 < nat < 0.8
    assert pq.mean_pairwise_identity(test[:8], max_pairs=28) == pytest.approx(nat, abs=1e-12)  # all pairs: exact
    sub = pq.mean_pairwise_identity(test[:8], max_pairs=10, seed=0)
    sel = np.random.default_rng(0).choice(28, size=10, replace=False)  # the documented uniform sample of 10 pairs
    assert sub == pytest.approx(ids[sel].mean(), abs=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        pq.mean_pairwise_identity([s])
    with pytest.raises(ValueError, match="symmetric"):
        pq.mean_pairwise_identity([s, s], denominator="first")


def test_recovery():
    native = "ACDEFGHIKL"
    pred = "ACDQFGHWKL"  # positions 3 and 7 changed
    assert pq.recovery(pred, native, [0, 3, 5, 7]) == pytest.approx(0.5)
    assert pq.recovery(pred, native, [3, 7]) == 0.0
    assert pq.recovery(native, native, range(10)) == 1.0
    assert pq.recovery("AC_EFGHIKL", native, [2, 3]) == pytest.approx(0.5)  # unfilled mask = not recovered
    # several sequences: pooled over positions; shared or per-sequence position lists
    assert pq.recovery([pred, native], [native, native], [3, 7]) == pytest.approx(0.5)
    assert pq.recovery([pred, native], [native, native], [[3, 7], [0, 1, 2, 3, 4, 5]]) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="range"):
        pq.recovery(pred, native, [10])
    with pytest.raises(ValueError, match="duplicated"):
        pq.recovery(pred, native, [1, 1])
    with pytest.raises(ValueError, match="length"):
        pq.recovery(pred[:-1], native, [1])
    with pytest.raises(ValueError, match="'Z'"):
        pq.recovery("ACZ", "ACD", [2])


def test_composition():
    c = pq.composition(["AAC", "DA"])
    assert c.shape == (20,) and c.sum() == pytest.approx(1.0)
    assert c[AA.index("A")] == pytest.approx(0.6) and c[AA.index("C")] == pytest.approx(0.2)
    assert pq.composition_distance(c, c) == pytest.approx(0.0, abs=1e-12)
    p = np.zeros(20)
    p[0] = 1
    q = np.zeros(20)
    q[1] = 1
    assert pq.composition_distance(p, q) == pytest.approx(math.log(2))
    assert pq.composition_distance(p * 3, p) == pytest.approx(0.0, abs=1e-12)  # renormalised
    with pytest.raises(ValueError, match="shape"):
        pq.composition_distance(np.ones(21), np.ones(20))
    with pytest.raises(ValueError, match="non-negative"):
        pq.composition_distance(-p, q)
    with pytest.raises(ValueError, match="'X'"):
        pq.composition(["ACX"])


def test_quality_report(family, dhfr_split):
    train_rows, val, test = dhfr_split
    train = [pr.degap(r) for r in train_rows]
    thr = family.threshold(val)
    gen = test[:6]
    natives = list(gen)
    infilled = [s[:10] + ("A" if s[10] != "A" else "C") + s[11:] for s in gen]  # position 10 wrong
    rep = pq.quality_report(infilled, hmm=family, threshold=thr, train_seqs=train, natives=natives,
                            positions=[9, 10, 11, 12])
    sc = family.score(infilled)
    mx = pq.max_identity_to(infilled, train)
    assert rep["n"] == 6 and rep["n_no_hit"] == 0
    assert rep["mean_bit_score"] == pytest.approx(sc.mean()) and rep["median_bit_score"] == pytest.approx(np.median(sc))
    assert rep["frac_above_threshold"] == pytest.approx((sc >= thr).mean()) and rep["mean_bit_score"] > 100
    assert rep["recovery"] == pytest.approx(0.75)
    assert rep["mean_max_identity"] == pytest.approx(mx.mean()) and rep["mean_novelty"] == pytest.approx(1 - mx.mean())
    assert rep["diversity_mean_pairwise_identity"] == pytest.approx(pq.mean_pairwise_identity(infilled))
    assert rep["composition_js"] == pytest.approx(pq.composition_distance(pq.composition(infilled), pq.composition(train)))
    assert 0 <= rep["composition_js"] < 0.05
    # random sequences and a homopolymer, which HMMER does not hit: the floor enters the mean, -inf the median
    rnd = _random([150] * 3) + ["W" * 150]
    sc2 = family.score(rnd)
    assert not np.isfinite(sc2[-1])
    rep2 = pq.quality_report(rnd, hmm=family, threshold=thr, train_seqs=train, no_hit_floor=-7.0)
    assert "recovery" not in rep2 and rep2["frac_above_threshold"] == 0.0 and rep2["n_no_hit"] == (~np.isfinite(sc2)).sum()
    assert rep2["mean_bit_score"] == pytest.approx(np.where(np.isfinite(sc2), sc2, -7.0).mean())
    assert rep2["median_bit_score"] == np.median(sc2) and rep2["composition_js"] > rep["composition_js"]
    with pytest.raises(ValueError, match="both"):
        pq.quality_report(gen, hmm=family, threshold=thr, train_seqs=train, natives=natives)
