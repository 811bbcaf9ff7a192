"""`propagated_mi`: the damped mean-field propagation against a loop-by-loop reference and a known value."""
import math

import numpy as np
import pytest
import torch

from mimdm.data import sudoku as sd
from mimdm.probing.sudoku_mi import propagated_mi, propagated_mi_rounds


def loop_reference(p_LV, masked_L, rounds, damping, eps=1e-6, top_k=9):
    """The same update and MI, one scenario (j, v) and one cell k at a time, in float64, over the explicit peers;
    each direction conditions on j's ``top_k`` likeliest digits, their weights renormalised."""
    p = np.asarray(p_LV, dtype=float)
    masked = np.asarray(masked_L, dtype=bool)
    graph = sd.constraint_graph()
    log_not_p = np.log(np.maximum(1 - p, eps))
    cells = np.flatnonzero(masked)
    d = np.zeros((81, 81))
    for j in cells:
        cond = []
        digits = np.argsort(-p[j], kind="stable")[:top_k]
        w = p[j][digits] / p[j][digits].sum()
        for v in digits:
            q = p.copy()
            q[j] = np.eye(9)[v]
            for _ in range(rounds):
                delta = np.where(masked[:, None], np.log(np.maximum(1 - q, eps)) - log_not_p, 0.0)
                new = q.copy()
                for k in cells:
                    if k == j:
                        continue
                    logit = np.log(p[k]) + delta[graph[k]].sum(0)
                    e = np.exp(logit - logit.max())
                    new[k] = (1 - damping) * q[k] + damping * e / e.sum()
                q = new
            cond.append(q)
        cond = np.stack(cond)  # [v, 81, 9]
        mix = np.einsum("v,via->ia", w, cond)
        kl = (cond * (np.log(np.maximum(cond, 1e-12)) - np.log(np.maximum(mix, 1e-12)))).sum(-1)  # [v, i]
        d[:, j] = w @ kl
    d *= masked[:, None] & masked[None, :]
    np.fill_diagonal(d, 0)
    return (d + d.T) / 2


def test_matches_the_loop_reference_on_random_marginals():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(2, 81, 9, generator=g, dtype=torch.float64), -1)
    masked = torch.zeros(2, 81, dtype=torch.bool)
    masked[0, [0, 1, 2, 9, 10, 20, 40, 41, 50, 80]] = True  # peers, peers of peers and far cells
    masked[1, [3, 12, 21, 30, 31, 39, 57]] = True
    got = propagated_mi(p, masked, rounds=3, damping=0.6, chunk=1)
    assert got.dtype == torch.float32 and got.shape == (2, 81, 81)
    for b in range(2):
        ref = loop_reference(p[b].numpy(), masked[b].numpy(), rounds=3, damping=0.6)
        assert ref.max() > 0.01
        np.testing.assert_allclose(got[b].double().numpy(), ref, atol=2e-5)
    top3 = propagated_mi(p, masked, rounds=2, damping=0.8, top_k=3)
    np.testing.assert_allclose(top3[0].double().numpy(), loop_reference(p[0].numpy(), masked[0].numpy(), 2, 0.8, top_k=3),
                               atol=2e-5)
    assert not torch.allclose(top3, propagated_mi(p, masked, rounds=2, damping=0.8), atol=1e-3)
    assert torch.equal(got, got.transpose(1, 2)) and (got >= 0).all()
    assert (got.diagonal(dim1=1, dim2=2) == 0).all() and (got[0][~masked[0]] == 0).all()


def test_a_deadly_rectangle_couples_its_diagonal_from_the_second_round(deadly_rectangle):
    sol, cells, grid = deadly_rectangle
    assert sd.count_solutions(grid, 10) == 2
    p = torch.zeros(1, 81, 9)
    p[0, torch.arange(81), torch.from_numpy(sol.astype(np.int64) - 1)] = 1  # givens: ignored
    a, b = int(sol[cells[0]]) - 1, int(sol[cells[1]]) - 1
    p[0, cells] = 0
    p[0, cells, a] = p[0, cells, b] = 0.5  # the true marginals of the two completions
    masked = torch.zeros(1, 81, dtype=torch.bool)
    masked[0, cells] = True
    by_round = propagated_mi_rounds(p, masked, (1, 2), damping=1.0)
    one, two = by_round[1][0], by_round[2][0]
    ln2 = math.log(2)
    for i, j in [(0, 1), (0, 2), (1, 3), (2, 3)]:  # pairs sharing a row or a column: excluded in round 1
        assert one[cells[i], cells[j]].item() == pytest.approx(ln2, abs=1e-4)
    for i, j in [(0, 3), (1, 2)]:  # diagonal: no shared unit, reached through a peer in round 2
        assert one[cells[i], cells[j]].item() == 0
        assert two[cells[i], cells[j]].item() == pytest.approx(ln2, abs=1e-4)
    assert torch.equal(propagated_mi(p, masked, rounds=2, damping=1.0), by_round[2])


def test_top_k_and_rounds_are_consistent():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(3, 81, 9, generator=g), -1)
    masked = torch.rand(3, 81, generator=g) < 0.5
    by_round = propagated_mi_rounds(p, masked, (4, 2), damping=0.5, top_k=3, chunk=2)
    assert sorted(by_round) == [2, 4]
    for r in (2, 4):
        assert torch.allclose(by_round[r], propagated_mi(p, masked, r, 0.5, top_k=3), atol=1e-6)
    # top_k = 9 is all digits
    assert torch.allclose(propagated_mi(p, masked, 2, top_k=9), propagated_mi(p, masked, 2), atol=1e-6)
    few = torch.zeros(1, 81, dtype=torch.bool)
    few[0, 5] = True  # a single masked cell: no pair
    assert (propagated_mi(p[:1], few) == 0).all()


def test_bad_input():
    p = torch.full((1, 81, 9), 1 / 9)
    masked = torch.ones(1, 81, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs p"):
        propagated_mi(p[:, :80], masked)
    with pytest.raises(ValueError, match="rounds"):
        propagated_mi(p, masked, rounds=0)
    with pytest.raises(ValueError, match="damping"):
        propagated_mi(p, masked, damping=0)
    with pytest.raises(ValueError, match="damping"):
        propagated_mi(p, masked, damping=1.5)
    with pytest.raises(ValueError, match="top_k"):
        propagated_mi(p, masked, top_k=10)
    with pytest.raises(ValueError, match="chunk"):
        propagated_mi(p, masked, chunk=0)
    with pytest.raises(ValueError, match="non-finite"):
        propagated_mi(torch.full((1, 81, 9), float("nan")), masked)
    with pytest.raises(ValueError, match="rounds"):
        propagated_mi_rounds(p, masked, ())
    with pytest.raises(ValueError, match="rounds"):
        propagated_mi(p, masked, rounds=2.5)
    with pytest.raises(ValueError, match="rounds"):
        propagated_mi_rounds(p, masked, 3)
    with pytest.raises(ValueError, match="eps"):
        propagated_mi(p, masked, eps=0)
    with pytest.raises(ValueError, match="bool"):
        propagated_mi(p, masked.float())
    with pytest.raises(ValueError, match="sum to 1"):
        propagated_mi(-p, masked)
    with pytest.raises(ValueError, match="sum to 1"):
        propagated_mi(2 * p, masked)
    assert (propagated_mi(2 * p, torch.zeros(1, 81, dtype=torch.bool)) == 0).all()  # unmasked rows are not checked
