"""I-MDCE likelihood estimators against exact log-probabilities of an enumerable joint."""
import math

import pytest
import torch

from mimdm.evaluation.likelihood import exhaustive_nll, harmonic, log_likelihood_ratio, time_free_nll, time_integral_nll
from mimdm.models.oracle import TableJointMDM, potts_chain_log_joint
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig


@pytest.fixture(scope="module")
def oracle():
    log_joint = potts_chain_log_joint(6, 3, coupling=1.2, generator=torch.Generator().manual_seed(3))
    return TableJointMDM.from_table(log_joint), log_joint


def _states(n, L=6, V=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, L), generator=g)


def test_harmonic():
    assert float(harmonic(1)) == 1.0
    assert abs(float(harmonic(4)) - (1 + 1 / 2 + 1 / 3 + 1 / 4)) < 1e-15
    assert torch.allclose(harmonic(torch.tensor([0, 2])), torch.tensor([0.0, 1.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="n >= 0"):
        harmonic(-1)


def test_exhaustive_nll_refuses_a_batch(oracle):
    model, _ = oracle
    with pytest.raises(ValueError, match=r"one sequence.*\[L\]"):
        exhaustive_nll(model, _states(2, L=3))
    with pytest.raises(ValueError, match="maskable_L"):
        exhaustive_nll(model, _states(1)[0], torch.ones(1, 6, dtype=torch.bool))


def test_exhaustive_time_free_sum_is_exact(oracle):
    model, log_joint = oracle
    for x in _states(5):
        exact = -float(log_joint[tuple(x.tolist())])
        assert abs(exhaustive_nll(model, x) - exact) < 1e-9


def test_exhaustive_conditional_is_exact(oracle):
    model, log_joint = oracle
    x = _states(1, seed=1)[0]
    S = torch.tensor([True, False, True, True, False, True])
    # −log p(x_S | x_{not S}) from the table
    lj = log_joint.flatten()
    states = torch.cartesian_prod(*[torch.arange(3)] * 6)
    ctx = (states[:, ~S] == x[~S]).all(1)
    exact = -(float(log_joint[tuple(x.tolist())]) - float(torch.logsumexp(lj[ctx], 0)))
    assert abs(exhaustive_nll(model, x, S) - exact) < 1e-9
    # masked positions outside S are marginalised: score x_S given nothing else observed
    xm = x.clone()
    xm[~S] = model.mask_id
    marg = torch.logsumexp(log_joint.permute(*[i for i in range(6) if S[i]], *[i for i in range(6) if not S[i]])
                           .reshape(3 ** int(S.sum()), -1), 1).reshape([3] * int(S.sum()))
    exact_m = -float(marg[tuple(x[S].tolist())])
    assert abs(exhaustive_nll(model, xm) - exact_m) < 1e-9


@pytest.mark.parametrize("estimator", [time_free_nll, time_integral_nll,
                                       lambda *a, **k: time_free_nll(*a, sizes="harmonic", **k)])
def test_monte_carlo_converges(oracle, estimator):
    model, log_joint = oracle
    x = _states(3, seed=2)
    exact = torch.tensor([-float(log_joint[tuple(r.tolist())]) for r in x], dtype=torch.float64)
    est = estimator(model, x, n_samples=4000, seed=0)
    err = (est.value - exact).abs()
    assert (err < 4 * est.stderr + 1e-3).all(), (est.value, exact, est.stderr)
    assert (est.stderr < 0.25).all()
    assert est.draws.shape == (3, 4000)


def test_time_free_cost_and_determinism(oracle):
    model, _ = oracle
    x = _states(2)
    a = time_free_nll(model, x, n_samples=16, seed=5)
    b = time_free_nll(model, x, n_samples=16, seed=5)
    assert torch.equal(a.draws, b.draws)
    assert a.nfe.tolist() == [16, 16]  # every time-free mask is non-empty
    c = time_integral_nll(model, x, n_samples=200, seed=5)
    assert (c.nfe <= 200).all() and (c.nfe > 150).all()  # empty masks (prob E[(1-λ)^6] = 1/7) cost nothing


def test_time_free_has_lower_variance(oracle):
    model, _ = oracle
    x = _states(4, seed=4)
    tf = time_free_nll(model, x, n_samples=3000, seed=1)
    th = time_free_nll(model, x, n_samples=3000, seed=1, sizes="harmonic")
    ti = time_integral_nll(model, x, n_samples=3000, seed=1)
    assert (tf.variance < ti.variance).all() and (tf.variance < th.variance).all()


@pytest.mark.slow
def test_coupled_ratio(oracle):
    model, log_joint = oracle
    x = _states(3, seed=6)
    y = x.clone()
    y[:, 2] = (y[:, 2] + 1) % 3  # a one-site change: most of the two NLLs is shared
    exact = torch.tensor([float(log_joint[tuple(a.tolist())] - log_joint[tuple(b.tolist())]) for a, b in zip(x, y)],
                         dtype=torch.float64)
    cp = log_likelihood_ratio(model, x, y, n_samples=3000, coupled=True, seed=2)
    dc = log_likelihood_ratio(model, x, y, n_samples=3000, coupled=False, seed=2)
    for e in (cp, dc):
        assert ((e.value - exact).abs() < 4 * e.stderr + 1e-3).all()
        assert e.nfe.tolist() == [6000] * 3
    assert (cp.variance < dc.variance).all()
    # coupled identical sequences: every draw is exactly zero
    same = log_likelihood_ratio(model, x, x, n_samples=10, coupled=True)
    assert torch.equal(same.draws, torch.zeros_like(same.draws))
    # the other estimators, coupled: unbiased too (the time integral skips empty masks, so fewer passes)
    for est in ("time_free_harmonic", "time_integral"):
        e = log_likelihood_ratio(model, x, y, n_samples=3000, coupled=True, estimator=est, seed=3)
        assert ((e.value - exact).abs() < 4 * e.stderr + 1e-3).all(), est
        assert (e.nfe <= 6000).all() and (e.nfe > 5000).all()
    with pytest.raises(ValueError, match="n_samples must be an integer"):
        log_likelihood_ratio(model, x, y, n_samples=1.5)


def test_bad_input(oracle):
    model, _ = oracle
    x = _states(1)
    with pytest.raises(ValueError, match="no maskable"):
        time_free_nll(model, torch.full_like(x, model.mask_id))
    with pytest.raises(ValueError, match="not a value"):
        time_free_nll(model, x.masked_fill(torch.tensor([[True] + [False] * 5]), model.mask_id),
                      maskable_BL=torch.ones_like(x, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_samples"):
        time_free_nll(model, x, n_samples=0)
    with pytest.raises(ValueError, match="same shape"):
        log_likelihood_ratio(model, x, _states(2))
    with pytest.raises(ValueError, match="sizes"):
        time_free_nll(model, x, sizes="linear")
    with pytest.raises(ValueError, match="estimator"):
        log_likelihood_ratio(model, x, x, estimator="elbo")
    with pytest.raises(ValueError, match="2\\^"):
        exhaustive_nll(model, x[0], max_positions=3)


def test_zero_probability_value_is_an_error():
    states = torch.tensor([[0, 1], [1, 0]])
    model = TableJointMDM.from_samples(states, 2)
    with pytest.raises(ValueError, match="probability 0"):
        exhaustive_nll(model, torch.tensor([0, 0]))
    assert abs(exhaustive_nll(model, torch.tensor([0, 1])) - math.log(2)) < 1e-12


def test_sudoku_model_estimate_is_exact_for_a_uniform_model_and_near_the_exhaustive_nll():
    import numpy as np

    from mimdm.data import sudoku as sd
    from mimdm.pipelines.zoo import grids_to_tokens

    torch.manual_seed(0)
    model = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)).eval()
    grid = grids_to_tokens(sd.random_solutions(2, np.random.default_rng(0)))
    with torch.no_grad():  # zero output layer: every conditional uniform over 9 digits, NLL = 81 ln 9 in every draw
        model.out.weight.zero_(); model.out.bias.zero_()
    est = time_free_nll(model, grid, n_samples=64)
    assert torch.allclose(est.value, torch.full((2,), 81 * math.log(9), dtype=torch.float64), atol=1e-3)
    assert est.stderr.max() < 1e-4
    # a random (non-uniform) model on a grid with 6 blanks: the estimator against the exhaustive chain rule
    torch.manual_seed(1)
    model = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)).eval()
    x = grid[0].clone()
    S = torch.zeros(81, dtype=torch.bool); S[torch.arange(6) * 13] = True
    exact = exhaustive_nll(model, x, maskable_L=S)  # the time-free sum over all 63 subsets of S
    est = time_free_nll(model, x[None], n_samples=2000, seed=2, maskable_BL=S[None])
    assert abs(float(est.value[0]) - exact) < 4 * float(est.stderr[0]) + 1e-6


def test_uniform_sizes_spend_one_pass_per_draw_and_agree_with_the_exact_nll(oracle):
    model, log_joint = oracle
    x = _states(1)
    est = time_free_nll(model, x, n_samples=600, sizes="uniform", seed=3)
    assert est.nfe.tolist() == [600]
    exact = -float(log_joint[tuple(x[0].tolist())])
    assert abs(float(est.value[0]) - exact) < 4 * float(est.stderr[0])
    assert len(torch.unique(est.draws.round(decimals=9))) > 6  # many different masks, not one repeated


@pytest.mark.parametrize("kind, expected", [
    ("time_free_uniform", lambda m, n: 1 / n),
    ("time_free_harmonic", lambda m, n: (1 / m) / sum(1 / k for k in range(1, n + 1))),
])
def test_mask_size_distributions_and_weights(kind, expected):
    """Mask sizes follow U{1..n} (weight n/m) or (1/m)/H_n (weight H_n), on the scored set only."""
    from mimdm.evaluation.likelihood import _draw_masks

    n, K = 6, 60_000
    maskable = torch.tensor([[True] * n + [False] * 2])
    masks, w = _draw_masks(kind, maskable, K, torch.Generator().manual_seed(0))
    assert not masks[0, :, n:].any()
    m = masks[0].sum(1)
    for size in range(1, n + 1):
        assert (m == size).double().mean().item() == pytest.approx(expected(size, n), abs=0.01)
    H = sum(1 / k for k in range(1, n + 1))
    want = n / m.double() if kind == "time_free_uniform" else torch.full((K,), H, dtype=torch.float64)
    assert torch.allclose(w[0], want)


def test_chapter_helpers_on_oracle():
    from mimdm.experiments.likelihood import oracle_exactness, perturb_grids, reference_nll
    o = oracle_exactness(n_sequences=2, draws=(64,))
    assert o["exhaustive_max_error"] < 1e-9
    assert len(o["convergence"]) == 3
    ref = reference_nll()
    assert abs(ref["uniform_valid_grids"] - 50.252) < 1e-3
    import numpy as np

    from mimdm.data import sudoku as sd
    g = sd.random_solutions(4, np.random.default_rng(0))
    p = perturb_grids(g, 1, 0)
    assert ((p != g).sum(1) == 2).all() and not sd.is_valid_solution_batch(p).any()
    assert (np.sort(p.reshape(4, 9, 9), 2) == np.sort(g.reshape(4, 9, 9), 2)).all()  # rows keep their digits


def test_monte_carlo_conditional_and_marginalised(oracle):
    """The conditional (S a strict subset) and marginalised (masks outside S) paths converge to the table values."""
    model, log_joint = oracle
    x = _states(1, seed=9)[0]
    S = torch.tensor([True, True, False, True, False, True])
    states = torch.cartesian_prod(*[torch.arange(3)] * 6)
    lj = log_joint.flatten()
    ctx = (states[:, ~S] == x[~S]).all(1)
    exact_cond = -(float(log_joint[tuple(x.tolist())]) - float(torch.logsumexp(lj[ctx], 0)))
    for sizes in ("uniform", "harmonic"):
        e = time_free_nll(model, x[None], n_samples=4000, maskable_BL=S[None], seed=4, sizes=sizes)
        assert abs(float(e.value) - exact_cond) < 4 * float(e.stderr) + 1e-3
        assert float(e.value) != pytest.approx(float(time_free_nll(model, x[None], 4000, seed=4, sizes=sizes).value), abs=0.3)
    xm = x.clone()
    xm[~S] = model.mask_id
    exact_marg = exhaustive_nll(model, xm)
    e = time_free_nll(model, xm[None], n_samples=4000, seed=5)
    assert abs(float(e.value) - exact_marg) < 4 * float(e.stderr) + 1e-3


def test_zero_probability_outside_the_scored_set_is_not_nan():
    # value 0 impossible at position 0 given x_1 = 1 ... the masked position 2 must not poison the sum
    states = torch.tensor([[0, 1, 1], [1, 0, 1], [1, 1, 1]])
    model = TableJointMDM.from_samples(states, 2)
    x = torch.tensor([0, 1, model.mask_id])
    assert math.isfinite(exhaustive_nll(model, x))
    assert abs(exhaustive_nll(model, x) - math.log(3)) < 1e-12  # p(x0=0, x1=1) = 1/3
    assert torch.isfinite(time_free_nll(model, x[None], n_samples=20).value).all()


def test_ratio_refuses_different_contexts(oracle):
    model, _ = oracle
    x = _states(1)
    y = x.clone()
    y[0, 0] = model.mask_id
    with pytest.raises(ValueError, match="different positions"):
        log_likelihood_ratio(model, x, y)
