"""`constraint_mi`: the O(L² V) closed form against the brute-force formula and a known value."""
import math

import pytest
import torch

from mimdm.data import sudoku as sd
from mimdm.probing.sudoku_mi import constraint_mi, constraint_mi_among


def brute_force(p_LV, masked_L, w_LV=None):
    """The same constraint model with the full [j, v, i, a] conditionals and probing's formula (−∞ as −200);
    ``w_LV``: the conditioning cell's weights p_j(v) (default ``p_LV``)."""
    L = sd.N_CELLS
    peer = torch.from_numpy(sd.constraint_graph()).double()
    U = torch.zeros(27, L, dtype=torch.float64)
    U[torch.arange(27)[:, None], torch.tensor(sd.UNITS)] = 1
    p = p_LV * masked_L[:, None]
    m = torch.einsum("uk,kj,kv->ujv", U, peer, p)
    t = torch.einsum("ui,uj,ujv->jvi", U, 1 - U, -torch.log((1 - m).clamp_min(1e-3)))
    shift = torch.where(peer[:, None, :].bool(), torch.full_like(t, -200.0), t)  # [j, v, i]
    eye = torch.eye(9, dtype=torch.float64)
    logp = torch.log(p_LV.clamp_min(1e-300))
    P = (logp[None, None] + shift[..., None] * eye[None, :, None, :]).log_softmax(-1).exp()  # [j, v, i, a]
    w = p if w_LV is None else w_LV * masked_L[:, None]
    mix = torch.einsum("jv,jvia->jia", w, P)
    kl = (P * (torch.log(P.clamp_min(1e-300)) - torch.log(mix.clamp_min(1e-300))[:, None])).sum(-1)
    d = torch.einsum("jv,jvi->ji", w, kl).clamp_min(0)
    pair = masked_L[:, None] * masked_L[None, :] * (1 - torch.eye(L, dtype=torch.float64))
    d = d * pair
    return (d + d.T) / 2


def test_matches_brute_force_on_random_marginals():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(3, 81, 9, generator=g, dtype=torch.float64), -1)
    masked = torch.rand(3, 81, generator=g) < 0.6
    got = constraint_mi(p, masked)
    for b in range(3):
        ref = brute_force(p[b], masked[b].double())
        assert torch.allclose(got[b], ref, atol=1e-9), float((got[b] - ref).abs().max())
        assert float(ref.max()) > 0.05  # the comparison is not between zeros
    assert torch.equal(got, got.transpose(1, 2))
    assert float(got[~masked].abs().max()) == 0.0


def test_two_cells_of_a_row_sharing_two_digits_have_ln2():
    p = torch.full((1, 81, 9), 1 / 9, dtype=torch.float64)
    p[0, :2] = 0
    p[0, :2, :2] = 0.5  # cells r1c1 and r1c2: digits 1 or 2, each with probability 1/2
    masked = torch.zeros(1, 81, dtype=torch.bool)
    masked[0, :2] = True
    mi = constraint_mi(p, masked)
    assert mi[0, 0, 1].item() == pytest.approx(math.log(2), abs=1e-9)
    assert float(mi.sum()) == pytest.approx(2 * math.log(2), abs=1e-9)


def test_bad_input():
    with pytest.raises(ValueError, match=r"p \[B, 81, 9\]"):
        constraint_mi(torch.zeros(1, 80, 9), torch.zeros(1, 80, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-finite"):
        constraint_mi(torch.full((1, 81, 9), float("nan")), torch.ones(1, 81, dtype=torch.bool))


def test_among_chosen_cells_is_the_submatrix():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(5, 81, 9, generator=g, dtype=torch.float64), -1)
    masked = torch.rand(5, 81, generator=g) < 0.6
    full = constraint_mi(p, masked)
    pos = torch.stack([torch.randperm(81, generator=g)[:12] for _ in range(5)])
    pos[:, -1] = pos[:, 0]  # a repeated cell (padding): no pair with itself
    valid = torch.ones(5, 12, dtype=torch.bool)
    valid[2, 3] = False
    got = constraint_mi_among(p, masked, pos, valid, chunk=2)  # chunks of 2 grids, the last one short
    for b in range(5):
        ok = valid[b][:, None] & valid[b][None, :] & (pos[b][:, None] != pos[b][None, :])
        want = full[b][pos[b]][:, pos[b]] * ok
        assert torch.allclose(got[b], want, atol=1e-12), b
        assert want[0, -1] == 0 and (b != 2 or not want[3].any())
    assert float(got.max()) > 0.05
    with pytest.raises(ValueError, match="positions and valid"):
        constraint_mi_among(p, masked, pos, valid[:, :5])


def test_top_k_conditions_on_the_k_most_likely_digits():
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(3 * torch.randn(2, 81, 9, generator=g, dtype=torch.float64), -1)
    masked = torch.rand(2, 81, generator=g) < 0.6
    assert torch.allclose(constraint_mi(p, masked, top_k=9), constraint_mi(p, masked), atol=1e-12)
    got = constraint_mi(p, masked, top_k=3)
    for b in range(2):
        val, idx = p[b].topk(3, dim=-1)
        w = torch.zeros_like(p[b]).scatter(1, idx, val / val.sum(-1, keepdim=True))  # truncated, renormalised
        ref = brute_force(p[b], masked[b].double(), w)
        assert torch.allclose(got[b], ref, atol=1e-9), float((got[b] - ref).abs().max())
        assert not torch.allclose(got[b], constraint_mi(p[b:b + 1], masked[b:b + 1])[0], atol=1e-3)
    with pytest.raises(ValueError, match="top_k must be in 1..9"):
        constraint_mi(p, masked, top_k=0)
