#!/usr/bin/env python
"""Compare the long Sudoku MDM runs on development puzzles only, paired against a reference run (issue 20).

The zoo's 200 evaluation puzzles no longer tell the long runs apart (relation24, deep24 and deep32 all solve 197):
their failures lie in the 16 puzzles that naked and hidden singles do not solve. This script decodes each run's
current ``state.pt`` (sequential, confidence order, as every solve rate of the study) on two development sets that
neither the zoo nor the chapters report on, so a model can be chosen on them:

- ``beyond_singles``: `mimdm.pipelines.long_run.DEV_BEYOND_SINGLES`, 30-35-clue puzzles that singles do not solve;
- ``hard_dev``: chapter 5's development hard puzzles (`mimdm.experiments.speedup.chapter_sets` of the `cpu`
  profile, on which chapter 5 chooses its rules' settings; its held-out puzzles are not touched).

For each run and set it reports the solve rate and, against the reference run (the first of ``--runs``), the
discordant counts (puzzles only one of the two solves) with the exact two-sided McNemar p-value
(`scipy.stats.binomtest` on the discordant pairs). Writes ``--out``/long_run_dev.json.

    .venv/bin/python scripts/long_run_dev.py --runs relation24 deep32 hard30 --threads 2 --out benchmarks/records
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binomtest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimdm.app.profiles import get_profile  # noqa: E402
from mimdm.core.artifacts import git_commit  # noqa: E402
from mimdm.data.curriculum import CurriculumConfig, build_pool  # noqa: E402
from mimdm.experiments.speedup import chapter_sets  # noqa: E402
from mimdm.pipelines.long_run import DEV_BEYOND_SINGLES, RUNS, load_state_model, solved_mask  # noqa: E402


def paired(ref: np.ndarray, other: np.ndarray) -> dict:
    """Discordant counts of two runs on the same puzzles and the exact McNemar p-value (two-sided)."""
    only_ref, only_other = int((ref & ~other).sum()), int((~ref & other).sum())
    n = only_ref + only_other
    p = 1.0 if n == 0 else float(binomtest(only_other, n, 0.5).pvalue)
    return {"only_reference_solves": only_ref, "only_this_solves": only_other, "mcnemar_p": p}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", default=["relation24", "deep32", "hard30"],
                    help="runs of mimdm.pipelines.long_run.RUNS; the first is the reference")
    ap.add_argument("--n", type=int, default=200, help="beyond-singles development puzzles (default 200)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="folder for long_run_dev.json (default: print only)")
    args = ap.parse_args(argv)
    bad = [r for r in args.runs if r not in RUNS]
    if bad:
        ap.error(f"unknown run(s) {', '.join(bad)}; known: {', '.join(sorted(RUNS))}")
    if args.n < 1 or args.threads < 1:
        ap.error("--n and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    clues, seed = DEV_BEYOND_SINGLES
    pool = build_pool(CurriculumConfig(pool_size=args.n, clues=clues, seed=seed, beyond_singles=True), progress=False)
    dev, _, _ = chapter_sets(get_profile("cpu"))
    sets = {"beyond_singles": (pool.puzzles, pool.solutions),
            "hard_dev": (np.stack([p.puzzle for p in dev]), np.stack([p.solution for p in dev]))}
    solved, rows = {}, []
    for run in args.runs:
        try:
            model, step = load_state_model(ROOT / "checkpoints" / RUNS[run][1], "cpu")
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        row = {"run": run, "step": step}
        for name, (pz, sol) in sets.items():
            solved[run, name] = s = solved_mask(model, pz, sol)
            row[name] = {"n_solved": int(s.sum()), "n": len(s), "solve_rate": float(s.mean())}
            if run != args.runs[0]:
                row[name]["vs_reference"] = paired(solved[args.runs[0], name], s)
        rows.append(row)
        print(json.dumps(row), flush=True)
    record = {"commit": git_commit(), "torch": torch.__version__, "threads": args.threads, "reference": args.runs[0],
              "sets": {"beyond_singles": {"n": args.n, "clues": list(clues), "seed": seed},
                       "hard_dev": {"n": len(dev), "from": "chapter_sets(cpu profile), development split"}},
              "decoding": "sequential, confidence order", "rows": rows,
              "seconds": round(time.perf_counter() - t0, 1)}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "long_run_dev.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
