"""Sudoku grids: parsing, rules, an exact solver, fast random solutions and unique puzzles.

Representation
--------------
A grid is an ``np.ndarray`` of shape ``[81]`` and dtype ``int8``: 0 is a blank, 1..9 are digits,
cells in row-major order (cell = 9 * row + col, rows and columns 0-based in code). Batches are
``[N, 81]``. Messages name cells 1-based, as ``r3c7`` (row 3, column 7) and boxes 1..9 in
row-major order.

Every bad input (wrong shape, bad character, digit out of range, givens that break a rule, a
bound exceeded) raises :class:`SudokuError`, a ``ValueError`` whose message names the problem.

Contents
--------
* text: :func:`parse_grid`, :func:`format_grid`;
* structure: :data:`UNITS`, :data:`PEERS`, :func:`constraint_graph`;
* rules: :func:`rule_violations`, :func:`is_consistent`, :func:`is_valid_solution`,
  :func:`is_valid_solution_batch`, :func:`is_completion_of`;
* exact solver (bitmask backtracking, most-constrained cell first): :func:`solve`,
  :func:`solve_stats`, :func:`count_solutions`, :func:`enumerate_completions`;
* generation: :func:`random_solutions`, :class:`Puzzle`, :func:`make_puzzle`,
  :func:`make_puzzles`, :func:`random_partial`.

Only numpy is needed.
"""
from __future__ import annotations

import random as _random
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "SudokuError",
    "TooManyCompletions",
    "cell_name",
    "UNITS",
    "PEERS",
    "constraint_graph",
    "parse_grid",
    "format_grid",
    "rule_violations",
    "is_consistent",
    "is_valid_solution",
    "is_valid_solution_batch",
    "is_completion_of",
    "solve",
    "solve_stats",
    "fill_singles",
    "count_solutions",
    "enumerate_completions",
    "random_solutions",
    "Puzzle",
    "make_puzzle",
    "make_puzzles",
    "random_partial",
]

N_CELLS = 81
MIN_UNIQUE_CLUES = 17  # proven minimum number of givens of a uniquely solvable sudoku


class SudokuError(ValueError):
    """Bad sudoku input: wrong shape or characters, out-of-range digits, broken rules, bounds."""


class TooManyCompletions(SudokuError):
    """A partial grid has more completions than the enumeration bound allows."""


# --------------------------------------------------------------------------- structure

def _build_units() -> np.ndarray:
    rows = [[9 * r + c for c in range(9)] for r in range(9)]
    cols = [[9 * r + c for r in range(9)] for c in range(9)]
    boxes = [
        [9 * (3 * br + i) + 3 * bc + j for i in range(3) for j in range(3)]
        for br in range(3)
        for bc in range(3)
    ]
    units = np.array(rows + cols + boxes, dtype=np.int64)
    units.setflags(write=False)
    return units


UNITS: np.ndarray = _build_units()
"""``[27, 9]`` int64 cell indices: rows 0..8 (units 0-8), columns (9-17), boxes (18-26).
Boxes are numbered row-major; each unit lists its cells in row-major order. Read-only."""

_ROW = [i // 9 for i in range(N_CELLS)]
_COL = [i % 9 for i in range(N_CELLS)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(N_CELLS)]
_RCB = [(_ROW[i], _COL[i], _BOX[i]) for i in range(N_CELLS)]
_UNIT_LISTS = [u.tolist() for u in UNITS]


def _build_peers() -> np.ndarray:
    peers = np.empty((N_CELLS, 20), dtype=np.int64)
    for i in range(N_CELLS):
        ps = sorted(
            {j for j in range(N_CELLS) if j != i and (
                _ROW[j] == _ROW[i] or _COL[j] == _COL[i] or _BOX[j] == _BOX[i])}
        )
        peers[i] = ps
    peers.setflags(write=False)
    return peers


PEERS: np.ndarray = _build_peers()
"""``[81, 20]`` int64: the sorted peers of each cell (cells sharing its row, column or box,
the cell itself excluded). Read-only."""


def constraint_graph() -> np.ndarray:
    """Return the ``[81, 81]`` bool adjacency of the sudoku constraint graph.

    Entry ``[i, j]`` is True iff ``i != j`` and cells i and j share a row, column or box. The
    matrix is symmetric with a False diagonal and exactly 20 True entries per row. A fresh
    (writable) array is returned on every call.
    """
    adj = np.zeros((N_CELLS, N_CELLS), dtype=bool)
    adj[np.arange(N_CELLS)[:, None], PEERS] = True
    return adj


# --------------------------------------------------------------------------- validation

def cell_name(i: int) -> str:
    """``r{row}c{col}`` (1-based) of cell ``i`` in 0..80."""
    return f"r{i // 9 + 1}c{i % 9 + 1}"


def _as_grid(grid, name: str = "grid") -> np.ndarray:
    """Validate one grid and return it as a ``[81]`` int8 array (a copy only if needed)."""
    a = np.asarray(grid)
    if a.shape != (N_CELLS,):
        raise SudokuError(f"{name} has shape {a.shape}, expected (81,)")
    return _check_values(a, name).astype(np.int8, copy=False)


def _as_batch(grids, name: str = "grids") -> np.ndarray:
    a = np.asarray(grids)
    if a.ndim != 2 or a.shape[1] != N_CELLS:
        raise SudokuError(f"{name} has shape {a.shape}, expected (N, 81)")
    return _check_values(a, name)


def _check_values(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise SudokuError(f"{name} has dtype {a.dtype}, expected an integer dtype")
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 9:
            bad = lo if lo < 0 else hi
            pos = int(np.flatnonzero(a.reshape(-1) == bad)[0])
            raise SudokuError(
                f"{name} has value {bad} at flat position {pos}; "
                "expected 0 (blank) or 1-9"
            )
    return a


# --------------------------------------------------------------------------- text

def _as_count(x, name: str) -> int:
    """``x`` as an int; a float or bool that is not an exact integer is an error, not truncated."""
    if isinstance(x, bool) or not float(x).is_integer():
        raise SudokuError(f"{name} must be an integer, got {x!r}")
    return int(x)


def parse_grid(s: str, check: bool = True) -> np.ndarray:
    """Parse a sudoku from text into a ``[81]`` int8 grid (0 = blank).

    The text must hold exactly 81 cell characters in row-major order: ``1``-``9`` for digits,
    ``.`` or ``0`` for blanks. Whitespace (spaces, tabs, newlines) is ignored anywhere, so the
    one-line form and the 9-row ``format_grid(..., pretty=True)`` form both parse.

    Args:
        s: the text.
        check: if True (default), also require that the givens break no rule.

    Raises:
        SudokuError: ``s`` is not a str; a character other than a digit, ``.``, ``0`` or
            whitespace ("bad character 'x' at position 5 (row 1, col 6); ..."; position counts
            cell characters from 0); not exactly 81 cell characters ("grid has 80 characters,
            expected 81"); with ``check``, a digit repeated in a row, column or box ("givens
            break a rule: digit 5 appears twice in row 3 (cells r3c1, r3c7)").
    """
    if not isinstance(s, str):
        raise SudokuError(f"expected a str, got {type(s).__name__}")
    chars = "".join(s.split())
    for pos, ch in enumerate(chars):
        if ch not in "0123456789.":
            where = f" (row {pos // 9 + 1}, col {pos % 9 + 1})" if pos < N_CELLS else ""
            raise SudokuError(
                f"bad character {ch!r} at position {pos}{where}; "
                "use 1-9 for digits and '.' or '0' for blanks"
            )
    if len(chars) != N_CELLS:
        raise SudokuError(f"grid has {len(chars)} characters, expected 81")
    grid = np.frombuffer(chars.replace(".", "0").encode("ascii"), dtype=np.uint8)
    grid = (grid - ord("0")).astype(np.int8)
    if check:
        bad = rule_violations(grid)
        if bad:
            raise SudokuError("givens break a rule: " + "; ".join(bad))
    return grid


def format_grid(grid, blank: str = ".", pretty: bool = False) -> str:
    """Format a ``[81]`` grid as text that :func:`parse_grid` reads back.

    Args:
        grid: ``[81]`` integer array-like, values 0..9.
        blank: the one character written for blanks, ``'.'`` (default) or ``'0'``.
        pretty: if False, one line of 81 characters. If True, nine text rows, digits separated
            by spaces, an extra space between stacks (3-column groups) and an empty line
            between bands (3-row groups); the layout is whitespace only, so it parses back.

    Raises:
        SudokuError: bad shape/dtype/values, or ``blank`` not ``'.'`` or ``'0'``.
    """
    g = _as_grid(grid)
    if blank not in (".", "0"):
        raise SudokuError(f"blank must be '.' or '0', got {blank!r}")
    cells = [blank if v == 0 else str(int(v)) for v in g.tolist()]
    if not pretty:
        return "".join(cells)
    lines = []
    for r in range(9):
        row = cells[9 * r: 9 * r + 9]
        lines.append("  ".join(" ".join(row[3 * k: 3 * k + 3]) for k in range(3)))
        if r in (2, 5):
            lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- rules

_COUNT_WORDS = {2: "twice", 3: "three times"}


def _unit_name(u: int) -> str:
    kind = ("row", "column", "box")[u // 9]
    return f"{kind} {u % 9 + 1}"


def rule_violations(grid) -> list[str]:
    """List every rule broken by the givens of ``grid`` (blanks are ignored).

    One message per (unit, digit) repeated in it, units in order rows, columns, boxes, e.g.
    ``"digit 5 appears twice in row 3 (cells r3c1, r3c7)"``. Empty list if none.

    Raises:
        SudokuError: bad shape/dtype/values.
    """
    g = _as_grid(grid).tolist()
    out = []
    for u, unit in enumerate(UNITS.tolist()):
        seen: dict[int, list[int]] = {}
        for i in unit:
            v = g[i]
            if v:
                seen.setdefault(v, []).append(i)
        for v in sorted(seen):
            cells = seen[v]
            if len(cells) > 1:
                times = _COUNT_WORDS.get(len(cells), f"{len(cells)} times")
                names = ", ".join(cell_name(i) for i in cells)
                out.append(f"digit {v} appears {times} in {_unit_name(u)} (cells {names})")
    return out


def _unit_counts(g: np.ndarray) -> np.ndarray:
    """``[..., 27, 9]`` counts of digits 1..9 in each unit of ``[..., 81]`` grids."""
    vals = g[..., UNITS]  # [..., 27, 9]
    return (vals[..., :, :, None] == np.arange(1, 10, dtype=vals.dtype)).sum(axis=-2)


def is_consistent(grid) -> bool:
    """True iff no digit is repeated in any row, column or box (blanks ignored).

    Raises:
        SudokuError: bad shape/dtype/values.
    """
    g = _as_grid(grid)
    return bool((_unit_counts(g) <= 1).all())


def is_valid_solution(grid) -> bool:
    """True iff ``grid`` is complete (no blanks) and breaks no rule.

    Raises:
        SudokuError: bad shape/dtype/values.
    """
    g = _as_grid(grid)
    return bool(is_valid_solution_batch(g[None])[0])


def is_valid_solution_batch(grids) -> np.ndarray:
    """Vectorized :func:`is_valid_solution`: ``[N, 81]`` integer grids -> ``[N]`` bool.

    Raises:
        SudokuError: bad shape (not ``[N, 81]``), dtype or values.
    """
    g = _as_batch(grids)
    if g.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    complete = (g > 0).all(axis=1)
    # A unit holds 1..9 exactly once iff the OR of its digit bits is 0b111111111.
    bits = np.left_shift(np.int16(1), np.clip(g, 1, 9).astype(np.int16) - 1)
    unit_or = np.bitwise_or.reduce(bits[:, UNITS], axis=2)  # [N, 27]
    return complete & (unit_or == 511).all(axis=1)


def is_completion_of(solution, puzzle) -> bool:
    """True iff ``solution`` is a valid complete grid agreeing with every given of ``puzzle``.

    Raises:
        SudokuError: bad shape/dtype/values of either grid.
    """
    s = _as_grid(solution, "solution")
    p = _as_grid(puzzle, "puzzle")
    given = p > 0
    return bool(is_valid_solution(s) and (s[given] == p[given]).all())


# --------------------------------------------------------------------------- solver

_POP = [bin(m).count("1") for m in range(512)]
_BITS = [tuple((d, 1 << (d - 1)) for d in range(1, 10) if m >> (d - 1) & 1) for m in range(512)]


def _search(g: list, limit: int, shuffle=None, collect: list | None = None,
            exclude: tuple[int, int] | None = None) -> tuple[int, int]:
    """Backtracking core on a python list ``g`` of 81 ints (modified as scratch).

    Counts solutions up to ``limit`` (stops there), appending each to ``collect`` if given.
    Branches on the empty cell with fewest candidates (first such cell in row-major order on
    ties) and tries its digits in ascending order, or in ``shuffle``-d order.
    ``exclude=(cell, digit)``: ``cell`` must be blank; only solutions with a different digit
    there are searched. Returns ``(n_solutions, n_dead_ends)``; an inconsistent ``g`` has 0.
    """
    rows = [0] * 9
    cols = [0] * 9
    boxes = [0] * 9
    empties = []
    RCB = _RCB
    for i in range(N_CELLS):
        v = g[i]
        if v:
            bit = 1 << (v - 1)
            r, c, b = RCB[i]
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return 0, 0
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
        else:
            empties.append(i)
    n = len(empties)
    POP = _POP
    BITS = _BITS
    count = 0
    dead = 0

    def rec(k: int) -> bool:
        nonlocal count, dead
        if k == n:
            count += 1
            if collect is not None:
                collect.append(g[:])
            return count >= limit
        bj = k
        bm = 0
        bn = 10
        for j in range(k, n):
            r, c, b = RCB[empties[j]]
            m = 511 & ~(rows[r] | cols[c] | boxes[b])
            p = POP[m]
            if p < bn:
                if p == 0:
                    dead += 1
                    return False
                bj = j
                bm = m
                bn = p
                if p == 1:
                    break
        i = empties[bj]
        empties[bj] = empties[k]
        empties[k] = i
        r, c, b = RCB[i]
        digits = BITS[bm]
        if shuffle is not None and bn > 1:
            digits = list(digits)
            shuffle(digits)
        for d, bit in digits:
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            g[i] = d
            if rec(k + 1):
                return True
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        g[i] = 0
        return False

    if exclude is None:
        rec(0)
        return count, dead
    # Branch first on the excluded cell, over its candidates other than the excluded digit.
    cell, digit = exclude
    j = empties.index(cell)
    empties[j] = empties[0]
    empties[0] = cell
    r, c, b = RCB[cell]
    m = 511 & ~(rows[r] | cols[c] | boxes[b]) & ~(1 << (digit - 1))
    for d, bit in BITS[m]:
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
        g[cell] = d
        if rec(1):
            break
        rows[r] ^= bit
        cols[c] ^= bit
        boxes[b] ^= bit
    g[cell] = 0
    return count, dead


def _py_rng(rng):
    """A python ``random.Random`` seeded from a numpy Generator (fast per-node shuffles)."""
    if rng is None:
        return None
    rng = np.random.default_rng(rng)
    return _random.Random(int(rng.integers(0, 2**63 - 1)))


def solve(grid, rng=None) -> np.ndarray | None:
    """Return one completion of ``grid`` as ``[81]`` int8, or None if it has none.

    Deterministic (digits tried in ascending order) unless ``rng`` (a ``np.random.Generator``
    or seed) is given, in which case branch digits are tried in random order, so different
    completions of an under-determined grid can come out (not uniformly distributed).
    Givens that break a rule give None.

    Raises:
        SudokuError: bad shape/dtype/values.
    """
    g = _as_grid(grid).tolist()
    out: list = []
    pr = _py_rng(rng)
    _search(g, 1, shuffle=None if pr is None else pr.shuffle, collect=out)
    return np.array(out[0], dtype=np.int8) if out else None


def solve_stats(grid) -> tuple[np.ndarray | None, int]:
    """Solve deterministically and report the work done: ``(solution or None, n_backtracks)``.

    ``n_backtracks`` is the number of dead ends (an empty cell with no candidate left) that the
    deterministic solver (most-constrained cell first, ties to the lowest cell index, digits
    ascending) meets before its first solution, or before exhausting the search if there is
    none. Puzzles solvable by naked singles alone score 0. Used as :attr:`Puzzle.difficulty`,
    a standard solver-effort proxy for human difficulty.

    Raises:
        SudokuError: bad shape/dtype/values.
    """
    g = _as_grid(grid).tolist()
    out: list = []
    _, dead = _search(g, 1, collect=out)
    return (np.array(out[0], dtype=np.int8) if out else None), int(dead)


def fill_singles(grid) -> np.ndarray:
    """Fill ``grid`` with naked and hidden singles until neither applies; return ``[81]`` int8.

    A naked single is an empty cell with one candidate digit left (no peer holds it); a hidden
    single is a digit that has one possible cell left in some row, column or box. Both are
    placed repeatedly until no cell changes. The result keeps the givens; blanks (0) remain
    where these two rules alone do not reach. For a unique puzzle, a full result is its
    solution: ``(fill_singles(p) == 0).any()`` tells the puzzles that need more than singles
    (pairs, fish, chains or search), the ones sequential MDM decoding fails on most often.

    Raises:
        SudokuError: bad shape/dtype/values, or givens that break a rule.
    """
    g = _as_grid(grid).tolist()
    if rule_violations(np.array(g, dtype=np.int8)):
        raise SudokuError("the grid breaks a rule; singles are defined on a consistent grid")
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    RCB = _RCB
    units = _UNIT_LISTS

    def place(i: int, d: int) -> None:
        g[i] = d
        r, c, b = RCB[i]
        bit = 1 << (d - 1)
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit

    for i, v in enumerate(list(g)):  # the givens
        if v:
            place(i, v)

    changed = True
    while changed:
        changed = False
        for i in range(N_CELLS):  # naked singles
            if not g[i]:
                r, c, b = RCB[i]
                m = 511 & ~(rows[r] | cols[c] | boxes[b])
                if _POP[m] == 1:
                    place(i, m.bit_length())
                    changed = True
        for unit in units:  # hidden singles
            for d in range(1, 10):
                bit = 1 << (d - 1)
                spots = [i for i in unit if not g[i]
                         and not (rows[RCB[i][0]] | cols[RCB[i][1]] | boxes[RCB[i][2]]) & bit]
                if len(spots) == 1:
                    place(spots[0], d)
                    changed = True
    return np.array(g, dtype=np.int8)


def count_solutions(grid, limit: int = 2) -> int:
    """Number of completions of ``grid``, counting stops at ``limit`` (so the result is
    ``min(true count, limit)``). ``count_solutions(p) == 1`` iff puzzle ``p`` is unique.
    Givens that break a rule give 0.

    Raises:
        SudokuError: bad grid, or ``limit < 1``.
    """
    limit = _as_count(limit, "limit")
    if limit < 1:
        raise SudokuError(f"limit must be >= 1, got {limit}")
    g = _as_grid(grid).tolist()
    return _search(g, limit)[0]


def enumerate_completions(grid, max_solutions: int = 100_000) -> np.ndarray:
    """All completions of ``grid`` as ``[K, 81]`` int8 (solver order; ``[0, 81]`` if none).

    Raises:
        SudokuError: bad grid, or ``max_solutions`` not an integer >= 1.
        TooManyCompletions: (a `SudokuError`) more than ``max_solutions`` completions ("more
            than 100000 completions; raise max_solutions or give more clues").
    """
    max_solutions = _as_count(max_solutions, "max_solutions")
    if max_solutions < 1:
        raise SudokuError(f"max_solutions must be >= 1, got {max_solutions}")
    g = _as_grid(grid).tolist()
    out: list = []
    count, _ = _search(g, max_solutions + 1, collect=out)
    if count > max_solutions:
        raise TooManyCompletions(
            f"more than {max_solutions} completions; raise max_solutions or give more clues"
        )
    return np.array(out, dtype=np.int8).reshape(len(out), N_CELLS)


def _is_unique_without(g: list, cell: int, digit: int) -> bool:
    """For a puzzle ``g`` with a unique solution having ``digit`` at ``cell``: is it still
    unique once ``cell`` is blanked? (True iff no solution puts another digit there.)"""
    saved = g[cell]
    g[cell] = 0
    work = g[:]
    g[cell] = saved
    return _search(work, 1, exclude=(cell, digit))[0] == 0


# --------------------------------------------------------------------------- random solutions

_POOL_SIZE = 1024
_POOL_SEED = 20240601
_BASE_POOL: np.ndarray | None = None
#: Identity of the solution-grid generator (part of every trained model's cache key).
GENERATOR_ID = f"pool{_POOL_SIZE}-seed{_POOL_SEED}-sym-v1"


def _base_pool() -> np.ndarray:
    """``[1024, 9, 9]`` int8 valid grids from randomized backtracking (fixed seed, built once)."""
    global _BASE_POOL
    if _BASE_POOL is None:
        rng = np.random.default_rng(_POOL_SEED)
        empty = np.zeros(N_CELLS, dtype=np.int8)
        pool = np.stack([solve(empty, rng=rng) for _ in range(_POOL_SIZE)])
        assert is_valid_solution_batch(pool).all()
        pool = pool.reshape(_POOL_SIZE, 9, 9)
        pool.setflags(write=False)
        _BASE_POOL = pool
    return _BASE_POOL


def _random_line_perm(n: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, 9]`` random orders of 9 lines that keep bands: permute the 3 bands, and the 3
    lines inside each band."""
    bands = rng.permuted(np.tile(np.arange(3), (n, 1)), axis=1)  # [n, 3]
    within = rng.permuted(np.tile(np.arange(3), (n, 3, 1)), axis=2)  # [n, 3, 3]
    return (bands[:, :, None] * 3 + within).reshape(n, 9)


def random_solutions(n: int, rng) -> np.ndarray:
    """Return ``n`` random valid complete grids, ``[n, 81]`` int8.

    Each is a grid from a fixed pool of 1024 base grids (randomized backtracking with a fixed
    seed, built lazily once per process) transformed by a random validity-preserving symmetry,
    all vectorized: rows permuted within bands, bands permuted, columns within stacks, stacks,
    transpose with probability 1/2, and a uniformly random relabelling of the digits (so each
    cell's digit is exactly uniform over 1..9). The output depends only on ``rng``.
    The grids cover only the 1024 base equivalence classes (of ~5.5e9), each with ~1.2e12
    transformed versions, so repeats are negligible but the sample is not uniform over all
    6.7e21 sudoku grids.

    Args:
        n: number of grids, >= 0.
        rng: ``np.random.Generator`` (or a seed for ``np.random.default_rng``).

    Raises:
        SudokuError: ``n`` negative or not an integer.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise SudokuError(f"n must be a non-negative integer, got {n!r}")
    n = int(n)
    rng = np.random.default_rng(rng)
    pool = _base_pool()
    if n == 0:
        return np.zeros((0, N_CELLS), dtype=np.int8)
    base = pool[rng.integers(0, len(pool), n)]  # [n, 9, 9]
    rows = _random_line_perm(n, rng)
    cols = _random_line_perm(n, rng)
    grids = base[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    t = rng.random(n) < 0.5
    grids[t] = grids[t].transpose(0, 2, 1)
    table = np.zeros((n, 10), dtype=np.int8)
    table[:, 1:] = rng.permuted(np.tile(np.arange(1, 10, dtype=np.int8), (n, 1)), axis=1)
    return np.take_along_axis(table, grids.reshape(n, N_CELLS).astype(np.intp), axis=1)


def random_symmetry_maps(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random validity-preserving Sudoku symmetries, as index maps.

    Each symmetry permutes the rows within bands, the bands, the columns within stacks and the stacks, transposes
    with probability 1/2, and relabels the digits 1..9 uniformly at random (the maps `random_symmetries` applies;
    together with the row and column maps they generate the grid's validity-preserving group). Apply one as
    ``new = digits[k][old[cells[k]]]``: cell ``c`` of the new grid takes cell ``cells[k, c]`` of the old one.

    Args:
        n: number of symmetries, >= 0.
        rng: ``np.random.Generator`` (or a seed).

    Returns:
        ``(cells [n, 81] intp, digits [n, 10] int8)``: ``cells[k]`` a permutation of 0..80 that maps every row,
        column and box onto a row, column or box; ``digits[k, 0] = 0`` (blank stays blank) and ``digits[k, 1:]`` a
        permutation of 1..9.

    Raises:
        SudokuError: ``n`` negative or not an integer.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise SudokuError(f"n must be a non-negative integer, got {n!r}")
    n = int(n)
    rng = np.random.default_rng(rng)
    rows = _random_line_perm(n, rng)
    cols = _random_line_perm(n, rng)
    cells = rows[:, :, None] * 9 + cols[:, None, :]  # [n, 9, 9]: new (r, c) <- old (rows[r], cols[c])
    t = rng.random(n) < 0.5
    cells[t] = cells[t].transpose(0, 2, 1)
    digits = np.zeros((n, 10), dtype=np.int8)
    digits[:, 1:] = rng.permuted(np.tile(np.arange(1, 10, dtype=np.int8), (n, 1)), axis=1)
    return cells.reshape(n, N_CELLS).astype(np.intp), digits


def random_symmetries(grids, rng) -> np.ndarray:
    """Apply one random validity-preserving symmetry per item to stacks of grids, jointly.

    Each item ``grids[i]`` (e.g. a puzzle and its solution) gets the same random symmetry on all
    of its ``K`` grids (`random_symmetry_maps`): rows permuted within bands, bands permuted, columns within stacks,
    stacks, transpose with probability 1/2, and a uniformly random relabelling of the digits 1..9
    (0 = blank stays 0). These maps keep a grid valid and a puzzle's solution unique (they are
    bijections of the completions). The output depends only on ``rng``.

    Args:
        grids: ``[n, K, 81]`` integer array with values in 0..9.
        rng: ``np.random.Generator`` (or a seed).

    Returns:
        ``[n, K, 81]`` int8 transformed grids (a new array).

    Raises:
        SudokuError: wrong shape or values outside 0..9.
    """
    a = np.asarray(grids)
    if a.ndim != 3 or a.shape[2] != N_CELLS:
        raise SudokuError(f"grids must have shape [n, K, 81], got {a.shape}")
    if a.size and (not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() > 9):
        raise SudokuError("grid values must be integers 0 (blank) or 1..9")
    n, k = a.shape[:2]
    if n == 0:
        return np.zeros(a.shape, dtype=np.int8)
    cells, digits = random_symmetry_maps(n, rng)
    moved = np.take_along_axis(a.astype(np.intp), np.broadcast_to(cells[:, None, :], a.shape), axis=2)
    return np.take_along_axis(digits, moved.reshape(n, k * N_CELLS), axis=1).reshape(n, k, N_CELLS)


# --------------------------------------------------------------------------- puzzles

@dataclass(frozen=True)
class Puzzle:
    """A puzzle with a unique solution.

    Attributes:
        puzzle: ``[81]`` int8 givens (0 = blank), read-only.
        solution: ``[81]`` int8 its unique completion, read-only.
        n_clues: number of givens.
        difficulty: :func:`solve_stats` backtracks (dead ends) of the deterministic solver on
            ``puzzle``; 0 means naked singles suffice, larger means harder.
    """

    puzzle: np.ndarray
    solution: np.ndarray
    n_clues: int
    difficulty: int


def make_puzzle(n_clues: int, rng, max_tries: int = 200) -> Puzzle:
    """A random puzzle with exactly ``n_clues`` givens and a unique solution.

    Method: take a random solution (:func:`random_solutions`), visit its cells in random order
    and blank each one if the puzzle stays unique (checked exactly: no completion puts another
    digit in that cell, equivalent to ``count_solutions(limit=2) == 1``), stopping at
    ``n_clues``. If a pass ends with more clues (every remaining given is needed), restart from
    a new solution, up to ``max_tries`` times. A random pass typically ends near 22-26 clues,
    so targets >= 25 are fast, 22-24 need several restarts and below ~22 get slow or fail;
    17 is the proven minimum.

    Raises:
        SudokuError: ``n_clues`` outside 17..81, ``max_tries < 1``, or no success in
            ``max_tries`` tries ("target too low").
    """
    n_clues = _as_count(n_clues, "n_clues")
    if not MIN_UNIQUE_CLUES <= n_clues <= N_CELLS:
        raise SudokuError(
            f"n_clues must be in 17..81 (no sudoku with fewer than 17 clues has a unique "
            f"solution), got {n_clues}"
        )
    max_tries = _as_count(max_tries, "max_tries")
    if max_tries < 1:
        raise SudokuError(f"max_tries must be >= 1, got {max_tries}")
    rng = np.random.default_rng(rng)
    best = N_CELLS
    for _ in range(max_tries):
        sol = random_solutions(1, rng)[0]
        g = sol.tolist()
        clues = N_CELLS
        for cell in rng.permutation(N_CELLS).tolist():
            if clues == n_clues:
                break
            d = g[cell]
            if _is_unique_without(g, cell, d):
                g[cell] = 0
                clues -= 1
        if clues == n_clues:
            puzzle = np.array(g, dtype=np.int8)
            _, dead = solve_stats(puzzle)
            puzzle.setflags(write=False)
            sol.setflags(write=False)
            return Puzzle(puzzle=puzzle, solution=sol, n_clues=n_clues, difficulty=dead)
        best = min(best, clues)
    raise SudokuError(
        f"could not make a unique puzzle with {n_clues} clues in {max_tries} tries "
        f"(fewest reached: {best}); the target is too low: random digging usually stops at "
        f"22-26 clues. Ask for more clues or raise max_tries"
    )


def make_puzzles(n: int, n_clues, rng, max_tries: int = 200) -> list[Puzzle]:
    """``n`` puzzles from :func:`make_puzzle`.

    Args:
        n: number of puzzles, >= 0.
        n_clues: an int, or an inclusive ``(lo, hi)`` range from which each puzzle's clue count
            is drawn uniformly.
        rng: ``np.random.Generator`` (or a seed).
        max_tries: passed to :func:`make_puzzle`.

    Raises:
        SudokuError: bad ``n`` or ``n_clues`` (range with ``lo > hi``, out of 17..81), or as
            :func:`make_puzzle`.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise SudokuError(f"n must be a non-negative integer, got {n!r}")
    rng = np.random.default_rng(rng)
    if isinstance(n_clues, (tuple, list)):
        if len(n_clues) != 2:
            raise SudokuError(f"n_clues range must be (lo, hi), got {n_clues!r}")
        lo, hi = _as_count(n_clues[0], "n_clues[0]"), _as_count(n_clues[1], "n_clues[1]")
        if lo > hi:
            raise SudokuError(f"n_clues range has lo > hi: {n_clues!r}")
        if lo < MIN_UNIQUE_CLUES or hi > N_CELLS:
            raise SudokuError(f"n_clues range must lie in 17..81, got {n_clues!r}")
        counts = [int(c) for c in rng.integers(lo, hi + 1, int(n))]
    else:
        counts = [_as_count(n_clues, "n_clues")] * int(n)
    return [make_puzzle(c, rng, max_tries=max_tries) for c in counts]


def random_partial(solution, n_clues: int, rng) -> np.ndarray:
    """Keep a uniformly random subset of ``n_clues`` cells of ``solution``, blank the rest.

    No uniqueness is enforced (for under-determined contexts). Returns a new ``[81]`` int8.

    Raises:
        SudokuError: ``solution`` is not a complete valid grid, or ``n_clues`` is not an integer
            in 0..81.
    """
    s = _as_grid(solution, "solution")
    if not is_valid_solution(s):
        raise SudokuError("solution must be a complete, valid grid (use make_puzzle/solve to get one)")
    n_clues = _as_count(n_clues, "n_clues")
    if not 0 <= n_clues <= N_CELLS:
        raise SudokuError(f"n_clues must be in 0..81, got {n_clues}")
    rng = np.random.default_rng(rng)
    keep = rng.choice(N_CELLS, size=n_clues, replace=False)
    out = np.zeros(N_CELLS, dtype=np.int8)
    out[keep] = s[keep]
    return out


def read_puzzles(path: str | Path) -> list[Puzzle]:
    """Read a puzzle file (format and rules: `parse_puzzles`), for decoding studies on a set of the reader's own.

    Raises:
        FileNotFoundError: no such file.
        SudokuError: as `parse_puzzles`, each message naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"puzzle file not found: {path}")
    return parse_puzzles(path.read_text(), path.name)


def parse_puzzles(text: str, name: str = "<stdin>") -> list[Puzzle]:
    """Parse the text of a puzzle file (``name`` is used in messages, e.g. the file name or ``<stdin>``).

    Formats: an 81-character grid per line (``1``-``9``, ``.`` or ``0`` blanks), optionally followed by other
    whitespace- or comma-separated fields (a rating, a name), which are ignored; ``#`` starts a comment; blank lines
    are skipped. Or the common CSV layout with a header naming the columns ``puzzle`` and ``solution`` (and
    optionally others, e.g. ``rating``): the solution must complete the puzzle.

    Rule for puzzles without one answer: a puzzle with no solution is an error; puzzles with several solutions are
    left out with a `UserWarning` naming their lines (a solve rate needs one right answer). Every kept puzzle carries
    its unique solution and its solver difficulty (`solve_stats`).

    Returns:
        the puzzles in file order.

    Raises:
        SudokuError: a line that is not a puzzle (too short or long, a bad character, givens that break a rule), a
            puzzle with no solution, a CSV row with a missing column or a solution that does not complete its
            puzzle, or no puzzle at all; each message names ``name`` and the line.
    """
    lines = text.splitlines()
    body = [(n, line.split("#", 1)[0].strip()) for n, line in enumerate(lines, 1)]
    body = [(n, t) for n, t in body if t]
    header = [c.strip().lower() for c in body[0][1].split(",")] if body else []
    csv = "puzzle" in header and "solution" in header
    if csv:
        body = body[1:]
    out, several = [], []
    for n, row in body:
        where = f"{name} line {n}"
        if csv:
            cols = [c.strip() for c in row.split(",")]
            if len(cols) < len(header):
                raise SudokuError(f"{where}: {len(cols)} columns, the header names {len(header)} "
                                  f"({', '.join(header)})")
            puzzle_text, solution_text = cols[header.index("puzzle")], cols[header.index("solution")]
        else:
            puzzle_text, solution_text = row.replace(",", " ").split()[0], None
        try:
            grid = parse_grid(puzzle_text)
        except SudokuError as e:
            raise SudokuError(f"{where}: {e}") from None
        count = count_solutions(grid, limit=2)
        if count == 0:
            raise SudokuError(f"{where}: the puzzle has no solution (its givens break no rule, but no grid completes "
                              "them)")
        if count > 1:
            several.append(n)
            continue
        solution, difficulty = solve_stats(grid)
        if solution_text is not None:
            try:
                given = parse_grid(solution_text)
            except SudokuError as e:
                raise SudokuError(f"{where}: solution column: {e}") from None
            if not np.array_equal(given, solution):
                raise SudokuError(f"{where}: the solution column does not complete the puzzle")
        grid.flags.writeable = solution.flags.writeable = False
        out.append(Puzzle(grid, solution, int((grid > 0).sum()), difficulty))
    if several:
        warnings.warn(f"{name}: left out {len(several)} puzzle(s) with several solutions (lines "
                      f"{', '.join(map(str, several[:10]))}{' ...' if len(several) > 10 else ''})", UserWarning,
                      stacklevel=2)
    if not out:
        raise SudokuError(f"{name}: no puzzle with a unique solution in the file")
    return out


def write_puzzles(puzzles: list[Puzzle], path: str | Path) -> Path:
    """Write puzzles in the CSV layout `read_puzzles` reads (``puzzle,solution,clues,difficulty``), creating the
    folder if needed; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["puzzle,solution,clues,difficulty"] + [f"{format_grid(p.puzzle)},{format_grid(p.solution)},{p.n_clues},"
                                                   f"{p.difficulty}" for p in puzzles]
    path.write_text("\n".join(rows) + "\n")
    return path
