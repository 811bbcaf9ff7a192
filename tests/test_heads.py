import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mimdm.heads.mi_head import (
    HeadTrainConfig,
    MIHead,
    MIHeadConfig,
    head_inputs,
    load_head,
    mi_loss,
    predict_mi,
    save_head,
    train_head,
)
from mimdm.data import sudoku as sd
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.pipelines.labels import LabelConfig, generate_labels, is_complete, load_labels, split_of

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)


def test_parameter_count_near_paper():
    from mimdm.app.profiles import get_profile
    from mimdm.experiments.mi_head import head_config_for, protein_head_config_for

    paper = get_profile("paper")

    class Model:  # only the hidden size matters
        hidden_dim = 384

    assert 95_000 < MIHead(head_config_for(paper, Model)).n_parameters() < 115_000  # paper: ~100K on D=384
    Model.hidden_dim = 960
    assert 780_000 < MIHead(protein_head_config_for(paper, Model)).n_parameters() < 840_000  # paper: ~810K, ESM-C 300M


def test_head_output_properties():
    torch.manual_seed(0)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4))
    h = torch.randn(3, 10, 16)
    masked = torch.rand(3, 10) < 0.6
    ent = torch.rand(3, 10) * masked
    mi = head(h, masked, ent)
    assert mi.shape == (3, 10, 10)
    assert torch.allclose(mi, mi.transpose(1, 2), atol=1e-6)
    assert (mi >= 0).all()
    assert (torch.diagonal(mi, dim1=1, dim2=2) == 0).all()
    pair = masked[:, :, None] & masked[:, None, :]
    assert (mi[~pair] == 0).all()
    assert (mi <= (ent[:, :, None] + ent[:, None, :]) / 2 + 1e-7).all()  # default bound: mean entropy
    strict = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, bound="min"))
    assert (strict(h, masked, ent) <= torch.minimum(ent[:, :, None], ent[:, None, :]) + 1e-7).all()
    with pytest.raises(ValueError, match="pass entropy_BL"):
        head(h, masked)
    with pytest.raises(ValueError, match=r"entropy must have shape \(3, 10\), got \(3, 1\)"):
        head(h, masked, ent[:, :1])  # would broadcast silently
    with pytest.raises(ValueError, match="does not match the head's d_in"):
        head(torch.randn(3, 10, 8), masked, ent)
    with pytest.raises(ValueError, match="exceeds the head's max_len=81"):
        head(torch.randn(1, 82, 16), torch.ones(1, 82, dtype=torch.bool), torch.ones(1, 82))
    rel = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, positions="relative", max_len=8))
    out = rel(torch.randn(1, 200, 16), torch.ones(1, 200, dtype=torch.bool), torch.ones(1, 200))  # any length
    assert out.shape == (1, 200, 200) and torch.allclose(out, out.mT)
    with pytest.raises(ValueError, match="bound must be one of"):
        MIHead(MIHeadConfig(16, bound="max2"))
    # a sequence with no masked pair: all zeros, no error
    assert (head(h, torch.zeros(3, 10, dtype=torch.bool), ent * 0) == 0).all()


def test_loss_kinds():
    t = torch.zeros(1, 4, 4)
    t[0, 0, 1] = t[0, 1, 0] = 0.5
    masked = torch.ones(1, 4, dtype=torch.bool)
    assert mi_loss(t, t, masked).item() == 0
    assert mi_loss(t * 0, t, masked, "mse").item() == pytest.approx(0.25 / 6)
    # one of the 6 masked pairs off by log1p(0.5/0.01) = ln 51; its weight 1 + 0.5/0.05 = 11, the others 1
    assert mi_loss(t * 0, t, masked, "log1p").item() == pytest.approx(math.log(51) ** 2 / 6)
    assert mi_loss(t * 0, t, masked, "log1p_weighted").item() == pytest.approx(11 * math.log(51) ** 2 / 16)
    with pytest.raises(ValueError, match=r"\[B, L, L\]"):
        mi_loss(t, t[:, :3, :3], masked)
    with pytest.raises(ValueError, match=r"masked \[B, L\]"):
        mi_loss(t, t, masked[:, :3])
    with pytest.raises(ValueError, match="unknown loss kind"):
        mi_loss(t, t, masked, "l1")


def _synthetic_labels(n=48, L=12, D=16, seed=0):
    """Labels whose MI is a fixed function of the hidden states, so a head can fit them exactly."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, L, D, generator=g)
    masked = torch.rand(n, L, generator=g) < 0.7
    tokens = torch.where(masked, 9, 0)
    ent = torch.full((n, L), 2.0) * masked
    sim = torch.sigmoid(3 * torch.einsum("bid,bjd->bij", h[..., :4], h[..., :4]) / 2) * 0.5
    pair = masked[:, :, None] & masked[:, None, :] & ~torch.eye(L, dtype=torch.bool)
    mi = sim * pair
    return {"tokens": tokens, "hidden_-1": h, "entropy": ent, "mi": mi}


def test_head_overfits_a_tiny_label_set():
    data = _synthetic_labels()
    head, log = train_head(data, data, MIHeadConfig(16, d_hidden=64, rank=32),
                           HeadTrainConfig(epochs=150, batch_size=16, lr=5e-3, patience=150), mask_id=9, progress=False)
    assert log[-1]["train_loss"] < 0.05 * log[0]["train_loss"]
    pred = head(data["hidden_-1"], data["tokens"] == 9, data["entropy"])
    pair = (data["tokens"] == 9)[:, :, None] & (data["tokens"] == 9)[:, None, :] & ~torch.eye(12, dtype=torch.bool)
    r = np.corrcoef(pred[pair].detach().numpy(), data["mi"][pair].numpy())[0, 1]
    assert r > 0.95


def test_train_head_rejects_an_empty_split():
    data = _synthetic_labels(n=4)
    empty = {k: v[:0] for k, v in data.items()}
    for train, val, name in ((empty, data, "training"), (data, empty, "validation")):
        with pytest.raises(ValueError, match=f"the {name} split holds no contexts"):
            train_head(train, val, MIHeadConfig(16, d_hidden=8, rank=4), HeadTrainConfig(epochs=1), mask_id=9,
                       progress=False)


def _position_labels(n=64, L=12, D=16, seed=0):
    """MI set by the positions alone (0.3 nats within blocks of 3, else 0), hidden states pure noise."""
    g = torch.Generator().manual_seed(seed)
    masked = torch.rand(n, L, generator=g) < 0.8
    block = torch.arange(L) // 3
    same = (block[:, None] == block[None, :]) & ~torch.eye(L, dtype=torch.bool)
    mi = 0.3 * (same & masked[:, :, None] & masked[:, None, :])
    return {"tokens": torch.where(masked, 9, 0), "hidden_-1": torch.randn(n, L, D, generator=g),
            "entropy": torch.full((n, L), 1.0) * masked, "mi": mi.float()}


def test_position_pairs_learn_a_constraint_graph_the_hidden_states_do_not_carry():
    data = _position_labels()
    cfg = HeadTrainConfig(epochs=60, batch_size=16, lr=5e-3)
    masked = data["tokens"] == 9
    pair = masked[:, :, None] & masked[:, None, :] & ~torch.eye(12, dtype=torch.bool)
    r = {}
    for pos_dim in (0, 8):
        head, _ = train_head(data, data, MIHeadConfig(16, d_hidden=16, rank=8, max_len=12, pos_dim=pos_dim,
                                                      tri_channels=0), cfg, mask_id=9, progress=False)
        pred = head(data["hidden_-1"], masked, data["entropy"]).detach()
        r[pos_dim] = np.corrcoef(pred[pair].numpy(), data["mi"][pair].numpy())[0, 1]
    assert r[8] > 0.99  # the position table recovers the blocks
    assert r[0] < 0.5  # from noise alone it cannot


def test_schedules_and_old_checkpoints(tmp_path):
    from mimdm.core.artifacts import atomic_save
    from mimdm.heads.mi_head import make_optimizer

    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4))
    opt, sched = make_optimizer(head, HeadTrainConfig(epochs=2, lr=1e-2), steps_per_epoch=5)
    assert opt.param_groups[0]["lr"] < 1e-2  # one-cycle starts low
    lrs = []
    for _ in range(10):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert max(lrs) == pytest.approx(1e-2, rel=1e-6) and lrs[-1] < 0.05 * 1e-2  # peaks at lr, anneals
    assert make_optimizer(head, HeadTrainConfig(schedule="constant"), 5)[1] is None
    with pytest.raises(ValueError, match="unknown schedule"):
        make_optimizer(head, HeadTrainConfig(schedule="cosine"), 5)
    atomic_save({"kind": "mi_head", "state_dict": {}, "head_config": json.dumps({"d_in": 16, "entropy_bound": True}),
                 "train_config": "{}", "log": "[]", "extra": "{}"}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="older MI head"):
        load_head(tmp_path / "old.pt")


def test_split_is_by_source():
    ids = np.arange(100)
    s = split_of(ids)
    assert (s[ids % 10 == 0] == 2).all() and (s[ids % 10 == 1] == 1).all() and (s[ids % 10 >= 2] == 0).all()


@pytest.mark.slow
def test_label_generation_resumes_with_identical_output(tmp_path):
    torch.manual_seed(0)
    model = SudokuMDM(TINY).eval()
    cfg = LabelConfig(n_shards=3, sources_per_shard=4, contexts_per_source=3, layers=(-1, 1))
    generate_labels(model, cfg, tmp_path / "a", progress=False)
    generate_labels(model, cfg, tmp_path / "b", progress=False, max_new_shards=1)  # interrupted after one shard
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert list(man["shards"]) == ["0"]
    generate_labels(model, cfg, tmp_path / "b", progress=False)  # continues with shards 1, 2
    a, b = load_labels(tmp_path / "a"), load_labels(tmp_path / "b")
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
    assert a["tokens"].shape == (3 * 4 * 3, 81) and a["hidden_1"].shape == (36, 81, 32)
    # no source is in two splits, every context has MI only between masked cells
    src, split = a["source_id"], a["split"]
    for s in src.unique():
        assert len(split[src == s].unique()) == 1
    masked = a["tokens"] == 9
    assert (a["mi"][~(masked[:, :, None] & masked[:, None, :])] == 0).all()
    test = load_labels(tmp_path / "a", "test")
    assert (test["source_id"] % 10 == 0).all()
    with pytest.raises(ValueError, match="unknown split"):
        load_labels(tmp_path / "a", "dev")
    with pytest.raises(FileNotFoundError, match="manifest.json missing"):
        load_labels(tmp_path / "none")
    # a shard file lost after its manifest entry: loading names it, generating again recomputes it
    (tmp_path / "b" / "shard_00001.pt").unlink()
    assert not is_complete(tmp_path / "b", cfg) and is_complete(tmp_path / "a", cfg)
    with pytest.raises(FileNotFoundError, match="1 shard files listed in .* are missing .*shard_00001.pt"):
        load_labels(tmp_path / "b")
    generate_labels(model, cfg, tmp_path / "b", progress=False)
    assert torch.equal(load_labels(tmp_path / "b")["mi"], a["mi"])
    with pytest.raises(ValueError, match="holds labels of another config"):
        generate_labels(model, LabelConfig(n_shards=2, sources_per_shard=4, contexts_per_source=3, layers=(-1, 1)),
                        tmp_path / "b", progress=False)


def test_head_checkpoint_roundtrip_and_one_pass_prediction(tmp_path):
    torch.manual_seed(0)
    model = SudokuMDM(TINY).eval()
    head = MIHead(MIHeadConfig(32, d_hidden=16, rank=8))
    save_head(head, tmp_path / "h.pt", HeadTrainConfig(), [{"epoch": 1}])
    head2, rec = load_head(tmp_path / "h.pt")
    x = torch.full((2, 81), 9)
    x[1, :40] = 3
    pred = predict_mi(model, head, x)
    assert torch.equal(pred, predict_mi(model, head2, x))
    with torch.no_grad():  # one MDM pass and one head pass per context, batched or not
        assert torch.allclose(pred, head(*head_inputs(model, x)), atol=1e-6)
        assert torch.allclose(predict_mi(model, head, x, batch_size=1), pred, atol=1e-6)
    assert pred[0].abs().sum() > 0 and (pred[1, :40] == 0).all() and (pred[1, :, :40] == 0).all()
    h, m, e, p = head_inputs(model, x)
    assert h.shape == (2, 81, 32) and m[1, :40].logical_not().all() and (e[1, :40] == 0).all()
    assert p.shape == (2, 81, 9) and torch.allclose(p.sum(-1), torch.ones(2, 81))
    assert rec["log"] == [{"epoch": 1}]
    with pytest.raises(FileNotFoundError):
        load_head(tmp_path / "missing.pt")


def _dense_reference(head: MIHead, h, masked, ent):
    """The head's prediction written densely over all (i, j), one sequence at a time (positions absolute)."""
    import math

    import torch.nn.functional as F

    out = []
    for b in range(h.shape[0]):
        L = h.shape[1]
        a = head.feat(head.norm(h[b]))
        z = torch.cat([a[:, None] * a[None], (head.pos[:L, None] * head.pos[None, :L])], -1)
        x = head.pair_in(z)  # [L, L, q]
        pair = masked[b][:, None] & masked[b][None] & ~torch.eye(L, dtype=torch.bool)
        for r in head.tri:
            m = r["msg"](x) * pair[..., None]  # messages only on masked pairs, symmetric
            t = torch.einsum("ikc,kjc->ijc", m, m) / math.sqrt(L)
            x = x + F.gelu(r["upd"](torch.cat([x, t], -1)))
        s = head.out(x).squeeze(-1)
        e = ent[b]
        mi = (e[:, None] + e[None]) / 2 * torch.sigmoid(s)
        out.append(mi * pair)
    return torch.stack(out)


def test_sparse_pairs_equal_a_dense_reference_and_every_parameter_learns():
    torch.manual_seed(1)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, max_len=12, pos_dim=4, tri_channels=3, tri_rounds=2))
    h = torch.randn(3, 12, 16)
    masked = torch.rand(3, 12) < 0.7
    ent = torch.rand(3, 12) * masked
    with torch.no_grad():
        got = head(h, masked, ent)
        one = torch.cat([head(h[b:b + 1], masked[b:b + 1], ent[b:b + 1]) for b in range(3)])
        assert torch.allclose(got, _dense_reference(head, h, masked, ent), atol=1e-5)
        assert torch.allclose(got, one, atol=1e-6)  # no leakage between sequences of a batch
    for m in (masked, torch.zeros_like(masked)):  # with and without a masked pair (DDP needs every gradient)
        head.zero_grad()
        head(h, m, ent).sum().backward()
        assert all(p.grad is not None for p in head.parameters())


@pytest.mark.parametrize("all_row", [False, True])  # few candidate pairs (row dot products) / many (dense product)
@pytest.mark.parametrize("rounds,positions", [(0, "absolute"), (1, "absolute"), (1, "relative"), (2, "absolute")])
def test_candidate_pairs_equal_the_full_matrix_there_and_zero_elsewhere(rounds, positions, all_row):
    torch.manual_seed(2)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, max_len=12, pos_dim=4, positions=positions,
                               tri_channels=3 if rounds else 0, tri_rounds=max(rounds, 1))).eval()
    with torch.no_grad():  # weights large enough that the two-hop term moves the output well beyond the tolerance
        for p in head.parameters():
            p.mul_(3)
        head.out[-1].bias.zero_()
    h = torch.randn(4, 12, 16)
    masked = torch.rand(4, 12) < 0.8
    ent = torch.rand(4, 12) * masked
    cand = torch.rand(4, 12) < 0.35
    cand[0] = False
    cand[0, 0] = True  # a lone candidate: nothing to return
    if all_row:
        cand[3] = True  # every position a candidate: the full matrix
    keep = (cand & masked)[:, :, None] & (cand & masked)[:, None, :]
    keep[0] = False
    with torch.no_grad():
        full, sub = head(h, masked, ent), head(h, masked, ent, candidates_BL=cand.long())
        if rounds == 1:  # the two-hop term matters here: without it the values differ
            head.tri[0]["msg"].weight.zero_(), head.tri[0]["msg"].bias.zero_()
            no_hop = head(h, masked, ent)
            assert not torch.allclose(no_hop * keep, full * keep, rtol=1e-3, atol=1e-6)
    n_pairs = int(keep.triu(1).sum())
    assert (n_pairs > 4 * 12) == all_row  # which two-hop path ran (threshold B·L)
    assert (full * keep).abs().sum() > 0
    assert torch.allclose(sub, full * keep, rtol=1e-5, atol=1e-7)
    assert not sub[0].any()
    if all_row:
        assert torch.allclose(sub[3], full[3], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="candidates must have shape"):
        head(h, masked, ent, candidates_BL=cand[:, :5])


def test_new_head_settings_keep_earlier_cache_keys():
    """loss scales and out_bias are left out of the configs' dicts at their defaults, so heads cached by earlier
    runs keep their keys; given, they are recorded and a saved head reloads with them."""

    assert set(HeadTrainConfig().to_dict()) == {"layer", "epochs", "batch_size", "lr", "weight_decay", "loss", "schedule",
                                                "patience", "seed"}
    assert "out_bias" not in MIHeadConfig(8).to_dict()
    t = HeadTrainConfig(loss_scale=0.001, loss_weight_scale=0.005).to_dict()
    assert t["loss_scale"] == 0.001 and t["loss_weight_scale"] == 0.005
    hc = MIHeadConfig(8, out_bias=-7.0)
    assert MIHeadConfig(**hc.to_dict()) == hc
    head = MIHead(hc)
    assert head.out[-1].bias.item() == -7.0


def _bilinear_reference(head, h, masked, ent):
    """The bilinear head by hand, pair by pair: SiLU units, readout, two-hop over masked k, mean bound."""
    c = head.config
    B, L, _ = h.shape
    a = head.feat(head.norm(h)).view(B, L, c.channels, c.rank)
    e = head.pos[:L]
    out = torch.zeros(B, L, L)
    k = head.tri_weight.numel()
    for b in range(B):
        g = torch.zeros(c.channels, L, L)
        for i in range(L):
            for j in range(L):
                g[:, i, j] = F.silu((a[b, i] * a[b, j]).sum(-1) / math.sqrt(c.rank) + (e[i] * e[j]).sum(-1) + head.bias)
        m = masked[b]
        for i in range(L):
            for j in range(L):
                if i == j or not (m[i] and m[j]):
                    continue
                u = F.silu(head.mix @ g[:, i, j] + head.mix_bias) if c.mix_channels else g[:, i, j]
                s = (head.readout * u).sum() + head.out_bias
                two_hop = sum(g[:k, i, q] * g[:k, q, j] for q in range(L) if m[q] and q not in (i, j)) \
                    if k else torch.zeros(0)
                if k:  # k = i or k = j is not a masked *pair* of the two-hop sum
                    s = s + (head.tri_weight * two_hop).sum() / math.sqrt(L)
                out[b, i, j] = (ent[b, i] + ent[b, j]) / 2 * torch.sigmoid(s)
    return out


def test_bilinear_head_equals_its_definition_and_is_cheap_to_configure():
    torch.manual_seed(3)
    cfg = MIHeadConfig(16, d_hidden=8, rank=4, channels=6, pos_dim=12, max_len=9, tri_channels=2, pairs="bilinear")
    head = MIHead(cfg)
    with torch.no_grad():
        head.tri_weight.copy_(torch.tensor([0.7, -0.4]))  # starts at zero: make the two-hop term count
    h = torch.randn(2, 9, 16)
    masked = torch.rand(2, 9) < 0.7
    ent = torch.rand(2, 9) * masked
    with torch.no_grad():
        got = head(h, masked, ent)
        assert torch.allclose(got, _bilinear_reference(head, h, masked, ent), atol=1e-5)
        assert torch.equal(got, got.mT) and not got.diagonal(dim1=1, dim2=2).any()
        cand = torch.rand(2, 9) < 0.5
        keep = (cand & masked)[:, :, None] & (cand & masked)[:, None, :]
        keep &= (cand & masked).sum(1)[:, None, None] >= 2
        assert torch.equal(head(h, masked, ent, candidates_BL=cand), got * keep)
    head.zero_grad()
    head(h, masked, ent).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert MIHeadConfig(**cfg.to_dict()) == cfg and cfg.to_dict()["pairs"] == "bilinear"
    assert "mix_channels" not in cfg.to_dict()
    mixed = MIHead(dataclasses.replace(cfg, mix_channels=5))  # with a hidden pair layer
    with torch.no_grad():
        mixed.tri_weight.copy_(torch.tensor([0.7, -0.4]))
        assert torch.allclose(mixed(h, masked, ent), _bilinear_reference(mixed, h, masked, ent), atol=1e-5)
    assert mixed.mix.shape == (5, 6) and mixed.readout.shape == (5,) and mixed.config.to_dict()["mix_channels"] == 5
    with pytest.raises(ValueError, match="mix_channels must be >= 0"):
        MIHead(dataclasses.replace(cfg, mix_channels=-1))
    assert "pairs" not in MIHeadConfig(8).to_dict() and "channels" not in MIHeadConfig(8).to_dict()
    rel = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=3, positions="relative", max_len=5, tri_channels=2,
                             pairs="bilinear"))
    out = rel(torch.randn(1, 30, 16), torch.ones(1, 30, dtype=torch.bool), torch.ones(1, 30))
    assert out.shape == (1, 30, 30) and torch.allclose(out, out.mT)
    # the head runs on the gathered masked rows only: the same values as on all L rows
    with torch.no_grad():
        rel.tri_weight.copy_(torch.tensor([0.5, -0.3]))
        hh, ee = torch.randn(3, 30, 16), torch.rand(3, 30)
        mm = torch.rand(3, 30) < 0.5
        mm[1] = False
        mm[1, 7] = True  # a sequence with a single masked position: no pair
        for hd in (rel, mixed):
            hh_, mm_, ee_ = (hh, mm, ee) if hd is rel else (hh[:, :9], mm[:, :9], ee[:, :9])
            L_ = hh_.shape[1]
            full = hd._forward_bilinear(hh_, mm_[:, :, None] & mm_[:, None, :] & ~torch.eye(L_, dtype=torch.bool), ee_)
            assert torch.allclose(hd(hh_, mm_, ee_), full, atol=1e-6) and not hd(hh_, mm_, ee_)[1].any()
    with pytest.raises(ValueError, match=r"pos_dim \(10\) must be a multiple of channels \(4\)"):
        MIHead(MIHeadConfig(16, channels=4, pos_dim=10, pairs="bilinear"))
    with pytest.raises(ValueError, match="at most one two-hop round on at most channels=4"):
        MIHead(MIHeadConfig(16, channels=4, pos_dim=8, tri_channels=5, pairs="bilinear"))
    with pytest.raises(ValueError, match="pairs must be one of"):
        MIHead(MIHeadConfig(16, pairs="sparse"))


@pytest.mark.parametrize("arch", [dict(positions="absolute", pos_dim=12, max_len=30, mix_channels=5),
                                  dict(positions="relative", max_len=5), dict(pos_dim=0, tri_channels=0)])
def test_bilinear_head_on_candidate_rows_equals_the_full_matrix(arch, monkeypatch):
    """With candidates, the bilinear head computes the units of the candidate rows only (against every masked row,
    for the two-hop sum): the full matrix's values between candidates, zero elsewhere."""
    torch.manual_seed(5)
    cfg = dataclasses.replace(MIHeadConfig(16, d_hidden=8, rank=4, channels=6, tri_channels=2, pairs="bilinear"), **arch)
    head = MIHead(cfg)
    with torch.no_grad():
        head.tri_weight.copy_(torch.tensor([0.7, -0.4])[:head.tri_weight.numel()])
    calls = []
    rows = head._bilinear_rows
    monkeypatch.setattr(head, "_bilinear_rows", lambda *a: calls.append(a[5].shape) or rows(*a))
    h, ent = torch.randn(5, 30, 16), torch.rand(5, 30)
    masked = torch.rand(5, 30) < 0.7
    masked[4] = True  # every position masked
    cand = masked & (torch.rand(5, 30) < 0.3)
    cand[0] = False
    cand[0, masked[0].nonzero()[0]] = True  # a lone candidate: nothing to return
    keep = cand[:, :, None] & cand[:, None, :]
    keep[0] = False
    with torch.no_grad():
        full, sub = head(h, masked, ent), head(h, masked, ent, candidates_BL=cand)
    assert calls == [(5, int(cand.sum(1).max()))]  # the candidate rows only, padded to the largest count
    assert (full * keep).abs().sum() > 0 and not sub[0].any() and torch.equal(sub, sub.mT)
    assert torch.allclose(sub, full * keep, rtol=1e-5, atol=1e-7)


def test_bilinear_head_learns_position_blocks_and_reloads(tmp_path):
    data = _position_labels()
    masked = data["tokens"] == 9
    pair = masked[:, :, None] & masked[:, None, :] & ~torch.eye(12, dtype=torch.bool)
    cfg = MIHeadConfig(16, d_hidden=16, rank=4, channels=4, pos_dim=8, max_len=12, tri_channels=0, pairs="bilinear")
    torch.manual_seed(0)
    head, _ = train_head(data, data, cfg, HeadTrainConfig(epochs=60, batch_size=16, lr=2e-2), mask_id=9, progress=False)
    pred = head(data["hidden_-1"], masked, data["entropy"]).detach()
    assert np.corrcoef(pred[pair].numpy(), data["mi"][pair].numpy())[0, 1] > 0.99
    save_head(head, tmp_path / "h.pt", HeadTrainConfig(), [])
    again, _ = load_head(tmp_path / "h.pt")
    assert torch.equal(again(data["hidden_-1"], masked, data["entropy"]), pred)


def test_packed_label_set_unpacks_to_the_same_shards(tmp_path):
    """`pack_labels` keeps everything but the hidden states; `unpack_labels` recomputes those: identical shards."""
    import shutil

    from mimdm.pipelines.labels import PACKED, pack_labels, unpack_labels

    torch.manual_seed(0)
    model = SudokuMDM(TINY).eval()
    cfg = LabelConfig(n_shards=2, sources_per_shard=3, contexts_per_source=2, layers=(-1, 1))
    generate_labels(model, cfg, tmp_path / "a", progress=False)
    path = pack_labels(tmp_path / "a")
    (tmp_path / "b").mkdir()
    shutil.copy(path, tmp_path / "b" / PACKED)
    assert not is_complete(tmp_path / "b", cfg)
    unpack_labels(model, cfg, tmp_path / "b")
    assert is_complete(tmp_path / "b", cfg)
    assert (tmp_path / "a" / "manifest.json").read_text() == (tmp_path / "b" / "manifest.json").read_text()
    for k in (0, 1):
        a = torch.load(tmp_path / "a" / f"shard_{k:05d}.pt", weights_only=True)
        b = torch.load(tmp_path / "b" / f"shard_{k:05d}.pt", weights_only=True)
        assert set(a) == set(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (k, key)
    with pytest.raises(ValueError, match="labels of another config"):
        unpack_labels(model, dataclasses.replace(cfg, n_shards=3), tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="no packed label set"):
        unpack_labels(model, cfg, tmp_path / "none")


def test_random_symmetry_maps_move_units_onto_units():
    from mimdm.data import sudoku as sd

    cells, digits = sd.random_symmetry_maps(64, np.random.default_rng(3))
    r, c = np.divmod(np.arange(81), 9)
    b = (r // 3) * 3 + c // 3
    same_unit = (r[:, None] == r) | (c[:, None] == c) | (b[:, None] == b)
    assert (np.sort(cells, 1) == np.arange(81)).all()
    assert (digits[:, 0] == 0).all() and (np.sort(digits[:, 1:], 1) == np.arange(1, 10)).all()
    for k in range(64):  # the constraint graph is invariant: 810 pairs share a unit, before and after
        assert (same_unit[cells[k]][:, cells[k]] == same_unit).all()
    assert len({tuple(x) for x in cells}) == 64  # 64 distinct maps
    grids = sd.random_solutions(64, 0)
    moved = np.take_along_axis(digits, np.take_along_axis(grids.astype(np.intp), cells, 1), 1)
    assert sd.is_valid_solution_batch(moved).all()


def test_sudoku_symmetry_augment_permutes_labels_and_recomputes_inputs():
    from mimdm.data import sudoku as sd
    from mimdm.experiments.mi_head import random_symmetry_tensors, sudoku_symmetry_augment

    torch.manual_seed(0)
    model = SudokuMDM(TINY).eval()
    sol = torch.from_numpy(sd.random_solutions(6, 1).astype(np.int64) - 1)  # values 0..8
    masked = torch.rand(6, 81, generator=torch.Generator().manual_seed(2)) < 0.5
    tokens = torch.where(masked, model.mask_id, model.value_token_ids[sol])
    mi = torch.rand(6, 81, 81, generator=torch.Generator().manual_seed(4))
    split = {"tokens": tokens, "mi": mi + mi.transpose(1, 2), "entropy": torch.zeros(6, 81),
             "hidden_-1": torch.zeros(6, 81, 32, dtype=torch.float16)}
    out = sudoku_symmetry_augment(model, split, -1, np.random.default_rng(7))
    cells, digits = random_symmetry_tensors(6, np.random.default_rng(7))  # the same draws
    new_masked = out["tokens"] == model.mask_id
    assert (new_masked == masked.gather(1, cells)).all()
    for k in range(6):
        assert torch.equal(out["mi"][k], split["mi"][k][cells[k]][:, cells[k]])
        filled = ~new_masked[k]
        new_digits = out["tokens"][k][filled] + 1  # value token v writes digit v + 1
        assert torch.equal(new_digits, digits[k][sol[k].gather(0, cells[k])[filled] + 1])
    full = torch.where(new_masked, 0, out["tokens"] + 1)
    sol_moved = torch.stack([digits[k][sol[k][cells[k]] + 1] for k in range(6)])
    assert sd.is_valid_solution_batch(sol_moved.numpy().astype(np.int8)).all()
    assert ((full == 0) | (full == sol_moved)).all()
    h, _, e, p = head_inputs(model, out["tokens"])
    assert out["hidden_-1"].dtype == torch.float16
    assert torch.equal(out["hidden_-1"], h.half()) and torch.allclose(out["entropy"], e.float())
    assert torch.equal(out["probs"], p)
    assert (out["entropy"][new_masked] > 0).all() and (out["entropy"][~new_masked] == 0).all()


def test_train_head_augments_every_epoch_and_keys_only_when_set():
    data = _synthetic_labels(n=8)
    calls = []

    def augment(split, rng):
        calls.append(int(rng.integers(1 << 30)))
        return split

    cfg = HeadTrainConfig(epochs=3, batch_size=4, augment="sudoku_symmetry")
    train_head(data, data, MIHeadConfig(16, d_hidden=8, rank=4), cfg, mask_id=9, progress=False, augment=augment)
    assert len(calls) == 3 and len(set(calls)) == 3  # once per epoch, fresh draws
    with pytest.raises(ValueError, match="needs an augment function"):
        train_head(data, data, MIHeadConfig(16, d_hidden=8, rank=4), cfg, mask_id=9, progress=False)
    with pytest.raises(ValueError, match="unknown augment 'flip'"):
        train_head(data, data, MIHeadConfig(16, d_hidden=8, rank=4), dataclasses.replace(cfg, augment="flip"),
                   mask_id=9, progress=False, augment=augment)
    with pytest.raises(ValueError, match="augment returned 4 contexts for 8"):
        train_head(data, data, MIHeadConfig(16, d_hidden=8, rank=4), cfg, mask_id=9, progress=False,
                   augment=lambda s, rng: {k: v[:4] for k, v in s.items()})
    assert "augment" not in HeadTrainConfig().to_dict()  # earlier heads' cache keys hold
    assert cfg.to_dict()["augment"] == "sudoku_symmetry"


def _sudoku_marginals(B, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(B, 81, 9, generator=g), -1)
    masked = torch.rand(B, 81, generator=g) < 0.7
    return probs, masked


def test_constraint_features_enter_the_logit():
    """With every other input silenced (zero hidden-state units, no positions, two-hop, mix or bias), the logit is
    exactly a feature: log1p(I^c / 0.01) with I^c = `constraint_mi` of the marginals (top 4 digits), or the
    marginals' overlap Σ_v p_i(v) p_j(v). Invert the bound and compare."""
    from mimdm.probing.sudoku_mi import constraint_mi

    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=2, pos_dim=0, tri_channels=0, pairs="bilinear",
                               max_len=81, constraint_feature=True)).eval()
    probs, masked = _sudoku_marginals(3, 0)
    ent = -(probs * probs.log()).sum(-1) * masked
    pairs = masked[:, :, None] & masked[:, None, :] & ~torch.eye(81, dtype=torch.bool)
    bound = (ent[:, :, None] + ent[:, None, :]) / 2
    wants = [torch.log1p(constraint_mi(probs, masked, top_k=4) / 0.01), torch.einsum("biv,bjv->bij", probs, probs)]
    for k, want in enumerate(wants):
        with torch.no_grad():
            head.readout.zero_()
            head.out_bias.zero_()
            head.feature_logit.zero_()
            head.feature_logit[k] = 1.0
            mi = head(torch.randn(3, 81, 16), masked, ent, probs)
        got = torch.logit((mi / bound)[pairs].double())
        assert torch.allclose(got, want[pairs].double(), atol=1e-3), (k, float((got - want[pairs]).abs().max()))
        assert float(want[pairs].std()) > 0.05  # not a comparison between constants
        assert (mi[~pairs] == 0).all()


def test_constraint_feature_head_on_candidates_equals_the_full_matrix_and_needs_marginals():
    torch.manual_seed(3)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=4, pos_dim=8, tri_channels=2, mix_channels=3,
                               pairs="bilinear", max_len=81, constraint_feature=True)).eval()
    with torch.no_grad():
        head.feature_logit.fill_(0.5)
    probs, masked = _sudoku_marginals(4, 1)
    h, ent = torch.randn(4, 81, 16), torch.rand(4, 81) * masked
    cand = masked & (torch.rand(4, 81) < 0.2)
    keep = cand[:, :, None] & cand[:, None, :]
    with torch.no_grad():
        full, sub = head(h, masked, ent, probs), head(h, masked, ent, probs, candidates_BL=cand)
        other = head(h, masked, ent, probs.roll(1, dims=1))  # other marginals: another feature, another output
    assert (full * keep).abs().sum() > 0
    assert torch.allclose(sub, full * keep, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(other, full)
    with pytest.raises(ValueError, match="pass probs_BLV"):
        head(h, masked, ent)
    with pytest.raises(ValueError, match=r"probs must have shape \(4, 81, 9\)"):
        head(h, masked, ent, probs[:, :, :8])
    with pytest.raises(ValueError, match="constraint_feature is for Sudoku"):
        MIHead(MIHeadConfig(16, max_len=81, constraint_feature=True))  # pairs="gather"
    assert "constraint_feature" not in MIHeadConfig(16).to_dict()  # earlier heads' cache keys hold


def test_constraint_hops_enter_the_logit_as_walk_sums():
    """With ``constraint_hops`` = 2 and every other input silenced, the logit is exactly a walk sum of the feature f
    (log1p(I^c / 0.01), or the overlap) over the masked cells: Σ_k f_ik f_kj / 81 (two hops) or
    Σ_k,l f_ik f_kl f_lj / 81² (three), computed here by explicit sums over the intermediate cells."""
    from mimdm.probing.sudoku_mi import constraint_mi

    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=2, pos_dim=0, tri_channels=0, pairs="bilinear",
                               max_len=81, constraint_feature=True, constraint_hops=2)).eval()
    assert head.feature_logit.shape == (6,) and head.config.n_features == 6
    probs, masked = _sudoku_marginals(2, 5)
    ent = -(probs * probs.log()).sum(-1) * masked
    pairs = masked[:, :, None] & masked[:, None, :] & ~torch.eye(81, dtype=torch.bool)
    bound = (ent[:, :, None] + ent[:, None, :]) / 2
    feats = [torch.log1p(constraint_mi(probs, masked, top_k=4) / 0.01).double(),
             torch.einsum("biv,bjv->bij", probs, probs).double() * pairs]
    for k, f in enumerate(feats):
        two, three = torch.zeros_like(f), torch.zeros_like(f)
        for kk in range(81):  # one intermediate cell at a time (f is zero at unmasked cells)
            two += f[:, :, kk, None] * f[:, None, kk, :] / 81
        for kk in range(81):
            three += two[:, :, kk, None] * f[:, None, kk, :] / 81
        for channel, want in ((2 + k, two), (4 + k, three)):
            with torch.no_grad():
                head.readout.zero_()
                head.out_bias.zero_()
                head.feature_logit.zero_()
                head.feature_logit[channel] = 1.0
                mi = head(torch.randn(2, 81, 16), masked, ent, probs)
            got = torch.logit((mi / bound)[pairs].double())
            assert torch.allclose(got, want[pairs], rtol=1e-4, atol=2e-6), (channel, float((got - want[pairs]).abs().max()))
            assert float(want[pairs].std()) > 1e-4  # not a comparison between constants (50x the tolerance)


def test_constraint_hops_head_on_candidates_equals_the_full_matrix():
    torch.manual_seed(4)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=4, pos_dim=8, tri_channels=2, mix_channels=3,
                               pairs="bilinear", max_len=81, constraint_feature=True, constraint_hops=2)).eval()
    with torch.no_grad():
        head.feature_logit.fill_(0.5)
    probs, masked = _sudoku_marginals(4, 2)
    h, ent = torch.randn(4, 81, 16), torch.rand(4, 81) * masked
    cand = masked & (torch.rand(4, 81) < 0.2)
    keep = cand[:, :, None] & cand[:, None, :]
    with torch.no_grad():
        full, sub = head(h, masked, ent, probs), head(h, masked, ent, probs, candidates_BL=cand)
        head.feature_logit[2:] = 0  # the two-hop channels carry weight: silencing them changes the output
        plain = head(h, masked, ent, probs)
    assert (full * keep).abs().sum() > 0
    assert torch.allclose(sub, full * keep, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(plain, full)
    with pytest.raises(ValueError, match="needs constraint_feature=True"):
        MIHead(MIHeadConfig(16, max_len=81, pairs="bilinear", constraint_hops=1))
    assert "constraint_hops" not in MIHeadConfig(16, constraint_feature=True).to_dict()  # earlier heads' keys hold


def test_constraint_feature_head_trains_on_labels_with_marginals():
    from mimdm.experiments.mi_head import with_marginals

    torch.manual_seed(0)
    model = SudokuMDM(TINY).eval()
    sol = torch.from_numpy(sd_random_solutions(8) - 1)
    masked = torch.rand(8, 81, generator=torch.Generator().manual_seed(2)) < 0.6
    tokens = torch.where(masked, model.mask_id, model.value_token_ids[sol])
    h, m, e, p = head_inputs(model, tokens)
    mi = torch.rand(8, 81, 81, generator=torch.Generator().manual_seed(4)) * 0.1
    split = {"tokens": tokens, "mi": (mi + mi.mT) * (m[:, :, None] & m[:, None, :]), "entropy": e,
             "hidden_-1": h.half()}
    cfg = MIHeadConfig(32, d_hidden=8, rank=4, channels=2, pos_dim=4, tri_channels=1, mix_channels=2,
                       pairs="bilinear", max_len=81, constraint_feature=True)
    with pytest.raises(KeyError, match="with_marginals"):
        train_head(split, split, cfg, HeadTrainConfig(epochs=1), mask_id=model.mask_id, progress=False)
    full = with_marginals(model, split)
    assert torch.equal(full["probs"], p) and with_marginals(model, full) is full
    head, log = train_head(full, full, cfg, HeadTrainConfig(epochs=2, lr=1e-2), mask_id=model.mask_id, progress=False)
    assert len(log) == 2 and all(math.isfinite(r["val_loss"]) for r in log)
    assert (head.feature_logit != 0).all()  # the features' weights were trained


def sd_random_solutions(n):
    from mimdm.data import sudoku as sd

    return sd.random_solutions(n, 1).astype(np.int64)


def test_ablations_of_a_constraint_feature_head():
    """The cpu profile's head reads the constraint feature: one ablation removes it, the earlier gathered head is the
    same as before (8 two-hop channels, no feature), and every ablation config builds."""
    from mimdm.app.profiles import get_profile
    from mimdm.experiments.mi_head import ablation_configs, head_config_for

    P = get_profile("cpu")
    base = head_config_for(P, SudokuMDM(TINY))
    assert base.constraint_feature and base.pairs == "bilinear"
    abl = ablation_configs(P)
    assert abl["no constraint feature"][0] == {"constraint_feature": False}
    gathered = dataclasses.replace(base, **abl["gathered pair network (earlier head)"][0])
    assert (gathered.pairs, gathered.tri_channels, gathered.constraint_feature) == ("gather", 8, False)
    for over, cfg in abl.values():
        MIHead(dataclasses.replace(base, **over))
        assert cfg.augment == "none"
    assert "no constraint feature" not in ablation_configs(get_profile("smoke"))


def test_graph_rounds_propagate_the_pair_layer_along_masked_peers():
    """``graph_rounds`` = 2 by hand: the hidden pair layer u_ij = SiLU(W g_ij + β) of the masked pairs, then twice
    u_ij ← u_ij + U SiLU(V [u_ij, mean of u_kj over the masked peers k ≠ j of i] + c), the peers listed from the
    Sudoku constraint graph cell by cell; the readout, the two-hop term and the bound as without rounds, the bound
    symmetrising. The head computes it on the gathered masked rows (grid 0), or on all 81 (grid 1, fully masked):
    the same values."""
    torch.manual_seed(5)
    cfg = MIHeadConfig(16, d_hidden=8, rank=4, channels=4, pos_dim=8, tri_channels=2, mix_channels=3,
                       pairs="bilinear", max_len=81, graph_rounds=2)
    head = MIHead(cfg).eval()
    with torch.no_grad():
        head.tri_weight.copy_(torch.tensor([0.6, -0.3]))
        head.graph_bias.normal_()
    B, L = 2, 81
    h = torch.randn(B, L, 16)
    masked = torch.rand(B, L) < 0.6
    masked[1] = True  # every cell masked: the head's path without gathering
    ent = torch.rand(B, L) * masked
    peer = sd.constraint_graph()
    with torch.no_grad():
        a = head.feat(head.norm(h)).view(B, L, 4, 4)
        e = head.pos[:L]
        g = F.silu(torch.einsum("bicr,bjcr->bcij", a, a) / 2 + torch.einsum("icp,jcp->cij", e, e)[None]
                   + head.bias[None, :, None, None])  # [B, C, L, L]
        pm = masked[:, :, None] & masked[:, None, :] & ~torch.eye(L, dtype=torch.bool)
        u = F.silu(torch.einsum("mc,bcij->bmij", head.mix, g) + head.mix_bias[None, :, None, None]) * pm[:, None]
        for r in range(2):
            msg = torch.zeros_like(u)
            for b in range(B):
                for i in range(L):
                    ks = [k for k in range(L) if peer[i, k] and masked[b, k]]
                    for j in range(L):
                        others = [k for k in ks if k != j]
                        if masked[b, i] and others:
                            msg[b, :, i, j] = u[b][:, others, j].mean(1)
            pre = torch.einsum("mn,bnij->bmij", head.graph_in[r], torch.cat([u, msg], 1)) \
                + head.graph_bias[r][None, :, None, None]
            u = u + torch.einsum("mn,bnij->bmij", head.graph_out[r], F.silu(pre)) * pm[:, None]
        s = torch.einsum("m,bmij->bij", head.readout, u) + head.out_bias
        gm = g[:, :2] * pm[:, None]
        s = s + torch.einsum("k,bkij->bij", head.tri_weight, gm @ gm) / 9
        mi = (ent[:, :, None] + ent[:, None, :]) / 2 * torch.sigmoid(s) * pm
        want = (mi + mi.mT) / 2
        got = head(h, masked, ent)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), float((got - want).abs().max())
    with torch.no_grad():  # the rounds count: without them another output
        head.graph_out.zero_()
        assert (head(h, masked, ent) - got).abs().max() > 1e-3
    assert MIHeadConfig(**cfg.to_dict()) == cfg and "graph_rounds" not in dataclasses.replace(cfg, graph_rounds=0).to_dict()
    with pytest.raises(ValueError, match="graph_rounds propagate the hidden pair layer: they need mix_channels >= 1"):
        MIHead(dataclasses.replace(cfg, mix_channels=0))
    with pytest.raises(ValueError, match="they need pairs='bilinear', positions='absolute' and max_len=81"):
        MIHead(dataclasses.replace(cfg, max_len=50))
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="graph_rounds must be an integer >= 0"):
            MIHead(dataclasses.replace(cfg, graph_rounds=bad))
    with pytest.raises(ValueError, match="constraint_hops must be an integer >= 0, got True"):
        MIHead(dataclasses.replace(cfg, constraint_feature=True, constraint_hops=True))
    with pytest.raises(ValueError, match="reads Sudoku grids of 81 cells, got length 50"):
        head(h[:, :50], masked[:, :50], ent[:, :50])


def test_graph_rounds_head_on_candidates_equals_the_full_matrix_and_every_parameter_learns():
    torch.manual_seed(6)
    head = MIHead(MIHeadConfig(16, d_hidden=8, rank=4, channels=4, pos_dim=8, tri_channels=2, mix_channels=3,
                               pairs="bilinear", max_len=81, constraint_feature=True, graph_rounds=1))
    probs, masked = _sudoku_marginals(3, 4)
    h, ent = torch.randn(3, 81, 16), torch.rand(3, 81) * masked
    cand = masked & (torch.rand(3, 81) < 0.2)
    keep = cand[:, :, None] & cand[:, None, :]
    with torch.no_grad():
        full, sub = head(h, masked, ent, probs), head(h, masked, ent, probs, candidates_BL=cand)
    assert (full * keep).abs().sum() > 0 and torch.equal(sub, full * keep)
    head(h, masked, ent, probs).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert not any(k == "peer" for k in head.state_dict())  # the graph is not a parameter: checkpoints hold none
