import math

import numpy as np
import pytest
import torch

from mimdm.core.information import pairwise_mi
from mimdm.data import sudoku as sd
from mimdm.evaluation.metrics import correlation, graph_recovery, masked_pairs
from mimdm.models.oracle import TableJointMDM, potts_chain_log_joint
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.probing.exact import probe_mi
from mimdm.probing.sudoku_mi import EMPTY_GRID_UNIT_MI, data_mi, masked_contexts, sample_data_mi


@pytest.fixture(scope="module")
def potts():
    return TableJointMDM.from_table(potts_chain_log_joint(6, 3, coupling=1.5, generator=torch.Generator().manual_seed(1)))


def _contexts(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    L, V = model.max_len, model.n_values
    x = torch.randint(0, V, (n, L), generator=g)
    masked = torch.rand(n, L, generator=g) < 0.6
    masked[:, :2] = True
    return x.masked_fill(masked, model.mask_id)


def test_probing_equals_exact_conditional_mi_on_oracle(potts):
    x = _contexts(potts, 12, 0)
    res = probe_mi(potts, x)
    for b in range(len(x)):
        exact = potts.exact_mi(x[b])
        assert (res.mi[b] - exact).abs().max() < 1e-6
        assert res.asymmetry[b].max() < 1e-9  # one joint: I_{j->i} = I_{i->j}
    assert res.mi.max() > 0.05  # the check is not vacuous: real dependence is present


def test_probing_runs_in_fp32_unless_told_otherwise():
    """A model set to bf16 (here: the attribute, with bf16 autocast on the CPU) or an enclosing autocast context
    is probed in fp32 by default, its setting restored; precision=None keeps bf16, which perturbs the MI."""
    torch.manual_seed(0)
    m = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
    x = grids_to_tokens(sd.make_puzzles(2, (40, 44), np.random.default_rng(1))[0].puzzle[None])
    ref = probe_mi(m, x).mi
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(probe_mi(m, x).mi, ref)
        low_ctx = probe_mi(m, x, precision=None).mi
    m.precision = "bf16"
    try:
        assert torch.equal(probe_mi(m, x).mi, ref) and m.precision == "bf16"
        low = probe_mi(m, x, precision=None).mi
    finally:
        m.precision = "fp32"
    assert not torch.equal(low, ref) and not torch.equal(low_ctx, ref)
    with pytest.raises(ValueError, match="precision"):
        probe_mi(m, x, precision="fp16")
    with pytest.raises(RuntimeError, match="CUDA"):
        probe_mi(m, x, precision="bf16")


def test_probing_a_subset_gives_the_same_mi_between_its_positions_for_fewer_passes(potts):
    x = _contexts(potts, 16, 3)
    full = probe_mi(potts, x)
    sub = full.masked & (torch.rand(x.shape, generator=torch.Generator().manual_seed(4)) < 0.6)
    res = probe_mi(potts, x, positions_BL=sub)
    pair = sub[:, :, None] & sub[:, None, :]
    assert full.mi[pair].max() > 0.05  # real dependence between the kept positions
    assert torch.allclose(res.mi[pair], full.mi[pair], rtol=0, atol=1e-12)
    assert (res.mi[~pair] == 0).all()  # nothing read outside the subset
    assert torch.equal(res.n_values, full.n_values * sub)
    assert torch.equal(res.nfe, 1 + res.n_values.sum(1)) and (res.nfe < full.nfe).any()
    assert torch.equal(res.entropy, full.entropy) and torch.equal(res.masked, full.masked)
    one = probe_mi(potts, x[0], positions_BL=sub[0])  # a single context as [L]
    assert torch.allclose(one.mi[0], res.mi[0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="not masked"):
        probe_mi(potts, x, positions_BL=sub | ~full.masked)
    with pytest.raises(ValueError, match="must match"):
        probe_mi(potts, x, positions_BL=sub[:, :3])


def test_given_base_log_probs_replace_the_first_pass(potts):
    """A decoding step's own log-probabilities stand in for probing's first pass: same MI, one pass fewer."""
    x = _contexts(potts, 6, 5)
    full = probe_mi(potts, x)
    reused = probe_mi(potts, x, base_log_probs=potts.log_probs(x))
    assert torch.allclose(reused.mi, full.mi, rtol=0, atol=1e-12)
    # the given log-probabilities are the marginals used (not a rerun pass): a tempered base shows through
    tempered = torch.log_softmax(potts.log_probs(x) * 0.5, -1)
    assert torch.allclose(probe_mi(potts, x, base_log_probs=tempered).marginals, tempered.exp() * full.masked[..., None],
                          rtol=0, atol=1e-12)
    assert torch.equal(reused.n_values, full.n_values) and torch.equal(reused.nfe, full.nfe - 1)
    one = probe_mi(potts, x[0], base_log_probs=potts.log_probs(x[:1])[0])  # a single context as [L] and [L, V]
    assert torch.allclose(one.mi[0], full.mi[0], rtol=0, atol=1e-12) and one.nfe.item() == full.nfe[0].item() - 1
    with pytest.raises(ValueError, match=r"base_log_probs has shape \(6, 6\)"):
        probe_mi(potts, x, base_log_probs=potts.log_probs(x)[..., 0])


def test_an_inconsistent_model_has_directed_mi_that_disagrees():
    """A random-init Sudoku MDM is no joint distribution: I_{j->i} != I_{i->j}; mi is their mean, asymmetry the gap."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)).double().eval()  # float64: exact to 1e-12
    x = grids_to_tokens(np.stack([sd.random_partial(g, 70, np.random.default_rng(0)) for g in sd.random_solutions(2, 0)]))
    res = probe_mi(model, x)
    pair = res.masked[:, :, None] & res.masked[:, None, :]
    assert res.asymmetry[pair].max() > 1e-6 and (res.asymmetry[~pair] == 0).all()

    def by_hand(b, j, i):  # I_{j->i}: fill j with each value v, read p(x_i | c, x_j = v), mix by p(x_j = v | c)
        with torch.no_grad():
            w = model.log_probs(x[b:b + 1])[0, j].double().exp()
            filled = x[b].repeat(model.n_values, 1)
            filled[:, j] = model.value_token_ids
            p = model.log_probs(filled)[:, i].double().exp()  # [V(v), V(x_i)]
        mix = (w[:, None] * p).sum(0)
        return float((w * (p * (p / mix).log()).sum(-1)).sum())

    j, i = torch.nonzero(res.masked[1]).squeeze(1)[[0, 5]].tolist()
    ji, ij = by_hand(1, j, i), by_hand(1, i, j)
    assert res.directed[1, j, i].item() == pytest.approx(ji, rel=1e-9, abs=1e-15)
    assert res.directed[1, i, j].item() == pytest.approx(ij, rel=1e-9, abs=1e-15)
    assert res.mi[1, j, i].item() == pytest.approx((ji + ij) / 2, rel=1e-9, abs=1e-15)
    assert res.asymmetry[1, i, j].item() == pytest.approx(abs(ji - ij), rel=1e-6, abs=1e-15) and abs(ji - ij) > 1e-9


def test_exact_mi_closed_form_for_two_copies():
    """X1 = X2 uniform over V values and independent X3: I(X1;X2) = ln V, others 0."""
    V = 4
    states = torch.tensor([[a, a, c] for a in range(V) for c in range(V)])
    oracle = TableJointMDM.from_samples(states, V)
    res = probe_mi(oracle, torch.full((1, 3), V))
    assert res.mi[0, 0, 1].item() == pytest.approx(math.log(V), abs=1e-9)
    assert res.mi[0, 0, 2].item() == pytest.approx(0.0, abs=1e-12)
    assert res.nfe.item() == 1 + 3 * V


def test_mi_properties_and_nfe(potts):
    x = _contexts(potts, 8, 1)
    res = probe_mi(potts, x)
    mi = res.mi
    assert torch.isfinite(mi).all() and (mi >= 0).all()
    assert torch.allclose(mi, mi.transpose(1, 2))
    assert (torch.diagonal(mi, dim1=1, dim2=2) == 0).all()
    unmasked = ~res.masked
    assert (mi[unmasked[:, :, None].expand_as(mi)] == 0).all()
    # every probable value probed: NFE = 1 + Σ_j (#values with p > 0)
    assert torch.equal(res.nfe, 1 + res.n_values.sum(1))
    assert torch.equal(res.n_values, res.masked.long() * 3)
    ent = res.entropy
    assert ((ent >= 0) & (ent <= math.log(3) + 1e-9)).all() and (ent[unmasked] == 0).all()


def test_batching_does_not_change_results(potts):
    x = _contexts(potts, 5, 2)
    a = probe_mi(potts, x, batch_tokens=6)  # one row per pass
    b = probe_mi(potts, x, batch_tokens=10_000)
    c = torch.stack([probe_mi(potts, x[i]).mi[0] for i in range(len(x))])
    assert torch.allclose(a.mi, b.mi, atol=1e-12) and torch.allclose(b.mi, c, atol=1e-12)
    d = probe_mi(potts, x, batch_tokens="auto")  # CPU: 512 rows per pass
    assert torch.allclose(d.mi, b.mi, atol=1e-12)
    for bad in (0, "big"):
        with pytest.raises(ValueError, match="batch_tokens must be >= 1 or 'auto'"):
            probe_mi(potts, x, batch_tokens=bad)


def test_pruning_keeps_the_smallest_top_set_and_matches_hand_computation():
    """Two binary-ish positions: X1 ~ (0.7, 0.2, 0.1), X2 = X1. With delta=0.25 only values {0, 1}
    of each are probed (mass 0.9 >= 0.75, while {0} alone has 0.7 < 0.75); renormalised weights
    (7/9, 2/9) and X2 determined by X1 give I = H(7/9, 2/9)."""
    states = torch.tensor([[0, 0], [1, 1], [2, 2]])
    oracle = TableJointMDM(states, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64).log(), 3)
    res = probe_mi(oracle, torch.full((1, 2), 3), delta=0.25)
    assert res.n_values[0].tolist() == [2, 2] and res.nfe.item() == 1 + 4
    w = torch.tensor([7 / 9, 2 / 9], dtype=torch.float64)
    assert res.mi[0, 0, 1].item() == pytest.approx(float(-(w * w.log()).sum()), abs=1e-12)
    full = probe_mi(oracle, torch.full((1, 2), 3))
    assert full.nfe.item() == 7
    h = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    assert full.mi[0, 0, 1].item() == pytest.approx(float(-(h * h.log()).sum()), abs=1e-12)


def test_pruning_reduces_nfe_with_small_error(potts):
    x = _contexts(potts, 6, 3)
    full = probe_mi(potts, x)
    pr = probe_mi(potts, x, delta=0.05)
    assert (pr.nfe <= full.nfe).all() and pr.nfe.sum() < full.nfe.sum()
    assert (pr.mi - full.mi).abs().max() < 0.05


def test_probe_errors(potts):
    with pytest.raises(ValueError, match="delta"):
        probe_mi(potts, torch.full((1, 6), 3), delta=1.0)
    with pytest.raises(ValueError, match="exceeds the model's maximum"):
        probe_mi(potts, torch.full((1, 7), 3))


def test_probing_a_sudoku_completion_oracle_equals_data_mi():
    """Oracle = uniform over the completions of a partial grid: probing reproduces the data MI exactly."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        grid = sd.random_partial(sd.random_solutions(1, rng)[0], 40, rng)
        comps = sd.enumerate_completions(grid, max_solutions=5000)
        if 3 <= len(comps) <= 2000:
            break
    else:
        pytest.fail("no grid with a few completions found")
    dmi, k = data_mi(grid)
    assert k == len(comps)
    oracle = TableJointMDM.from_samples(torch.from_numpy(comps.astype(np.int64) - 1), 9)
    x = torch.from_numpy(np.where(grid == 0, 9, grid.astype(np.int64) - 1))[None]
    res = probe_mi(oracle, x, batch_tokens=81 * 64)
    assert (res.mi[0] - dmi).abs().max() < 1e-6
    assert dmi.max() > 0.1


def test_data_mi_of_deadly_pattern_is_ln2():
    """Two completions differing by a swapped rectangle: the 4 blank cells are perfectly coupled."""
    sol = sd.random_solutions(1, np.random.default_rng(0))[0].copy()
    g = sol.reshape(9, 9)
    # find rows r1, r2 in the same band and columns c1, c2 in different stacks with g[r1,c1]=g[r2,c2], g[r1,c2]=g[r2,c1]
    found = None
    for r1 in range(9):
        for r2 in range(r1 + 1, (r1 // 3) * 3 + 3):
            for c1 in range(9):
                for c2 in range(c1 + 1, 9):
                    if c1 // 3 != c2 // 3 and g[r1, c1] == g[r2, c2] and g[r1, c2] == g[r2, c1]:
                        found = (r1, r2, c1, c2)
    if found is None:
        pytest.skip("no unavoidable rectangle in this grid")
    r1, r2, c1, c2 = found
    grid = sol.copy()
    cells = [9 * r1 + c1, 9 * r1 + c2, 9 * r2 + c1, 9 * r2 + c2]
    grid[cells] = 0
    mi, k = data_mi(grid)
    assert k == 2
    for a in cells:
        for b in cells:
            assert mi[a, b].item() == pytest.approx(0.0 if a == b else math.log(2), abs=1e-12)


def test_pairwise_mi_closed_form_empty_sudoku():
    """Random solution grids: same-unit pairs have MI ln(81/72)."""
    mi = sample_data_mi(60_000, np.random.default_rng(0))
    graph = torch.from_numpy(sd.constraint_graph())
    assert mi[graph].mean().item() == pytest.approx(EMPTY_GRID_UNIT_MI, abs=0.004)
    assert EMPTY_GRID_UNIT_MI == pytest.approx(0.1178, abs=1e-4)


def test_pairwise_mi_validates():
    with pytest.raises(ValueError, match="non-negative"):
        pairwise_mi(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1.0, -1.0]), 2)
    with pytest.raises(ValueError, match="must lie in"):
        pairwise_mi(torch.full((2, 3), 5), torch.ones(2), 2)
    with pytest.raises(ValueError, match="distinct"):
        TableJointMDM.from_samples(torch.zeros(2, 3, dtype=torch.long), 2)


def test_probe_sudoku_mdm_counts_passes():
    m = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
    grids = masked_contexts(sd.random_solutions(2, np.random.default_rng(0)), 50 / 81, np.random.default_rng(1))
    res = probe_mi(m, grids_to_tokens(grids), batch_tokens=81 * 100)
    assert res.nfe.tolist() == [451, 451]
    assert res.mi.shape == (2, 81, 81) and (res.mi >= 0).all()


def test_graph_recovery_perfect_and_random():
    rng = np.random.default_rng(0)
    graph = sd.constraint_graph()
    masked = torch.ones(81, dtype=torch.bool)
    perfect = graph.astype(float) + 0.01 * rng.random((81, 81))
    assert graph_recovery(perfect, masked, graph)["auroc"] == 1.0
    noise = rng.random((81, 81))
    assert abs(graph_recovery(noise + noise.T, masked, graph)["auroc"] - 0.5) < 0.05
    i, j = masked_pairs(masked)
    assert len(i) == 81 * 80 // 2


def test_correlation_values():
    c = correlation([1, 2, 3, 4], [2, 4, 6, 8.5])
    # sums of products of deviations from the means (2.5, 5.125): 10.75, 5 and 23.1875
    assert c["pearson"] == pytest.approx(10.75 / math.sqrt(5 * 23.1875), abs=1e-12) and c["spearman"] == pytest.approx(1.0)
    assert c["mae"] == pytest.approx((1 + 2 + 3 + 4.5) / 4)


def test_correlation_of_a_constant_array_is_nan_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's ConstantInputWarning would fail the test
        c = correlation([0.0, 0.0, 0.0, 0.0], [0.1, 0.3, 0.0, 0.2])
    assert math.isnan(c["pearson"]) and math.isnan(c["spearman"])
    assert c["mae"] == pytest.approx(0.15) and c["max_abs_error"] == pytest.approx(0.3) and c["n"] == 4


def test_underdetermined_grids_yield_only_multi_completion_grids():
    from mimdm.probing.sudoku_mi import underdetermined_grids

    stats = {}
    out = list(underdetermined_grids((30, 40), np.random.default_rng(0), 5000, 12, stats))
    assert stats["attempts"] == 12 and len(out) + stats["unique"] + stats["too_many"] == 12
    for grid, dmi, k, n in out:
        assert k >= 2 and (grid > 0).sum() == n and 30 <= n <= 40
        assert dmi.shape == (81, 81) and (dmi[torch.from_numpy(grid > 0)] == 0).all()


def test_table_joint_normalises_its_table_and_refuses_an_empty_one():
    w = torch.tensor([[2.0, 1.0], [1.0, 0.0]])  # weights, not probabilities: p = w / 4
    model = TableJointMDM.from_table(w.log())
    assert torch.allclose(model.log_p.exp(), torch.tensor([0.5, 0.25, 0.25, 0.0], dtype=torch.float64))
    p = torch.softmax(model(torch.tensor([[2, 2]])).logits[0, 0].double(), -1)  # p(x0) with x1 masked
    assert torch.allclose(p, torch.tensor([0.75, 0.25], dtype=torch.float64), atol=1e-6)
    for bad in (torch.full((2, 2), float("-inf")), torch.tensor([[0.0, float("nan")], [0.0, 0.0]])):
        with pytest.raises(ValueError, match="finite"):
            TableJointMDM.from_table(bad)
