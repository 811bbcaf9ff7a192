"""Sharded label generation and DDP head training on 2 CPU processes (gloo), against single-process runs."""
import json
import os
import socket
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mimdm.distributed import generate_labels_distributed, marker_path, shard_path, train_head_ddp
from mimdm.heads import HeadTrainConfig, MIHeadConfig, load_head, train_head
from mimdm.labels import LabelConfig, generate_labels, load_labels
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig

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
        Path(report).write_text(json.dumps({"computed": rep.computed, "recovered": rep.recovered,
                                            "complete": rep.complete}))


def _mismatch_job(rank, out_dir):
    model = _model()
    if rank == 1:
        torch.manual_seed(1)
        model = SudokuMDM(TINY).eval()
    generate_labels_distributed(model, CFG, out_dir, progress=False)


def _head_job(rank, labels, out):
    out = Path(out)
    head, log = train_head_ddp(load_labels(labels, "train"), load_labels(labels, "val"), HEAD, TRAIN, mask_id=9,
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
    finished = {int(k) for k in man["shards"]} | {k for k in range(CFG.n_shards) if marker_path(out, k).exists()}
    assert 1 in finished and 3 not in finished and shard_path(out, 3).exists()  # 3 is torn
    _spawn(_labels_job, str(out), str(tmp_path / "rep.json"))
    rep = _report(tmp_path / "rep.json")
    print("finished before restart:", sorted(finished), "restart:", rep)
    redone = sorted(k for c in rep["computed"] for k in c)
    assert redone == sorted(set(range(CFG.n_shards)) - finished) and 3 in redone and rep["complete"]
    assert sorted(rep["recovered"]) == sorted(finished - {int(k) for k in man["shards"]})  # markers merged
    assert not list(out.glob("*.done.json")) and not list(out.glob("*.tmp"))
    _assert_same_label_dir(reference, out)


def test_ddp_head_training_on_two_processes(tmp_path, reference):
    _spawn(_head_job, str(reference), str(tmp_path))
    head, rec = load_head(tmp_path / "head.pt")
    assert rec["extra"] == {"trainer": "ddp", "world_size": 2}
    s0, s1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # identical weights on both ranks
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in s0.items())
    log0, log1 = (json.loads((tmp_path / f"log{r}.json").read_text()) for r in (0, 1))
    assert len(log0) == TRAIN.epochs and [e["val_loss"] for e in log0] == [e["val_loss"] for e in log1]
    assert all(np.isfinite(e["train_loss"]) and np.isfinite(e["val_loss"]) for e in log0)


def test_ddp_trainer_alone_reproduces_train_head(reference, one_thread):
    tr, va = load_labels(reference, "train"), load_labels(reference, "val")
    cfg = HeadTrainConfig(epochs=3, batch_size=5, patience=3)
    a, log_a = train_head(tr, va, HEAD, cfg, mask_id=9, progress=False)
    b, log_b = train_head_ddp(tr, va, HEAD, cfg, mask_id=9, progress=False)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    strip = lambda log: [{k: v for k, v in e.items() if k != "seconds"} for e in log]  # noqa: E731
    assert strip(log_a) == strip(log_b)


def test_ddp_trainer_refuses_empty_splits(reference):
    tr, va = load_labels(reference, "train"), load_labels(reference, "val")
    empty = {k: v[:0] if torch.is_tensor(v) else v for k, v in va.items()}
    for a, b, name in ((tr, empty, "validation"), (empty, va, "training")):
        with pytest.raises(ValueError, match=f"the {name} split holds no contexts"):
            train_head_ddp(a, b, HEAD, TRAIN, mask_id=9, progress=False)


def test_ranks_with_different_models_refuse(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match="different model weights"):
        _spawn(_mismatch_job, str(tmp_path / "labels"))
    assert not list((tmp_path / "labels").glob("shard_*"))
