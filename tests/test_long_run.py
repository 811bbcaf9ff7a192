"""Puzzle-mask curriculum, WSD schedule and the resumable long Sudoku run (issue 20)."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from mimdm.core.artifacts import load_checkpoint
from mimdm.data import sudoku as sd
from mimdm.data.curriculum import CurriculumConfig, PuzzlePool, curriculum_batch, load_or_build_pool
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.models.training import TrainConfig, _lr_at, mask_tokens, mdm_loss, train_mdm
from mimdm.pipelines.long_run import read_curve, run_long_training

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)
SMALL_POOL = CurriculumConfig(fraction=0.5, pool_size=6, clues=(33, 35), seed=3)


def test_random_symmetries_keep_puzzles_unique_and_solutions_valid():
    rng = np.random.default_rng(0)
    ps = sd.make_puzzles(3, 34, rng)
    pairs = np.stack([np.stack([p.puzzle, p.solution]) for p in ps])  # [3, 2, 81]
    out = sd.random_symmetries(pairs, np.random.default_rng(1))
    assert out.shape == (3, 2, 81) and out.dtype == np.int8
    assert sd.is_valid_solution_batch(out[:, 1]).all()
    for (pz, sol), (pz0, _) in zip(out, pairs):
        assert (pz != 0).sum() == (pz0 != 0).sum()
        assert ((pz == 0) | (pz == sol)).all()
        assert sd.count_solutions(pz) == 1
    assert not np.array_equal(out, pairs)
    with pytest.raises(sd.SudokuError):
        sd.random_symmetries(np.zeros((2, 81), dtype=np.int8), rng)
    with pytest.raises(sd.SudokuError):
        sd.random_symmetries(np.full((1, 1, 81), 10), rng)


def test_forced_masks_replace_random_masks_only_where_given():
    m = SudokuMDM(TINY)
    vals = torch.from_numpy(sd.random_solutions(4, 0).astype(np.int64) - 1)
    t = torch.full((4,), 0.5)
    forced = torch.zeros(4, 81, dtype=torch.bool)
    forced[1, :10] = True
    tok0, m0 = mask_tokens(vals, m, t, torch.Generator().manual_seed(0))
    tok1, m1 = mask_tokens(vals, m, t, torch.Generator().manual_seed(0), forced_BL=forced)
    assert torch.equal(m1[1], forced[1]) and torch.equal(m1[[0, 2, 3]], m0[[0, 2, 3]])
    assert (tok1[1, :10] == m.mask_id).all() and (tok1[1, 10:] == m.value_token_ids[vals[1, 10:]]).all()
    # all-False forced rows: bit-identical to no forced masks, loss included
    none = torch.zeros(4, 81, dtype=torch.bool)
    a = mdm_loss(m, vals, torch.Generator().manual_seed(1))
    b = mdm_loss(m, vals, torch.Generator().manual_seed(1), forced_BL=none)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="forced_BL"):
        mask_tokens(vals, m, t, torch.Generator(), forced_BL=forced[:, :80])


def test_curriculum_batch_shapes_and_masks():
    pool_ps = sd.make_puzzles(4, 34, np.random.default_rng(2))
    pool = PuzzlePool(np.stack([p.puzzle for p in pool_ps]), np.stack([p.solution for p in pool_ps]))
    sample = curriculum_batch(pool, 0.5)
    v, f = sample(np.random.default_rng(0), 7)
    assert v.shape == (7, 81) and v.dtype == torch.int64 and f.shape == (7, 81) and f.dtype == torch.bool
    assert (f[:4].sum(1) == 81 - 34).all() and not f[4:].any()  # round(3.5) = 4 puzzle rows
    assert sd.is_valid_solution_batch(v.numpy() + 1).all()
    v2, f2 = sample(np.random.default_rng(0), 7)
    assert torch.equal(v, v2) and torch.equal(f, f2)
    with pytest.raises(ValueError):
        curriculum_batch(pool, 1.5)


def test_pool_cache_is_reproducible_and_checked(tmp_path):
    a = load_or_build_pool(SMALL_POOL, tmp_path / "pool.npz", progress=False)
    b = load_or_build_pool(SMALL_POOL, tmp_path / "pool.npz", progress=False)  # from disk
    c = load_or_build_pool(SMALL_POOL, tmp_path / "pool2.npz", progress=False)  # rebuilt from the seed
    assert np.array_equal(a.puzzles, b.puzzles) and np.array_equal(a.puzzles, c.puzzles)
    assert np.array_equal(a.solutions, c.solutions)
    assert all(sd.count_solutions(p) == 1 for p in a.puzzles)
    with pytest.raises(ValueError, match="another configuration"):
        load_or_build_pool(replace(SMALL_POOL, seed=4), tmp_path / "pool.npz", progress=False)


def test_beyond_singles_pool_holds_only_puzzles_singles_do_not_solve(tmp_path, monkeypatch):
    import mimdm.data.curriculum as cur

    cfg = CurriculumConfig(fraction=0.5, pool_size=5, clues=(28, 31), seed=9, beyond_singles=True)
    pool = load_or_build_pool(cfg, tmp_path / "hard.npz", progress=False)
    assert len(pool) == 5 and all(sd.count_solutions(p) == 1 for p in pool.puzzles)
    assert all((sd.fill_singles(p) == 0).any() for p in pool.puzzles)
    assert all(28 <= (p > 0).sum() <= 31 for p in pool.puzzles)
    plain = cur.build_pool(replace(cfg, beyond_singles=False), progress=False)
    assert not all((sd.fill_singles(p) == 0).any() for p in plain.puzzles)  # unfiltered: most are singles-solvable
    # the flag enters the config's identity only when set: older pools, runs and artifact keys keep theirs
    assert "beyond_singles" not in SMALL_POOL.to_dict() and cfg.to_dict()["beyond_singles"] is True
    assert CurriculumConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert CurriculumConfig.from_dict(json.loads(json.dumps(SMALL_POOL.to_dict()))) == SMALL_POOL
    with pytest.raises(ValueError, match="another configuration"):
        load_or_build_pool(replace(cfg, beyond_singles=False), tmp_path / "hard.npz", progress=False)
    with pytest.raises(ValueError, match="must be a bool"):
        CurriculumConfig(beyond_singles=1)
    monkeypatch.setattr(cur, "MAX_SINGLES_TRIES", 1)
    with pytest.raises(sd.SudokuError, match="singles do not solve in 1 tries"):
        cur.build_pool(replace(cfg, pool_size=40, clues=(35, 35)), progress=False)


def test_wsd_schedule_and_default_config_dict_unchanged():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1, schedule="wsd", decay_frac=0.2)
    assert cfg.decay_start() == 80
    assert _lr_at(0, cfg) == pytest.approx(0.1) and _lr_at(9, cfg) == pytest.approx(1.0)
    assert all(_lr_at(s, cfg) == 1.0 for s in range(10, 81))
    assert _lr_at(90, cfg) == pytest.approx(0.55) and _lr_at(100, cfg) == pytest.approx(0.1)
    assert "schedule" not in TrainConfig().to_dict() and cfg.to_dict()["schedule"] == "wsd"
    with pytest.raises(ValueError):
        TrainConfig(schedule="step")


def test_wsd_run_can_be_extended_before_its_decay(tmp_path):
    cfg = TrainConfig(steps=8, batch_size=4, warmup=2, schedule="wsd", decay_frac=0.5, ckpt_every=2, log_every=2)
    sample = curriculum_batch(PuzzlePool(*[np.stack(x) for x in zip(*[(p.puzzle, p.solution) for p in
                                                                         sd.make_puzzles(2, 35, 0)])]), 0.5)
    m = SudokuMDM(TINY)
    train_mdm(m, sample, cfg, tmp_path / "s.pt", progress=False, stop_after=3)
    longer = replace(cfg, steps=12)
    with pytest.raises(ValueError, match="another training config"):
        train_mdm(m, sample, longer, tmp_path / "s.pt", progress=False)
    train_mdm(m, sample, longer, tmp_path / "s.pt", progress=False, stop_after=5, allow_extend=True)
    with pytest.raises(ValueError, match="past the decay start"):
        train_mdm(m, sample, replace(cfg, steps=6), tmp_path / "s.pt", progress=False, allow_extend=True)


def test_wsd_run_in_its_decay_cannot_be_lengthened(tmp_path):
    # decay from step 4 of 8; at step 6 the weights have had decayed learning rates, so a 20-step plan
    # (decay from 10) would not be the run "planned with 20 steps from the start"
    cfg = TrainConfig(steps=8, batch_size=4, warmup=2, schedule="wsd", decay_frac=0.5, ckpt_every=2, log_every=2)
    sample = curriculum_batch(PuzzlePool(*[np.stack(x) for x in zip(*[(p.puzzle, p.solution) for p in
                                                                         sd.make_puzzles(2, 35, 0)])]), 0.5)
    m = SudokuMDM(TINY)
    train_mdm(m, sample, cfg, tmp_path / "s.pt", progress=False, stop_after=6)
    with pytest.raises(ValueError, match="past the decay start 4 of its 8-step"):
        train_mdm(m, sample, replace(cfg, steps=20), tmp_path / "s.pt", progress=False, allow_extend=True)
    train_mdm(m, sample, cfg, tmp_path / "s.pt", progress=False)  # the planned length still resumes
    assert load_checkpoint(tmp_path / "s.pt")["step"] == 8


@pytest.mark.slow
def test_long_run_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=8, lr=1e-3, warmup=2, schedule="wsd", decay_frac=0.5, seed=5,
                      ckpt_every=2, log_every=1)
    kw = dict(eval_every=3, eval_puzzles=2, progress=False)
    full = run_long_training(tmp_path / "a", TINY, cfg, SMALL_POOL, **kw)
    part = run_long_training(tmp_path / "b", TINY, cfg, SMALL_POOL, stop_after=4, **kw)
    assert [c["step"] for c in part] == [3]
    (tmp_path / "b" / "puzzle_pool.npz").unlink()  # rebuilt deterministically on resume
    (tmp_path / "b" / "README.md").write_text("measured: kept\n")  # a run's README is written once, never replaced
    resumed = run_long_training(tmp_path / "b", TINY, cfg, SMALL_POOL, **kw)
    assert [c["step"] for c in full] == [3, 6] and [c["examples_seen"] for c in full] == [24, 48]
    strip = lambda curve: [{k: v for k, v in c.items() if k != "seconds"} for c in curve]  # noqa: E731
    assert strip(full) == strip(resumed) == strip(read_curve(tmp_path / "b" / "curve.jsonl"))
    sa = torch.load(tmp_path / "a" / "state.pt", weights_only=True)
    sb = torch.load(tmp_path / "b" / "state.pt", weights_only=True)
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    assert sa["numpy_rng"] == sb["numpy_rng"] and torch.equal(sa["torch_rng"], sb["torch_rng"])
    assert [e["loss"] for e in json.loads(sa["log"])] == [e["loss"] for e in json.loads(sb["log"])]
    assert (tmp_path / "a" / "model.pt").exists() and "state.pt" in (tmp_path / "a" / "README.md").read_text()
    assert (tmp_path / "b" / "README.md").read_text() == "measured: kept\n"
    conf = json.loads((tmp_path / "a" / "config.json").read_text())
    assert conf["curriculum"] == SMALL_POOL.to_dict() and conf["train"]["schedule"] == "wsd"
    with pytest.raises(ValueError, match="another run"):
        run_long_training(tmp_path / "a", TINY, replace(cfg, lr=2e-3), SMALL_POOL, **kw)


def test_second_schedule_cycle_counts_from_cycle_start():
    cfg = TrainConfig(steps=140, lr=1.0, warmup=10, min_lr_ratio=0.1, schedule="wsd", decay_frac=0.25, cycle_start=100)
    assert cfg.decay_start() == 130  # 100 + 40 - 10
    assert _lr_at(100, cfg) == pytest.approx(0.1) and _lr_at(109, cfg) == pytest.approx(1.0)
    assert all(_lr_at(st, cfg) == 1.0 for st in range(110, 131))
    assert _lr_at(135, cfg) == pytest.approx(0.55) and _lr_at(140, cfg) == pytest.approx(0.1)
    assert "cycle_start" not in replace(cfg, cycle_start=0).to_dict() and cfg.to_dict()["cycle_start"] == 100
    with pytest.raises(ValueError, match="cycle_start must be in"):
        TrainConfig(steps=10, cycle_start=10)


@pytest.mark.slow
def test_continuation_starts_from_the_finished_run_and_resumes_exactly(tmp_path):
    first = TrainConfig(steps=4, batch_size=8, lr=1e-3, warmup=2, schedule="wsd", decay_frac=0.5, seed=5,
                        ckpt_every=2, log_every=1)
    second = replace(first, steps=8, cycle_start=4, lr=2e-3, warmup=2)
    kw = dict(eval_every=2, eval_puzzles=2, progress=False)
    with pytest.raises(ValueError, match="continues a run's state at that step"):
        train_mdm(SudokuMDM(TINY), lambda rng, b: torch.zeros(b, 81, dtype=torch.long), second,
                  tmp_path / "none.pt", progress=False)
    parent = run_long_training(tmp_path / "p", TINY, first, SMALL_POOL, **kw)
    with pytest.raises(ValueError, match="another batch_size"):
        run_long_training(tmp_path / "x", TINY, replace(second, batch_size=4), SMALL_POOL, init_from=tmp_path / "p", **kw)
    with pytest.raises(ValueError, match="not at cycle_start=3"):
        run_long_training(tmp_path / "y", TINY, replace(second, cycle_start=3), SMALL_POOL, init_from=tmp_path / "p", **kw)
    full = run_long_training(tmp_path / "a", TINY, second, SMALL_POOL, init_from=tmp_path / "p", **kw)
    part = run_long_training(tmp_path / "b", TINY, second, SMALL_POOL, init_from=tmp_path / "p", stop_after=6, **kw)
    resumed = run_long_training(tmp_path / "b", TINY, second, SMALL_POOL, init_from=tmp_path / "p", **kw)
    assert [c["step"] for c in part] == [4, 6] and [c["step"] for c in full] == [4, 6, 8]
    # the first row re-evaluates the parent's final state; its loss is not the parent's
    assert {k: full[0][k] for k in ("solve_30_35", "solve_hard")} == {k: parent[-1][k] for k in ("solve_30_35", "solve_hard")}
    assert full[0]["loss"] is None and full[1]["loss"] is not None
    strip = lambda curve: [{k: v for k, v in c.items() if k != "seconds"} for c in curve]  # noqa: E731
    assert strip(full) == strip(resumed)
    sp, sa, sb = (torch.load(tmp_path / d / "state.pt", weights_only=True) for d in ("p", "a", "b"))
    log = json.loads(sa["log"])
    assert [e["step"] for e in log] == list(range(1, 9))  # the parent's log goes on
    # the first cycle's last step (decayed from 1e-3), then the second's warmup to its peak 2e-3
    assert [e["lr"] for e in log[3:6]] == pytest.approx([5.5e-4, 1e-3, 2e-3])
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
        assert not torch.equal(sa["model"][k], sp["model"][k]) or k.endswith("relation_bias"), k
    conf = json.loads((tmp_path / "a" / "config.json").read_text())
    assert conf["continues"]["folder"] == "p" and conf["continues"]["step"] == 4
    assert (tmp_path / "a" / "puzzle_pool.npz").read_bytes() == (tmp_path / "p" / "puzzle_pool.npz").read_bytes()
    assert conf["train"]["cycle_start"] == 4 and (tmp_path / "a" / "model.pt").exists()
    # a continuation trains with its own weight decay, not the one saved in the source's optimiser state
    run_long_training(tmp_path / "c", TINY, replace(second, weight_decay=0.5), SMALL_POOL, init_from=tmp_path / "p",
                      stop_after=5, **kw)
    sc = torch.load(tmp_path / "c" / "state.pt", weights_only=True)
    assert [g["weight_decay"] for g in sc["optimizer"]["param_groups"]] == [0.5]
    assert sp["optimizer"]["param_groups"][0]["weight_decay"] == first.weight_decay == 0.01
    # a continuation may change the curriculum (a second cycle on other puzzles): it builds its own pool
    other = replace(SMALL_POOL, seed=4)
    run_long_training(tmp_path / "d", TINY, second, other, init_from=tmp_path / "p", stop_after=5, **kw)
    conf = json.loads((tmp_path / "d" / "config.json").read_text())
    assert conf["curriculum"] == other.to_dict() and conf["continues"]["folder"] == "p"
    pd, pp = (np.load(tmp_path / d / "puzzle_pool.npz") for d in ("d", "p"))
    assert json.loads(str(pd["config"])) == other.to_dict() and not np.array_equal(pd["puzzles"], pp["puzzles"])


def test_adopted_long_run_is_the_zoo_model_of_its_configuration(tmp_path):
    """A finished long run, adopted into the cache, is what the zoo loads for its configuration, and training that
    configuration from scratch with the zoo (what `make book RETRAIN=1` does) gives the same weights."""
    from mimdm.pipelines.long_run import adopt
    from mimdm.pipelines.zoo import load_or_train_sudoku_mdm, sudoku_mdm_dir

    cfg = TrainConfig(steps=6, batch_size=8, lr=1e-3, warmup=2, schedule="wsd", decay_frac=0.5, seed=5,
                      ckpt_every=2, log_every=1)
    with pytest.raises(FileNotFoundError, match="has not finished"):
        adopt(tmp_path / "run", n_eval=2, root=tmp_path / "cache")
    run_long_training(tmp_path / "run", TINY, cfg, SMALL_POOL, eval_every=3, eval_puzzles=2, progress=False,
                      stop_after=3)
    curve = run_long_training(tmp_path / "run", TINY, cfg, SMALL_POOL, eval_every=3, eval_puzzles=2, progress=False)
    path = adopt(tmp_path / "run", n_eval=3, root=tmp_path / "cache")
    assert path == sudoku_mdm_dir(TINY, cfg, tmp_path / "cache", SMALL_POOL) / "model.pt"
    assert path.parent != sudoku_mdm_dir(TINY, cfg, tmp_path / "cache")  # the curriculum is part of the key
    model, rec = load_or_train_sudoku_mdm(TINY, cfg, n_eval=3, root=tmp_path / "cache", train=False,
                                          curriculum=SMALL_POOL)
    assert rec["eval"]["n_puzzles"] == 3 and rec["trained_on"]["curve"] == curve
    assert rec["trained_on"]["curriculum"] == SMALL_POOL.to_dict()
    fresh, _ = load_or_train_sudoku_mdm(TINY, cfg, n_eval=3, progress=False, root=tmp_path / "fresh",
                                        curriculum=SMALL_POOL)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k


def test_two_stage_zoo_keys_check_their_stages(tmp_path):
    from mimdm.pipelines.zoo import sudoku_mdm_dir

    first = TrainConfig(steps=4, batch_size=8, schedule="wsd")
    second = replace(first, steps=8, cycle_start=4)
    with pytest.raises(ValueError, match="continues a first stage"):
        sudoku_mdm_dir(TINY, second, tmp_path, create=False)
    with pytest.raises(ValueError, match="one-cycle training of 4 steps"):
        sudoku_mdm_dir(TINY, second, tmp_path, first=(replace(first, steps=5), None), create=False)
    with pytest.raises(ValueError, match="batch size"):
        sudoku_mdm_dir(TINY, second, tmp_path, first=(replace(first, batch_size=4), None), create=False)
    for bad in ((first,), (SMALL_POOL, first), [first, None]):
        with pytest.raises(ValueError, match="must be a .TrainConfig, CurriculumConfig or None. pair"):
            sudoku_mdm_dir(TINY, second, tmp_path, first=bad, create=False)
    a = sudoku_mdm_dir(TINY, second, tmp_path, first=(first, None), create=False)
    b = sudoku_mdm_dir(TINY, second, tmp_path, first=(first, SMALL_POOL), create=False)
    assert a != b  # the first stage's curriculum is part of the key
    assert not (tmp_path / "sudoku_mdm").exists()  # create=False writes nothing


@pytest.mark.slow
def test_adopted_continuation_is_the_zoo_model_of_its_two_stages(tmp_path, monkeypatch):
    """A finished continuation (a second cycle on another curriculum), adopted, is what the zoo loads for the two
    stages, and the zoo training both from scratch (the first keeping its final state) gives the same weights."""
    from mimdm.pipelines.long_run import adopt
    from mimdm.pipelines.zoo import load_or_train_sudoku_mdm, sudoku_mdm_dir

    first = TrainConfig(steps=4, batch_size=8, lr=1e-3, warmup=2, schedule="wsd", decay_frac=0.5, seed=5,
                        ckpt_every=2, log_every=1)
    second = replace(first, steps=8, cycle_start=4, lr=2e-3, warmup=2)
    other = replace(SMALL_POOL, seed=4)
    kw = dict(eval_every=2, eval_puzzles=2, progress=False)
    run_long_training(tmp_path / "p", TINY, first, SMALL_POOL, **kw)
    run_long_training(tmp_path / "c", TINY, second, other, init_from=tmp_path / "p", **kw)
    path = adopt(tmp_path / "c", n_eval=3, root=tmp_path / "cache")
    assert path == sudoku_mdm_dir(TINY, second, tmp_path / "cache", other, first=(first, SMALL_POOL)) / "model.pt"
    model, rec = load_or_train_sudoku_mdm(TINY, second, n_eval=3, root=tmp_path / "cache", train=False,
                                          curriculum=other, first=(first, SMALL_POOL))
    assert rec["trained_on"]["long_run"]["continues"]["folder"] == "p"
    fresh, frec = load_or_train_sudoku_mdm(TINY, second, n_eval=3, progress=False, root=tmp_path / "fresh",
                                           curriculum=other, first=(first, SMALL_POOL))
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    d1 = sudoku_mdm_dir(TINY, first, tmp_path / "fresh", SMALL_POOL, create=False)
    assert (d1 / "model.pt").is_file() and (d1 / "train_state.pt").is_file()  # the first stage keeps its state
    assert frec["trained_on"]["continues"]["artifact"] == d1.name
    assert [e["step"] for e in frec["log"]] == list(range(1, 9))  # one log over both stages
    # a second stage stopped part-way resumes from its own state, even once the first stage's state is gone
    part_cfg = replace(second, steps=10)
    d2 = sudoku_mdm_dir(TINY, part_cfg, tmp_path / "fresh", other, first=(first, SMALL_POOL), create=False)
    import mimdm.pipelines.zoo as zoo

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):  # stopped after the copy, before training
        m.setattr(zoo, "train_mdm", interrupted)
        load_or_train_sudoku_mdm(TINY, part_cfg, n_eval=3, progress=False, root=tmp_path / "fresh", curriculum=other,
                                 first=(first, SMALL_POOL))
    assert (d2 / "train_state.pt").is_file() and json.loads((d2 / "continues.json").read_text())["artifact"] == d1.name
    (d1 / "train_state.pt").unlink()
    _, rec10 = load_or_train_sudoku_mdm(TINY, part_cfg, n_eval=3, progress=False, root=tmp_path / "fresh",
                                        curriculum=other, first=(first, SMALL_POOL))
    assert rec10["trained_on"]["continues"]["artifact"] == d1.name and rec10["log"][-1]["step"] == 10
    # a first stage cached without its state cannot start a new second stage
    with pytest.raises(FileNotFoundError, match="delete .* to retrain it"):
        load_or_train_sudoku_mdm(TINY, replace(second, steps=9), n_eval=3, progress=False, root=tmp_path / "fresh",
                                 curriculum=other, first=(first, SMALL_POOL))


def test_run_curves_reads_each_committed_run_in_order(tmp_path):
    from mimdm.pipelines.long_run import RUNS, run_curves

    (tmp_path / RUNS["relation"][1]).mkdir()
    (tmp_path / RUNS["relation"][1] / "config.json").write_text(json.dumps({"model": {"d_model": 8}, "train": {"steps": 5}}))
    (tmp_path / RUNS["relation"][1] / "curve.jsonl").write_text('{"step": 1, "solve_30_35": 0.5}\n\n{"step": 2, "solve_30_35": 0.75}\n')
    (tmp_path / RUNS["long"][1]).mkdir()  # a folder without a curve is left out
    (tmp_path / RUNS["long"][1] / "config.json").write_text(json.dumps({"model": {}, "train": {"steps": 1}}))
    assert run_curves(tmp_path) == {"relation": {"model": {"d_model": 8}, "steps": 5, "done": False, "curve": [
        {"step": 1, "solve_30_35": 0.5}, {"step": 2, "solve_30_35": 0.75}]}}
    committed = run_curves()
    assert list(committed)[:2] == ["long", "relation"] and set(committed) <= set(RUNS)
    assert committed["relation"]["model"]["relation_bias"] and not committed["long"]["model"].get("relation_bias")
    assert committed["long"]["curve"][-1]["step"] == committed["long"]["steps"] == 24_000 and committed["long"]["done"]


def test_relation24_is_the_relation_run_planned_twice_as_long():
    from dataclasses import replace

    from mimdm.pipelines.long_run import RUNS, relation24_run_configs, relation_run_configs

    (m24, t24, c24), (m, t, c) = relation24_run_configs(), relation_run_configs()
    assert (m24, c24, replace(t24, steps=t.steps)) == (m, c, t)
    assert t24.steps == 24_000 and t24.decay_start() == 19_200 and t.decay_start() == 9_600
    assert RUNS["relation24"] == (relation24_run_configs, "sudoku_cpu_relation24")


def test_deep24_is_relation24_with_seven_layers():
    from dataclasses import replace

    from mimdm.models.sudoku import SudokuMDM
    from mimdm.pipelines.long_run import RUNS, deep24_run_configs, relation24_run_configs

    (md, td, cd), (m, t, c) = deep24_run_configs(), relation24_run_configs()
    assert (replace(md, n_layers=m.n_layers), td, cd) == (m, t, c) and md.n_layers == 7 and m.n_layers == 5
    assert RUNS["deep24"] == (deep24_run_configs, "sudoku_cpu_deep24")
    n = SudokuMDM(md).n_parameters()
    from mimdm.core.shipped import MAX_FILE_BYTES

    assert 1_380_000 < n < 1_400_000 and 12 * n + 1_000_000 < MAX_FILE_BYTES  # state.pt: weights + two AdamW moments


def test_batch256_is_relation24_with_four_times_the_batch():
    from dataclasses import replace

    from mimdm.pipelines.long_run import RUNS, batch256_run_configs, relation24_run_configs

    (mb, tb, cb), (m, t, c) = batch256_run_configs(), relation24_run_configs()
    assert (mb, replace(tb, batch_size=t.batch_size), cb) == (m, t, c) and (tb.batch_size, t.batch_size) == (256, 64)
    assert RUNS["batch256"] == (batch256_run_configs, "sudoku_cpu_batch256")


def test_deep32_continues_deep24_in_a_second_cycle():
    from dataclasses import replace

    from mimdm.pipelines.long_run import CONTINUES, RUNS, deep24_run_configs, deep32_run_configs

    (m32, t32, c32), (m24, t24, c24) = deep32_run_configs(), deep24_run_configs()
    assert (m32, c32) == (m24, c24) and CONTINUES["deep32"] == "deep24"
    assert replace(t32, steps=t24.steps, cycle_start=0, lr=t24.lr, warmup=t24.warmup, decay_frac=t24.decay_frac) == t24
    assert (t32.cycle_start, t32.steps, t32.decay_start()) == (24_000, 32_000, 30_000)
    assert _lr_at(24_000, t32) == pytest.approx(5e-4 / 200) and _lr_at(25_000, t32) == 5e-4
    assert RUNS["deep32"] == (deep32_run_configs, "sudoku_cpu_deep32")


def test_hard30_continues_relation24_on_puzzles_singles_do_not_solve():
    from dataclasses import replace

    from mimdm.pipelines.long_run import CONTINUES, RUNS, hard30_run_configs, relation24_run_configs

    (mh, th, ch), (m24, t24, c24) = hard30_run_configs(), relation24_run_configs()
    assert mh == m24 and CONTINUES["hard30"] == "relation24"
    assert replace(th, steps=t24.steps, cycle_start=0, lr=t24.lr, warmup=t24.warmup, decay_frac=t24.decay_frac) == t24
    assert (th.cycle_start, th.steps, th.decay_start()) == (24_000, 30_000, 28_500)
    assert ch.beyond_singles and not c24.beyond_singles and (ch.fraction, ch.clues, ch.seed) == (0.5, (24, 35), 778)
    assert RUNS["hard30"] == (hard30_run_configs, "sudoku_cpu_hard30")


def test_state_solve_rate_is_the_zoo_evaluation_of_the_current_state(tmp_path, monkeypatch):
    from mimdm.pipelines import long_run
    from mimdm.pipelines.long_run import state_solve_rate
    from mimdm.pipelines.zoo import solve_rate

    torch.manual_seed(0)
    m = SudokuMDM(TINY).eval()
    (tmp_path / "config.json").write_text(json.dumps({"model": TINY.to_dict()}))
    torch.save({"model": m.state_dict(), "step": 7}, tmp_path / "state.pt")
    got = state_solve_rate(tmp_path, 3)
    want = solve_rate(m, 3)
    assert got["step"] == 7 and got["n_puzzles"] == 3 and got["solve_rate"] == want["solve_rate"]
    assert got["n_solved"] == round(3 * want["solve_rate"]) and got["nfe_mean"] == want["nfe_mean"]
    seen = []  # the evaluated model holds the state's weights (an untrained tiny model scores the same 0)
    monkeypatch.setattr(long_run, "solve_rate", lambda model, n: seen.append((model, n)) or want)
    state_solve_rate(tmp_path, 3)
    (model, n), = seen
    assert n == 3 and not model.training
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(FileNotFoundError, match="not a long run's folder"):
        state_solve_rate(tmp_path / "missing", 3)


def test_state_dev_solve_rate_counts_the_solved_development_puzzles(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mimdm.data.curriculum import build_pool
    from mimdm.pipelines import long_run
    from mimdm.pipelines.zoo import grids_to_tokens

    torch.manual_seed(0)
    (tmp_path / "config.json").write_text(json.dumps({"model": TINY.to_dict()}))
    torch.save({"model": SudokuMDM(TINY).state_dict(), "step": 9}, tmp_path / "state.pt")
    clues, seed = long_run.DEV_BEYOND_SINGLES
    pool = build_pool(CurriculumConfig(pool_size=4, clues=clues, seed=seed, beyond_singles=True), progress=False)
    seen = []

    def fake_decode(model, tokens, rule):  # solves every puzzle but the second; keeps the givens it was given
        seen.append(tokens)
        out = pool.solutions.copy()
        out[1] = pool.puzzles[1]
        return SimpleNamespace(tokens=grids_to_tokens(out, model.device))

    monkeypatch.setattr(long_run, "decode", fake_decode)
    got = long_run.state_dev_solve_rate(tmp_path, 4)
    assert torch.equal(seen[0], grids_to_tokens(pool.puzzles, "cpu"))  # the development puzzles, in order
    assert got == {"step": 9, "n_puzzles": 4, "n_solved": 3, "solve_rate": 0.75, "clues": [30, 35], "seed": seed,
                   "failed": [1]}
    with pytest.raises(ValueError, match="n_puzzles must be >= 1"):
        long_run.state_dev_solve_rate(tmp_path, 0)


def test_zoo_eval_of_a_folder_without_state_exits_2(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("tsl", Path(__file__).parent.parent / "scripts" / "train_sudoku_long.py")
    tsl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tsl)
    assert tsl.main(["--run", "deep24", "--state-dir", str(tmp_path), "--zoo-eval", "5"]) == 2
    assert "not a long run's folder" in capsys.readouterr().err
    assert tsl.main(["--run", "hard30", "--state-dir", str(tmp_path), "--dev-eval", "5"]) == 2
    assert "not a long run's folder" in capsys.readouterr().err
    for bad in (["--zoo-eval", "0"], ["--dev-eval", "0"], ["--zoo-eval", "5", "--dev-eval", "5"]):
        with pytest.raises(SystemExit) as e:
            tsl.main(bad)
        assert e.value.code == 2


def test_long_run_dev_pairs_runs_with_an_exact_mcnemar_test(capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("lrd", Path(__file__).parent.parent / "scripts" / "long_run_dev.py")
    lrd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lrd)
    ref = np.array([True] * 4 + [False] * 6 + [True, False])
    other = np.array([True] * 4 + [True] * 6 + [False, False])
    got = lrd.paired(ref, other)
    # 6 puzzles only the other run solves, 1 only the reference: two-sided exact p = 2 * P(X <= 1), X ~ Bin(7, 1/2)
    assert got == {"only_reference_solves": 1, "only_this_solves": 6, "mcnemar_p": pytest.approx(2 * 8 / 128)}
    assert lrd.paired(ref, ref)["mcnemar_p"] == 1.0
    with pytest.raises(SystemExit) as e:
        lrd.main(["--runs", "relation24", "nosuchrun"])
    assert e.value.code == 2 and "unknown run(s) nosuchrun" in capsys.readouterr().err
