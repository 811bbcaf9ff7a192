import json
import math

import numpy as np
import pytest
import torch

from mimdm.core.artifacts import atomic_save, load_checkpoint
from mimdm.core.device import resolve_device
from mimdm.data import sudoku as sd
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.models.training import TrainConfig, mask_tokens, mdm_loss, train_mdm
from mimdm.pipelines.zoo import (
    grids_to_tokens,
    load_or_train_sudoku_mdm,
    load_sudoku_mdm,
    sudoku_batch,
    tokens_to_grids,
)
from mimdm.sampling.decoding import Sequential, decode

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)


def test_parameter_counts_of_named_configs():
    assert SudokuMDM(SudokuMDMConfig.paper()).n_parameters() == 3_966_473
    n = SudokuMDM(SudokuMDMConfig.cpu()).n_parameters()
    assert 0.9e6 < n < 1.1e6


def test_forward_shapes_and_layers():
    m = SudokuMDM(TINY).eval()
    x = torch.randint(0, 10, (3, 81))
    out = m(x)
    assert out.logits.shape == (3, 81, 9) and out.hidden.shape == (3, 81, 32)
    assert m(x, layer=0).hidden.shape == (3, 81, 32)
    assert not torch.allclose(m(x, layer=1).hidden, m(x, layer=2).hidden)
    lp = m.log_probs(x)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3, 81), atol=1e-5)
    assert m.legal_values(81).all() and m.n_values == 9 and m.mask_id == 9


def test_bidirectional_every_cell_sees_every_other():
    m = SudokuMDM(TINY).eval()
    x = torch.full((1, 81), 9)
    y = x.clone()
    y[0, 80] = 3
    d = (m(x).logits - m(y).logits).abs().sum(-1)[0]
    assert (d[:80] > 0).all()  # changing the last cell changes the first one's prediction


def test_bad_input_errors():
    m = SudokuMDM(TINY)
    with pytest.raises(ValueError, match="exceeds the model's maximum 81"):
        m(torch.zeros(1, 82, dtype=torch.long))
    with pytest.raises(ValueError, match="81 cells"):
        m(torch.zeros(1, 80, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\)"):
        m(torch.full((1, 81), 10))
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(1, 81))
    with pytest.raises(ValueError, match=r"shape \[B, L\]"):
        m(torch.zeros(81, dtype=torch.long))


def test_resolve_device_errors():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")


def test_train_config_validation():
    with pytest.raises(ValueError, match="log_every must be >= 1"):
        TrainConfig(log_every=0)


def test_token_grid_roundtrip():
    g = sd.random_solutions(4, np.random.default_rng(0))
    g[:, ::3] = 0
    t = grids_to_tokens(g)
    assert (t[:, ::3] == 9).all()
    assert np.array_equal(tokens_to_grids(t), g)
    with pytest.raises(sd.SudokuError, match="values must be 0"):
        grids_to_tokens(np.full((1, 81), 10))
    with pytest.raises(sd.SudokuError, match=r"shape \[N, 81\]"):
        grids_to_tokens(np.zeros((1, 80)))


def test_masking_rate_and_at_least_one_mask():
    m = SudokuMDM(TINY)
    gen = torch.Generator().manual_seed(0)
    v = torch.randint(0, 9, (2000, 81))
    t = torch.full((2000,), 0.3)
    tok, masked = mask_tokens(v, m, t, gen)
    assert abs(masked.float().mean().item() - 0.3) < 0.01
    assert (tok[masked] == 9).all() and (tok[~masked] == v[~masked]).all()
    _, masked = mask_tokens(v[:50], m, torch.full((50,), 1e-6), gen)
    assert (masked.sum(1) == 1).all()


def test_training_reduces_loss_and_resumes_identically(tmp_path):
    cfg = TrainConfig(steps=40, batch_size=16, warmup=5, ckpt_every=10, log_every=10, lr=3e-3)
    torch.manual_seed(0)
    a = SudokuMDM(TINY)
    init = {k: v.clone() for k, v in a.state_dict().items()}
    log_a = train_mdm(a, sudoku_batch, cfg, tmp_path / "a.pt", progress=False)
    assert len(log_a) == 4 and all(np.isfinite(e["loss"]) for e in log_a)
    # interrupted run: stop at step 25 (between logs/checkpoints), then resume in a fresh model
    b = SudokuMDM(TINY)
    b.load_state_dict(init)
    train_mdm(b, sudoku_batch, cfg, tmp_path / "b.pt", progress=False, stop_after=25)
    st = torch.load(tmp_path / "b.pt", weights_only=True)
    assert st["step"] == 25
    c = SudokuMDM(TINY)
    log_c = train_mdm(c, sudoku_batch, cfg, tmp_path / "b.pt", progress=False)
    assert [e["step"] for e in log_c] == [10, 20, 30, 40]
    assert [e["loss"] for e in log_c] == pytest.approx([e["loss"] for e in log_a], abs=1e-6)
    for k, v in a.state_dict().items():
        assert torch.allclose(v, c.state_dict()[k], atol=1e-5), k
    with pytest.raises(ValueError, match="another training config"):
        train_mdm(SudokuMDM(TINY), sudoku_batch, TrainConfig(steps=50), tmp_path / "b.pt", progress=False)


def test_training_state_records_device_segments_and_refuses_a_cuda_generator(tmp_path):
    """Draws come from a CPU generator, so a state moves between devices; one holding a CUDA generator cannot."""
    cfg = TrainConfig(steps=6, batch_size=8, warmup=2, ckpt_every=3, log_every=3)
    torch.manual_seed(0)
    train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "s.pt", progress=False, stop_after=3)
    train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "s.pt", progress=False)
    st = torch.load(tmp_path / "s.pt", weights_only=True)
    assert st["step"] == 6 and st["rng_device"] == "cpu" and st["torch_rng"].dtype == torch.uint8
    assert json.loads(st["segments"]) == [{"from_step": 0, "device": "cpu", "torch": torch.__version__}]
    # a state written on a GPU (relabelled here) resumes on the CPU: same draws, so the same weights as one CPU run
    mid = {k: v for k, v in torch.load(tmp_path / "s.pt", weights_only=True).items()}
    torch.manual_seed(0)
    train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "g.pt", progress=False, stop_after=3)
    g = torch.load(tmp_path / "g.pt", weights_only=True)
    gpu_seg = {"from_step": 0, "device": "cuda", "torch": "2.11.0+cu130"}
    atomic_save({**g, "device_type": "cuda", "segments": json.dumps([gpu_seg])}, tmp_path / "g.pt")
    train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "g.pt", progress=False)
    g = torch.load(tmp_path / "g.pt", weights_only=True)
    assert json.loads(g["segments"]) == [gpu_seg, {"from_step": 3, "device": "cpu", "torch": torch.__version__}]
    for k, v in mid["model"].items():
        assert torch.equal(v, g["model"][k]), k
    # a state written before the draws moved to the CPU, on CUDA: refused with the reason
    old = {k: v for k, v in st.items() if k not in ("rng_device", "segments")}
    atomic_save({**old, "device_type": "cuda", "step": 3}, tmp_path / "old.pt")
    with pytest.raises(RuntimeError, match="cuda random generator"):
        train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "old.pt", progress=False)
    # the same state written on the CPU (no segments recorded yet) resumes, its first segment inferred
    atomic_save({**old, "step": 3}, tmp_path / "cpu.pt")
    train_mdm(SudokuMDM(TINY), sudoku_batch, cfg, tmp_path / "cpu.pt", progress=False)
    assert json.loads(torch.load(tmp_path / "cpu.pt", weights_only=True)["segments"]) == [{"from_step": 0, "device": "cpu"}]


@pytest.mark.slow
def test_training_memorises_one_grid(tmp_path):
    """A model trained on a single grid must drive the loss far below log 9 (uniform guessing)."""
    grid = torch.from_numpy(sd.random_solutions(1, np.random.default_rng(3)).astype(np.int64) - 1)
    torch.manual_seed(0)
    m = SudokuMDM(TINY)
    cfg = TrainConfig(steps=150, batch_size=16, warmup=5, lr=3e-3, log_every=25, ckpt_every=150)
    log = train_mdm(m, lambda rng, n: grid.repeat(n, 1), cfg, tmp_path / "state.pt", progress=False)
    assert log[0]["loss"] > 1.9
    assert log[-1]["loss"] < 0.5


def test_mdm_loss_weightings():
    """A model with uniform logits has cross-entropy ln 9 at every masked cell, so the per-cell
    weightings give ln 9 exactly and the MDLM 1/t weighting gives mean_b ln 9 · |M_b| / (t_b L)."""
    m = SudokuMDM(TINY)
    with torch.no_grad():
        m.out.weight.zero_()
        m.out.bias.zero_()
    v = torch.randint(0, 9, (64, 81), generator=torch.Generator().manual_seed(1))
    for w in ("example", "none"):
        assert mdm_loss(m, v, torch.Generator().manual_seed(0), weighting=w).item() == pytest.approx(math.log(9))
    g = torch.Generator().manual_seed(0)
    t = 1e-3 + (1 - 1e-3) * torch.rand(64, generator=g)  # the draws mdm_loss makes first
    _, masked = mask_tokens(v, m, t, g)
    want = (math.log(9) * masked.sum(1) / (t * 81)).mean().item()
    assert mdm_loss(m, v, torch.Generator().manual_seed(0), weighting="mdlm").item() == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="unknown weighting"):
        mdm_loss(m, v, torch.Generator(), weighting="elbo")


def test_load_or_train_caches_and_checkpoint_loads_weights_only(tmp_path):
    cfg = TrainConfig(steps=12, batch_size=8, warmup=2, ckpt_every=6, log_every=6)
    m, rec = load_or_train_sudoku_mdm(TINY, cfg, n_eval=3, progress=False, root=tmp_path)
    path = rec["path"]
    ck = load_checkpoint(path)  # weights_only=True
    assert ck["kind"] == "sudoku_mdm" and json.loads(ck["model_config"])["d_model"] == 32
    assert len(rec["log"]) == 2 and rec["eval"]["n_puzzles"] == 3
    # second call loads instead of training: same weights object values
    m2, rec2 = load_or_train_sudoku_mdm(TINY, cfg, n_eval=3, progress=False, root=tmp_path, train=False)
    assert rec2["path"] == path
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k])


def test_missing_checkpoint_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_sudoku_mdm(tmp_path / "nope.pt")
    torn = tmp_path / "torn.pt"
    torch.save({"w": torch.zeros(1000)}, torn)
    torn.write_bytes(torn.read_bytes()[:300])  # an interrupted copy
    with pytest.raises(ValueError, match="torn.pt is not a readable checkpoint .* delete it and train again"):
        load_checkpoint(torn)
    torn.write_bytes(b"")
    with pytest.raises(ValueError, match="torn.pt is not a readable checkpoint"):
        load_checkpoint(torn)
    with pytest.raises(ValueError, match="not a device"):
        load_checkpoint(torn, device="gpu0")
    cfg = TrainConfig(steps=3)
    with pytest.raises(FileNotFoundError, match="no trained Sudoku MDM"):
        load_or_train_sudoku_mdm(TINY, cfg, root=tmp_path, train=False)


def test_sequential_decoding_fills_every_mask_once_and_keeps_givens():
    m = SudokuMDM(TINY).eval()
    p = sd.make_puzzle(30, np.random.default_rng(0))
    x = grids_to_tokens(np.stack([p.puzzle, p.puzzle]))
    res = decode(m, x, Sequential("confidence"))
    n_masked = int((p.puzzle == 0).sum())
    assert (res.nfe == n_masked).all()
    assert not (res.tokens == 9).any()
    out = tokens_to_grids(res.tokens)
    assert np.all(out[:, p.puzzle > 0] == p.puzzle[p.puzzle > 0])
    assert sorted(res.step_of[0][res.step_of[0] >= 0].tolist()) == list(range(n_masked))


def test_atomic_save_records_a_digest_that_catches_changed_truncated_and_torn_files(tmp_path):
    import threading

    from mimdm.core.artifacts import atomic_save, sidecar_path
    from mimdm.pipelines.labels import run_shards, shard_path

    path = tmp_path / "m.pt"
    atomic_save({"w": torch.arange(4000.0)}, path)
    assert sidecar_path(path).read_text().split() == [__import__("hashlib").sha256(path.read_bytes()).hexdigest(), "m.pt"]
    assert torch.equal(load_checkpoint(path)["w"], torch.arange(4000.0))
    good = path.read_bytes()
    for frac in (0.1, 0.5, 0.75):  # truncated copies
        path.write_bytes(good[:int(len(good) * frac)])
        with pytest.raises(ValueError, match="does not match the sha256 recorded when it was written"):
            load_checkpoint(path)
    bad = bytearray(good)
    bad[len(bad) // 2:len(bad) // 2 + 64] = bytes(64)  # 64 overwritten bytes: torch would load them silently
    path.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="m.pt does not match the sha256"):
        load_checkpoint(path)
    # two writers of one file never share a temporary file; the last one wins, intact
    errors = []

    def write(v):
        try:
            for _ in range(5):
                atomic_save({"w": torch.full((20000,), float(v))}, path)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write, args=(v,)) for v in (1, 2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and load_checkpoint(path)["w"][0].item() in (1.0, 2.0)
    assert not list(tmp_path.glob("*.tmp"))
    # a label shard changed after it was written is recomputed, with a warning, not counted as finished
    calls = []

    def make(k):
        calls.append(k)
        return {"tokens": torch.full((2, 3), k), "nfe": torch.ones(2, dtype=torch.long), "seconds": 0.0,
                "source_id": torch.tensor([k, k])}

    out = tmp_path / "labels"
    run_shards(out, {"c": 1}, 2, make, progress=False)
    shard_path(out, 1).write_bytes(shard_path(out, 1).read_bytes()[:100])
    with pytest.warns(UserWarning, match="recomputing a label shard"):
        run_shards(out, {"c": 1}, 2, make, progress=False)
    assert calls == [0, 1, 1] and torch.equal(load_checkpoint(shard_path(out, 1))["tokens"], torch.full((2, 3), 1))


def test_relation_masks_count_each_cells_peers():
    from mimdm.models.sudoku import RELATIONS, relation_masks

    R = relation_masks()
    assert R.shape == (4, 81, 81) and RELATIONS == ("self", "row", "column", "box")
    assert [int(r.sum()) for r in R] == [81, 81 * 9, 81 * 9, 81 * 9]  # every relation includes the cell itself
    assert int((R[1] * R[3]).sum()) == 81 * 3  # a cell shares its row and its box with 3 cells (itself included)
    assert int((R[1:].amax(0)).sum()) == 81 * 21  # 20 peers plus itself
    assert torch.equal(R, R.transpose(1, 2))


def test_relation_bias_starts_as_the_plain_model_and_can_restrict_attention():
    cfg = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)
    rel = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, relation_bias=True)
    assert "relation_bias" not in cfg.to_dict() and rel.to_dict()["relation_bias"] is True  # old keys unchanged
    torch.manual_seed(0)
    plain, biased = SudokuMDM(cfg).eval(), SudokuMDM(rel).eval()
    missing, unexpected = biased.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["rel_bias"] and unexpected == []
    assert biased.n_parameters() == plain.n_parameters() + 2 * 2 * 4
    x = torch.randint(0, 10, (3, 81))
    with torch.no_grad():
        for mode in (True, False):  # training and inference paths (dropout 0)
            plain.train(mode), biased.train(mode)
            assert torch.allclose(biased(x).logits, plain(x).logits, atol=1e-5)  # zero bias: the same model
        biased.rel_bias[:, :, 0] = 1e4  # every head attends only to the cell itself
        y = x.clone()
        y[:, 1:] = (x[:, 1:] + 1) % 10  # change every other cell
        assert torch.allclose(biased(x).logits[:, 0], biased(y).logits[:, 0], atol=1e-5)
        assert not torch.allclose(plain(x).logits[:, 0], plain(y).logits[:, 0], atol=1e-3)
        biased.rel_bias[:, :, 0] = 0
        biased.rel_bias[:, :, 1] = 1e4  # only the row: a change outside cell 0's row leaves it alone
        z = x.clone()
        z[:, 9:] = (x[:, 9:] + 1) % 10
        assert torch.allclose(biased(x).logits[:, 0], biased(z).logits[:, 0], atol=1e-5)
        assert not torch.allclose(biased(x).logits[:, 9], biased(z).logits[:, 9], atol=1e-3)


def test_attention_maps_are_the_forward_pass_written_out():
    torch.manual_seed(0)
    for relation in (False, True):
        model = SudokuMDM(SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, relation_bias=relation)).eval()
        x = torch.randint(0, 10, (3, 81))
        attn, logits = model.attention_maps(x)
        assert attn.shape == (3, 2, 2, 81, 81) and logits.shape == (3, 81, 9)
        assert torch.allclose(attn.sum(-1), torch.ones(3, 2, 2, 81), atol=1e-5)
        with torch.no_grad():
            assert torch.allclose(logits, model(x).logits, atol=1e-5)
    with torch.no_grad():
        model.rel_bias[:, :, 1] = 1e4  # every head attends only within the cell's row
    attn, _ = model.attention_maps(x)
    row = torch.arange(81) // 9
    same_row = row[:, None] == row[None, :]
    assert float(attn[..., ~same_row].abs().max()) < 1e-6
    assert torch.allclose((attn * same_row).sum(-1), torch.ones(3, 2, 2, 81), atol=1e-5)
    with pytest.raises(ValueError, match=r"\[B, 81\]"):
        model.attention_maps(torch.zeros(2, 80, dtype=torch.long))
