"""Running a chapter on a reader's own data or model, as the "Adapt the study" page does: one papermill run per
chapter with extra parameters (``puzzle_file``, ``model_path``, ``family_alignment``, ``model``, ...), into a
folder of its own so the book's record is never touched, and the numbers it wrote read back.

The same run from a shell is the command `papermill_command` prints.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path

import numpy as np
import papermill as pm

from mimdm.core import shipped
from mimdm.data import sudoku as sd


def papermill_command(notebook: str | Path, output: str | Path, parameters: dict) -> str:
    """The shell command that runs ``notebook`` (relative to the repository) with ``parameters`` into ``output``:
    ``papermill <notebook> <output> --cwd book -p <name> <value> ...`` (values quoted for a POSIX shell; papermill
    reads ``-p`` values as YAML, so numbers stay numbers and ``null`` is None)."""
    args = ["papermill", str(notebook), str(output), "--cwd", "book"]
    for k, v in parameters.items():
        args += ["-p", k, "null" if v is None else (json.dumps(v) if isinstance(v, (list, tuple)) else str(v))]
    return " ".join(shlex.quote(a) for a in args)


def run_chapter(notebook: str | Path, out_dir: str | Path, parameters: dict, progress: bool = False) -> dict:
    """Execute a chapter notebook with papermill on a reader's parameters, writing the executed notebook and the
    chapter's results into ``out_dir`` (``results_dir`` is set to ``out_dir/results`` and ``record`` to False, so
    the book's ``book/results/*.json`` stay as they are).

    The run may train what its inputs need (a new family's models, a head for another model), as it would from a
    shell: `mimdm book`'s guard against training anything but the shipped checkpoints (``$MIMDM_SHIPPED_ONLY``,
    `mimdm.core.shipped.refuse_training`) is lifted for it and restored afterwards.

    Args:
        notebook: the chapter, e.g. ``"05_speedup_analysis.ipynb"`` from a chapter (relative paths are taken from
            the current folder), or an absolute path.
        out_dir: a folder of this run's own (created); an earlier run's results there are replaced.
        parameters: papermill parameters (e.g. ``{"profile": "cpu", "puzzle_file": "...csv"}``).

    Returns:
        ``{"command": the equivalent shell command (`papermill_command`), "seconds": wall-clock of the run,
        "notebook": the executed notebook's path, "results_path": the one results file the chapter wrote,
        "results": its contents}``.

    Raises:
        FileNotFoundError: no such notebook.
        RuntimeError: the chapter wrote no results file, or more than one.
        papermill.PapermillExecutionError: the chapter failed (the message names the cell).
    """
    nb = Path(notebook).resolve()  # a relative path is taken from the current folder (a chapter's: book/)
    if not nb.is_file():
        raise FileNotFoundError(f"chapter notebook not found: {nb}")
    out = Path(out_dir).resolve()
    res_dir = out / "results"
    for old in res_dir.rglob("*.json"):
        old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    params = {**parameters, "results_dir": str(res_dir), "record": False}
    executed = out / nb.name
    t0 = time.perf_counter()
    guard = os.environ.pop(shipped.ENV, None)  # a run on other inputs trains what they need (see the docstring)
    try:
        # the kernel's start-up warnings (e.g. ipykernel's about TCP transport) go to this process's stderr,
        # which inside a chapter is a cell output of the page that called this: only errors are logged
        pm.execute_notebook(str(nb), str(executed), parameters=params, cwd=str(nb.parent), kernel_name="python3",
                            progress_bar=progress, extra_arguments=["--IPKernelApp.log_level=ERROR"])
    finally:
        if guard is not None:
            os.environ[shipped.ENV] = guard
    seconds = time.perf_counter() - t0
    written = sorted(res_dir.rglob("*.json"))
    if len(written) != 1:
        raise RuntimeError(f"{nb.name} wrote {len(written)} results files under {res_dir} (expected one): "
                           f"{[str(p) for p in written]}")
    shown = f"book/{nb.name}" if nb.parent.name == "book" else nb  # as run from the repository root
    return {"command": papermill_command(shown, f"my_{nb.name}", parameters), "seconds": seconds, "notebook": executed,
            "results_path": written[0], "results": json.loads(written[0].read_text())}



def generated_puzzles(n: int, clues: tuple[int, int], seed: int = 0) -> list[sd.Puzzle]:
    """``n`` unique-solution puzzles with a clue count uniform in ``clues`` (`mimdm.data.sudoku.make_puzzles`, from
    ``numpy.random.default_rng(seed + 90)``): the page's puzzle file, at a clue range of the reader's choice.

    Raises:
        mimdm.data.sudoku.SudokuError: ``n < 1`` or a clue range outside 17-81.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise sd.SudokuError(f"need at least one puzzle, got n={n!r}")
    return sd.make_puzzles(int(n), tuple(clues), np.random.default_rng(seed + 90))


def protein_run_profile(profile: str, protein_profile: str | None = None) -> str:
    """The profile of the page's chapter-4 run: ``protein_profile`` when given, else ``smoke`` under ``cpu`` (training
    a new family's Potts MDMs under ``cpu`` takes about 21 minutes on two cores, more than the book may spend) and
    the page's own profile otherwise (``smoke`` stays ``smoke``; ``paper`` runs on a GPU)."""
    if protein_profile is not None:
        return protein_profile
    return "smoke" if profile == "cpu" else profile


def headline_table(records: dict[str, dict]) -> list[dict]:
    """One row per results record (``{label: record}`` as `mimdm.core.results.write_results` writes them): the label
    as ``"run"``, the record's profile and its ``values["headline"]`` numbers (absent ones NaN when other records
    have them), for a side-by-side table.

    Raises:
        KeyError: a record without ``values["headline"]``.
    """
    keys: list[str] = []
    for rec in records.values():
        keys += [k for k in rec["values"]["headline"] if k not in keys]
    rows = []
    for label, rec in records.items():
        h = rec["values"]["headline"]
        rows.append({"run": label, "profile": rec["profile"],
                     **{k: (math.nan if h.get(k) is None else h[k]) for k in keys}})
    return rows


def protein_run_note(results: dict) -> str:
    """What the page's chapter-4 run shows, as Markdown: under ``smoke`` that its numbers only test that the chapter
    runs on the new family (the ``cpu`` record of the same run is the one to read); else its long-range P@L."""
    fam = results["values"].get("family", {})
    name = (f"`{fam['alignment']}` (structure `{fam.get('structure')}`, chain {fam.get('chain')})"
            if "alignment" in fam else "the family")
    if results["profile"] not in ("cpu", "paper"):
        return (f"The run above is a `{results['profile']}` run: chapter 4's whole pipeline (alignment, aligned "
                f"columns, models, probing, head, contacts, decoding) ran on {name}, but with tiny models whose "
                "numbers only show that the code runs on a new family. The row marked *cpu record* is the same "
                "command with `-p profile cpu`, made by the project (see the appendix).")
    h = results["values"]["headline"]
    return (f"Under `{results['profile']}`, probed MI on {name} ranks long-range contacts with P@L "
            f"{h['mi_long_range_p_at_l']:.3f} (the head: {h['head_long_range_p_at_l']:.3f}).")


def puzzle_file_record(puzzles: list[sd.Puzzle], clues: tuple[int, int], seed: int) -> dict:
    """What the page records about its generated puzzle file: the generator's settings and `puzzle_set_summary`."""
    c = [p.n_clues for p in puzzles]
    return {"seed": seed, "clue_range": list(clues), "n": len(puzzles), "clues": [min(c), max(c)],
            "mean_difficulty": float(np.mean([p.difficulty for p in puzzles]))}


def run_record(run: dict) -> dict:
    """The part of a `run_chapter` result the page records: command, minutes, results file name, its profile and
    headline numbers."""
    return {"command": run["command"], "minutes": round(run["seconds"] / 60, 2),
            "results_file": Path(run["results_path"]).name, "profile": run["results"]["profile"],
            "headline": run["results"]["values"].get("headline", {})}
