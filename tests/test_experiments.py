"""The chapter measurements on tiny models and hand-made inputs."""
import math

import numpy as np
import pytest
import torch

from mimdm.data import sudoku as sd
from mimdm.experiments import ground_truth as gt
from mimdm.experiments import mi_head as mh
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)


def test_oracle_exactness_is_exact():
    r = gt.oracle_exactness(n_contexts=10, seed=1)
    assert r["max_abs_error"] < 1e-9 and r["max_asymmetry"] < 1e-9 and r["max_mi"] > 0.05


def test_probe_levels_and_puzzles_summaries():
    m = SudokuMDM(TINY).eval()
    lv = gt.probe_levels(m, [1.0, 0.5], n_contexts=2, seed=0)
    assert [x["n_masked"] for x in lv] == [81, 40]
    assert lv[0]["nfe_per_context"] == 1 + 81 * 9 and lv[1]["nfe_per_context"] == 1 + 40 * 9
    assert all(0 <= x["auroc"] <= 1 for x in lv)
    pz = gt.probe_puzzles(m, 2, clues=(34, 35))
    assert 46 <= pz["n_masked"] <= 47 and len(pz["difficulty"]) == 2


def _fake_labels(n=6, seed=0):
    rng = np.random.default_rng(seed)
    sols = sd.random_solutions(n, rng)
    tokens = torch.from_numpy(sols.astype(np.int64) - 1)
    masked = torch.rand(n, 81, generator=torch.Generator().manual_seed(seed)) < torch.linspace(0.3, 1.0, n)[:, None]
    tokens[masked] = 9
    graph = torch.from_numpy(sd.constraint_graph()).float()
    pair = masked[:, :, None] & masked[:, None, :]
    mi = (0.1 * graph + 0.01 * torch.rand(n, 81, 81)) * pair
    mi = (mi + mi.transpose(1, 2)) / 2
    return {"tokens": tokens, "mi": mi}


def test_accuracy_of_perfect_and_shuffled_predictions():
    data = _fake_labels()
    perfect = mh.accuracy(data["mi"], data, 9)
    assert perfect["overall"]["pearson"] == pytest.approx(1.0) and perfect["overall"]["topk_recall"] == pytest.approx(1.0)
    assert perfect["overall"]["mae"] == 0
    noise = torch.rand_like(data["mi"])
    bad = mh.accuracy((noise + noise.transpose(1, 2)) / 2, data, 9)
    assert abs(bad["overall"]["pearson"]) < 0.1 and bad["overall"]["topk_recall"] < 0.5
    assert sum(r["n_contexts"] for r in perfect["by_rate"]) == 6
    cal = mh.calibration(perfect["pred_pairs"], perfect["true_pairs"], n_bins=5)
    assert all(c["pred_mean"] == pytest.approx(c["true_mean"]) for c in cal)
    import warnings

    flat = {**data, "mi": torch.zeros_like(data["mi"])}  # no pair above min_mi: no top-k recall, and no numpy warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        none = mh.accuracy(data["mi"], flat, 9)
    assert math.isnan(none["overall"]["topk_recall"]) and none["overall"]["n_contexts_without_dependence"] == 6


def test_direction_agreement_from_the_directed_mi():
    """Three masked cells with known directed MI I_{i->j}: the statistics are Pearson over both orders."""
    tokens = torch.zeros(1, 81, dtype=torch.long)
    tokens[0, :3] = 9
    directed = np.zeros((81, 81))
    directed[0, 1], directed[1, 0] = 3.0, 1.0  # T = 2, A = 2
    directed[0, 2] = directed[2, 0] = 1.0  # T = 1, A = 0
    directed[5, 6] = 4.0  # an unmasked pair: ignored
    data = {"tokens": tokens, "mi": torch.from_numpy((directed + directed.T) / 2)[None],
            "asymmetry": torch.from_numpy(np.abs(directed - directed.T))[None]}
    got = mh.direction_agreement(data, 9)
    a, b = np.array([3.0, 1.0, 0.0, 1.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0, 3.0, 1.0, 0.0])  # (0,1), (0,2), (1,2)
    assert got["n_pairs"] == 3
    assert got["directions_pearson"] == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert got["one_direction_pearson"] == pytest.approx(np.corrcoef(a, (a + b) / 2)[0, 1])
    consistent = mh.direction_agreement({**data, "asymmetry": torch.zeros(1, 81, 81)}, 9)
    assert consistent["directions_pearson"] == pytest.approx(1.0) and consistent["one_direction_pearson"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ in shape"):
        mh.direction_agreement({**data, "asymmetry": torch.zeros(1, 80, 80)}, 9)
    with pytest.raises(ValueError, match="no pair of masked"):
        mh.direction_agreement({**data, "tokens": torch.zeros(1, 81, dtype=torch.long)}, 9)


def test_direction_findings_say_what_the_agreement_shows():
    base = {"one_direction_pearson": 0.99, "n_pairs": 1234}
    below = mh._direction_findings({**base, "directions_pearson": 0.9}, 0.85)
    assert "so the two differ" in below and "Pearson 0.900 with the other" in below and "below the 0.95 target" in below
    assert "above the 0.95 target" in mh._direction_findings({**base, "directions_pearson": 0.96}, 0.85)
    exact = mh._direction_findings({**base, "directions_pearson": 1.0}, 0.85)
    assert "agree exactly" in exact and "differ" not in exact
    for undefined in (float("nan"), None):  # None: a NaN read back from the results JSON
        text = mh._direction_findings({**base, "directions_pearson": undefined}, 0.85)
        assert "is undefined here" in text and "Pearson n/a with the other" in text and "differ" not in text
    assert mh._direction_findings(None, 0.85) == ""


def test_error_by_pair_class_locates_the_error():
    data = _fake_labels()
    graph = sd.constraint_graph()
    other = ~graph & ~np.eye(81, dtype=bool)
    masked = (data["tokens"] == 9).numpy()
    pred = data["mi"] * torch.from_numpy(graph)  # exact on pairs sharing a unit, 0 on the others
    rows = {r["pair_class"]: r for r in mh.error_by_pair_class(
        pred, data, 9, {"unit": graph, "other": other, "all": ~np.eye(81, dtype=bool)})}
    iu = np.triu_indices(81, 1)
    mi = data["mi"].numpy()
    n_pairs = n_unit = 0
    mi_unit = mi_all = 0.0
    for b, m in enumerate(masked):
        both = m[iu[0]] & m[iu[1]]
        n_pairs, n_unit = n_pairs + int(both.sum()), n_unit + int((both & graph[iu]).sum())
        mi_all += float(mi[b][iu][both].sum())
        mi_unit += float(mi[b][iu][both & graph[iu]].sum())
    assert rows["unit"]["share_of_pairs"] == pytest.approx(n_unit / n_pairs)
    assert rows["unit"]["share_of_mi"] == pytest.approx(mi_unit / mi_all)
    assert rows["unit"]["share_of_mi"] + rows["other"]["share_of_mi"] == pytest.approx(1.0)
    assert rows["unit"]["share_of_squared_error"] == 0 and rows["other"]["share_of_squared_error"] == pytest.approx(1.0)
    assert rows["unit"]["pearson"] == pytest.approx(1.0) and np.isnan(rows["other"]["pearson"])  # predictions all 0
    pooled = mh.accuracy(pred, data, 9)["overall"]["pearson"]
    assert pooled < 0.9999 and rows["unit"]["pearson_if_exact"] == pytest.approx(pooled)  # nothing left to fix there
    assert rows["other"]["pearson_if_exact"] == pytest.approx(1.0)
    exact = mh.error_by_pair_class(data["mi"], data, 9, {"unit": graph})[0]
    assert np.isnan(exact["share_of_squared_error"]) and exact["pearson_if_exact"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not symmetric"):
        mh.error_by_pair_class(pred, data, 9, {"lower": np.tril(np.ones((81, 81), dtype=bool), -1)})
    with pytest.raises(ValueError, match="bool matrix"):
        mh.error_by_pair_class(pred, data, 9, {"float": graph.astype(float)})
    with pytest.raises(ValueError, match="differ in shape"):
        mh.error_by_pair_class(pred[:2], data, 9, {"unit": graph})


def test_error_class_findings_verdicts():
    row = {"share_of_pairs": 0.25, "share_of_mi": 0.7, "share_of_squared_error": 0.4, "pearson": 0.9}
    short = [{**row, "pair_class": "share a unit", "pearson_if_exact": 0.91},
             {**row, "pair_class": "share no unit", "pearson_if_exact": 0.9499}]
    text = mh._error_class_findings(short, 0.856)
    assert "no single class, made exact, reaches 0.95 on its own" in text and "0.9499" in text and "0.8560" in text
    enough = [short[0], {**short[1], "pearson_if_exact": 0.97}]
    assert "made exact, the pairs that share no unit would bring it to 0.95" in mh._error_class_findings(enough, 0.856)
    assert "already reaches 0.95" in mh._error_class_findings(short, 0.96)
    nan = [{**short[0], "pearson": None, "share_of_squared_error": float("nan")}]
    assert "Pearson n/a" in mh._error_class_findings(nan, 0.856) and "n/a of the squared error" in \
        mh._error_class_findings(nan, 0.856)
    assert mh._error_class_findings([], 0.856) == ""


def _completion_split(deadly_rectangle):
    """Four contexts: one completion (2 masked peers), the deadly rectangle (2 completions), the empty grid (1000+)
    and a grid breaking a rule (0 completions, 2 masked cells); labels and head predictions set by hand."""
    sol, cells, rect = deadly_rectangle
    one = sol.copy()
    one[[0, 1]] = 0
    empty = np.zeros(81, dtype=np.int8)
    broken = sol.copy()
    broken[2] = sol[1]  # two equal digits in row 0
    broken[[40, 80]] = 0
    grids = np.stack([one, rect, empty, broken])
    tokens = torch.from_numpy(np.where(grids == 0, 9, grids.astype(np.int64) - 1))
    mi, pred = torch.zeros(4, 81, 81), torch.zeros(4, 81, 81)

    def put(m, b, i, j, v):
        m[b, i, j] = m[b, j, i] = v

    put(mi, 0, 0, 1, 0.1)
    put(pred, 0, 0, 1, 0.3)  # squared error 0.04
    for a in range(4):
        for c in range(a + 1, 4):
            put(mi, 1, cells[a], cells[c], 0.5)
            put(pred, 1, cells[a], cells[c], 0.4)  # 6 x 0.01
    graph = torch.from_numpy(sd.constraint_graph()).float()
    mi[2] = pred[2] = 0.01 * graph  # exact
    put(mi, 3, 40, 80, 0.2)
    put(pred, 3, 40, 80, 0.2)
    return {"tokens": tokens, "mi": mi}, pred


def test_error_by_completions_groups_contexts_by_their_completions(deadly_rectangle):
    data, pred = _completion_split(deadly_rectangle)
    rows = mh.error_by_completions(pred, data, 9)
    assert [r["completions"] for r in rows] == ["0", "1", "2-32", "1000+"]  # no context in 33-999: no row
    by = {r["completions"]: r for r in rows}
    n = 1 + 1 + 6 + 81 * 80 // 2
    assert all(r["n_contexts"] == 1 for r in rows)
    assert by["1"]["share_of_pairs"] == pytest.approx(1 / n) and by["2-32"]["share_of_pairs"] == pytest.approx(6 / n)
    assert by["1"]["share_of_squared_error"] == pytest.approx(0.4) and by["2-32"]["share_of_squared_error"] == pytest.approx(0.6)
    assert by["0"]["share_of_squared_error"] == 0 and by["1000+"]["share_of_squared_error"] == 0
    assert by["0"]["share_of_pairs"] == pytest.approx(1 / n) and by["1000+"]["share_of_pairs"] == pytest.approx(3240 / n)
    mass = 0.1 + 6 * 0.5 + 0.01 * 810 + 0.2  # 810 peer pairs i < j on the empty grid
    assert by["2-32"]["share_of_mi"] == pytest.approx(3.0 / mass)
    assert by["0"]["share_of_mi"] == pytest.approx(0.2 / mass) and by["1000+"]["share_of_mi"] == pytest.approx(8.1 / mass)
    masked = data["tokens"] == 9
    t = np.concatenate([mh.pair_values(data["mi"][b], masked[b]) for b in range(4)])
    p = np.concatenate([mh.pair_values(pred[b], masked[b]) for b in range(4)])
    fixed = p.copy()
    fixed[1:7] = t[1:7]  # the rectangle's 6 pairs come after context 0's single pair
    assert by["2-32"]["pearson_if_exact"] == pytest.approx(np.corrcoef(fixed, t)[0, 1])
    with pytest.raises(ValueError, match="no completion class holds 0"):
        mh.error_by_completions(pred, data, 9, classes=((1, 1), (2, None)))
    with pytest.raises(ValueError, match="Sudoku tokens"):
        mh.error_by_completions(pred, data, 10)
    with pytest.raises(ValueError, match="differ in shape"):
        mh.error_by_completions(pred[:2], data, 9)
    with pytest.raises(ValueError, match="do not match"):
        mh.error_by_completions(pred, {**data, "tokens": data["tokens"][:2]}, 9)
    with pytest.raises(ValueError, match="non-finite"):
        mh.error_by_completions(pred * float("nan"), data, 9)
    with pytest.raises(ValueError, match="straddles"):
        mh.error_by_completions(pred, data, 9, limit=50)


def _propagation_split(deadly_rectangle):
    """The deadly rectangle with its true marginals (labels ln 2 on its 6 pairs) and three determined cells in three
    different units (labels 0)."""
    sol, cells, rect = deadly_rectangle
    far = sol.copy()
    far[[0, 40, 80]] = 0
    grids = np.stack([rect, far])
    tokens = torch.from_numpy(np.where(grids == 0, 9, grids.astype(np.int64) - 1))
    probs = torch.zeros(2, 81, 9)
    probs[:, torch.arange(81), torch.from_numpy(sol.astype(np.int64) - 1)] = 1
    a, b = int(sol[cells[0]]) - 1, int(sol[cells[1]]) - 1
    probs[0, cells] = 0
    probs[0, cells, a] = probs[0, cells, b] = 0.5
    mi = torch.zeros(2, 81, 81)
    for i in cells:
        for j in cells:
            if i != j:
                mi[0, i, j] = math.log(2)
    return {"tokens": tokens, "mi": mi, "probs": probs}


def test_propagation_reference_chooses_on_validation_and_combines(deadly_rectangle):
    val = _propagation_split(deadly_rectangle)
    _, cells, _ = deadly_rectangle
    test = {**val, "mi": val["mi"].clone()}
    for i, j in [(0, 3), (1, 2)]:  # test labels without the diagonal: round 1 would fit them, round 2 fits validation
        test["mi"][0, cells[i], cells[j]] = test["mi"][0, cells[j], cells[i]] = 0
    head_val, head_test = 0.5 * val["mi"], 0.5 * test["mi"]
    head_val[1, 0, 40] = head_val[1, 40, 0] = 0.3  # the head errs where the reference does not
    summary, mi_test = mh.propagation_reference(val, test, 9, head_val, head_test, dampings=(1.0,), rounds=(1, 2))
    assert [(g["damping"], g["rounds"]) for g in summary["grid"]] == [(1.0, 1), (1.0, 2)]
    assert summary["grid"][0]["val_pearson"] < 0.9  # round 1 misses the rectangle's diagonal
    assert summary["grid"][1]["val_pearson"] == pytest.approx(1.0, abs=1e-4)
    assert summary["rounds"] == 2 and summary["damping"] == 1.0 and summary["top_k"] == mh.PROPAGATION_TOP_K
    assert summary["val_pearson"] == summary["grid"][1]["val_pearson"]
    assert summary["test"]["pearson"] < 0.9  # read once, at the validation choice
    w_head, w_ref, w_0 = summary["combined"]["weights"]
    assert w_ref == pytest.approx(1.0, abs=1e-3) and w_head == pytest.approx(0.0, abs=1e-3) and abs(w_0) < 1e-4
    assert summary["combined"]["val_pearson"] == pytest.approx(1.0, abs=1e-4)
    assert mi_test.shape == (2, 81, 81) and mi_test[1].abs().max() < 1e-4
    with pytest.raises(ValueError, match="probs"):
        mh.propagation_reference({k: v for k, v in val.items() if k != "probs"}, test, 9, head_val, head_test)
    with pytest.raises(ValueError, match="differ in shape"):
        mh.propagation_reference(val, test, 9, head_val[:1], head_test)
    with pytest.raises(ValueError, match="not all finite"):
        mh.propagation_reference(val, test, 9, head_val, head_test * float("nan"))


def test_propagation_cost_times_both_on_the_same_contexts():
    m = SudokuMDM(TINY).eval()
    c = mh.propagation_cost(m, damping=0.5, rounds=2, batch=2)
    assert set(c) == {"mdm_forward_s", "reference_s", "reference_over_forward"}
    assert c["mdm_forward_s"] > 0 and c["reference_s"] > 0
    assert c["reference_over_forward"] == pytest.approx(c["reference_s"] / c["mdm_forward_s"])


def test_completion_and_propagation_findings():
    rows = [{"completions": "1", "n_contexts": 1, "share_of_pairs": 0.14, "share_of_squared_error": 0.2,
             "pearson_if_exact": 0.94},
            {"completions": "2-32", "n_contexts": 14, "share_of_pairs": 0.1, "share_of_squared_error": 0.4,
             "pearson_if_exact": 0.95}]
    text = mh._completions_findings(rows)
    assert "2-32 completions: 14 contexts, 10% of the pairs, 40% of the squared error" in text
    assert "1 completion: 1 context, 14% of the pairs" in text
    assert "heaviest in contexts with 2-32 completions (40% of the squared error on 10% of the" in text
    assert "would be 0.950." in text and mh._completions_findings([]) == ""
    ref = {"damping": 0.5, "rounds": 7, "grid": [{}] * 30, "val_pearson": 0.944, "test": {"pearson": 0.948},
           "combined": {"pearson": 0.955}, "cost": {"reference_over_forward": 16.2}}
    head = {"head_over_forward": 0.225, "mdm_forward_s": 0.0016, "probing_s": 1.4}
    text = mh._propagation_findings(ref, 0.924, head)
    assert "damping 0.5 and 7 rounds chosen on" in text and "among 30 settings" in text
    assert "above the head's 0.924" in text and "at 16x one MDM forward" in text and "probing: 875x" in text
    assert "test Pearson 0.955 and reach the 0.95 target" in text
    low = mh._propagation_findings({**ref, "test": {"pearson": 0.9}, "combined": {"pearson": 0.93}}, 0.924, head)
    assert "below the head's 0.924" in low and "stay below the 0.95 target" in low
    assert mh._propagation_findings(None, 0.924, head) == ""


def test_constraint_recovery_of_graph_shaped_maps():
    data = _fake_labels()
    masked = data["tokens"] == 9
    rec = mh.constraint_recovery(data["mi"], masked)
    assert all(r["auroc"] == 1.0 for r in rec)
    rates = masked.float().mean(1).numpy()
    rows = mh.recovery_by_rate(rec, rec, rates)
    assert sum(r["n_contexts"] for r in rows) == 6 and all(r["pred_auroc"] == 1.0 for r in rows)


def test_speedup_scoring_and_tables(tmp_path):
    from mimdm.experiments import speedup as sp
    from mimdm.pipelines.zoo import grids_to_tokens

    rng = np.random.default_rng(0)
    ps = sp.hard_puzzles(3, (30, 31), rng)
    assert len(ps) == 3 and all(p.n_clues in (30, 31) for p in ps)
    sol = grids_to_tokens(np.stack([p.solution for p in ps]))
    assert sp.score_solving(sol, ps) == {"solve_rate": 1.0, "valid_rate": 1.0}
    wrong = sol.clone()
    wrong[0, :2] = wrong[0, [1, 0]] if wrong[0, 0] != wrong[0, 1] else wrong[0, :2]
    assert sp.score_solving(wrong, ps)["solve_rate"] == pytest.approx(2 / 3)
    dev, test = sp.hard_puzzle_split(3, 5, (30, 31), 7)
    assert (len(dev), len(test)) == (3, 5)
    grids = {p.puzzle.tobytes() for p in dev + test}
    assert len(grids) == 8  # disjoint, no repeats
    pool = sorted(sp.hard_puzzles(8, (30, 31), np.random.default_rng(7)), key=lambda p: p.puzzle.tobytes())
    assert grids == {p.puzzle.tobytes() for p in pool}  # the 8 hardest of the same candidates, split
    with pytest.raises(ValueError, match="n_dev and n_test must be >= 1"):
        sp.hard_puzzle_split(0, 5, (30, 31), 7)
    from dataclasses import replace

    from mimdm.app.profiles import get_profile

    P = replace(get_profile("smoke"), dev_puzzles=2, hard_puzzles=3, hard_clues=(30, 31), generation_contexts=2)
    d1, t1, g1 = sp.chapter_sets(P, seed=3, root=tmp_path)
    d2, t2, g2 = sp.chapter_sets(P, seed=3, root=tmp_path)  # from the cache: the same puzzles, solutions and ratings
    assert len(list(tmp_path.glob("puzzle_sets/*/sets.npz"))) == 1
    assert [(p.puzzle.tobytes(), p.solution.tobytes(), p.n_clues, p.difficulty) for p in d1 + t1] == \
        [(p.puzzle.tobytes(), p.solution.tobytes(), p.n_clues, p.difficulty) for p in d2 + t2] and (g1 == g2).all()
    assert not d2[0].puzzle.flags.writeable
    d3, t3, _ = sp.chapter_sets(P, seed=3, root=tmp_path / "fresh")  # made again: the same sets
    assert [p.puzzle.tobytes() for p in d3 + t3] == [p.puzzle.tobytes() for p in d1 + t1]
    assert (len(d1), len(t1), len(g1)) == (2, 3, 2) and not {p.puzzle.tobytes() for p in d1} & {p.puzzle.tobytes() for p in t1}
    torch.manual_seed(0)
    untrained = SudokuMDM(SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    ref = sp.sequential_solve_rate(untrained, t1)  # a random model solves none; sequential: one pass per blank
    assert ref["n"] == 3 and ref["solve_rate"] == 0.0 and (ref["ci_low"], ref["ci_high"]) == sp.rate_interval(0.0, 3)
    assert ref["nfe"] == pytest.approx(np.mean([81 - p.n_clues for p in t1]))
    ctx = sp.generation_contexts(4, 3, rng)
    assert ((ctx > 0).sum(1) <= 3).all()
    g = sp.score_generation(grids_to_tokens(sd.random_solutions(4, rng)), np.zeros((4, 81), np.int8))
    assert g["valid_rate"] == 1.0 and g["distinct_valid"] == 1.0 and 0.5 < g["mean_hamming"] <= 1.0
    rows = [{"rule": "sequential", "knob": float("nan"), "nfe": 50, "seconds": 1.0, "solve_rate": 0.9},
            {"rule": "top-k", "knob": 2, "nfe": 25, "seconds": 0.5, "solve_rate": 0.895},
            {"rule": "top-k", "knob": 4, "nfe": 13, "seconds": 0.25, "solve_rate": 0.7},
            {"rule": "EB-sampler", "knob": 0.1, "nfe": 30, "seconds": 0.7, "solve_rate": 0.5}]
    m = {r["rule"]: r for r in sp.matched_quality(rows, "solve_rate", 0.01)}
    assert m["top-k"]["knob"] == 2 and m["top-k"]["nfe_reduction"] == 2.0
    assert np.isnan(m["EB-sampler"]["nfe"])
    q = sp.quality_at_budget(rows, "solve_rate", [13, 30])
    assert q[0]["top-k"] == 0.7 and np.isnan(q[0]["EB-sampler"]) and q[1]["top-k"] == 0.895


def test_pareto_front_oracle_gap_and_capped_rules():
    import math

    from mimdm.experiments import speedup as sp
    from mimdm.sampling.decoding import MIGuided

    rows = [{"rule": "MI-guided", "knob": e, "entropy_cap": c, "nfe": n, "solve_rate": q}
            for e, c, n, q in [(0.01, 0.3, 20, 0.5), (0.03, 0.3, 18, 0.5), (0.01, 0.5, 15, 0.3), (0.1, 0.5, 16, 0.2),
                               (0.01, None, 8, 0.0), (0.1, 1.0, 9, float("nan"))]]
    front = sp.pareto_front(rows, "solve_rate")
    assert [(r["knob"], r["entropy_cap"]) for r in front] == [(0.01, None), (0.01, 0.5), (0.03, 0.3)]
    nll = [{"nfe": n, "nll": v} for n, v in [(10, 90.0), (12, 95.0), (15, 70.0), (20, 71.0), (30, 60.0)]]
    assert [r["nfe"] for r in sp.pareto_front(nll, "nll", higher_is_better=False)] == [10, 15, 30]
    orc = [{**r, "rule": "MI-oracle", "solve_rate": r["solve_rate"] + 0.1, "nfe": r["nfe"] - 1} for r in rows[:3]]
    gap = sp.oracle_gap(rows + orc, "solve_rate")
    assert [(g["eps"], g["entropy_cap"]) for g in gap] == [(0.01, 0.3), (0.03, 0.3), (0.01, 0.5)]
    assert all(g["solve_rate_gap"] == pytest.approx(0.1) and g["nfe_gap"] == 1 for g in gap)
    grid = sp.rule_grid(head=object(), knobs={"MI-guided": [(0.01, 0.3), (0.1, math.inf)], "entropy cap": [0.5]})
    mi = [(n, k, r.entropy_cap) for n, k, r in grid if isinstance(r, MIGuided)]
    assert mi == [("entropy cap", 0.5, 0.5), ("MI-guided", 0.01, 0.3), ("MI-guided", 0.1, math.inf)]
    assert sp.entropy_cap_of(grid[-2][2]) == 0.3 and sp.entropy_cap_of(grid[-1][2]) is None
    assert [n for n, _, _ in sp.rule_grid(knobs={"entropy cap": [0.5]})][-1] == "entropy cap"  # no head needed
    with pytest.raises(ValueError, match=r"\(eps, entropy cap\) pairs"):
        sp.rule_grid(head=object(), knobs={"MI-guided": [0.01]})


def test_rate_interval_is_the_wilson_interval_and_generation_grid_is_a_subset():
    import math

    from mimdm.experiments import speedup as sp

    # Wilson interval by its closed form: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    p, n, z = 0.345, 200, 1.959963984540054
    c, h = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = sp.rate_interval(p, n)
    assert lo == pytest.approx((c - h) / (1 + z * z / n), abs=1e-9) and hi == pytest.approx((c + h) / (1 + z * z / n), abs=1e-9)
    assert sp.rate_interval(0.0, 10)[0] == 0.0 and sp.rate_interval(1.0, 10)[1] == pytest.approx(1.0)
    for bad in [(0.5, 0), (1.5, 10), (-0.1, 10)]:
        with pytest.raises(ValueError, match="must be"):
            sp.rate_interval(*bad)
    with pytest.raises(ValueError, match="confidence"):
        sp.rate_interval(0.5, 10, confidence=1.0)
    assert set(sp.GENERATION_MI_SETTINGS) <= set(sp.MI_SETTINGS)
    assert [e for e, c in sp.GENERATION_MI_SETTINGS if math.isinf(c)] == [e for e, c in sp.MI_SETTINGS if math.isinf(c)]


def test_entropy_cap_control_costs_no_head_pass_and_equals_the_capped_rule_without_mi():
    import math

    from mimdm.heads.mi_head import MIHead, MIHeadConfig
    from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
    from mimdm.sampling.decoding import MIGuided, decode, head_mi_fn, zero_mi_fn

    torch.manual_seed(0)
    model = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
    head = MIHead(MIHeadConfig(32, d_hidden=16, rank=8)).eval()
    x = torch.full((3, 81), model.mask_id)
    x[:, :20] = torch.randint(0, 9, (3, 20))
    ctrl = decode(model, x, MIGuided(zero_mi_fn(), eps=0.0, entropy_cap=1.5))
    same = decode(model, x, MIGuided(head_mi_fn(head), eps=math.inf, entropy_cap=1.5))
    assert torch.equal(ctrl.tokens, same.tokens) and torch.equal(ctrl.nfe, same.nfe)
    assert ctrl.extra_passes.get("head_passes", 0) == 0 and same.extra_passes["head_passes"] > 0


def test_paired_comparison_mcnemar_and_bootstrap_interval():
    import math

    from mimdm.experiments import speedup as sp

    # 200 items: a right and b wrong on 12, the reverse on 4, both agree on the rest
    a = np.r_[np.ones(12), np.zeros(4), np.ones(60), np.zeros(124)].astype(int)
    b = np.r_[np.zeros(12), np.ones(4), np.ones(60), np.zeros(124)].astype(int)
    c = sp.paired_comparison(a, b)
    assert (c["a_only"], c["b_only"], c["n"]) == (12, 4, 200) and c["difference"] == pytest.approx(8 / 200)
    # exact McNemar: two-sided binomial tail of 12 of 16 discordant at p = 1/2
    tail = sum(math.comb(16, k) for k in range(12, 17)) / 2 ** 16
    assert c["mcnemar_p"] == pytest.approx(2 * tail, rel=1e-9)
    # the bootstrap interval agrees with the large-sample (Wald) interval of a paired difference
    d, n = 8 / 200, 200
    half = 1.959964 * math.sqrt((16 / n - d * d) / n)
    assert c["ci_low"] == pytest.approx(d - half, abs=0.01) and c["ci_high"] == pytest.approx(d + half, abs=0.01)
    assert sp.paired_comparison(a, b) == c  # seeded
    assert np.isnan(sp.paired_comparison(a, b, interval=False)["ci_low"])
    assert sp.paired_comparison(a, b, interval=False)["mcnemar_p"] == c["mcnemar_p"]
    one = sp.paired_comparison([1], [0])  # one item: a test but no interval
    assert one["mcnemar_p"] == 1.0 and np.isnan(one["ci_high"])
    same = sp.paired_comparison(a, a)
    assert (same["difference"], same["ci_low"], same["ci_high"], same["mcnemar_p"]) == (0.0, 0.0, 0.0, 1.0)
    for bad in [(a, b[:-1]), (a[:0], b[:0]), (a * 2, b)]:
        with pytest.raises(ValueError, match="outcome|0/1"):
            sp.paired_comparison(*bad)


def test_per_item_outcomes_feed_paired_matched_and_oracle_rows():
    from mimdm.experiments import speedup as sp
    from mimdm.pipelines.zoo import grids_to_tokens

    rng = np.random.default_rng(1)
    ps = sp.hard_puzzles(3, (30, 31), rng)
    sol = grids_to_tokens(np.stack([p.solution for p in ps]))
    sol[1, 0] = sol[1, 1]  # puzzle 1 wrong
    s = sp.score_solving(sol, ps, per_item=True)
    assert s[sp.items_key("solve_rate")].tolist() == [1, 0, 1] and s["solve_rate"] == pytest.approx(2 / 3)
    g = sp.score_generation(sol, np.zeros((3, 81), np.int8), per_item=True)
    assert g[sp.items_key("valid_rate")].tolist() == [1, 0, 1]
    K = sp.items_key("solve_rate")
    seq = np.r_[np.ones(10), np.zeros(10)].astype(np.int8)
    fast = seq.copy(); fast[0] = 0  # one puzzle lost: 5 points below on 20 items
    rows = [{"rule": "sequential", "knob": float("nan"), "nfe": 50, "seconds": 1.0, "solve_rate": 0.5, K: seq},
            {"rule": "top-k", "knob": 2, "nfe": 25, "seconds": 0.5, "solve_rate": 0.45, K: fast},
            {"rule": "EB-sampler", "knob": 0.1, "nfe": 30, "seconds": 0.7, "solve_rate": 0.1, K: seq * 0}]
    m = {r["rule"]: r for r in sp.matched_quality(rows, "solve_rate", 0.05)}
    assert m["top-k"]["paired_difference"] == pytest.approx(-0.05) and m["top-k"]["mcnemar_p"] == pytest.approx(1.0)
    assert m["top-k"]["paired_ci_low"] < -0.0 <= m["top-k"]["paired_ci_high"]
    assert np.isnan(m["EB-sampler"]["mcnemar_p"])
    no_items = [rows[0], {k: v for k, v in rows[1].items() if k != K}]  # a rule scored without per-item outcomes
    assert np.isnan(sp.matched_quality(no_items, "solve_rate", 0.05)[0]["mcnemar_p"])
    assert "mcnemar_p" not in sp.matched_quality([{**r, "neg": -r["nfe"]} for r in rows], "neg", 1.0)[0]  # other metric: unpaired
    assert all(K not in r for r in sp.drop_items(rows)) and K in rows[0]
    orc = [{"rule": r, "knob": 0.01, "entropy_cap": 0.3, "nfe": 10, "solve_rate": v.mean(), K: v}
           for r, v in [("MI-guided", seq), ("MI-oracle", np.r_[np.ones(16), np.zeros(4)].astype(np.int8))]]
    gap = sp.oracle_gap(orc, "solve_rate")
    assert gap[0]["solve_rate_gap"] == pytest.approx(0.3) and gap[0]["mcnemar_p"] == pytest.approx(2 / 2 ** 6)


def test_nfe_reduction_interval_is_paired_over_items():
    from mimdm.experiments import speedup as sp

    # one item costs sequential 100 passes and the rule 10, the others 50 and 25: the ratio of means moves with
    # how often the first item is drawn; pairing keeps each item's two costs together
    ref, rule = np.array([100.0] + [50.0] * 9), np.array([10.0] + [25.0] * 9)
    lo, hi = sp.nfe_reduction_interval(ref, rule, seed=1)
    ratio = ref.mean() / rule.mean()
    assert lo < ratio < hi and lo >= 2.0 - 1e-9 and hi <= 100 / 10
    assert sp.nfe_reduction_interval(ref, rule, seed=1) == (lo, hi)  # seeded
    # perfectly proportional costs: every resample gives the same ratio
    assert sp.nfe_reduction_interval(ref, ref / 2.5, seed=1) == pytest.approx((2.5, 2.5))
    assert all(math.isnan(x) for x in sp.nfe_reduction_interval([60.0], [15.0]))
    with pytest.raises(ValueError, match="positive"):
        sp.nfe_reduction_interval([60.0, 0.0], [15.0, 15.0])
    with pytest.raises(ValueError, match="one length"):
        sp.nfe_reduction_interval([60.0, 50.0], [15.0])


def test_settings_chosen_on_dev_are_reported_on_held_out_items():
    from mimdm.experiments import speedup as sp

    nan = float("nan")

    def row(rule, knob, nfe, rate, cap=None, budget=None, seconds=None):
        return {"rule": rule, "knob": knob, "entropy_cap": cap, "mi_budget": budget, "nfe": nfe, "solve_rate": rate,
                "seconds": seconds or nfe / 100}

    dev = [row("sequential", nan, 60, 0.80), row("top-k", 2, 30, 0.79), row("top-k", 4, 15, 0.60),
           row("MI-guided", 0.01, 20, 0.80, cap=0.3), row("MI-guided", 0.03, 12, 0.795, cap=0.3),
           row("MI-guided", 0.03, 12, 0.70, cap=None), row("threshold", 0.5, 10, 0.2)]
    sel = sp.select_on_dev(dev, "solve_rate")
    assert [(s["rule"], s["knob"], s["entropy_cap"], s["dev_nfe"]) for s in sel[1:]] == \
        [("top-k", 2, None, 30), ("MI-guided", 0.03, 0.3, 12)]  # threshold never matches: left out
    assert sel[0]["rule"] == "sequential" and sel[0]["dev_solve_rate"] == 0.80
    grid = sp.rule_grid(head=object(), knobs={"top-k": [2, 4], "MI-guided": [(0.03, 0.3), (0.03, float("inf"))]})
    chosen = sp.chosen_rules(sel, grid)
    assert [(n, k) for n, k, _ in chosen] == [("sequential", sel[0]["knob"]), ("top-k", 2), ("MI-guided", 0.03)]
    assert chosen[2][2].entropy_cap == 0.3
    with pytest.raises(ValueError, match="chosen on the development set is not in the rule grid"):
        sp.chosen_rules(sel, sp.rule_grid(knobs={"top-k": [4]}))
    # held out: 10 puzzles; sequential solves 8, top-k(2) the same 8, MI-guided 7 of them
    ik = sp.items_key("solve_rate")
    s_items = np.array([1] * 8 + [0] * 2, np.int8)
    test = [{**row("sequential", nan, 60, 0.8), ik: s_items}, {**row("top-k", 2, 30, 0.8), ik: s_items.copy()},
            {**row("MI-guided", 0.03, 15, 0.7, cap=0.3, seconds=0.3), ik: np.array([1] * 7 + [0] * 3, np.int8)}]
    rep = sp.report_held_out(test, "solve_rate")
    assert [r["nfe_reduction"] for r in rep] == [1.0, 2.0, 4.0]
    assert rep[2]["wallclock_reduction"] == pytest.approx(0.6 / 0.3)
    assert rep[1]["paired_difference"] == 0 and rep[1]["mcnemar_p"] == 1.0
    assert rep[2]["paired_difference"] == pytest.approx(-0.1) and rep[2]["mcnemar_p"] == 1.0  # 1 discordant item
    lo, hi = sp.rate_interval(0.8, 10)
    assert (rep[0]["solve_rate_ci_low"], rep[0]["solve_rate_ci_high"]) == (lo, hi) and rep[0]["n"] == 10
    gen = [{"rule": "MI-guided", "nfe_reduction": 2.5, "wallclock_reduction": 2.0}]
    hl = sp.speedup_headline(rep, gen)
    assert tuple(hl) == sp.HEADLINE_KEYS
    assert (hl["n_hard"], hl["sequential_hard_solve_rate"], hl["mi_guided_nfe_reduction_hard"]) == (10, 0.8, 4.0)
    assert hl["mi_guided_wallclock_reduction_hard"] == pytest.approx(2.0) and math.isnan(hl["entropy_cap_nfe_reduction_hard"])
    assert (hl["mi_guided_nfe_reduction_generation"], hl["mi_guided_wallclock_reduction_generation"]) == (2.5, 2.0)
    with pytest.raises(ValueError, match="sequential decoding as the reference"):
        sp.speedup_headline(rep[1:], gen)
    text = sp.held_out_verdict(rep)
    assert "On 10 held-out hard puzzles" in text and "needs 4.00× fewer passes" in text and "within the paper's 3-5×" in text
    assert "70.0% against sequential's 80.0% (-10.0 points" in text and "not detectably lower" in text  # 1 discordant
    assert "wall-clock 2.00×, less than 0.8 of the NFE reduction" in text
    assert "entropy cap had no matched setting" in text
    assert "trades passes for solve rate against top-k (15.0 vs 30.0 passes, 70.0% vs 80.0% solved)" in text
    beaten = [{**r, "solve_rate": 0.8} if r["rule"] == "MI-guided" else r for r in rep]
    assert "beats top-k (15.0 vs 30.0 passes" in sp.held_out_verdict(beaten)
    assert "no setting was carried" in sp.held_out_verdict(rep[:2])
    worse = [{**r, "paired_ci_high": -0.02} if r["rule"] == "MI-guided" else r for r in rep]
    assert "to -2.0: lower)" in sp.held_out_verdict(worse)
    assert math.isnan(rep[2]["nfe_reduction_ci_low"])  # rows without per-item NFE
    nfe_rep = sp.report_held_out([{**test[0], "nfe_items": np.full(10, 60.0)},
                                  {**test[2], "nfe_items": np.full(10, 15.0)}], "solve_rate")
    assert (nfe_rep[1]["nfe_reduction_ci_low"], nfe_rep[1]["nfe_reduction_ci_high"]) == (4.0, 4.0)
    assert "4.00× fewer passes than sequential decoding (paired 95% interval 4.00-4.00×)" in sp.held_out_verdict(nfe_rep)
    assert math.isnan(rep[2]["wallclock_reduction_low"])  # rows without timing rounds
    rounds = sp.report_held_out([{**test[0], "seconds_rounds": [0.6, 0.9, 0.3]},
                                 {**test[2], "seconds_rounds": [0.3, 0.2, 0.3]}], "solve_rate")
    assert (rounds[1]["wallclock_reduction_low"], rounds[1]["wallclock_reduction_high"]) == (1.0, 4.5)
    assert "wall-clock 2.00× (median timing round; rounds 1.00-4.50×)" in sp.held_out_verdict(rounds)
    with pytest.raises(ValueError, match="per-item outcomes"):
        sp.report_held_out([row("sequential", nan, 60, 0.8)], "solve_rate")
    with pytest.raises(ValueError, match="sequential decoding as the reference"):
        sp.report_held_out(test[1:], "solve_rate")


def _committed_findings(notebook: str, marker: str) -> str:
    """The one Markdown output of a committed chapter that contains ``marker``."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "book" / notebook).read_text())
    shown = ["".join(o["data"]["text/markdown"]) for c in nb["cells"] if c["cell_type"] == "code"
             for o in c.get("outputs", []) if marker in "".join(o.get("data", {}).get("text/markdown", ""))]
    assert len(shown) == 1
    return shown[0]


def _committed_results(name: str) -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "book" / "results" / f"{name}.json").read_text())


def test_chapter_findings_are_those_of_their_committed_results():
    """Each committed chapter's findings cell shows exactly what its `findings_markdown` says of the committed
    results file (so the verdicts are computed, tested code, and the chapter and its results agree)."""
    from mimdm.experiments import ground_truth as gt
    from mimdm.experiments import likelihood as lk
    from mimdm.experiments import mi_head as mh
    from mimdm.experiments import speedup as sp

    res = _committed_results("speedup")
    assert sp.findings_markdown(res["values"], res["config"]["oracle_puzzles"]) == \
        _committed_findings("05_speedup_analysis.ipynb", "**Reference.**")
    res = _committed_results("ground_truth_mi")
    assert gt.findings_markdown(res["values"], res["config"]["prune_deltas"]) == \
        _committed_findings("01_ground_truth_mi.ipynb", "**Probing is exact.**")
    res = _committed_results("estimator_accuracy")
    assert mh.estimator_findings_markdown(res["values"]) == \
        _committed_findings("02_estimator_accuracy.ipynb", "**Accuracy.**")
    res = _committed_results("sudoku_constraints")
    assert mh.constraint_findings_markdown(res["values"]) == \
        _committed_findings("03_sudoku_constraints.ipynb", "**Heavily masked grids**")
    res = _committed_results("likelihood")
    assert lk.findings_markdown(res["values"], res["config"]["likelihood_draws"]) == \
        _committed_findings("06_likelihood.ipynb", "**Coupled ratios.**")


def test_sweep_figures_draw_each_rule_in_its_colour_with_its_frontier():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mimdm.experiments.plotting import RULE_COLORS, plot_nfe_sweep, plot_pareto_sweep

    rows = [{"rule": "sequential", "nfe": 50.0, "solve_rate": 0.9},
            {"rule": "MI-guided", "nfe": 10.0, "solve_rate": 0.7}, {"rule": "MI-guided", "nfe": 20.0, "solve_rate": 0.6},
            {"rule": "MI-guided", "nfe": 30.0, "solve_rate": 0.85}]
    fig, ax = plt.subplots()
    plot_pareto_sweep(rows, "solve_rate", ax)
    lines = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    assert set(lines) == {"sequential", "MI-guided"}
    assert lines["MI-guided"].get_color() == RULE_COLORS["MI-guided"]
    assert list(lines["MI-guided"].get_xdata()) == [10.0, 30.0]  # (20, 0.6) is dominated: not on the frontier
    assert ax.get_ylabel() == "puzzles solved (fraction)"
    fig2, ax2 = plt.subplots()
    plot_nfe_sweep(rows, "solve_rate", ax2)
    assert ax2.get_xscale() == "log" and [ln.get_color() for ln in ax2.lines] == ["black", RULE_COLORS["MI-guided"]]
    from mimdm.experiments.plotting import plot_held_out

    held = [{"rule": "sequential", "nfe": 50.0, "solve_rate": 0.9, "solve_rate_ci_low": 0.8, "solve_rate_ci_high": 0.95},
            {"rule": "MI-guided", "nfe": 12.0, "solve_rate": 0.85, "solve_rate_ci_low": 0.7, "solve_rate_ci_high": 0.9}]
    fig3, ax3 = plt.subplots()
    plot_held_out({"yours": held, "study": held[:1]}, "solve_rate", ax3)
    legend = [t.get_text() for t in ax3.get_legend().get_texts()]
    assert legend == ["yours", "study", "sequential", "MI-guided"] and ax3.get_xscale() == "log"
    bars = [c for c in ax3.containers]  # one error bar per row: three
    assert len(bars) == 3 and bars[1].lines[0].get_color() == RULE_COLORS["MI-guided"]
    assert list(bars[1].lines[0].get_xdata()) == [12.0] and list(bars[1].lines[0].get_ydata()) == [0.85]
    plt.close("all")


def test_book_table_shows_short_headers_intervals_and_missing_values():
    import re

    from mimdm.experiments.plotting import book_table

    rows = [{"rule": "sequential", "knob": None, "entropy_cap": float("nan"), "solve_rate": 0.803,
             "solve_rate_ci_low": 0.777, "solve_rate_ci_high": 0.8264, "nfe": 56.14, "n": 1000},
            {"rule": "MI-guided", "knob": 0.0001, "entropy_cap": 0.3, "solve_rate": 0.787,
             "solve_rate_ci_low": float("nan"), "solve_rate_ci_high": 0.8, "nfe": 10.8, "n": 1000}]
    t = book_table(rows, ["rule", "knob", "entropy_cap", "solve_rate", "nfe", "n"],
                   {"solve_rate": ("solve_rate_ci_low", "solve_rate_ci_high")})
    cells = re.findall(r">([^<>]*)</t[dh]>", t.to_html())
    assert cells == ["rule", "knob", "cap (nats)", "solved", "NFE", "n",
                     "sequential", "–", "–", "0.803 (0.777–0.826)", "56.1", "1000",
                     "MI-guided", "0.0001", "0.3", "0.787", "10.8", "1000"]
    assert "row_heading" not in t.to_html()  # no index column
    assert list(book_table(rows, digits=2).data.columns)[:4] == ["rule", "knob", "cap (nats)", "solved"]
    with pytest.raises(KeyError, match="nfe_reduction"):
        book_table(rows, ["rule", "nfe_reduction"])
    with pytest.raises(KeyError, match="paired_ci_low"):
        book_table(rows, ["rule"], {"solve_rate": ("paired_ci_low", "solve_rate_ci_high")})
