"""Sharded label generation and DDP head training on 2 CPU processes (gloo), against single-process runs."""
import json
import math
import os
import socket
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mimdm.core.artifacts import file_lock
from mimdm.heads.mi_head import (
    HeadTrainConfig,
    MIHead,
    MIHeadConfig,
    evaluate_loss,
    load_head,
    make_optimizer,
    mi_loss,
    train_head,
)
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.pipelines.distributed import generate_labels_distributed
from mimdm.pipelines.labels import LabelConfig, compute_shards, generate_labels, label_shard, load_labels, shard_path

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)
CFG = LabelConfig(n_shards=4, sources_per_shard=2, contexts_per_source=2, layers=(-1, 1))
HEAD = MIHeadConfig(32, d_hidden=16, rank=8)
# 12 training contexts (sources 2-7) in batches of 11: the last global batch (1 context) leaves rank 1 an
# empty part; the 2 validation contexts are one evaluation batch, so rank 1 evaluates nothing
TRAIN = HeadTrainConfig(epochs=2, batch_size=11, patience=2)


def _model():
    torch.manual_seed(0)
    return SudokuMDM(TINY).eval()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, job, args):
    """What torchrun would set up for a rank, then ``job(rank, *args)``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the reference runs with one thread too: bit-identical matmuls
    try:
        job(rank, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(job, *args, world=2):
    """Run ``job`` on ``world`` local ranks. Forked, not spawned: a fresh interpreter per rank would
    re-import torch (seconds each on a loaded machine); gloo itself is only set up in the children."""
    mp.start_processes(_worker, args=(world, _free_port(), job, args), nprocs=world, join=True, start_method="fork")


def _crash(out_dir, k):
    """Rank 1 after its first shard: tear the file of its next shard (a crash mid-write) and die."""
    shard_path(out_dir, k + 2).write_bytes(b"PK\x03\x04 torn")
    os._exit(17)


def _labels_job(rank, out_dir, report, crash=False):
    hook = partial(_crash, Path(out_dir)) if crash and rank == 1 else None
    rep = generate_labels_distributed(_model(), CFG, out_dir, progress=False, on_shard_done=hook)
    if rank == 0:
        Path(report).write_text(json.dumps({"computed": rep.computed, "dropped": rep.dropped,
                                            "complete": rep.complete}))


def _alone_job(rank, out_dir, report_dir):
    """A run of its own (no process group) on a folder another run works on at the same time."""
    rep = compute_shards(Path(out_dir), CFG.to_dict(), CFG.n_shards, lambda k: label_shard(_model(), CFG, k),
                         progress=False)
    (Path(report_dir) / f"alone{rank}.json").write_text(json.dumps(rep.computed))


def _mismatch_job(rank, out_dir):
    model = _model()
    if rank == 1:
        torch.manual_seed(1)
        model = SudokuMDM(TINY).eval()
    generate_labels_distributed(model, CFG, out_dir, progress=False)


def _head_job(rank, labels, out):
    out = Path(out)
    head, log = train_head(load_labels(labels, "train"), load_labels(labels, "val"), HEAD, TRAIN, mask_id=9,
                           progress=False, save_path=out / "head.pt")
    torch.save(head.state_dict(), out / f"rank{rank}.pt")
    (out / f"log{rank}.json").write_text(json.dumps(log))


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-process label set."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    d = generate_labels(_model(), CFG, tmp_path_factory.mktemp("ref") / "labels", progress=False)
    torch.set_num_threads(n)
    return d


def _assert_same_label_dir(a: Path, b: Path):
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    ma, mb = json.loads((a / "manifest.json").read_text()), json.loads((b / "manifest.json").read_text())
    assert ma["config"] == mb["config"]
    strip = lambda m: {k: {f: v for f, v in e.items() if f != "seconds"} for k, e in m["shards"].items()}  # noqa: E731
    assert strip(ma) == strip(mb) and len(ma["shards"]) == CFG.n_shards
    for k in range(CFG.n_shards):
        ta = torch.load(shard_path(a, k), weights_only=True)
        tb = torch.load(shard_path(b, k), weights_only=True)
        assert ta.keys() == tb.keys()
        for key in ta:
            if key != "seconds":  # probing wall-clock
                assert torch.equal(ta[key], tb[key]), (k, key)


def _report(path):
    return json.loads(Path(path).read_text())


def test_two_processes_equal_one_and_a_damaged_shard_alone_is_redone(tmp_path, reference, one_thread):
    out = tmp_path / "labels"
    _spawn(_labels_job, str(out), str(tmp_path / "rep.json"))
    rep = _report(tmp_path / "rep.json")
    assert rep["computed"] == [[0, 2], [1, 3]] and rep["complete"]
    _assert_same_label_dir(reference, out)
    # damage shard 2 the way a crash of an unsafe writer would: truncated, not in the manifest
    p = shard_path(out, 2)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    man = json.loads((out / "manifest.json").read_text())
    del man["shards"]["2"]
    (out / "manifest.json").write_text(json.dumps(man, indent=1))
    before = {k: shard_path(out, k).stat().st_mtime_ns for k in (0, 1, 3)}
    r = generate_labels_distributed(_model(), CFG, out, progress=False)  # world size 1: no process group
    assert r.computed == [[2]] and r.complete
    assert {k: shard_path(out, k).stat().st_mtime_ns for k in (0, 1, 3)} == before
    _assert_same_label_dir(reference, out)
    with pytest.raises(ValueError, match="another config"):
        generate_labels_distributed(_model(), LabelConfig(n_shards=5), out, progress=False)


def test_a_crashed_rank_loses_only_its_unfinished_shards(tmp_path, reference):
    out = tmp_path / "labels"
    with pytest.raises(mp.ProcessExitedException):
        _spawn(_labels_job, str(out), str(tmp_path / "rep.json"), True)
    man = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {"shards": {}}
    finished = {int(k) for k in man["shards"]}  # every shard whose hook ran is in the manifest
    assert 1 in finished and 3 not in finished and shard_path(out, 3).exists()  # 3 is torn
    _spawn(_labels_job, str(out), str(tmp_path / "rep.json"))
    rep = _report(tmp_path / "rep.json")
    print("finished before restart:", sorted(finished), "restart:", rep)
    redone = sorted(k for c in rep["computed"] for k in c)
    assert redone == sorted(set(range(CFG.n_shards)) - finished) and 3 in redone and rep["complete"]
    assert not list(out.glob("*.tmp")) and not list(out.glob("shard_*.lock"))
    _assert_same_label_dir(reference, out)


def test_ddp_head_training_on_two_processes(tmp_path, reference):
    _spawn(_head_job, str(reference), str(tmp_path))
    head, rec = load_head(tmp_path / "head.pt")
    assert rec["extra"] == {"world_size": 2}
    s0, s1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # identical weights on both ranks
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in s0.items())
    log0, log1 = (json.loads((tmp_path / f"log{r}.json").read_text()) for r in (0, 1))
    assert len(log0) == TRAIN.epochs and [e["val_loss"] for e in log0] == [e["val_loss"] for e in log1]
    assert all(np.isfinite(e["train_loss"]) and np.isfinite(e["val_loss"]) for e in log0)


def _single_process_reference(train, val, head_cfg, cfg, mask_id):
    """The single-process trainer as it was before the DDP trainer became the only one (commit c71859b)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    head = MIHead(head_cfg)
    n = len(train["tokens"])
    opt, sched = make_optimizer(head, cfg, math.ceil(n / cfg.batch_size))
    best, best_state, log = float("inf"), None, []
    for epoch in range(cfg.epochs):
        head.train()
        losses = []
        idx = rng.permutation(n)
        for s in range(0, n, cfg.batch_size):
            b = torch.from_numpy(idx[s:s + cfg.batch_size])
            masked = train["tokens"][b] == mask_id
            pred = head(train[f"hidden_{cfg.layer}"][b], masked, train["entropy"][b])
            loss = mi_loss(pred, train["mi"][b], masked, cfg.loss, cfg.loss_scale, cfg.loss_weight_scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(loss.item())
        head.eval()
        tot, cnt = 0.0, 0
        with torch.no_grad():
            for s in range(0, len(val["tokens"]), 64):
                b = torch.arange(s, min(s + 64, len(val["tokens"])))
                masked = val["tokens"][b] == mask_id
                pred = head(val[f"hidden_{cfg.layer}"][b], masked, val["entropy"][b])
                tot += mi_loss(pred, val["mi"][b], masked, cfg.loss, cfg.loss_scale, cfg.loss_weight_scale).item() * len(b)
                cnt += len(b)
        log.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "val_loss": tot / cnt})
        if tot / cnt < best - 1e-6:
            best, best_state = tot / cnt, {k: x.clone() for k, x in head.state_dict().items()}
    head.load_state_dict(best_state)
    return head, log


def test_trainer_alone_reproduces_the_single_process_loop(reference, one_thread):
    tr, va = load_labels(reference, "train"), load_labels(reference, "val")
    cfg = HeadTrainConfig(epochs=3, batch_size=5, patience=None)
    a, log_a = _single_process_reference(tr, va, HEAD, cfg, mask_id=9)
    b, log_b = train_head(tr, va, HEAD, cfg, mask_id=9, progress=False)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert log_a == [{k: v for k, v in e.items() if k != "seconds"} for e in log_b]
    assert evaluate_loss(b, va, cfg.layer, cfg.loss, 9, scale=cfg.loss_scale,
                         weight_scale=cfg.loss_weight_scale) == min(e["val_loss"] for e in log_a)


def test_ddp_trainer_refuses_empty_splits(reference):
    tr, va = load_labels(reference, "train"), load_labels(reference, "val")
    empty = {k: v[:0] if torch.is_tensor(v) else v for k, v in va.items()}
    for a, b, name in ((tr, empty, "validation"), (empty, va, "training")):
        with pytest.raises(ValueError, match=f"the {name} split holds no contexts"):
            train_head(a, b, HEAD, TRAIN, mask_id=9, progress=False)


def test_ranks_with_different_models_refuse(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match="different model weights"):
        _spawn(_mismatch_job, str(tmp_path / "labels"))
    assert not list((tmp_path / "labels").glob("shard_*"))


def test_two_runs_on_one_folder_split_the_shards(tmp_path, reference):
    out = tmp_path / "labels"
    _spawn(_alone_job, str(out), str(tmp_path))
    a, b = (set(json.loads((tmp_path / f"alone{r}.json").read_text())) for r in (0, 1))
    assert not a & b and a | b == set(range(CFG.n_shards))  # nothing computed twice, nothing lost
    _assert_same_label_dir(reference, out)


def test_a_shard_held_by_another_run_is_left_to_it_then_waited_for(tmp_path):
    calls = []

    def make(k):
        calls.append(k)
        return {"tokens": torch.full((2, 3), k), "nfe": torch.ones(2, dtype=torch.long), "seconds": 0.0}

    out = tmp_path / "labels"
    with file_lock(out / "shard_00000.lock") as held:  # another run computing shard 0
        assert held
        rep = compute_shards(out, {"c": 1}, 4, make, progress=False, max_new_shards=3)
        assert rep.computed == [1, 2, 3] and not rep.complete
        assert sorted(json.loads((out / "manifest.json").read_text())["shards"]) == ["1", "2", "3"]
    rep = compute_shards(out, {"c": 1}, 4, make, progress=False)  # that run died: shard 0 is computed here
    assert rep.computed == [0] and rep.complete and calls == [1, 2, 3, 0]
    assert compute_shards(out, {"c": 1}, 4, make, progress=False).computed == []
    with pytest.raises(ValueError, match="max_new_shards must be >= 0"):
        compute_shards(out, {"c": 1}, 4, make, progress=False, max_new_shards=-5)
