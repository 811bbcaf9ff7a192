"""Tests for mimdm.data.sudoku: parsing, rules, exact solver, random solutions, puzzles."""

import numpy as np
import pytest

from mimdm.data import sudoku as S
from mimdm.data.sudoku import SudokuError

# Wikipedia's example puzzle and its solution.
WIKI_PUZZLE = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
WIKI_SOLUTION = (
    "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
)
# A hard puzzle for naive solvers (Norvig's "hardest" example); it has a unique solution.
HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"


def _rectangles(sol: np.ndarray):
    """All 'deadly pattern' rectangles of a solution: 4 cells in 2 rows, 2 columns and 2 boxes
    with digits a b / b a."""
    g = sol.reshape(9, 9)
    out = []
    for r1 in range(9):
        for r2 in range(r1 + 1, 9):
            for c1 in range(9):
                for c2 in range(c1 + 1, 9):
                    same_band, same_stack = r1 // 3 == r2 // 3, c1 // 3 == c2 // 3
                    if same_band == same_stack:  # need exactly two boxes
                        continue
                    if g[r1, c1] == g[r2, c2] and g[r1, c2] == g[r2, c1]:
                        out.append([9 * r1 + c1, 9 * r1 + c2, 9 * r2 + c1, 9 * r2 + c2])
    return out


# ------------------------------------------------------------------ parse / format

def test_parse_values_and_round_trip():
    g = S.parse_grid(WIKI_PUZZLE)
    assert g.shape == (81,) and g.dtype == np.int8
    assert g[:5].tolist() == [5, 3, 0, 0, 7]
    assert g[80] == 9 and int((g > 0).sum()) == 30
    assert S.format_grid(g) == WIKI_PUZZLE
    assert S.format_grid(g, blank="0") == WIKI_PUZZLE.replace(".", "0")
    assert np.array_equal(S.parse_grid(WIKI_PUZZLE.replace(".", "0")), g)


def test_pretty_format_parses_back():
    g = S.parse_grid(WIKI_PUZZLE)
    text = S.format_grid(g, pretty=True)
    rows = [line for line in text.splitlines() if line.strip()]
    assert len(rows) == 9
    assert rows[0] == "5 3 .  . 7 .  . . ."
    assert np.array_equal(S.parse_grid(text), g)
    # arbitrary whitespace, tabs and newlines are ignored
    messy = "\n".join(WIKI_PUZZLE[9 * r: 9 * r + 9] for r in range(9)).replace("7", "\t7 ")
    assert np.array_equal(S.parse_grid(messy), g)


def test_parse_wrong_length():
    with pytest.raises(SudokuError, match="grid has 80 characters, expected 81"):
        S.parse_grid(WIKI_PUZZLE[:-1])
    with pytest.raises(SudokuError, match="grid has 82 characters, expected 81"):
        S.parse_grid(WIKI_PUZZLE + "1")


def test_parse_bad_character():
    s = WIKI_PUZZLE[:5] + "x" + WIKI_PUZZLE[6:]
    with pytest.raises(SudokuError) as e:
        S.parse_grid(s)
    assert str(e.value).startswith("bad character 'x' at position 5 (row 1, col 6)")
    assert "'.' or '0' for blanks" in str(e.value)
    with pytest.raises(SudokuError, match="bad character '|'"):
        S.parse_grid("|" + WIKI_PUZZLE[1:])
    with pytest.raises(SudokuError, match="expected a str"):
        S.parse_grid(list(WIKI_PUZZLE))


@pytest.mark.parametrize(
    "cells, message",
    [
        ((18, 24), "digit 5 appears twice in row 3 (cells r3c1, r3c7)"),
        ((1, 73), "digit 5 appears twice in column 2 (cells r1c2, r9c2)"),
        ((0, 10), "digit 5 appears twice in box 1 (cells r1c1, r2c2)"),
    ],
)
def test_parse_duplicate_givens(cells, message):
    chars = ["."] * 81
    for c in cells:
        chars[c] = "5"
    s = "".join(chars)
    with pytest.raises(SudokuError) as e:
        S.parse_grid(s)
    assert str(e.value) == "givens break a rule: " + message
    g = S.parse_grid(s, check=False)  # the check can be skipped
    assert S.rule_violations(g) == [message]
    assert not S.is_consistent(g)


def test_rule_violations_lists_all_units():
    g = np.zeros(81, dtype=np.int8)
    g[[0, 1]] = 7  # same row and same box
    assert S.rule_violations(g) == [
        "digit 7 appears twice in row 1 (cells r1c1, r1c2)",
        "digit 7 appears twice in box 1 (cells r1c1, r1c2)",
    ]
    g[2] = 7
    assert "digit 7 appears three times in row 1 (cells r1c1, r1c2, r1c3)" in S.rule_violations(g)
    assert S.rule_violations(S.parse_grid(WIKI_PUZZLE)) == []


def test_format_and_grid_validation_errors():
    sol = S.parse_grid(WIKI_SOLUTION)
    with pytest.raises(SudokuError, match=r"shape \(80,\), expected \(81,\)"):
        S.format_grid(sol[:80])
    with pytest.raises(SudokuError, match=r"shape \(9, 9\)"):
        S.format_grid(sol.reshape(9, 9))
    bad = sol.astype(np.int64)
    bad[3] = 10
    with pytest.raises(SudokuError, match="value 10 at flat position 3"):
        S.format_grid(bad)
    with pytest.raises(SudokuError, match="dtype float64"):
        S.format_grid(sol.astype(float))
    with pytest.raises(SudokuError, match="blank must be"):
        S.format_grid(sol, blank="x")
    with pytest.raises(SudokuError, match="value -1"):
        S.is_valid_solution(np.full(81, -1))
    with pytest.raises(SudokuError, match=r"expected \(N, 81\)"):
        S.is_valid_solution_batch(sol)


# ------------------------------------------------------------------ structure

def test_units_and_peers():
    assert S.UNITS.shape == (27, 9)
    assert S.UNITS[2].tolist() == list(range(18, 27))  # row 3
    assert S.UNITS[9].tolist() == list(range(0, 81, 9))  # column 1
    assert S.UNITS[18 + 4].tolist() == [30, 31, 32, 39, 40, 41, 48, 49, 50]  # centre box
    # every cell is in exactly one row, one column and one box
    assert np.array_equal(np.bincount(S.UNITS.ravel(), minlength=81), np.full(81, 3))
    assert S.PEERS.shape == (81, 20)
    assert S.PEERS[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 18, 19, 20,
                                   27, 36, 45, 54, 63, 72]
    assert (np.diff(S.PEERS, axis=1) > 0).all()


def test_constraint_graph():
    a = S.constraint_graph()
    assert a.shape == (81, 81) and a.dtype == bool
    assert (a.sum(axis=1) == 20).all()
    assert np.array_equal(a, a.T)
    assert not a.diagonal().any()
    assert a[0, 8] and a[0, 72] and a[0, 20]  # same row, same column, same box
    assert not a[0, 30] and not a[0, 40]
    assert int(a.sum()) == 81 * 20


def test_band_stack_pairs():
    """Cells in one band or stack (45 with itself) minus the 20 unit peers and itself: 24 per cell."""
    from mimdm.probing.sudoku_mi import band_stack_pairs

    b = band_stack_pairs()
    assert b.shape == (81, 81) and b.dtype == bool and np.array_equal(b, b.T) and not b.diagonal().any()
    assert (b.sum(1) == 24).all() and not (b & S.constraint_graph()).any()
    r0c0 = 0
    assert b[r0c0, 1 * 9 + 3] and b[r0c0, 4 * 9 + 1]  # same band (rows 0-2), other box; same stack, other box
    assert not b[r0c0, 4 * 9 + 4] and not b[r0c0, 1 * 9 + 1] and not b[r0c0, 3 * 9 + 0]  # neither; same box; same column


# ------------------------------------------------------------------ rules

def test_validity_checks():
    sol = S.parse_grid(WIKI_SOLUTION)
    puz = S.parse_grid(WIKI_PUZZLE)
    assert S.is_valid_solution(sol) and S.is_consistent(sol)
    assert not S.is_valid_solution(puz) and S.is_consistent(puz)  # incomplete
    assert S.is_completion_of(sol, puz)
    swapped = sol.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # row still a permutation, columns broken
    assert not S.is_valid_solution(swapped)
    other = S.random_solutions(1, 3)[0]
    assert S.is_valid_solution(other) and not S.is_completion_of(other, puz)


def test_valid_solution_batch_matches_scalar():
    rng = np.random.default_rng(0)
    grids = S.random_solutions(300, rng).astype(np.int64)
    kind = rng.integers(0, 4, 300)
    for i in np.flatnonzero(kind == 1):  # swap two cells of a row
        r, c1, c2 = rng.integers(0, 9), *rng.choice(9, 2, replace=False)
        grids[i, [9 * r + c1, 9 * r + c2]] = grids[i, [9 * r + c2, 9 * r + c1]]
    grids[kind == 2, rng.integers(0, 81)] = 0  # a blank
    for i in np.flatnonzero(kind == 3):  # one wrong digit
        c = rng.integers(0, 81)
        grids[i, c] = grids[i, c] % 9 + 1
    batch = S.is_valid_solution_batch(grids)
    assert batch.shape == (300,) and batch.dtype == bool
    assert np.array_equal(batch, kind == 0)
    assert np.array_equal(batch, [S.is_valid_solution(g) for g in grids])
    assert S.is_valid_solution_batch(np.zeros((0, 81), dtype=np.int8)).shape == (0,)


# ------------------------------------------------------------------ solver

def test_solve_hard_puzzle_unique():
    p = S.parse_grid(HARD)
    assert S.count_solutions(p, limit=10) == 1
    sol = S.solve(p)
    assert sol.shape == (81,) and sol.dtype == np.int8
    assert S.is_valid_solution(sol) and S.is_completion_of(sol, p)
    assert np.array_equal(S.solve(p, rng=np.random.default_rng(5)), sol)
    sol2, backtracks = S.solve_stats(p)
    assert np.array_equal(sol2, sol) and backtracks > 0


def test_solve_wiki_puzzle():
    assert S.format_grid(S.solve(S.parse_grid(WIKI_PUZZLE))) == WIKI_SOLUTION


def _singles_left(g: np.ndarray) -> tuple[int, int]:
    """(naked singles, hidden singles) still available in grid ``g``, counted independently of the solver."""
    cand = np.ones((81, 9), dtype=bool)
    for i in np.flatnonzero(g):
        cand[i] = False
        cand[S.PEERS[i], g[i] - 1] = False
    naked = int((cand.sum(1) == 1).sum())
    hidden = sum(int(cand[u, d].sum() == 1) for u in S.UNITS for d in range(9))
    return naked, hidden


def test_fill_singles_solves_easy_and_stops_where_singles_end():
    wiki = S.parse_grid(WIKI_PUZZLE)
    assert S.format_grid(S.fill_singles(wiki)) == WIKI_SOLUTION
    one_blank = S.parse_grid(WIKI_SOLUTION)
    one_blank[40] = 0
    assert S.format_grid(S.fill_singles(one_blank)) == WIKI_SOLUTION  # a naked single
    hard = S.parse_grid(HARD)
    f = S.fill_singles(hard)
    assert f.dtype == np.int8 and (f == 0).any()
    assert np.all((f == 0) | (f == S.solve(hard))) and np.all((hard == 0) | (f == hard))  # sound, keeps givens
    assert _singles_left(f) == (0, 0) and np.array_equal(S.fill_singles(f), f)  # a fixed point


def test_fill_singles_places_a_hidden_single():
    # digit 1 is barred from row 0's cells 1-8 (by columns 1, 2 and boxes 1, 2), so it must go to cell 0,
    # which itself still has all nine candidates: only the hidden-single rule places it (nothing else follows)
    g = np.zeros(81, dtype=np.int8)
    for r, c in [(1, 3), (2, 6), (4, 1), (7, 2)]:
        g[9 * r + c] = 1
    assert _singles_left(g) == (0, 3)  # row 0, column 0 and box 0 each leave 1 only cell 0
    f = S.fill_singles(g)
    assert np.flatnonzero(f != g).tolist() == [0] and f[0] == 1


def test_fill_singles_on_random_puzzles_and_bad_input():
    for p in S.make_puzzles(20, (24, 35), np.random.default_rng(12)):
        f = S.fill_singles(p.puzzle)
        assert np.all((f == 0) | (f == p.solution)) and _singles_left(f) == (0, 0)
    bad = np.zeros(81, dtype=np.int8)
    bad[[0, 1]] = 5
    with pytest.raises(SudokuError, match="breaks a rule"):
        S.fill_singles(bad)


def test_count_solutions():
    empty = np.zeros(81, dtype=np.int8)
    assert S.count_solutions(empty, limit=5) == 5
    assert S.count_solutions(empty) == 2
    assert S.count_solutions(S.parse_grid(WIKI_PUZZLE), limit=5) == 1
    bad = empty.copy()
    bad[[0, 1]] = 4
    assert S.count_solutions(bad) == 0 and S.solve(bad) is None
    # consistent givens but no completion: r1c1 can be nothing (1-8 in row, 9 in column)
    dead = empty.copy()
    dead[1:9] = np.arange(1, 9)
    dead[9 * 4] = 9
    assert S.is_consistent(dead) and S.count_solutions(dead) == 0 and S.solve(dead) is None
    with pytest.raises(SudokuError, match="limit must be >= 1"):
        S.count_solutions(empty, limit=0)


def test_solve_random_order_gives_different_valid_grids():
    empty = np.zeros(81, dtype=np.int8)
    grids = np.stack([S.solve(empty, rng=np.random.default_rng(s)) for s in range(5)])
    assert S.is_valid_solution_batch(grids).all()
    assert len(np.unique(grids, axis=0)) == 5
    assert np.array_equal(S.solve(empty, rng=np.random.default_rng(1)), grids[1])


def test_enumerate_deadly_pattern():
    sol = S.parse_grid(WIKI_SOLUTION)
    rects = _rectangles(sol)
    assert rects, "the example solution has a deadly-pattern rectangle"
    cells = rects[0]
    p = sol.copy()
    p[cells] = 0
    comps = S.enumerate_completions(p)
    assert comps.shape == (2, 81) and comps.dtype == np.int8
    assert S.is_valid_solution_batch(comps).all()
    assert any(np.array_equal(c, sol) for c in comps)
    other = comps[1] if np.array_equal(comps[0], sol) else comps[0]
    assert np.array_equal(other[cells], sol[[cells[1], cells[0], cells[3], cells[2]]])
    rest = np.setdiff1d(np.arange(81), cells)
    assert np.array_equal(other[rest], sol[rest])
    assert S.count_solutions(p, limit=10) == 2
    # two disjoint rectangles: 4 completions; the bound is exact
    disjoint = [r for r in rects[1:] if not set(r) & set(cells)]
    assert disjoint
    p[disjoint[0]] = 0
    assert len(S.enumerate_completions(p, max_solutions=4)) == 4
    with pytest.raises(SudokuError, match="more than 3 completions; raise max_solutions or give"):
        S.enumerate_completions(p, max_solutions=3)


def test_enumerate_bound_and_edge_cases():
    # a grid with 17 random givens of a solution has far more than 1000 completions
    sparse = S.random_partial(S.parse_grid(WIKI_SOLUTION), 17, np.random.default_rng(0))
    with pytest.raises(S.TooManyCompletions, match="more than 1000 completions; raise max_solutions"):
        S.enumerate_completions(sparse, max_solutions=1000)
    for bad in (2.5, True):  # not silently truncated to an int
        with pytest.raises(SudokuError, match="max_solutions must be an integer"):
            S.enumerate_completions(sparse, max_solutions=bad)
        with pytest.raises(SudokuError, match="limit must be an integer"):
            S.count_solutions(sparse, limit=bad)
    with pytest.raises(SudokuError, match="n_clues must be an integer"):
        S.make_puzzles(1, 25.7, 0)
    with pytest.raises(SudokuError, match=r"n_clues\[1\] must be an integer"):
        S.make_puzzles(1, (24, 25.5), 0)
    with pytest.raises(SudokuError, match="more than 100000 completions; raise max_solutions"):
        S.enumerate_completions(np.zeros(81, dtype=np.int8))
    sol = S.parse_grid(WIKI_SOLUTION)
    assert np.array_equal(S.enumerate_completions(sol), sol[None])
    bad = sol.copy()
    bad[0] = bad[1]
    assert S.enumerate_completions(bad).shape == (0, 81)


def test_random_solutions_valid_and_distinct():
    g = S.random_solutions(2000, np.random.default_rng(0))
    assert g.shape == (2000, 81) and g.dtype == np.int8
    assert S.is_valid_solution_batch(g).all()
    assert len(np.unique(g, axis=0)) >= 1995
    assert np.array_equal(g, S.random_solutions(2000, np.random.default_rng(0)))
    assert S.random_solutions(0, 0).shape == (0, 81)
    with pytest.raises(SudokuError, match="non-negative integer"):
        S.random_solutions(-1, 0)


def test_random_solutions_digit_frequency_uniform():
    n = 18000
    g = S.random_solutions(n, np.random.default_rng(1))
    expected = n / 9  # 2000, binomial sd ~ 42
    for cell in (0, 40, 80, 17):
        counts = np.bincount(g[:, cell], minlength=10)[1:]
        assert np.abs(counts - expected).max() < 250, counts
    # both orientations and many row orders occur: first column is not fixed by the pool
    first_rows = {tuple(r) for r in g[:500, :9].tolist()}
    assert len(first_rows) > 450


def _triples(g: np.ndarray, cols: bool = False) -> list:
    """The 27 row-triples (cells of one row inside one box) as digit sets; columns if cols."""
    g = g.reshape(9, 9).T if cols else g.reshape(9, 9)
    return [frozenset(g[r, 3 * k: 3 * k + 3].tolist()) for r in range(9) for k in range(3)]


def _overlap_hist(g: np.ndarray, cols: bool = False) -> tuple:
    """Relabel-invariant: histogram of |A & B| over pairs of row-triples (column-triples).
    Invariant under every symmetry used except transposition, which swaps rows and columns."""
    tr = _triples(g, cols)
    sizes = [len(tr[i] & tr[j]) for i in range(27) for j in range(i + 1, 27)]
    return tuple(np.bincount(sizes, minlength=4).tolist())


def test_random_solutions_applies_each_symmetry(monkeypatch):
    base = S.parse_grid(WIKI_SOLUTION)
    assert _overlap_hist(base) != _overlap_hist(base, cols=True)
    monkeypatch.setattr(S, "_BASE_POOL", base.reshape(1, 9, 9))  # a pool of one grid
    g = S.random_solutions(400, np.random.default_rng(5))
    assert S.is_valid_solution_batch(g).all()
    # transposition: each output keeps the base's row statistics or has its column ones, ~1/2
    hists = [_overlap_hist(x) for x in g]
    transposed = np.array([h == _overlap_hist(base, cols=True) for h in hists])
    assert all(h in (_overlap_hist(base), _overlap_hist(base, cols=True)) for h in hists)
    assert 0.4 < transposed.mean() < 0.6
    # relabelling: the set of all row/column triples is geometry-invariant, so only digit
    # relabelling can vary it (one base grid without relabelling would give 1 value)
    sigs = {frozenset(_triples(x) + _triples(x, cols=True)) for x in g}
    assert len(sigs) > 350
    # geometry: after undoing the labels (row 1 read as 1..9) the grids still differ
    canon = set()
    for x in g:
        table = np.zeros(10, dtype=np.int8)
        table[x[:9]] = np.arange(1, 10)
        canon.add(table[x].tobytes())
    assert len(canon) > 350


# ------------------------------------------------------------------ puzzles

@pytest.mark.parametrize("n_clues", [25, 35])
def test_make_puzzle_unique(n_clues):
    rng = np.random.default_rng(n_clues)
    for _ in range(5):
        p = S.make_puzzle(n_clues, rng)
        assert p.n_clues == n_clues and int((p.puzzle > 0).sum()) == n_clues
        assert p.puzzle.dtype == np.int8 and p.solution.dtype == np.int8
        assert S.count_solutions(p.puzzle, limit=2) == 1
        assert S.is_completion_of(p.solution, p.puzzle)
        assert np.array_equal(S.solve(p.puzzle), p.solution)
        assert isinstance(p.difficulty, int) and p.difficulty >= 0
        assert p.difficulty == S.solve_stats(p.puzzle)[1]


def test_make_puzzle_deterministic_and_minimal_pass():
    a = S.make_puzzle(30, np.random.default_rng(7))
    b = S.make_puzzle(30, np.random.default_rng(7))
    assert np.array_equal(a.puzzle, b.puzzle) and a.difficulty == b.difficulty
    # the fast removal check agrees with count_solutions on every given
    g = a.puzzle.tolist()
    for cell in np.flatnonzero(a.puzzle):
        blanked = a.puzzle.copy()
        blanked[cell] = 0
        assert S._is_unique_without(g, int(cell), int(a.puzzle[cell])) == (
            S.count_solutions(blanked) == 1)


def test_make_puzzles_range():
    ps = S.make_puzzles(15, (26, 30), np.random.default_rng(3))
    assert len(ps) == 15
    counts = [p.n_clues for p in ps]
    assert all(26 <= c <= 30 for c in counts) and len(set(counts)) >= 3
    for p in ps:
        assert int((p.puzzle > 0).sum()) == p.n_clues
        assert S.count_solutions(p.puzzle) == 1
    assert [p.n_clues for p in S.make_puzzles(3, 33, 0)] == [33, 33, 33]
    with pytest.raises(SudokuError, match="lo > hi"):
        S.make_puzzles(2, (30, 26), 0)


def test_make_puzzle_errors():
    with pytest.raises(SudokuError, match="17..81"):
        S.make_puzzle(16, 0)
    with pytest.raises(SudokuError, match="target is too low"):
        S.make_puzzle(17, np.random.default_rng(0), max_tries=2)


def test_difficulty_hard_above_easy():
    easy = S.make_puzzle(35, np.random.default_rng(4))
    _, hard = S.solve_stats(S.parse_grid(HARD))
    assert hard > easy.difficulty
    assert hard >= 20
    assert S.solve_stats(S.parse_grid(WIKI_SOLUTION))[1] == 0


def test_random_partial():
    sol = S.parse_grid(WIKI_SOLUTION)
    rng = np.random.default_rng(0)
    a = S.random_partial(sol, 20, rng)
    b = S.random_partial(sol, 20, rng)
    assert a.shape == (81,) and a.dtype == np.int8
    assert int((a > 0).sum()) == 20 and int((b > 0).sum()) == 20
    assert S.is_completion_of(sol, a)
    assert not np.array_equal(a, b)
    assert np.array_equal(S.random_partial(sol, 81, rng), sol)
    assert not S.random_partial(sol, 0, rng).any()
    # inclusion is uniform over cells
    hits = sum((S.random_partial(sol, 27, rng) > 0).astype(int) for _ in range(900))
    assert abs(hits.mean() - 300) < 1e-9 and hits.min() > 220 and hits.max() < 380
    with pytest.raises(SudokuError, match="0..81"):
        S.random_partial(sol, 82, rng)


PUZ = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
SOL = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def test_read_puzzles_plain_csv_and_the_rule_for_several_solutions(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(f"# my set\n{PUZ} 3.5\n\n{PUZ.replace('.', '0')},rated\n")
    ps = S.read_puzzles(f)
    assert len(ps) == 2 and S.format_grid(ps[0].solution) == SOL and ps[0].n_clues == 30
    assert ps[0].difficulty == S.solve_stats(S.parse_grid(PUZ))[1]
    c = tmp_path / "p.csv"
    c.write_text(f"puzzle,solution,rating\n{PUZ},{SOL},1\n")
    assert S.format_grid(S.read_puzzles(c)[0].puzzle) == PUZ
    several = "." * 81
    f.write_text(f"{several}\n{PUZ}\n")
    with pytest.warns(UserWarning, match=r"left out 1 puzzle\(s\) with several solutions \(lines 1\)"):
        assert len(S.read_puzzles(f)) == 1
    back = S.write_puzzles(ps, tmp_path / "w.csv")
    assert [S.format_grid(p.puzzle) for p in S.read_puzzles(back)] == [PUZ, PUZ]


def test_read_puzzles_names_the_bad_line(tmp_path):
    cases = {
        "short": (f"{PUZ}\n{PUZ[:-1]}\n", "short line 2: grid has 80 characters"),
        "char": (f"{PUZ[:5]}x{PUZ[6:]}\n", "char line 1: bad character 'x' at position 5"),
        "rule": ("55" + PUZ[2:] + "\n", "rule line 1: givens break a rule: digit 5 appears twice in row 1"),
        "unsolvable": ("12345678." + "........9" + "." * 63 + "\n", "unsolvable line 1: the puzzle has no solution"),
        "empty": ("# nothing\n\n", "empty: no puzzle with a unique solution"),
        "csv": (f"puzzle,solution,rating\n{PUZ},{SOL},1\n{PUZ},{SOL}\n", "csv line 3: 2 columns, the header names 3"),
        "wrongsol": (f"puzzle,solution\n{PUZ},{SOL[:-2] + SOL[-1] + SOL[-2]}\n", "wrongsol line 2: solution column"),
    }
    for name, (text, msg) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(S.SudokuError, match=msg):
            S.read_puzzles(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="puzzle file not found"):
        S.read_puzzles(tmp_path / "nope")


def test_sixteen_of_the_zoos_puzzles_need_more_than_singles():
    """The class the READMEs of the long runs name: the zoo's 200 evaluation puzzles that singles do not solve."""
    from mimdm.pipelines.zoo import EVAL_CLUES, EVAL_SEED

    puzzles = S.make_puzzles(200, EVAL_CLUES, np.random.default_rng(EVAL_SEED))
    filled = [S.fill_singles(p.puzzle) for p in puzzles]
    stuck = [i for i, f in enumerate(filled) if (f == 0).any()]
    assert stuck == [26, 48, 61, 64, 66, 76, 89, 106, 122, 123, 124, 133, 136, 140, 176, 192]
    assert all(np.array_equal(f, p.solution) for i, (f, p) in enumerate(zip(filled, puzzles)) if i not in stuck)
    assert all(_singles_left(filled[i]) == (0, 0) for i in stuck)
