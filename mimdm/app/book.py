"""The main job: train what the chapters need, execute every chapter with papermill, build the HTML book.

``mimdm book --profile cpu`` (what ``make book`` runs) executes the chapter notebooks *in place*
under ``book/`` (so the committed notebooks are the executed ones), writes their headline numbers
to ``book/results/*.json`` and builds ``_build/html`` with ``jupyter-book build -W``. Trained
artifacts are cached by configuration (see `mimdm.core.artifacts`), so a rerun does not retrain.
Tests run the same job with the ``smoke`` profile on a copy of the book (`copy_book_sources`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from mimdm.app.profiles import get_profile
from mimdm.core import shipped
from mimdm.core.artifacts import REPO_ROOT
from mimdm.core.device import resolve_device
from mimdm.core.results import write_results
from mimdm.experiments import mi_head, protein
from mimdm.pipelines.protein_zoo import FamilySpec
from mimdm.pipelines.zoo import profile_sudoku_mdm

#: Chapter notebooks in reading order (paths relative to the book root); keep in sync with _toc.yml.
CHAPTERS = ["book/01_ground_truth_mi.ipynb", "book/02_estimator_accuracy.ipynb", "book/03_sudoku_constraints.ipynb", "book/04_protein_decoding.ipynb",
            "book/05_speedup_analysis.ipynb", "book/06_likelihood.ipynb", "book/mi_explorer.ipynb",
            "book/adapt_the_study.ipynb", "book/appendix_protein_families.ipynb"]


def prepare_artifacts(profile: str, device: str = "cpu", progress: bool = True) -> None:
    """Train (or find in the cache) every model the chapters need, with progress bars in the terminal."""

    p = get_profile(profile)
    model, rec = profile_sudoku_mdm(p, device=device, progress=progress)
    print(f"[mimdm] Sudoku MDM ({rec['n_parameters']:,} parameters): solve rate "
          f"{rec['eval']['solve_rate']:.3f} on {rec['eval']['n_puzzles']} puzzles -> {rec['path']}", flush=True)
    prep = mi_head.prepare(p, model, rec["path"], progress=progress)
    print(f"[mimdm] MI labels -> {prep['labels']}; MI head ({prep['head'].n_parameters():,} parameters) "
          f"and ablations ({len(prep['ablations'])} settings) ready", flush=True)

    pp = protein.prepare(p, FamilySpec(), device=device, progress=progress)
    rec = pp["record"]
    val = rec["val"]["ce"] if "val" in rec else rec["eval"]["val_ce"]
    print(f"[mimdm] protein MDM {pp['model_name']} ({rec['n_parameters']:,} parameters, validation CE "
          f"{val:.3f} nats) -> {rec['path']}; protein MI head ({pp['head'].n_parameters():,} parameters) ready",
          flush=True)


def execute_chapters(root: Path, profile: str, device: str = "cpu", chapters: list[str] | None = None,
                     progress: bool = True, chapter_parameters: dict[str, dict] | None = None) -> list[Path]:
    """Execute chapter notebooks in place with papermill (parameters ``profile``, ``device`` and ``record=True``: the
    chapters write the book's record, `mimdm.core.results.write_results`), then hide papermill's injected-parameters
    cell from the rendered page (`hide_injected_parameters`).

    Raises:
        FileNotFoundError: a chapter notebook is missing.
        papermill.PapermillExecutionError: a chapter failed (the message names the cell).
    """
    import papermill as pm

    root = Path(root)
    done = []
    for ch in chapters or CHAPTERS:
        nb = root / ch
        if not nb.is_file():
            raise FileNotFoundError(f"chapter notebook not found: {nb}")
        t0 = time.perf_counter()
        print(f"[mimdm] executing {ch} (profile={profile}, device={device})", flush=True)
        params = {"profile": profile, "device": device, "record": True, **(chapter_parameters or {}).get(ch, {})}
        pm.execute_notebook(str(nb), str(nb), parameters=params,
                            cwd=str(nb.parent), kernel_name="python3", progress_bar=progress)
        hide_injected_parameters(nb)
        print(f"[mimdm] {ch} done in {time.perf_counter() - t0:.0f} s", flush=True)
        done.append(nb)
    return done


def hide_injected_parameters(nb_path: Path) -> bool:
    """Tag papermill's injected-parameters cell of a notebook ``remove-cell`` (Jupyter Book leaves it off the page;
    the chapter's own parameters cell, with every parameter explained, stays). Returns True if a cell was tagged."""
    nb = nbformat.read(str(nb_path), as_version=4)
    changed = False
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
            changed = True
    if changed:
        nbformat.write(nb, str(nb_path))
    return changed


def build_html(root: Path, warnings_as_errors: bool = True) -> Path:
    """``jupyter-book build`` of the book at ``root``; returns ``_build/html/index.html``.

    Raises:
        RuntimeError: the build failed (its output is printed).
    """
    root = Path(root)
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(root)]
    if warnings_as_errors:
        cmd += ["-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-20000:], proc.stderr[-20000:], sep="\n")
        raise RuntimeError(f"jupyter-book build failed (exit {proc.returncode}); see the output above")
    index = root / "_build" / "html" / "index.html"
    if not index.is_file():
        raise RuntimeError(f"build finished but {index} is missing")
    return index


def copy_book_sources(dst: Path, src: Path = REPO_ROOT) -> Path:
    """Copy ``_config.yml``, ``_toc.yml`` and ``book/`` (without build outputs) to ``dst``."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("_config.yml", "_toc.yml"):
        shutil.copy2(src / f, dst / f)
    shutil.copytree(src / "book", dst / "book", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints", "__pycache__"))
    return dst


def use_shipped(profile: str, retrain: bool = False) -> list[Path]:
    """Install the profile's shipped checkpoints into the cache and refuse any other training of their kinds.

    Unless ``retrain``: every slot under ``checkpoints/<profile>/`` is verified (sha256, config hash) and copied into
    the artifact cache, and ``$MIMDM_SHIPPED_ONLY`` is set to the profile for this process and the chapters' kernels
    (`mimdm.core.shipped.refuse_training`). With ``retrain`` the variable is cleared and nothing is installed, so
    everything is trained from scratch into the cache. Returns the cache folders filled.

    Raises:
        mimdm.core.shipped.ShippedCheckpointError: a shipped file is missing or altered.
    """

    if retrain or not shipped.records(profile):
        os.environ.pop(shipped.ENV, None)
        return []
    filled = shipped.install(profile)
    os.environ[shipped.ENV] = profile
    print(f"[mimdm] {len(filled)} shipped checkpoints of profile {profile!r} verified and installed; other training "
          f"of their kinds is refused (retrain from scratch: `{shipped.RETRAIN_COMMAND}`)", flush=True)
    return filled


def run_book(profile: str = "cpu", device: str = "cpu", root: Path = REPO_ROOT, chapters: list[str] | None = None,
             execute: bool = True, build: bool = True, progress: bool = True, retrain: bool = False,
             chapter_parameters: dict[str, dict] | None = None) -> Path | None:
    """The main job: prepare artifacts, execute chapters, build HTML. Returns the index path if built.

    Uses the profile's shipped checkpoints unless ``retrain`` (`use_shipped`). A full run (every chapter executed)
    writes ``book/results/book_run.json``: seconds of the preparation and of each chapter, ``total_minutes``,
    whether it retrained and which shipped checkpoints it used. ``chapter_parameters`` maps a chapter (path as in
    `CHAPTERS`) to more papermill parameters (e.g. chapter 5's ``puzzle_file`` and ``model_path``).
    """

    resolve_device(device)  # fail early on a wrong device
    prof = get_profile(profile)
    t0 = time.perf_counter()
    if execute:
        filled = use_shipped(profile, retrain)
        prepare_artifacts(profile, device, progress)
        t_prep = time.perf_counter() - t0
        seconds = {}
        for ch in chapters or CHAPTERS:
            t1 = time.perf_counter()
            execute_chapters(root, profile, device, [ch], progress, chapter_parameters)
            seconds[ch] = round(time.perf_counter() - t1, 1)
        if chapters is None:
            write_results("book_run", {"prepare_seconds": round(t_prep, 1), "chapter_seconds": seconds,
                                       "total_minutes": round((time.perf_counter() - t0) / 60, 2), "retrain": retrain,
                                       "shipped": [f"{p.parent.name}/{p.name}" for p in filled]},
                          prof, device, Path(root) / "book" / "results", record=True)
    index = build_html(root) if build else None
    print(f"[mimdm] book done in {time.perf_counter() - t0:.0f} s" + (f": {index}" if index else ""), flush=True)
    return index
