"""Puzzle-shaped masks for Sudoku MDM training (a curriculum on the masking pattern).

Random masking at rate t ~ U(0, 1] rarely produces the masks decoding meets: the blanks of a
unique puzzle (17-35 givens that determine everything else). `PuzzlePool` holds unique puzzles
made once with `mimdm.data.sudoku.make_puzzle` (reproducible from a seed, cached on disk) and
`curriculum_batch` builds a sample function for `mimdm.models.training.train_mdm` in which a
fixed fraction of each batch is a pool puzzle under a fresh random Sudoku symmetry (applied
jointly to the puzzle and its solution), masked exactly at its blanks; the rest are random grids
masked at random as without a curriculum.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from mimdm.data import sudoku as sd


@dataclass(frozen=True)
class CurriculumConfig:
    """Puzzle-mask curriculum: ``fraction`` of each batch (rounded to whole examples) are pool
    puzzles; the pool holds ``pool_size`` unique puzzles with clue counts uniform in ``clues``
    (inclusive), made with ``seed``. With ``beyond_singles``, each pool puzzle is one that naked and hidden
    singles alone do not solve (`mimdm.data.sudoku.fill_singles` leaves a blank): at each drawn clue count,
    puzzles are made until one qualifies, so the clue counts stay uniform (about 2% of random 35-clue puzzles
    qualify, 17% of 30-clue and 54% of 24-clue ones)."""

    fraction: float = 0.5
    pool_size: int = 4096
    clues: tuple[int, int] = (22, 35)
    seed: int = 777
    beyond_singles: bool = False

    def __post_init__(self):
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"CurriculumConfig.fraction must be in [0, 1], got {self.fraction}")
        if self.pool_size < 1:
            raise ValueError(f"CurriculumConfig.pool_size must be >= 1, got {self.pool_size}")
        lo, hi = self.clues
        if not sd.MIN_UNIQUE_CLUES <= lo <= hi < sd.N_CELLS:
            raise ValueError(f"CurriculumConfig.clues must satisfy 17 <= lo <= hi < 81, got {self.clues}")
        if not isinstance(self.beyond_singles, bool):
            raise ValueError(f"CurriculumConfig.beyond_singles must be a bool, got {self.beyond_singles!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "CurriculumConfig":
        """The config of a `to_dict` result (e.g. read back from a run's ``config.json``)."""
        return cls(**{**d, "clues": tuple(d["clues"])})

    def to_dict(self) -> dict:
        """The config as JSON-ready data; ``beyond_singles`` only when set, so the pools, runs and artifact keys
        of configs made before it existed keep their identity."""
        d = asdict(self)
        d["clues"] = list(self.clues)
        if not self.beyond_singles:
            del d["beyond_singles"]
        return d


@dataclass(frozen=True)
class PuzzlePool:
    """Unique puzzles and their solutions.

    Attributes:
        puzzles: ``[N, 81]`` int8 givens (0 = blank).
        solutions: ``[N, 81]`` int8 unique completions.
    """

    puzzles: np.ndarray
    solutions: np.ndarray

    def __len__(self) -> int:
        return len(self.puzzles)


#: Puzzles made per clue count before `build_pool` gives up finding one that singles do not solve.
MAX_SINGLES_TRIES = 5000


def build_pool(cfg: CurriculumConfig, progress: bool = True) -> PuzzlePool:
    """Make ``cfg.pool_size`` unique puzzles (deterministic in ``cfg.seed``; about 5-30 ms each, 0.1-0.2 s each
    under ``beyond_singles`` at 30-35 clues).

    Raises:
        SudokuError: as `mimdm.data.sudoku.make_puzzle` (a clue count too low to reach), or under
            ``beyond_singles`` no qualifying puzzle in `MAX_SINGLES_TRIES` tries at some clue count.
    """
    rng = np.random.default_rng(cfg.seed)
    counts = rng.integers(cfg.clues[0], cfg.clues[1] + 1, cfg.pool_size)
    puzzles, solutions = [], []
    for c in tqdm(counts.tolist(), disable=not progress, desc="puzzle pool", unit="puzzle", mininterval=2.0):
        p = sd.make_puzzle(c, rng)
        tries = 1
        while cfg.beyond_singles and not (sd.fill_singles(p.puzzle) == 0).any():
            if tries == MAX_SINGLES_TRIES:
                raise sd.SudokuError(f"no {c}-clue puzzle that singles do not solve in {tries} tries; lower the "
                                     f"curriculum's clue range")
            p = sd.make_puzzle(c, rng)
            tries += 1
        puzzles.append(p.puzzle)
        solutions.append(p.solution)
    return PuzzlePool(np.stack(puzzles).astype(np.int8), np.stack(solutions).astype(np.int8))


def load_or_build_pool(cfg: CurriculumConfig, path: Path, progress: bool = True) -> PuzzlePool:
    """The pool of ``cfg``, read from ``path`` (``.npz``) if it was written for ``cfg``, else built
    and written there (atomically).

    Raises:
        ValueError: the file at ``path`` holds a pool of another configuration, or its puzzles
            do not complete to its solutions.
    """
    path = Path(path)
    if path.exists():
        with np.load(path) as z:
            meta = json.loads(str(z["config"]))
            if meta != cfg.to_dict():
                raise ValueError(f"{path} holds a puzzle pool of another configuration ({meta}); delete it "
                                 f"to rebuild it for {cfg.to_dict()}")
            pool = PuzzlePool(z["puzzles"].astype(np.int8), z["solutions"].astype(np.int8))
        ok = ((pool.puzzles == 0) | (pool.puzzles == pool.solutions)).all() and sd.is_valid_solution_batch(
            pool.solutions).all()
        if not ok or len(pool) != cfg.pool_size:
            raise ValueError(f"{path} is corrupt (puzzles do not match their solutions, or wrong size)")
        return pool
    pool = build_pool(cfg, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, puzzles=pool.puzzles, solutions=pool.solutions, config=json.dumps(cfg.to_dict()))
    tmp.replace(path)
    return pool


def curriculum_batch(pool: PuzzlePool, fraction: float) -> Callable[[np.random.Generator, int], tuple]:
    """A ``train_mdm`` sample function mixing pool puzzles with random grids.

    The returned ``sample(rng, batch_size)`` gives ``(values [B, 81] long, forced [B, 81] bool)``:
    the first ``round(fraction * B)`` rows are pool puzzles (drawn uniformly with replacement)
    under a random symmetry, their solution as values and their blanks as forced mask; the rest
    are fresh random grids (`mimdm.data.sudoku.random_solutions`) with an all-False forced row
    (masked at random). Depends only on ``rng``.

    Raises:
        ValueError: ``fraction`` outside [0, 1] or an empty pool.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if len(pool) == 0:
        raise ValueError("the puzzle pool is empty")
    pairs = np.stack([pool.puzzles, pool.solutions], axis=1)  # [N, 2, 81]

    def sample(rng: np.random.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = int(round(fraction * batch_size))
        idx = rng.integers(0, len(pool), k)
        pz = sd.random_symmetries(pairs[idx], rng)  # [k, 2, 81]
        rand = sd.random_solutions(batch_size - k, rng)
        values = np.concatenate([pz[:, 1], rand]).astype(np.int64) - 1
        forced = np.concatenate([pz[:, 0] == 0, np.zeros((batch_size - k, sd.N_CELLS), dtype=bool)])
        return torch.from_numpy(values), torch.from_numpy(forced)

    return sample
