"""Trained models of the study, cached by configuration (train once, load afterwards)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from mimdm.core.artifacts import artifact_dir, atomic_save, file_sha256, load_checkpoint
from mimdm.core.device import apply_precision, resolve_device
from mimdm.core.shipped import refuse_training
from mimdm.data import sudoku as sd
from mimdm.data.curriculum import CurriculumConfig, curriculum_batch, load_or_build_pool
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig
from mimdm.models.training import OBJECTIVE_VERSION, TrainConfig, train_mdm
from mimdm.sampling.decoding import Sequential, decode

EVAL_CLUES = (30, 35)
EVAL_SEED = 12345


def sudoku_batch(rng: np.random.Generator, batch_size: int) -> torch.Tensor:
    """``[B, 81]`` long clean training values (digit-1) of fresh random solution grids."""
    return torch.from_numpy(sd.random_solutions(batch_size, rng).astype(np.int64) - 1)


def grids_to_tokens(grids: np.ndarray, device="cpu") -> torch.Tensor:
    """``[N, 81]`` int grids (0 blank, 1..9) -> ``[N, 81]`` long Sudoku MDM tokens (9 = mask).

    Args:
        grids: ``[N, 81]`` integer array (floats holding whole numbers are accepted).
        device: where to put the tokens (checked by `mimdm.core.device.resolve_device`).

    Raises:
        SudokuError: wrong shape, values outside 0..9, or non-integer values (not truncated).
        ValueError / RuntimeError: as `mimdm.core.device.resolve_device` (not a device; CUDA asked for
            on a machine without it).
    """

    arr = np.asarray(grids)
    if arr.ndim != 2 or arr.shape[1] != 81:
        raise sd.SudokuError(f"grids must have shape [N, 81], got {arr.shape}")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise sd.SudokuError(f"grid values must be integers 0 (blank) or 1..9, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and arr.size and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise sd.SudokuError("grid values must be whole numbers 0 (blank) or 1..9, got non-integer values")
    if arr.size and (arr.min() < 0 or arr.max() > 9):
        raise sd.SudokuError(f"grid values must be 0 (blank) or 1..9, got range [{arr.min()}, {arr.max()}]")
    g = torch.as_tensor(arr.astype(np.int64), device=resolve_device(device))
    return torch.where(g == 0, torch.full_like(g, 9), g - 1)


def tokens_to_grids(tokens: torch.Tensor) -> np.ndarray:
    """Inverse of `grids_to_tokens`: ``[N, 81]`` int8 grids, mask -> 0."""
    t = tokens.detach().cpu().numpy().astype(np.int64)
    return np.where(t == 9, 0, t + 1).astype(np.int8)


def solve_rate(model: SudokuMDM, n_puzzles: int, clues=EVAL_CLUES, seed: int = EVAL_SEED) -> dict:
    """Fraction of unique puzzles the model solves by sequential confidence-ordered decoding.

    Puzzles: ``n_puzzles`` unique puzzles with clue counts uniform in ``clues`` (inclusive),
    made with ``seed``. Returns ``{"solve_rate", "valid_rate", "n_puzzles", "clues", "nfe_mean",
    "seconds"}``; "valid" means a valid grid that keeps the givens (for a unique puzzle this
    equals solved).
    """

    puzzles = sd.make_puzzles(n_puzzles, clues, np.random.default_rng(seed))
    grids = np.stack([p.puzzle for p in puzzles])
    t0 = time.perf_counter()
    res = decode(model, grids_to_tokens(grids, model.device), Sequential("confidence"))
    dt = time.perf_counter() - t0
    out = tokens_to_grids(res.tokens)
    solved = np.array([np.array_equal(o, p.solution) for o, p in zip(out, puzzles)])
    valid = sd.is_valid_solution_batch(out) & np.all((grids == 0) | (out == grids), axis=1)
    return {"solve_rate": float(solved.mean()), "valid_rate": float(valid.mean()), "n_puzzles": n_puzzles,
            "clues": list(clues), "nfe_mean": float(res.nfe.float().mean()), "seconds": round(dt, 2)}


#: A first training stage that a second schedule cycle continues: its training config and curriculum (None: random
#: masks only).
FirstStage = tuple[TrainConfig, CurriculumConfig | None]


def _check_stages(train_cfg: TrainConfig, first: FirstStage | None) -> None:
    if first is not None and not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], TrainConfig)
                                  and (first[1] is None or isinstance(first[1], CurriculumConfig))):
        raise ValueError(f"first must be a (TrainConfig, CurriculumConfig or None) pair, got {first!r}")
    if first is None:
        if train_cfg.cycle_start:
            raise ValueError(f"a training cycle from step {train_cfg.cycle_start} continues a first stage; pass first="
                             "(its TrainConfig, its curriculum)")
        return
    t1 = first[0]
    if not train_cfg.cycle_start or t1.steps != train_cfg.cycle_start or t1.cycle_start:
        raise ValueError(f"first must be a one-cycle training of {train_cfg.cycle_start} steps (the second cycle's "
                         f"cycle_start); got {t1.steps} steps from step {t1.cycle_start}")
    if t1.batch_size != train_cfg.batch_size:
        raise ValueError(f"the two stages must share the batch size, got {t1.batch_size} and {train_cfg.batch_size}")


def sudoku_mdm_dir(model_cfg: SudokuMDMConfig, train_cfg: TrainConfig, root: Path | None = None,
                   curriculum: CurriculumConfig | None = None, create: bool = True,
                   first: FirstStage | None = None) -> Path:
    """Artifact folder of the Sudoku MDM with these configurations (``curriculum``: the puzzle-mask curriculum it
    was trained with, `mimdm.data.curriculum`; None: random masks only, and the key of earlier models;
    ``create=False``: only the path, for a read-only lookup; ``first``: the first stage a second schedule cycle
    continues, ``train_cfg.cycle_start`` > 0, see `load_or_train_sudoku_mdm`).

    Raises:
        ValueError: ``first`` missing for a second cycle, given for a first one, not a (TrainConfig, CurriculumConfig
            or None) pair, or not ``cycle_start`` steps long.
    """
    _check_stages(train_cfg, first)
    cfg = {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "data": sd.GENERATOR_ID,
           "objective": OBJECTIVE_VERSION}
    if curriculum is not None:
        cfg["curriculum"] = curriculum.to_dict()
    if first is not None:
        cfg["continues"] = {"train": first[0].to_dict(),
                            **({} if first[1] is None else {"curriculum": first[1].to_dict()})}
    return artifact_dir("sudoku_mdm", f"d{model_cfg.d_model}-l{model_cfg.n_layers}", cfg, root, create)


def load_sudoku_mdm(path: Path, device="cpu") -> tuple[SudokuMDM, dict]:
    """Load a trained Sudoku MDM from its ``model.pt`` (``weights_only=True``).

    Returns:
        ``(model in eval mode, record)``; ``record`` holds ``model_config``, ``train_config``,
        ``log`` (training log), ``eval`` (solve rate) and ``n_parameters``.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the file is not a Sudoku MDM checkpoint.
    """
    dev = resolve_device(device)
    ck = load_checkpoint(path, dev)
    if ck.get("kind") != "sudoku_mdm":
        raise ValueError(f"{path} is not a Sudoku MDM checkpoint (kind={ck.get('kind')!r})")
    model = SudokuMDM(SudokuMDMConfig(**json.loads(ck["model_config"]))).to(dev)
    model.load_state_dict(ck["state_dict"])
    model.eval()
    record = {k: json.loads(ck[k]) for k in ("model_config", "train_config", "log", "eval") if k in ck}
    record["trained_on"] = json.loads(ck["trained_on"]) if "trained_on" in ck else None
    record["n_parameters"] = model.n_parameters()
    record["path"] = str(path)
    return model, record


def load_or_train_sudoku_mdm(model_cfg: SudokuMDMConfig, train_cfg: TrainConfig, device="cpu",
                             n_eval: int = 200, progress: bool = True, root: Path | None = None,
                             train: bool = True, precision: str = "auto",
                             curriculum: CurriculumConfig | None = None, first: FirstStage | None = None,
                             keep_state: bool = False) -> tuple[SudokuMDM, dict]:
    """The Sudoku MDM of these configurations: loaded from the artifact cache, else trained.

    With a ``curriculum`` part of each batch is puzzle-shaped masks from its puzzle pool (built once into the
    model's artifact folder; `mimdm.data.curriculum.curriculum_batch`), the rest random grids masked at random.

    With ``first`` (``train_cfg.cycle_start`` > 0) the model is a second warmup-stable-decay cycle: the first stage
    (this model config, ``first``'s training config and curriculum) is loaded or trained first, keeping its final
    training state, and the second stage starts from that state (weights, AdamW moments, RNG and data position) under
    ``train_cfg`` and ``curriculum``, as `mimdm.pipelines.long_run.run_long_training` does with ``init_from``.
    ``keep_state``: keep the final ``train_state.pt`` (what a second stage continues) instead of deleting it.

    The returned model computes forward passes in ``precision`` (`mimdm.core.device.apply_precision`:
    ``"auto"`` is bf16 autocast on a CUDA device that supports it, fp32 otherwise); training and
    its evaluation run in fp32.

    Training is resumable (an interrupted run continues from ``train_state.pt``); at the end the
    solve rate on ``n_eval`` 30-35-clue unique puzzles is measured and ``model.pt`` is written
    with the configs, training log and evaluation.

    Raises:
        FileNotFoundError: ``train=False`` and no trained model is cached; or the cached first stage has no final
            training state (it was trained without ``keep_state``): delete its folder to retrain it.
        ValueError: as `sudoku_mdm_dir` (``first`` inconsistent with ``train_cfg``).
    """
    dev = resolve_device(device)
    d = sudoku_mdm_dir(model_cfg, train_cfg, root, curriculum, create=train, first=first)
    final = d / "model.pt"
    if final.exists():
        model, rec = load_sudoku_mdm(final, dev)
        return apply_precision(model, precision), rec
    if not train:
        raise FileNotFoundError(f"no trained Sudoku MDM at {final}; run `mimdm train` or pass train=True")
    refuse_training(d, "Sudoku MDM")
    state = d / "train_state.pt"
    continues = None
    if first is not None and state.exists():  # a second stage resuming: its source was recorded when it began
        continues = json.loads((d / "continues.json").read_text()) if (d / "continues.json").is_file() else None
    elif first is not None:
        load_or_train_sudoku_mdm(model_cfg, first[0], device=device, n_eval=n_eval, progress=progress, root=root,
                                 curriculum=first[1], keep_state=True)
        d1 = sudoku_mdm_dir(model_cfg, first[0], root, first[1], create=False)
        src = d1 / "train_state.pt"
        if not src.is_file():
            raise FileNotFoundError(f"{d1} holds the first stage's model but not its final training state, which the "
                                    f"second stage continues; delete {d1} to retrain it")
        continues = {"artifact": d1.name, "state_sha256": file_sha256(src)}
        (d / "continues.json").write_text(json.dumps(continues) + "\n")  # before the state: a crash redoes both
        st = load_checkpoint(src)
        st["train_config"] = json.dumps(train_cfg.to_dict())  # the same state, trained on under this schedule
        atomic_save(st, state)
    torch.manual_seed(train_cfg.seed)
    model = SudokuMDM(model_cfg).to(dev)
    sample = sudoku_batch if curriculum is None else curriculum_batch(
        load_or_build_pool(curriculum, d / "puzzle_pool.npz", progress), curriculum.fraction)
    log = train_mdm(model, sample, train_cfg, state, progress=progress)
    ev = solve_rate(model, n_eval)
    atomic_save({
        "kind": "sudoku_mdm", "state_dict": model.state_dict(),
        "model_config": json.dumps(model_cfg.to_dict()), "train_config": json.dumps(train_cfg.to_dict()),
        "log": json.dumps(log), "eval": json.dumps(ev),
        "trained_on": json.dumps({"device": str(dev), "torch": torch.__version__, "data": sd.GENERATOR_ID,
                                  "objective": OBJECTIVE_VERSION,
                                  **({} if curriculum is None else {"curriculum": curriculum.to_dict()}),
                                  **({} if continues is None else {"continues": continues})}),
    }, final)
    if not keep_state:
        state.unlink(missing_ok=True)
    model, rec = load_sudoku_mdm(final, dev)
    return apply_precision(model, precision), rec


def profile_sudoku_mdm(profile, device="cpu", progress: bool = True, train: bool = True,
                       precision: str = "auto") -> tuple[SudokuMDM, dict]:
    """`load_or_train_sudoku_mdm` with a `mimdm.app.profiles.Profile`'s settings: ``sudoku_model``, ``sudoku_train``,
    ``sudoku_curriculum``, ``sudoku_first_stage`` and ``solve_eval_puzzles`` (the one way chapters, CLI and
    benchmarks get the profile's Sudoku MDM)."""
    return load_or_train_sudoku_mdm(profile.sudoku_model, profile.sudoku_train, device=device,
                                    n_eval=profile.solve_eval_puzzles, progress=progress, train=train,
                                    precision=precision, curriculum=profile.sudoku_curriculum,
                                    first=getattr(profile, "sudoku_first_stage", None))


def chapter_sudoku_mdm(profile, device="cpu", model_path: str | Path | None = None, progress: bool = False,
                       precision: str = "auto") -> tuple[SudokuMDM, dict]:
    """The Sudoku MDM a chapter studies: the profile's (`profile_sudoku_mdm`; the shipped checkpoint under ``cpu``)
    or, with ``model_path``, a trained Sudoku MDM checkpoint (a ``model.pt`` written by this package, e.g. a
    reader's own training), loaded with ``weights_only=True``.

    Raises:
        FileNotFoundError: no file at ``model_path``.
        ValueError: the file is not a Sudoku MDM checkpoint of this package (wrong kind, or unreadable).
    """
    if model_path is None:
        return profile_sudoku_mdm(profile, device=device, progress=progress, precision=precision)
    model, rec = load_sudoku_mdm(Path(model_path), resolve_device(device))
    return apply_precision(model, precision), rec

