"""The aligned-column Potts MDM, amino-acid-restricted probing, and aligned contact scoring."""
import numpy as np
import pytest
import torch

from mimdm.data import protein as pr
from mimdm.models.oracle import TableJointMDM, potts_chain_log_joint
from mimdm.models.potts import ALIGNED_MASK_ID, PottsMDM, PottsMDMConfig, held_out_ce, train_potts_mdm, weighted_rows
from mimdm.models.training import TrainConfig
from mimdm.probing.exact import probe_mi


def _restricted_pair_mi(oracle, tokens_L, i, j, subset):
    """I(X_i; X_j | c, X_i in S, X_j in S) from the oracle's exact joint, by hand."""
    states, probs = oracle.conditional(tokens_L)
    V = oracle.n_values
    P = torch.zeros(V, V, dtype=torch.float64)
    for s, p in zip(states.tolist(), probs.tolist()):
        P[s[i], s[j]] += p
    S = torch.as_tensor(subset)
    P = P * S[:, None] * S[None, :]
    P = P / P.sum()
    pi, pj = P.sum(1), P.sum(0)
    m = P > 0
    return float((P[m] * (P[m] / (pi[:, None] * pj[None, :])[m]).log()).sum())


def test_restricted_probing_is_the_mi_of_the_restricted_joint():
    oracle = TableJointMDM.from_table(potts_chain_log_joint(5, 3, coupling=1.5, generator=torch.Generator().manual_seed(2)))
    S = torch.tensor([True, True, False])
    x = torch.full((5,), oracle.mask_id)
    x[2] = 1
    res = probe_mi(oracle, x, values_V=S)
    full = probe_mi(oracle, x)
    checked = 0
    for i in (0, 1, 3, 4):
        for j in (0, 1, 3, 4):
            if i < j:
                want = _restricted_pair_mi(oracle, x, i, j, S)
                assert res.mi[0, i, j].item() == pytest.approx(want, abs=1e-9)
                assert res.directed[0, i, j].item() == pytest.approx(want, abs=1e-9)  # one joint: both directions agree
                checked += 1
    assert checked == 6
    assert not torch.allclose(res.mi, full.mi)  # restricting the values changes the MI here
    # only values in S are probed: 1 base pass + 2 values x 4 masked positions
    assert int(res.nfe[0]) == 1 + 2 * 4
    with pytest.raises(ValueError, match="values_V"):
        probe_mi(oracle, x, values_V=torch.tensor([True, False, False]))


def test_restricted_probing_gives_zero_for_a_position_outside_the_subset():
    """A position that is (almost) surely outside S (a terminal gap column) has restricted MI 0, no error, and the
    MI of the other pairs is unchanged."""
    states = torch.tensor([[2, a, b] for a in range(3) for b in range(3)])
    p = torch.tensor([0.3 if a == b else 0.05 for a in range(3) for b in range(3)], dtype=torch.float64)
    p = p / p.sum()
    oracle = TableJointMDM(states, p.log(), 3)
    S = torch.tensor([True, True, False])
    x = torch.full((3,), oracle.mask_id)
    res = probe_mi(oracle, x, values_V=S)
    assert torch.isfinite(res.mi).all()
    assert res.mi[0, 0].abs().max() == 0 and res.mi[0, :, 0].abs().max() == 0
    assert res.mi[0, 1, 2].item() == pytest.approx(_restricted_pair_mi(oracle, x, 1, 2, S), abs=1e-9)
    assert res.mi[0, 1, 2].item() > 0.05


def _tiny_alignment(n=400, L=6, seed=0):
    """Rows where column 1 copies column 4 (a 'contact') and everything else is random; column 0 often gapped."""
    g = np.random.default_rng(seed)
    v = g.integers(0, 20, (n, L))
    v[:, 1] = v[:, 4]
    v[g.random(n) < 0.3, 0] = 20
    return v


def test_potts_forward_is_the_potts_conditional():
    torch.manual_seed(0)
    m = PottsMDM(4, embed_dim=3)
    torch.nn.init.normal_(m.W, std=0.3)
    torch.nn.init.normal_(m.h, std=0.3)
    x = torch.tensor([[3, ALIGNED_MASK_ID, 20, ALIGNED_MASK_ID]])
    logits = m(x).logits[0].double()
    J = m.couplings().double().reshape(4, 21, 4, 21)
    for i in range(4):
        want = m.h[i].double() + J[i, :, 0, 3] + J[i, :, 2, 20] * 1.0
        if i == 0:
            want = m.h[0].double() + J[0, :, 2, 20]
        if i == 2:
            want = m.h[2].double() + J[2, :, 0, 3]
        assert torch.allclose(logits[i], want, atol=1e-5)
    assert torch.allclose(J, J.permute(2, 3, 0, 1))  # symmetric couplings
    assert J[1, :, 1, :].abs().max() == 0  # no self-coupling
    out = m(x, layer=-1)
    assert out.hidden.shape == (1, 4, 21 + 3)
    assert torch.allclose(out.hidden[0, :, :21], torch.log_softmax(out.logits[0], -1))
    with pytest.raises(ValueError, match="layer"):
        m(x, layer=2)
    with pytest.raises(ValueError, match="4 aligned columns"):
        m(torch.zeros(1, 3, dtype=torch.long))


def test_encode_decode_and_bad_rows():
    m = PottsMDM(5)
    t = m.encode(["AC-_Y"])
    assert t.tolist() == [[0, 1, 20, ALIGNED_MASK_ID, 19]]
    assert m.decode(t) == ["AC-_Y"]
    for bad, what in (("AC-_y", "'y'"), ("ACX-Y", "'X'"), ("AC-Y", "4 columns"), ("AC.-Y", "'.'")):
        with pytest.raises(ValueError, match=what):
            m.encode([bad])


def test_training_learns_the_coupled_pair_and_resumes(tmp_path):
    v = _tiny_alignment(n=2000)
    w = np.ones(len(v))
    cfg = PottsMDMConfig(embed_dim=2, l2=1.0, val_every=10, patience=None)
    tcfg = TrainConfig(steps=60, batch_size=128, lr=0.05, warmup=2, weight_decay=0.0, ckpt_every=10, log_every=10)
    m, rec = train_potts_mdm(v[:1600], w[:1600], v[1600:], w[1600:], cfg, tcfg, tmp_path / "s.pt", progress=False)
    F = m.coupling_norm()
    iu = np.triu_indices(6, 1)
    assert (iu[0][np.argmax(F[iu])], iu[1][np.argmax(F[iu])]) == (1, 4)
    assert F[1, 4] > 3 * np.delete(F[1], [1, 4]).max()
    assert rec["val"]["ce_0.15"] < rec["val"]["ce_1"] - 0.2  # context helps: the copied column is predicted
    assert rec["best_step"] in [e["step"] for e in rec["log"] if "val_loss" in e]
    # the returned model is already at the stored precision: saved and loaded, it gives the same CE exactly
    from mimdm.models.potts import load_potts, save_potts
    save_potts(m, tmp_path / "m.pt", cfg, tcfg, rec)
    m2, _ = load_potts(tmp_path / "m.pt")
    assert torch.equal(m2.couplings(), m.couplings()) and torch.equal(m2.embedding, m.embedding)
    assert held_out_ce(m2, v[1600:], w[1600:]) == rec["val"]
    # interrupted at step 20 and resumed: the same weights as the uninterrupted run
    (tmp_path / "r.pt").unlink(missing_ok=True)
    from mimdm.models.potts import PottsMDM as P
    from mimdm.models.training import train_mdm

    def run(stop):
        torch.manual_seed(0)
        mm = P(6, 2)
        train_mdm(mm, weighted_rows(v[:1600], w[:1600]), tcfg, tmp_path / "r.pt", progress=False, stop_after=stop,
                  penalty=lambda q: q.penalty(1600.0)[0], val_fn=lambda q: held_out_ce(q, v[1600:])["ce"],
                  val_every=10)
        return mm
    run(20)
    resumed = run(None)
    (tmp_path / "r.pt").unlink()
    straight = run(None)
    assert torch.equal(resumed.W, straight.W)


def test_one_masked_sampling_masks_exactly_one_column():
    v = _tiny_alignment()
    x, forced = weighted_rows(v, np.ones(len(v)), one_masked=True)(np.random.default_rng(0), 64)
    assert x.shape == (64, 6) and forced.dtype == torch.bool
    assert forced.sum(1).tolist() == [1] * 64


def test_weighted_rows_follow_the_weights():
    v = np.arange(4)[:, None].repeat(3, 1)
    w = np.array([0.0, 1.0, 3.0, 0.0])
    x = weighted_rows(v, w)(np.random.default_rng(0), 4000)
    share = np.bincount(x[:, 0].numpy(), minlength=4) / 4000
    assert share[0] == 0 and share[3] == 0
    assert share[2] == pytest.approx(0.75, abs=0.03)


def test_reference_columns_rule():
    rows = ["AC-De", "A-GDf", "-CGD-"]
    # match columns: 0..3 (column 4 has lower case); row 0 has residues at 0, 1, 3
    assert pr.reference_columns(rows, 0).tolist() == [0, 1, 3]
    assert pr.reference_columns(rows, 2).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="out of range"):
        pr.reference_columns(rows, 3)
