"""A long, resumable Sudoku MDM training run with a solve-rate curve (issue 20).

The run lives in one folder (default ``checkpoints/sudoku_cpu_long/``):

- ``state.pt``: resumable training state of `mimdm.models.training.train_mdm` (model, optimiser,
  numpy and torch RNG states, training log), replaced atomically every ``ckpt_every`` steps;
- ``curve.jsonl``: one line per evaluation, ``{"step", "examples_seen", "solve_30_35",
  "solve_hard", "loss", "seconds"}`` (sequential confidence-ordered solve rates on fixed puzzle
  sets; ``loss`` is the mean training loss since the previous evaluation, nats per masked cell;
  ``seconds`` is training wall-clock, evaluation excluded);
- ``config.json``: model, training and curriculum configs, the evaluation sets, and the commit
  the run started from; ``puzzle_pool.npz``: the curriculum's puzzles (rebuilt from the seed if
  absent); ``model.pt``: the final model in the `mimdm.pipelines.zoo.load_sudoku_mdm` format,
  written when the run completes.

Evaluation runs between training segments under `torch.random.fork_rng` and never touches the
training state, so a run interrupted anywhere and resumed equals an uninterrupted one.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mimdm.core.artifacts import REPO_ROOT, atomic_save, file_sha256, git_commit, load_checkpoint
from mimdm.data import sudoku as sd
from mimdm.data.curriculum import CurriculumConfig, build_pool, curriculum_batch, load_or_build_pool
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.models.training import OBJECTIVE_VERSION, TrainConfig, state_segments, train_mdm
from mimdm.pipelines.zoo import grids_to_tokens, load_sudoku_mdm, solve_rate, sudoku_mdm_dir, tokens_to_grids
from mimdm.sampling.decoding import Sequential, decode

#: Fixed evaluation sets of the long run: (name, clue range, seed). The seeds differ from the
#: chapters' (`mimdm.pipelines.zoo.EVAL_SEED` and the profiles' seeds).
EVAL_SETS = (("solve_30_35", (30, 35), 424242), ("solve_hard", (24, 26), 434343))


def long_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """The configuration of the committed long `cpu` run: the `cpu` architecture (~1M parameters),
    batch 64, WSD schedule (peak 1.5e-3, 1,000 warmup steps, last 20% cosine decay to 0.1x) over
    24,000 steps (1.54M examples), half of each batch puzzle-shaped masks (22-35 clues).

    The run was planned for 60,000 steps and re-planned to 24,000 at step 17,000 (``config.json``,
    ``extended``), before its decay had begun: the solve rates had stopped rising at the stable learning
    rate since about step 10,000 (``curve.jsonl``). Both plans give the same first 17,000 steps, so the
    result is the model of this configuration trained in one go. It was the `cpu` profile's configuration before
    `relation_run_configs`."""
    model = SudokuMDMConfig.cpu()
    train = TrainConfig(steps=24_000, batch_size=64, lr=1.5e-3, warmup=1000, min_lr_ratio=0.1,
                        schedule="wsd", decay_frac=0.2, seed=2026, ckpt_every=500, log_every=100)
    curriculum = CurriculumConfig(fraction=0.5, pool_size=4096, clues=(22, 35), seed=777)
    return model, train, curriculum


def relation_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """The long run's recipe on the `cpu` architecture with a relation attention bias
    (``SudokuMDMConfig.relation_bias``; 80 more parameters), over 12,000 steps (768K examples): the
    same batch, learning rate, WSD schedule (last 20% decay), seed and curriculum as `long_run_configs`, so
    its curve compares step for step with the long run's; the `cpu` profile's model until `relation24_run_configs`
    replaced it."""
    model = SudokuMDMConfig(d_model=128, n_layers=5, n_heads=4, d_ff=512, relation_bias=True)
    train = TrainConfig(steps=12_000, batch_size=64, lr=1.5e-3, warmup=1000, min_lr_ratio=0.1,
                        schedule="wsd", decay_frac=0.2, seed=2026, ckpt_every=500, log_every=100)
    curriculum = CurriculumConfig(fraction=0.5, pool_size=4096, clues=(22, 35), seed=777)
    return model, train, curriculum


def relation24_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """`relation_run_configs` planned over 24,000 steps (1.54M examples, the long run's length): the same model,
    batch, learning rate, seed and curriculum, so its first 9,600 steps (the 12,000-step run's stable phase) have
    that run's data and learning rates (the weights agree up to floating-point differences, e.g. of the thread
    count, which grow over training); its decay starts at step 19,200. The `cpu` profile trains this configuration
    (`mimdm.app.profiles`)."""
    model, train, curriculum = relation_run_configs()
    return model, replace(train, steps=24_000), curriculum


def deep24_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """`relation24_run_configs` with 7 transformer layers instead of 5 (~1.39M parameters instead of ~1.0M): the same
    width, batch, learning rate, WSD schedule over 24,000 steps, seed and curriculum, so its curve compares step for
    step with relation24's: what two more layers (and 40% more parameters and compute per step) add to this recipe,
    for one seed. Its resumable state (weights and two AdamW moments, ~12 bytes per parameter, plus the log) is
    ~16.9 MB, leaving ~3 MB under the repository's 20 MB file limit; 8 layers would be ~19.3 MB."""
    model, train, curriculum = relation24_run_configs()
    return replace(model, n_layers=7), train, curriculum


def batch256_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """`relation24_run_configs` with batch 256 instead of 64 (6.1M examples instead of 1.54M): the same ~1M-parameter
    model (so the book's decoding costs stay those of the `cpu` model), learning rate, WSD schedule over 24,000 steps,
    seed and curriculum. Four times the data per step at the same number of optimiser steps: a run sized for a GPU
    (on the 2-core CPU it would take about four times relation24's training time)."""
    model, train, curriculum = relation24_run_configs()
    return model, replace(train, batch_size=256), curriculum


def deep32_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """`deep24_run_configs` continued for 8,000 more steps (to 32,000; 2.05M examples) in a second warmup-stable-decay
    cycle from deep24's final state (weights, AdamW moments, RNG and data position: `run_long_training`'s
    ``init_from``): 200 warmup steps to a peak of 5e-4 (a third of the first cycle's, whose decay ended at 1.5e-4),
    the last 25% of the cycle (2,000 steps) a cosine decay to 0.1x. Same model, batch, seed and curriculum, so the
    curve goes on from deep24's on the same axes: what more training of the 7-layer model adds."""
    model, train, curriculum = deep24_run_configs()
    return model, replace(train, steps=32_000, cycle_start=24_000, lr=5e-4, warmup=200, decay_frac=0.25), curriculum


def hard30_run_configs() -> tuple[SudokuMDMConfig, TrainConfig, CurriculumConfig]:
    """`relation24_run_configs` continued for 6,000 more steps (to 30,000; 1.92M examples) from relation24's final
    state in a second warmup-stable-decay cycle (200 warmup steps to 5e-4, the last 25% a cosine decay to 0.1x, as
    `deep32_run_configs`) on a harder curriculum: half of each batch are puzzles that naked and hidden singles do not
    solve (``beyond_singles``; 24-35 clues, a new pool of 4,096 from seed 778), the other half random masks as before.
    The zoo's failures among its 30-35-clue puzzles all lie in that class (16 of its 200), which the first cycle's
    pool holds at about 30%: what training on it adds to the shipped `cpu` architecture, with no change in size or
    forward cost."""
    model, train, _ = relation24_run_configs()
    curriculum = CurriculumConfig(fraction=0.5, pool_size=4096, clues=(24, 35), seed=778, beyond_singles=True)
    return model, replace(train, steps=30_000, cycle_start=24_000, lr=5e-4, warmup=200, decay_frac=0.25), curriculum


#: The runs `scripts/train_sudoku_long.py` knows: name -> (configs, default folder under ``checkpoints/``).
RUNS = {"long": (long_run_configs, "sudoku_cpu_long"), "relation": (relation_run_configs, "sudoku_cpu_relation"),
        "relation24": (relation24_run_configs, "sudoku_cpu_relation24"),
        "deep24": (deep24_run_configs, "sudoku_cpu_deep24"),
        "batch256": (batch256_run_configs, "sudoku_cpu_batch256"),
        "deep32": (deep32_run_configs, "sudoku_cpu_deep32"),
        "hard30": (hard30_run_configs, "sudoku_cpu_hard30")}
#: Runs that continue another run's final state (a second schedule cycle): name -> the run they continue.
CONTINUES = {"deep32": "deep24", "hard30": "relation24"}


def read_curve(path: Path) -> list[dict]:
    """The evaluations recorded in ``curve.jsonl`` (empty list if absent)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_curves(root: Path | None = None) -> dict[str, dict]:
    """The solve-rate curves of the committed long runs (`RUNS`), for comparing their recipes.

    Args:
        root: the folder holding the runs' folders (default: the repository's ``checkpoints/``).

    Returns:
        ``{run name: {"model": model config dict, "steps": planned steps, "done": whether the curve reached them,
        "curve": `read_curve` rows}}`` for each run whose folder has a ``config.json`` and a non-empty ``curve.jsonl``,
        in `RUNS` order (a run still in progress has ``done`` False).
    """
    root = Path(root) if root is not None else REPO_ROOT / "checkpoints"
    out = {}
    for name, (_, folder) in RUNS.items():
        d = root / folder
        curve = read_curve(d / "curve.jsonl")
        if curve and (d / "config.json").is_file():
            cfg = json.loads((d / "config.json").read_text())
            steps = cfg["train"]["steps"]
            out[name] = {"model": cfg["model"], "steps": steps, "done": curve[-1]["step"] >= steps, "curve": curve}
    return out


def solved_mask(model: SudokuMDM, puzzles_N81: np.ndarray, solutions_N81: np.ndarray) -> np.ndarray:
    """``[N]`` bool: which puzzles (``[N, 81]`` givens, 0 = blank) sequential confidence-ordered decoding (fp32, no
    grad) completes to exactly their ``[N, 81]`` solutions."""
    with torch.no_grad():
        res = decode(model, grids_to_tokens(puzzles_N81, model.device), Sequential("confidence"))
    return (tokens_to_grids(res.tokens) == solutions_N81).all(axis=1)


def solve_rate_on(model: SudokuMDM, puzzles: list[sd.Puzzle]) -> float:
    """Fraction of ``puzzles`` solved exactly by sequential confidence-ordered decoding (`solved_mask`)."""
    return float(np.mean(solved_mask(model, np.stack([p.puzzle for p in puzzles]),
                                     np.stack([p.solution for p in puzzles]))))


_README = """# Long `cpu` Sudoku MDM run `{run}` (issue 20)

A resumable training of a `cpu`-sized Sudoku MDM with a puzzle-mask curriculum and a
warmup-stable-decay schedule (configs in `config.json`; code in `mimdm/pipelines/long_run.py`).

Resume (exactly: weights, optimiser, schedule, RNG and data position come from `state.pt`),
from the repository root, at low priority on one core, for up to 2.5 hours:

```bash
nice -n 19 .venv/bin/python scripts/train_sudoku_long.py --run {run} --threads 1 --hours 2.5 --eval-every {eval_every}
```

Files: `state.pt` (resumable state, replaced in place; commit it to carry the run to another
session), `curve.jsonl` (solve rates on {n} fixed 30-35-clue and {n} fixed 24-26-clue puzzles
against training examples seen, every `--eval-every` steps), `puzzle_pool.npz` (the curriculum's
unique puzzles, rebuilt deterministically from the seed if missing), `model.pt` (the final model,
once the run completes). Keep `--eval-every` and the evaluation size unchanged across sessions so
the curve stays on one grid.
"""

_LONG_NOTE = """
Measured (2026-12-01, one thread on a 2-core machine whose other core was busy): 1.4-1.7 steps/s
(about 95 examples/s) with a 100 + 100-puzzle evaluation taking about 35 s; the 24,000 steps took
about 5.9 hours of training (evaluations excluded) over three sessions. The run has finished; its
`model.pt` is shipped as `checkpoints/cpu/sudoku_mdm` (`scripts/ship_checkpoints.py`), and `state.pt` holds the
final state. Its learning rate has decayed, so a longer plan cannot resume from it (`train_mdm` refuses: the
weights would not be those of the run planned longer from the start).
"""


def run_long_training(state_dir: Path, model_cfg: SudokuMDMConfig, train_cfg: TrainConfig,
                      curriculum: CurriculumConfig, hours: float | None = None, eval_every: int = 1000,
                      eval_puzzles: int = 100, progress: bool = True, stop_after: int | None = None,
                      allow_extend: bool = False, run: str = "long", device: str | torch.device = "cpu",
                      init_from: Path | None = None) -> list[dict]:
    """Train (or continue) the long run in ``state_dir`` and record its solve-rate curve.

    Args:
        state_dir: the run's folder (created if absent; see module docstring).
        model_cfg, train_cfg, curriculum: the run's configuration; must match ``config.json`` of
            an existing run (``train_cfg.steps`` may differ under ``allow_extend``, see
            `train_mdm`).
        hours: wall-clock budget of this call (training and evaluation), or None for no limit;
            the state is saved before returning.
        eval_every: evaluate every this many steps (and at the last step).
        eval_puzzles: puzzles per evaluation set (`EVAL_SETS`).
        progress: tqdm progress bars.
        stop_after: stop at this step (simulates an interruption; a later call continues).
        allow_extend: accept a changed ``train_cfg.steps`` (see `train_mdm`).
        run: the run's name in `RUNS` (for the resume command in the folder's README).
        device: where this call trains and evaluates (fp32 on any device); a run may move between
            CPU and GPU across calls (`mimdm.models.training.train_mdm`), and ``model.pt`` records
            the devices of its segments.
        init_from: the folder of a finished run this one continues (``train_cfg.cycle_start`` > 0: a second
            schedule cycle, e.g. `deep32_run_configs`). When ``state_dir`` has no state yet, that run's ``state.pt``
            (at step ``cycle_start``) is copied in with this run's training config, so the run starts from its
            weights, optimiser moments, RNG and data position; ``config.json`` records the source (``continues``:
            folder, step and the state's sha256). The training seed is then unused (the RNG state is the source's).
            The curve's first row re-evaluates that state when ``cycle_start`` is a multiple of ``eval_every``.

    Returns:
        The curve (all of ``curve.jsonl``).

    Raises:
        ValueError: ``eval_every``/``eval_puzzles`` < 1, or ``config.json``/the state file belong
            to another configuration; with ``init_from``, a source run of another model, data,
            objective or batch size, or whose state is not at step ``cycle_start``.
        FileNotFoundError: ``init_from`` has no ``state.pt`` or ``config.json``.
    """
    if eval_every < 1 or eval_puzzles < 1:
        raise ValueError(f"eval_every and eval_puzzles must be >= 1, got {eval_every}, {eval_puzzles}")
    t_start = time.perf_counter()
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_path, curve_path = state_dir / "state.pt", state_dir / "curve.jsonl"
    spec = {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "curriculum": curriculum.to_dict(),
            "eval": {"puzzles_per_set": eval_puzzles, "every_steps": eval_every,
                     "sets": [{"key": k, "clues": list(c), "seed": s} for k, c, s in EVAL_SETS],
                     "decoding": "sequential, confidence order"},
            "data": sd.GENERATOR_ID, "objective": OBJECTIVE_VERSION}
    cfg_path = state_dir / "config.json"
    src = None
    if init_from is not None and state_path.exists():  # resuming: the source was checked when the run began
        spec["continues"] = json.loads(cfg_path.read_text()).get("continues") if cfg_path.exists() else None
    elif init_from is not None:
        src = _continuation_source(Path(init_from), spec, train_cfg)
        spec["continues"] = {"folder": Path(init_from).name, "step": train_cfg.cycle_start,
                             "state_sha256": file_sha256(src)}
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        mine = {k: old.get(k) for k in spec}
        if allow_extend:
            mine["train"] = {**mine["train"], "steps": train_cfg.steps}
        if mine != spec:
            raise ValueError(f"{cfg_path} describes another run; use its configuration or another --state-dir")
        if old["train"]["steps"] != train_cfg.steps:
            old.setdefault("extended", []).append({"from_steps": old["train"]["steps"], "to_steps": train_cfg.steps})
            old["train"] = spec["train"]
            cfg_path.write_text(json.dumps(old, indent=1) + "\n")
    else:
        cfg_path.write_text(json.dumps({**spec, "started_from_commit": git_commit(),
                                        "torch": torch.__version__}, indent=1) + "\n")
    if not (state_dir / "README.md").exists():  # written once: a finished run's README records its measurements
        (state_dir / "README.md").write_text(_README.format(eval_every=eval_every, n=eval_puzzles, run=run)
                                             + (_LONG_NOTE if run == "long" else ""))

    if src is not None:
        pool_src, pool_dst = Path(init_from) / "puzzle_pool.npz", state_dir / "puzzle_pool.npz"
        same = json.loads((Path(init_from) / "config.json").read_text()).get("curriculum") == spec["curriculum"]
        if same and pool_src.is_file() and not pool_dst.exists():  # the same curriculum's pool: no rebuild
            tmp = pool_dst.with_name(pool_dst.name + ".tmp")
            shutil.copyfile(pool_src, tmp)
            os.replace(tmp, pool_dst)  # before the state: an interrupted copy leaves no state, so it is redone
        st = load_checkpoint(src)
        st["train_config"] = json.dumps(train_cfg.to_dict())  # the same state, trained on under this run's schedule
        atomic_save(st, state_path)
    pool = load_or_build_pool(curriculum, state_dir / "puzzle_pool.npz", progress)
    sample = curriculum_batch(pool, curriculum.fraction)
    eval_sets = [(k, sd.make_puzzles(eval_puzzles, c, np.random.default_rng(s))) for k, c, s in EVAL_SETS]

    torch.manual_seed(train_cfg.seed)
    model = SudokuMDM(model_cfg).to(device)
    curve = read_curve(curve_path)

    def state_step() -> tuple[int, list[dict]]:
        if not state_path.exists():
            return 0, []
        st = load_checkpoint(state_path)
        return int(st["step"]), json.loads(st["log"])

    def evaluate(step: int, log: list[dict]) -> None:
        done = {c["step"] for c in curve}
        if step == 0 or step in done:
            return
        prev = max([s for s in done if s < step], default=0)
        window = [e["loss"] for e in log if max(prev, train_cfg.cycle_start) < e["step"] <= step]
        row = {"step": step, "examples_seen": step * train_cfg.batch_size}
        with torch.random.fork_rng(devices=[]):
            model.eval()
            for key, puzzles in eval_sets:
                row[key] = solve_rate_on(model, puzzles)
        row["loss"] = float(np.mean(window)) if window else None
        row["seconds"] = log[-1]["seconds"] if log else None
        curve.append(row)
        with open(curve_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if progress:
            print(json.dumps(row), flush=True)

    step, log = state_step()
    if step:  # a run stopped right after a checkpoint at an evaluation step: evaluate it now
        model.load_state_dict(load_checkpoint(state_path)["model"])
        if step % eval_every == 0 or step == train_cfg.steps:
            evaluate(step, log)
    while step < train_cfg.steps:
        left = None if hours is None else hours * 3600 - (time.perf_counter() - t_start)
        if left is not None and left <= 0:
            break
        target = min(train_cfg.steps, (step // eval_every + 1) * eval_every)
        if stop_after is not None:
            if step >= stop_after:
                break
            target = min(target, stop_after)
        train_mdm(model, sample, train_cfg, state_path, progress=progress, max_seconds=left,
                  stop_after=target, allow_extend=allow_extend)
        step, log = state_step()
        if step % eval_every == 0 or step == train_cfg.steps:
            evaluate(step, log)
        if step < target:  # out of time
            break
    if step >= train_cfg.steps and not (state_dir / "model.pt").exists():
        segments = state_segments(load_checkpoint(state_path))
        devices = sorted({s["device"] for s in segments})
        atomic_save({
            "kind": "sudoku_mdm", "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "model_config": json.dumps(model_cfg.to_dict()), "train_config": json.dumps(train_cfg.to_dict()),
            "log": json.dumps(log), "eval": json.dumps(curve[-1] if curve else {}),
            "trained_on": json.dumps({"device": devices[0] if len(devices) == 1 else "+".join(devices),
                                      "segments": segments, "torch": torch.__version__, "data": sd.GENERATOR_ID,
                                      "objective": OBJECTIVE_VERSION, "curriculum": curriculum.to_dict()}),
        }, state_dir / "model.pt")
    return curve


#: The development set for the failure class of sequential decoding: (clue range, seed) of unique 30-35-clue
#: puzzles that naked and hidden singles do not solve (`mimdm.data.sudoku.fill_singles`), made as a
#: ``beyond_singles`` curriculum pool. Its seed differs from the zoo's, the chapters' and `EVAL_SETS`'.
DEV_BEYOND_SINGLES = ((30, 35), 515151)


def load_state_model(state_dir: Path, device: str | torch.device = "cpu") -> tuple[SudokuMDM, int]:
    """The model of a long run's current ``state.pt`` (finished or not), in eval mode, and the state's step.

    Raises:
        FileNotFoundError: the folder has no ``state.pt`` or ``config.json``.
    """
    state_dir = Path(state_dir)
    for f in ("state.pt", "config.json"):
        if not (state_dir / f).is_file():
            raise FileNotFoundError(f"{state_dir / f} not found: not a long run's folder")
    cfg = json.loads((state_dir / "config.json").read_text())
    st = load_checkpoint(state_dir / "state.pt")
    model = SudokuMDM(SudokuMDMConfig(**cfg["model"]))
    model.load_state_dict(st["model"])
    return model.to(device).eval(), int(st["step"])


def state_solve_rate(state_dir: Path, n_puzzles: int, device: str | torch.device = "cpu") -> dict:
    """The zoo's evaluation (`mimdm.pipelines.zoo.solve_rate`: ``n_puzzles`` unique 30-35-clue puzzles of the zoo's
    seed, sequential confidence-ordered decoding) of a run's current ``state.pt``, finished or not, without touching
    it: what `adopt` would record, at any size (the `cpu` profile's is 200 puzzles).

    Returns:
        `mimdm.pipelines.zoo.solve_rate`'s dict with ``"step"`` (the state's step) and ``"n_solved"`` added.

    Raises:
        FileNotFoundError: the folder has no ``state.pt`` or ``config.json``.
    """
    model, step = load_state_model(state_dir, device)
    with torch.random.fork_rng(devices=[]):
        ev = solve_rate(model, n_puzzles)
    return {"step": step, "n_solved": int(round(ev["solve_rate"] * n_puzzles)), **ev}


def state_dev_solve_rate(state_dir: Path, n_puzzles: int, device: str | torch.device = "cpu",
                         progress: bool = False) -> dict:
    """Sequential confidence-ordered solve rate of a run's current ``state.pt`` on the development set
    `DEV_BEYOND_SINGLES`: ``n_puzzles`` 30-35-clue puzzles that singles do not solve (about 1 in 10 of the zoo's
    30-35-clue puzzles, and where all its failures lie). For comparing runs on that class and choosing among them
    without looking at the zoo's evaluation puzzles. Making the puzzles takes about 0.1 s each. The set depends on
    ``n_puzzles`` as a whole (the pool draws all clue counts first), so compare runs at one size (the record's is 200).

    Returns:
        ``{"step", "n_puzzles", "n_solved", "solve_rate", "clues", "seed", "failed"}``; ``failed`` lists the indices
        of the unsolved puzzles.

    Raises:
        FileNotFoundError: the folder has no ``state.pt`` or ``config.json``.
        ValueError: ``n_puzzles`` < 1.
    """
    if n_puzzles < 1:
        raise ValueError(f"n_puzzles must be >= 1, got {n_puzzles}")
    model, step = load_state_model(state_dir, device)
    clues, seed = DEV_BEYOND_SINGLES
    pool = build_pool(CurriculumConfig(pool_size=n_puzzles, clues=clues, seed=seed, beyond_singles=True), progress)
    with torch.random.fork_rng(devices=[]):
        solved = solved_mask(model, pool.puzzles, pool.solutions)
    return {"step": step, "n_puzzles": n_puzzles, "n_solved": int(solved.sum()), "solve_rate": float(solved.mean()),
            "clues": list(clues), "seed": seed, "failed": np.flatnonzero(~solved).tolist()}


def _continuation_source(init_from: Path, spec: dict, train_cfg: TrainConfig) -> Path:
    """The ``state.pt`` of the finished run ``init_from`` that a run of ``spec`` continues, after checking that the
    two runs share model, data, objective and batch size and that the state is at ``cycle_start`` (the curriculum
    may change: a second cycle on other puzzles, e.g. `hard30_run_configs`)."""
    src, cfg_path = init_from / "state.pt", init_from / "config.json"
    for f in (src, cfg_path):
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: the run to continue must have a state and a config")
    if not train_cfg.cycle_start:
        raise ValueError("init_from continues a finished run: train_cfg.cycle_start must be its last step (> 0)")
    parent = json.loads(cfg_path.read_text())
    differ = [k for k in ("model", "data", "objective") if parent.get(k) != spec[k]]
    if parent["train"]["batch_size"] != train_cfg.batch_size:
        differ.append("batch_size")
    if differ:
        raise ValueError(f"{init_from} is a run of another {', '.join(differ)}; a continuation keeps them")
    step = int(load_checkpoint(src)["step"])
    if step != train_cfg.cycle_start:
        raise ValueError(f"{src} is at step {step}, not at cycle_start={train_cfg.cycle_start}")
    return src


def adopt(state_dir: Path, n_eval: int, root: Path | None = None) -> Path:
    """Put the completed long run's model into the artifact cache as the Sudoku MDM of its configuration.

    Writes ``model.pt`` in `mimdm.pipelines.zoo.sudoku_mdm_dir` of the run's model, training and curriculum
    configurations (`mimdm.pipelines.zoo.load_or_train_sudoku_mdm` then loads it instead of training), with the
    zoo's evaluation (`mimdm.pipelines.zoo.solve_rate` on ``n_eval`` 30-35-clue puzzles), the run's training log and
    its solve-rate curve (``record["trained_on"]["curve"]``). Training the same configuration from scratch with the
    zoo gives the same weights up to floating-point nondeterminism: the run resumes exactly, its evaluations do not
    touch the training state, and a re-planned length (``config.json`` ``extended``) only moved the start of the
    final decay, which had not begun. A continuation (``cycle_start`` > 0, ``config.json`` ``continues``, recorded in
    ``trained_on["long_run"]``) goes to the zoo's folder of a second cycle whose first stage is the source run's
    configuration (read from the source folder beside it, ``../<continues.folder>/config.json``): the zoo trains the
    same two stages from scratch, the second from the first's final state, as the run did.

    Returns:
        The written ``model.pt``.

    Raises:
        FileNotFoundError: the run has no ``model.pt`` (not finished), or a continuation's source folder has no
            ``config.json``.
    """

    state_dir = Path(state_dir)
    src = state_dir / "model.pt"
    if not src.is_file():
        raise FileNotFoundError(f"{src} not found: the long run has not finished (run scripts/train_sudoku_long.py)")
    cfg = json.loads((state_dir / "config.json").read_text())
    model_cfg, train_cfg = SudokuMDMConfig(**cfg["model"]), TrainConfig(**cfg["train"])
    cur = cfg["curriculum"]
    curriculum = CurriculumConfig.from_dict(cur)
    ck = load_checkpoint(src)
    model, _ = load_sudoku_mdm(src)
    ev = solve_rate(model, n_eval)
    trained_on = {**json.loads(ck["trained_on"]), "curve": read_curve(state_dir / "curve.jsonl"),
                  "long_run": {k: cfg.get(k) for k in ("started_from_commit", "extended", "eval", "continues")}}
    first = None
    if cfg.get("continues"):  # the zoo's key of a second cycle names its first stage's configuration
        parent = json.loads((state_dir.parent / cfg["continues"]["folder"] / "config.json").read_text())
        pc = parent.get("curriculum")
        first = (TrainConfig(**parent["train"]), None if pc is None else CurriculumConfig.from_dict(pc))
    d = sudoku_mdm_dir(model_cfg, train_cfg, root, curriculum, first=first)
    atomic_save({**ck, "eval": json.dumps(ev), "trained_on": json.dumps(trained_on)}, d / "model.pt")
    return d / "model.pt"


__all__ = ["CONTINUES", "DEV_BEYOND_SINGLES", "EVAL_SETS", "RUNS", "adopt", "batch256_run_configs", "deep24_run_configs", "deep32_run_configs", "hard30_run_configs", "load_state_model", "long_run_configs", "relation24_run_configs",
           "relation_run_configs", "read_curve", "run_curves", "run_long_training", "solve_rate_on", "solved_mask", "state_dev_solve_rate", "state_solve_rate"]
