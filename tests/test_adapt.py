"""A reader's puzzles and models in the Sudoku chapters: results names, the puzzle-file branches of chapters 1, 3, 6
and the explorer (the default branches are the committed chapters' own)."""
import numpy as np
import pytest
import torch

from mimdm.app.profiles import get_profile
from mimdm.core.results import results_name
from mimdm.data import sudoku as sd
from mimdm.evaluation.metrics import graph_recovery
from mimdm.experiments import explorer as ex
from mimdm.experiments import ground_truth as gt
from mimdm.experiments import likelihood as lk
from mimdm.experiments import mi_head as mh
from mimdm.heads.mi_head import MIHead, MIHeadConfig
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.probing.exact import probe_mi


@pytest.fixture(scope="module")
def puzzles():
    return sd.make_puzzles(3, (34, 36), np.random.default_rng(7))


def test_results_name_keeps_the_record_and_names_other_runs():
    assert results_name("speedup") == "speedup"
    assert results_name("likelihood", "/data/hard 17.csv") == "likelihood_hard 17"
    assert results_name("ground_truth_mi", None, "/runs/big/model.pt") == "ground_truth_mi_big"
    assert results_name("speedup", "p.txt", "mine.pt") == "speedup_p_mine"  # a bare file: its stem


def test_explorer_contexts_from_given_solutions(puzzles):
    sols = np.stack([p.solution for p in puzzles])
    c = ex.sudoku_contexts(2, (0.25, 0.5), seed=3, solutions=sols)
    assert np.array_equal(c["solutions"], sols[:2].reshape(2, 81))
    assert c["n_masked"].tolist() == [20, 40]
    for p in range(2):
        for k, n in enumerate((20, 40)):
            g = c["grids"][p, k]
            assert (g == 0).sum() == n and np.array_equal(g[g > 0], c["solutions"][p][g > 0])
    assert c["order"][0, 0] == c["order"][1, 0]  # one cell masked in every context
    with pytest.raises(ValueError, match="need 4 solutions, got 3"):
        ex.sudoku_contexts(4, (0.5,), solutions=sols)
    bad = sols.copy().reshape(3, 81)
    bad[1, 0] = bad[1, 1]  # a digit twice in the first row
    with pytest.raises(ValueError, match=r"solutions \[1\] are not valid"):
        ex.sudoku_contexts(2, (0.5,), solutions=bad)


def test_chapter1_probes_the_given_puzzles(tiny, puzzles):
    res = gt.probe_puzzles(tiny, 2, puzzles=puzzles)
    assert np.array_equal(res["grids"], np.stack([p.puzzle for p in puzzles[:2]]))
    blanks = [int((p.puzzle == 0).sum()) for p in puzzles[:2]]
    assert res["n_masked"] == round(np.mean(blanks)) and res["difficulty"] == [p.difficulty for p in puzzles[:2]]
    assert res["nfe_per_context"] == 1 + 9 * np.mean(blanks)  # a random model gives every digit p > 0


def test_chapter3_recovery_on_puzzles_equals_probing_and_the_head(tiny, puzzles):
    torch.manual_seed(1)
    head = MIHead(MIHeadConfig(tiny.hidden_dim, max_len=81)).eval()
    r = mh.puzzle_recovery(tiny, head, puzzles)
    x = grids_to_tokens(np.stack([p.puzzle for p in puzzles]))
    ref = probe_mi(tiny, x)
    g = sd.constraint_graph()
    aurocs = [graph_recovery(ref.mi[b].float(), ref.masked[b], g)["auroc"] for b in range(3)]
    assert r["n_puzzles"] == 3 and r["gt_auroc"] == pytest.approx(float(np.mean(aurocs)), abs=1e-9)
    assert r["mean_blanks"] == pytest.approx(np.mean([(p.puzzle == 0).sum() for p in puzzles]))
    assert r["probing_nfe_per_puzzle"] == pytest.approx(1 + 9 * r["mean_blanks"], abs=1e-9)
    assert -1 <= r["pearson_pred_vs_gt"] <= 1 and 0 <= r["pred_auroc"] <= 1
    with pytest.raises(ValueError, match="no puzzle"):
        mh.puzzle_recovery(tiny, head, [])


def test_chapter6_inputs_from_a_puzzle_file_or_the_profile(puzzles):
    P = get_profile("smoke")
    assert np.array_equal(lk.chapter_grids(P, None, puzzles),
                          np.stack([p.solution.reshape(81) for p in puzzles[:P.likelihood_sequences]]))
    assert np.array_equal(lk.chapter_contexts(P, None, puzzles),
                          np.stack([p.puzzle.reshape(81) for p in puzzles[:P.likelihood_contexts]]))
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(lk.chapter_grids(P, a), sd.random_solutions(P.likelihood_sequences, b))
    ctx = lk.chapter_contexts(P, a)
    assert ctx.shape == (P.likelihood_contexts, 81) and all(sd.is_consistent(c) for c in ctx)


# ------------------------------------------------------------------------------------------ the "Adapt the study" page
def test_papermill_command_and_the_protein_run_profile():
    from mimdm.app.adapt import papermill_command, protein_run_profile

    cmd = papermill_command("book/05_speedup_analysis.ipynb", "my.ipynb",
                            {"profile": "cpu", "puzzle_file": "my puzzles.csv", "model_path": None, "clues": (27, 29)})
    assert cmd == ("papermill book/05_speedup_analysis.ipynb my.ipynb --cwd book -p profile cpu "
                   "-p puzzle_file 'my puzzles.csv' -p model_path null -p clues '[27, 29]'")
    assert [protein_run_profile(p) for p in ("cpu", "smoke", "paper")] == ["smoke", "smoke", "paper"]
    assert protein_run_profile("cpu", "cpu") == "cpu"


def test_headline_table_lines_up_records():
    from mimdm.app.adapt import headline_table

    rows = headline_table({"a": {"profile": "cpu", "values": {"headline": {"x": 1.0, "y": None}}},
                           "b": {"profile": "smoke", "values": {"headline": {"z": 2}}}})
    assert [r["run"] for r in rows] == ["a", "b"] and rows[0]["x"] == 1.0 and rows[1]["z"] == 2
    assert np.isnan(rows[0]["y"]) and np.isnan(rows[0]["z"]) and np.isnan(rows[1]["x"])
    with pytest.raises(KeyError):
        headline_table({"c": {"profile": "cpu", "values": {}}})


def test_generated_puzzles_have_one_solution_in_the_clue_range():
    from mimdm.app.adapt import generated_puzzles

    ps = generated_puzzles(4, (28, 29), seed=2)
    assert len(ps) == 4 and all(28 <= p.n_clues <= 29 and sd.count_solutions(p.puzzle, limit=2) == 1 for p in ps)
    assert all(sd.is_valid_solution(p.solution) for p in ps)
    assert [sd.format_grid(p.puzzle) for p in generated_puzzles(4, (28, 29), seed=2)] == \
        [sd.format_grid(p.puzzle) for p in ps]
    with pytest.raises(sd.SudokuError, match="at least one puzzle"):
        generated_puzzles(0, (28, 29))


def test_run_chapter_runs_a_notebook_into_its_own_folder(tmp_path, monkeypatch, capfd):
    import os

    import nbformat

    from mimdm.app.adapt import run_chapter

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "smoke"\nresults_dir = "results"\nrecord = True\nx = 1\nwrite = True')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from mimdm.app.profiles import get_profile\nfrom mimdm.core.results import write_results\n"
        "if write:\n    write_results('toy', {'headline': {'x': x}}, get_profile(profile), 'cpu', results_dir, record=record)")]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    (tmp_path / "book").mkdir()
    path = tmp_path / "book" / "toy.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setenv("MIMDM_SHIPPED_ONLY", "cpu")  # inside `mimdm book`: lifted for the run, then restored
    nb.cells[1].source += "\nimport os\nassert 'MIMDM_SHIPPED_ONLY' not in os.environ"
    nbformat.write(nb, path)
    capfd.readouterr()
    run = run_chapter(path, tmp_path / "out", {"profile": "smoke", "x": 7})
    # the kernel's start-up warnings would be a cell output of the calling chapter
    assert "WARNING" not in capfd.readouterr().err
    assert os.environ["MIMDM_SHIPPED_ONLY"] == "cpu"
    assert run["results"]["values"]["headline"] == {"x": 7} and run["results"]["profile"] == "smoke"
    assert run["results_path"] == (tmp_path / "out" / "results" / "smoke" / "toy.json").resolve()
    assert run["notebook"].is_file() and not (tmp_path / "book" / "results").exists()  # never the record
    assert run["command"] == "papermill book/toy.ipynb my_toy.ipynb --cwd book -p profile smoke -p x 7" and run["seconds"] > 0
    with pytest.raises(RuntimeError, match="wrote 0 results files"):
        run_chapter(path, tmp_path / "out", {"write": False})
