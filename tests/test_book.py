"""End to end: the main job under the `smoke` profile on a copy of the book, and the -W HTML build."""
import json
import re

from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

from mimdm.app.book import CHAPTERS, copy_book_sources, run_book
from mimdm.app.profiles import get_profile
from mimdm.core.artifacts import REPO_ROOT, module_sha256
from mimdm.data import sudoku as sd
from mimdm.experiments.protein import HEADLINE_KEYS
from mimdm.experiments.speedup import HEADLINE_KEYS as SPEEDUP_KEYS
from mimdm.pipelines.zoo import load_sudoku_mdm, profile_sudoku_mdm


def test_toc_lists_every_chapter_notebook():
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    listed = {c["file"] for c in toc["chapters"]}
    on_disk = {str(p.relative_to(REPO_ROOT).with_suffix("")) for p in (REPO_ROOT / "book").glob("*.ipynb")}
    assert on_disk == listed == {c.removesuffix(".ipynb") for c in CHAPTERS}


def test_chapters_have_a_papermill_parameters_cell():
    for ch in CHAPTERS:
        nb = nbformat.read(REPO_ROOT / ch, 4)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1, ch
        for name in ("profile", "device", "seed"):
            assert re.search(rf"^{name}\s*=", params[0].source, re.M), (ch, name)


RESULTS = {"book/01_ground_truth_mi.ipynb": "ground_truth_mi", "book/02_estimator_accuracy.ipynb": "estimator_accuracy",
           "book/03_sudoku_constraints.ipynb": "sudoku_constraints", "book/04_protein_decoding.ipynb": "protein",
           "book/05_speedup_analysis.ipynb": "speedup", "book/06_likelihood.ipynb": "likelihood",
           "book/mi_explorer.ipynb": "mi_explorer", "book/adapt_the_study.ipynb": "adapt",
           "book/appendix_protein_families.ipynb": "protein_families"}
#: Figures a chapter page shows at least (the adapt page: one; every other: two).
MIN_FIGURES = {"book/adapt_the_study.ipynb": 1}


def test_committed_chapters_are_executed_with_results_from_a_full_run():
    assert set(RESULTS) == set(CHAPTERS)
    for ch, stem in RESULTS.items():
        rec = json.loads((REPO_ROOT / "book" / "results" / f"{stem}.json").read_text())
        assert rec["profile"] in ("cpu", "paper"), f"{stem}.json comes from profile {rec['profile']!r}"
        nb = nbformat.read(REPO_ROOT / ch, 4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{ch} is not fully executed"
        assert nb.cells[[i for i, c in enumerate(nb.cells) if "injected-parameters" in c.metadata.get("tags", [])][0]] \
            .source.count(f'profile = "{rec["profile"]}"') == 1


@pytest.mark.slow
def test_smoke_book_runs_and_builds(tmp_path):
    root = copy_book_sources(tmp_path / "book_copy")
    record = {p.name: p.read_bytes() for p in (root / "book" / "results").glob("*.json")}
    # chapter 5 runs on a reader's puzzle file and a model given by its checkpoint path
    smoke = get_profile("smoke")
    _, mrec = profile_sudoku_mdm(smoke, progress=False)
    own = sd.make_puzzles(5, (30, 32), np.random.default_rng(7))
    puzzle_file = sd.write_puzzles(own, tmp_path / "my_puzzles.csv")
    params = {"book/05_speedup_analysis.ipynb": {"puzzle_file": str(puzzle_file), "model_path": mrec["path"]},
              "book/adapt_the_study.ipynb": {"n_puzzles": 4}}
    index = run_book("smoke", "cpu", root=root, progress=False, chapter_parameters=params)
    assert index.is_file()
    # a smoke run writes its own results/smoke/ and leaves the book's record as it was
    assert {p.name: p.read_bytes() for p in (root / "book" / "results").glob("*.json")} == record
    results = root / "book" / "results" / "smoke"
    res = json.loads((results / "ground_truth_mi.json").read_text())
    assert res["profile"] == "smoke"
    v = res["values"]
    assert v["oracle"]["max_abs_error"] < 1e-6
    assert len(v["levels"]) == 5 and all(0 <= lv["auroc"] <= 1 for lv in v["levels"])
    assert v["levels"][-1]["contexts"] == "unique puzzles"
    spd_name = f"speedup_my_puzzles_{Path(mrec['path']).parent.name}"
    for stem in RESULTS.values():
        stem = spd_name if stem == "speedup" else stem
        assert json.loads((results / f"{stem}.json").read_text())["profile"] == "smoke"
    lik = json.loads((results / "likelihood.json").read_text())["values"]
    assert lik["oracle"]["exhaustive_max_error"] < 1e-9
    prot = json.loads((results / "protein.json").read_text())["values"]
    methods = {r["method"] for r in prot["contacts"]}
    assert {"alignment MI + APC", "categorical Jacobian + APC", "probed MI, 100% masked + APC", "coupling norm + APC",
            "pseudo-likelihood Potts (plmDCA) + APC", "MI head, 100% masked + APC"} <= methods
    assert {r["rule"] for r in prot["decoding"]["generation"]} >= {"sequential", "top-k", "threshold", "EB-sampler",
                                                                     "MI-guided", "entropy cap"}
    assert {r["rule"] for r in prot["decoding"]["oracle_generation"]} == {"sequential", "MI-oracle"}
    assert set(prot["headline"]) == set(HEADLINE_KEYS) and prot["headline"]["head_test_contexts"] >= 1
    assert set(v["headline"]) == {"solve_rate_30_35", "solve_rate_hard"}
    assert v["hard_set"]["n"] == smoke.hard_puzzles and 0 <= v["headline"]["solve_rate_hard"] <= 1
    est = json.loads((results / "estimator_accuracy.json").read_text())["values"]
    assert set(est["headline"]) == {"head_pearson", "head_over_forward"} and est["headline"]["head_over_forward"] > 0
    spd = json.loads((results / f"{spd_name}.json").read_text())
    assert spd["models"]["sudoku_mdm"] == module_sha256(load_sudoku_mdm(mrec["path"])[0])
    spd = spd["values"]
    assert tuple(spd["headline"]) == SPEEDUP_KEYS and spd["headline"]["n_hard"] == len(own)
    assert (spd["dev_set"]["n"], spd["hard_set"]["n"]) == (smoke.dev_puzzles, len(own))
    assert spd["held_out"][0]["rule"] == "sequential" and spd["held_out"][0]["n"] == len(own)
    assert not (results / "speedup.json").exists()  # a run on another set never writes the study's file
    adapt = json.loads((results / "adapt.json").read_text())["values"]
    assert adapt["puzzle_file"]["n"] == 4 and adapt["speedup_run"]["results_file"] == "speedup_puzzles_27_29.json"
    assert adapt["protein_run"]["results_file"] == "protein_halabi_alignment_3tgiE.json"
    assert "-p family_alignment s1a -p structure s1a -p chain E" in adapt["protein_run"]["command"]
    for ch in CHAPTERS:
        nb = nbformat.read(root / ch, 4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, ch
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert len(injected) == 1 and "remove-cell" in injected[0].metadata["tags"], ch  # not shown on the page
        pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert pngs >= MIN_FIGURES.get(ch, 2), ch
        html = (root / "_build" / "html" / ch.replace(".ipynb", ".html")).read_text()
        assert html.count("<img") >= MIN_FIGURES.get(ch, 2), ch
    assert "Ground-truth MI" in (root / "_build" / "html" / "book" / "01_ground_truth_mi.html").read_text()
    # the explorer's widgets are embedded and load only vendored JavaScript
    nb = nbformat.read(root / "book/mi_explorer.ipynb", 4)
    assert nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    html = (root / "_build/html/book/mi_explorer.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in html and "_static/vendor/html-manager-1.0.15/embed-amd.js" in html
    assert not re.search(r'<script[^>]*src="https?://', html)


def test_only_the_main_job_under_a_full_profile_writes_the_record(tmp_path):
    from mimdm.core.results import write_results

    smoke, cpu = get_profile("smoke"), get_profile("cpu")
    assert write_results("x", {"a": 1}, smoke, "cpu", tmp_path, record=True) == tmp_path / "smoke" / "x.json"
    assert write_results("x", {"a": 2}, cpu, "cpu", tmp_path) == tmp_path / "cpu" / "x.json"
    assert write_results("x", {"a": float("nan")}, cpu, "cpu", tmp_path, record=True) == tmp_path / "x.json"
    rec = json.loads((tmp_path / "x.json").read_text())
    assert rec["profile"] == "cpu" and rec["values"] == {"a": None} and rec["config"]["name"] == "cpu"
    assert json.loads((tmp_path / "smoke" / "x.json").read_text())["values"] == {"a": 1}
    import numpy
    import scipy
    import torch

    assert {k: rec["versions"][k] for k in ("torch", "numpy", "scipy")} == {
        "torch": torch.__version__, "numpy": numpy.__version__, "scipy": scipy.__version__}
    assert "biotite" in rec["versions"]  # the unpinned libraries the chapters' numbers go through are recorded


def test_chapter_pages_hide_code_and_explain_every_parameter():
    for ch in CHAPTERS:
        nb = nbformat.read(REPO_ROOT / ch, 4)
        for c in (c for c in nb.cells if c.cell_type == "code"):
            tags = c.metadata.get("tags", [])
            if "parameters" in tags:  # kept on the page: every parameter with a comment saying what it does
                assert all("#" in line for line in c.source.splitlines() if "=" in line), ch
            elif "injected-parameters" in tags:
                assert "remove-cell" in tags, ch
            else:
                assert {"hide-input", "remove-input"} & set(tags), (ch, c.source[:60])
