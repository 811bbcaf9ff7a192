"""Shipped checkpoints: verification, installation into the cache, refusal to retrain, and the Potts packing."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from mimdm.core import shipped
from mimdm.core.artifacts import artifact_dir
from mimdm.models.potts import PottsMDM, PottsMDMConfig, load_potts, pack_couplings, save_potts, unpack_couplings
from mimdm.models.sudoku import SudokuMDMConfig
from mimdm.models.training import TrainConfig
from mimdm.pipelines.zoo import load_or_train_sudoku_mdm, solve_rate, sudoku_mdm_dir


@pytest.fixture
def roots(tmp_path, monkeypatch):
    ship_root, cache = tmp_path / "checkpoints", tmp_path / "cache"
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", ship_root)
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(cache))
    monkeypatch.delenv(shipped.ENV, raising=False)
    return ship_root, cache


def _artifact(cache, payload=b"weights", config=None):
    d = artifact_dir("toy_model", "m", config or {"width": 4, "train": {"steps": 10}}, cache)
    (d / "model.pt").write_bytes(payload)
    return d


def test_ship_verify_install_roundtrip(roots):
    ship_root, cache = roots
    src = _artifact(cache)
    slot = shipped.ship(src, "cpu", "toy", ["model.pt"], {"score": 0.5}, 1.5, "abc")
    rec = json.loads((slot / "record.json").read_text())
    assert rec["artifact"] == f"toy_model/{src.name}" and rec["config"] == {"width": 4, "train": {"steps": 10}}
    assert rec["files"]["model.pt"] == {"sha256": shipped.sha256_file(src / "model.pt"), "bytes": 7}
    assert [r["slot"] for r in shipped.records("cpu")] == ["toy"] and shipped.records("smoke") == []
    # a fresh cache receives the file; a second install leaves it alone; an altered cache copy is replaced
    (src / "model.pt").unlink()
    assert shipped.install("cpu") == [src] and (src / "model.pt").read_bytes() == b"weights"
    (src / "model.pt").write_bytes(b"stale")
    shipped.install("cpu")
    assert (src / "model.pt").read_bytes() == b"weights"


def test_install_over_a_locally_trained_file_resets_its_sha256_record(roots):
    """A cache file written by atomic_save (with its .sha256) and then replaced by the shipped one must load."""
    from mimdm.core.artifacts import atomic_save, load_checkpoint, sidecar_path

    ship_root, cache = roots
    src = _artifact(cache)
    atomic_save({"w": torch.ones(2)}, src / "model.pt")
    shipped.ship(src, "cpu", "toy", ["model.pt"], {}, None, None)
    atomic_save({"w": torch.zeros(3)}, src / "model.pt")  # a local retraining: other bytes, its own record
    shipped.install("cpu")
    assert torch.equal(load_checkpoint(src / "model.pt")["w"], torch.ones(2))
    assert sidecar_path(src / "model.pt").read_text().split()[0] == shipped.sha256_file(src / "model.pt")


def test_verify_catches_altered_missing_and_mislabelled_files(roots):
    ship_root, cache = roots
    slot = shipped.ship(_artifact(cache), "cpu", "toy", ["model.pt"], {}, None, None)
    (slot / "model.pt").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(shipped.ShippedCheckpointError, match=r"model.pt has sha256 .* not the recorded .*Git LFS"):
        shipped.install("cpu")
    (slot / "model.pt").unlink()
    with pytest.raises(shipped.ShippedCheckpointError, match="is missing; restore it"):
        shipped.verify(slot)
    rec = json.loads((slot / "record.json").read_text())
    rec["config"]["width"] = 5
    (slot / "record.json").write_text(json.dumps(rec))
    with pytest.raises(shipped.ShippedCheckpointError, match="config does not hash to the artifact name"):
        shipped.verify(slot)
    with pytest.raises(shipped.ShippedCheckpointError, match="no record.json"):
        shipped.verify(ship_root)


def test_ship_rejects_big_files_and_non_artifacts(roots, monkeypatch, tmp_path):
    _, cache = roots
    src = _artifact(cache)
    monkeypatch.setattr(shipped, "MAX_FILE_BYTES", 6)
    with pytest.raises(ValueError, match="7 bytes, over the 6-byte limit"):
        shipped.ship(src, "cpu", "toy", ["model.pt"], {}, None, None)
    with pytest.raises(FileNotFoundError, match="not an artifact folder"):
        shipped.ship(tmp_path, "cpu", "toy", [], {}, None, None)
    with pytest.raises(FileNotFoundError, match="other.pt not found"):
        shipped.ship(src, "cpu", "toy", ["other.pt"], {}, None, None)


def test_refuse_training_names_the_differing_keys(roots, monkeypatch):
    _, cache = roots
    shipped.ship(_artifact(cache), "cpu", "toy", ["model.pt"], {}, None, None)
    other = artifact_dir("toy_model", "m", {"width": 4, "train": {"steps": 99}}, cache)
    unrelated = artifact_dir("other_kind", "m", {"width": 1}, cache)
    shipped.refuse_training(other, "toy model")  # shipped-only is off: training allowed
    monkeypatch.setenv(shipped.ENV, "cpu")
    with pytest.raises(shipped.ShippedCheckpointError,
                       match=r"toy model: profile 'cpu' needs toy_model/m-\w+, which no shipped checkpoint holds "
                             r"\(closest: cpu/toy, differing in train.steps\); retrain everything with `make book RETRAIN=1`"):
        shipped.refuse_training(other, "toy model")
    shipped.refuse_training(unrelated, "other")  # the profile ships nothing of this kind: allowed
    monkeypatch.setenv(shipped.ENV, "smoke")
    shipped.refuse_training(other, "toy model")  # another profile's slots do not count


def test_shipped_sudoku_mdm_loads_without_training_and_reproduces_its_evaluation(roots, monkeypatch):
    _, cache = roots
    mcfg = SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    tcfg = TrainConfig(steps=4, batch_size=8, warmup=1, ckpt_every=2, log_every=2)
    model, rec = load_or_train_sudoku_mdm(mcfg, tcfg, n_eval=5, progress=False)
    d = sudoku_mdm_dir(mcfg, tcfg)
    shipped.ship(d, "cpu", "sudoku_mdm", ["model.pt"], rec["eval"], 0.01, None)
    (d / "model.pt").unlink()
    monkeypatch.setenv(shipped.ENV, "cpu")
    shipped.install("cpu")
    model2, rec2 = load_or_train_sudoku_mdm(mcfg, tcfg, n_eval=5, progress=False)
    assert solve_rate(model2, 5)["solve_rate"] == rec["eval"]["solve_rate"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    with pytest.raises(shipped.ShippedCheckpointError, match="differing in train.steps"):
        load_or_train_sudoku_mdm(mcfg, dataclasses.replace(tcfg, steps=5), n_eval=5, progress=False)


def test_ship_sudoku_records_an_evaluation_that_reproduce_recomputes(roots, monkeypatch):
    from types import SimpleNamespace

    from mimdm.experiments import ship

    ship_root, cache = roots
    prof = SimpleNamespace(name="cpu", sudoku_model=SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32),
                           sudoku_train=TrainConfig(steps=4, batch_size=8, warmup=1, ckpt_every=2, log_every=2),
                           sudoku_curriculum=None, solve_eval_puzzles=5)
    with pytest.raises(FileNotFoundError, match="no trained Sudoku MDM"):
        ship.ship_sudoku(prof)
    model, rec = load_or_train_sudoku_mdm(prof.sudoku_model, prof.sudoku_train, n_eval=5, progress=False)
    (slot,) = ship.ship_sudoku(prof)
    record = json.loads((slot / "record.json").read_text())
    ev = record["evaluation"]["reproduce"]["solve"]
    assert ev["n_puzzles"] == ship.SUDOKU_EVAL_PUZZLES
    assert ev["solve_rate"] == solve_rate(model, ship.SUDOKU_EVAL_PUZZLES)["solve_rate"]
    assert record["evaluation"]["measured"]["eval"] == rec["eval"] and record["kind"] == "sudoku_mdm"
    assert ship.reproduce(record) == record["evaluation"]["reproduce"]


def test_potts_couplings_pack_to_upper_blocks_in_float16(tmp_path):
    L, V = 5, 21
    g = torch.Generator().manual_seed(0)
    model = PottsMDM(L, embed_dim=3)
    with torch.no_grad():
        model.W.copy_(torch.randn(L * V, L * V, generator=g))
        model.h.copy_(torch.randn(L, V, generator=g))
        model.embedding.copy_(torch.randn(L, 3, generator=g))
    J = model.couplings()
    packed = pack_couplings(J, L)
    assert packed.shape == (L * (L - 1) // 2, V, V) and packed.dtype == torch.float16
    # block of the pair (1, 3): index 4 in triu order (0,1) (0,2) (0,3) (0,4) (1,2) ... -> (1,3) is 5
    assert torch.equal(packed[5], J[1 * V:2 * V, 3 * V:4 * V].half())
    J2 = unpack_couplings(packed, L)
    assert torch.equal(J2, J.half().float())  # exactly the float16 rounding, symmetric, zero diagonal blocks
    assert torch.equal(J2, J2.T) and not J2[:V, :V].any()
    save_potts(model, tmp_path / "m.pt", PottsMDMConfig(), TrainConfig(steps=1), {"val": {"ce": 1.0}})
    loaded, rec = load_potts(tmp_path / "m.pt")
    assert torch.equal(loaded.couplings(), J2) and torch.equal(loaded.h, model.h) and rec["val"]["ce"] == 1.0
    tok = torch.tensor([[0, 21, 3, 21, 20]])
    expect = model.h + (J2.reshape(L, V, L, V)[:, :, [0, 2, 4], [0, 3, 20]].sum(-1)).reshape(L, V)
    assert torch.allclose(loaded(tok).logits[0, [1, 3]], expect[[1, 3]], atol=1e-5)
    with pytest.raises(ValueError, match=r"packed couplings must have shape \(10, 21, 21\) for 5 columns"):
        unpack_couplings(packed[:3], L)


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_every_shipped_checkpoint_verifies_and_reproduces_its_evaluation(tmp_path, monkeypatch):
    """Each slot under checkpoints/cpu/: sha256 and config hash hold, and its recorded evaluation is recomputed
    from the installed files (CE on the test split, head fingerprints, the L2 choice)."""
    from mimdm.experiments import ship

    recs = shipped.records("cpu")
    if not recs:
        pytest.skip("no shipped cpu checkpoints in this checkout")
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path))
    assert len(shipped.install("cpu")) == len(recs)
    for rec in recs:
        assert all(m["bytes"] <= shipped.MAX_FILE_BYTES for m in rec["files"].values())
        got, want = _flat(ship.reproduce(rec)), _flat(rec["evaluation"]["reproduce"])
        assert set(got) == set(want), rec["slot"]
        for k in want:  # rel 1e-5: on another CPU the heads' MI sums moved by up to 2.5e-6 (float rounding, 2026-12-04)
            assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-9), (rec["slot"], k)


def test_readme_lists_every_slot(roots):
    _, cache = roots
    shipped.ship(_artifact(cache), "cpu", "toy", ["model.pt"], {"reproduce": {"ce": 1.25}}, 2.0, "0123456789")
    text = shipped.readme("cpu")
    assert "| toy | `toy_model/m-" in text and "`model.pt` 0.0 MB (sha256 " in text and '{"ce": 1.25}' in text
    assert "2.0 min | 0123456 |" in text


@pytest.mark.slow
def test_ship_sudoku_with_heads_ships_labels_and_heads_that_reproduce(roots, monkeypatch):
    """The smoke profile's Sudoku MDM, packed label set, MI head and ablation heads: each slot's evaluation is
    recomputed from the installed files alone, and the packed labels unpack into a fresh cache."""
    from mimdm.app.profiles import get_profile
    from mimdm.experiments import ship
    from mimdm.experiments.mi_head import load_or_build_labels
    from mimdm.pipelines.labels import is_complete, load_labels
    from mimdm.pipelines.zoo import profile_sudoku_mdm

    ship_root, cache = roots
    P = get_profile("smoke")
    model, rec = profile_sudoku_mdm(P, progress=False)
    dirs = ship.ship_sudoku(P, heads=True, progress=False)
    slots = [d.name for d in dirs]
    assert slots[:3] == ["sudoku_mdm", "sudoku_labels", "sudoku_mi_head"] and len(slots) > 4
    records = {r["slot"]: r for r in shipped.records("smoke")}
    for slot in slots:
        assert ship.reproduce(records[slot]) == records[slot]["evaluation"]["reproduce"], slot
    labels_dir = cache / records["sudoku_labels"]["artifact"]
    before = load_labels(labels_dir)
    for f in labels_dir.glob("shard_*.pt"):
        f.unlink()
    (labels_dir / "manifest.json").unlink()
    assert not is_complete(labels_dir, P.labels)
    from mimdm.experiments import mi_head

    def no_probing(*a, **k):
        raise AssertionError("the shipped label set was probed again")

    monkeypatch.setattr(mi_head, "generate_labels", no_probing)
    assert load_or_build_labels(model, rec["path"], P.labels, progress=False) == labels_dir  # unpacked, not probed
    after = load_labels(labels_dir)
    assert all(torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor))
    # the stored decodes of the shipped MDM ship as sudoku_evals; another model's entries stay behind
    from mimdm.data import sudoku as sd
    from mimdm.evaluation.evalcache import EvalCache, cached_decode
    from mimdm.experiments.mi_head import prepare
    from mimdm.models.sudoku import SudokuMDM
    from mimdm.pipelines.zoo import grids_to_tokens
    from mimdm.sampling.decoding import EBSampler, MIGuided, Sequential, head_mi_fn

    head = prepare(P, model, rec["path"], progress=False, ablations=False)["head"]
    x = grids_to_tokens(np.stack([p.puzzle for p in sd.make_puzzles(3, (30, 32), np.random.default_rng(1))]))
    ec = EvalCache("sudoku")
    for rule in (Sequential("confidence"), EBSampler(0.5), MIGuided(head_mi_fn(head, P.head_train.layer), eps=0.01)):
        cached_decode(ec, model, x, rule)
    cached_decode(ec, SudokuMDM(model.config), x, Sequential("confidence"))
    (slot,) = ship.ship_evals(P)
    rec_e = json.loads((slot / "record.json").read_text())
    assert len(rec_e["files"]) == 3 and rec_e["evaluation"]["reproduce"] == {
        "entries": 3, "rechecked": {"EBSampler": True, "MIGuided/head": True, "Sequential": True}}
    for f in ec.dir.glob("*.pt"):
        f.unlink()
    shipped.install("smoke")
    assert ship.reproduce(rec_e) == rec_e["evaluation"]["reproduce"]


def test_ablation_slot_names_are_folder_safe_and_distinct():
    from mimdm.app.profiles import get_profile
    from mimdm.experiments.mi_head import ablation_configs
    from mimdm.experiments.ship import slot_name

    assert slot_name("layer -1") == "layer_-1" and slot_name("layer 1") == "layer_1"
    assert slot_name("gathered pair network (earlier head)") == "gathered_pair_network_earlier_head"
    for arch in ({}, {"pairs": "bilinear"}):
        names = list(ablation_configs(dataclasses.replace(get_profile("cpu"), head_arch=arch)))
        slots = [slot_name(n) for n in names]
        assert len(set(slots)) == len(names) and all(s.replace("_", "").replace("-", "").isalnum() for s in slots)


def test_shipped_evals_leave_out_entries_of_other_models_and_heads():
    from mimdm.experiments.ship import _of_shipped

    heads = {"h1", "h2"}
    assert _of_shipped({"model": "m", "rule": {"class": "Sequential"}}, "m", heads)
    assert _of_shipped({"model": "m", "what": "nll"}, "m", heads)
    assert _of_shipped({"model": "m", "rule": {"class": "MIGuided", "mi_fn": "head:h2:layer-1"}}, "m", heads)
    assert _of_shipped({"model": "m", "rule": {"class": "MIGuided", "mi_fn": "zero"}}, "m", heads)
    assert not _of_shipped({"model": "m", "rule": {"class": "MIGuided", "mi_fn": "head:old:layer-1"}}, "m", heads)
    assert not _of_shipped({"model": "other", "rule": {"class": "Sequential"}}, "m", heads)
