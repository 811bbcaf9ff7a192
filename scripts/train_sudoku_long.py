#!/usr/bin/env python
"""Start or continue the long `cpu` Sudoku MDM run (issue 20), resumable across sessions.

Trains one of `mimdm.pipelines.long_run.RUNS` (``--run long``: `long_run_configs`; ``--run relation``:
`relation_run_configs`; ``--run relation24``: the same over 24,000 steps, the shipped `cpu` model;
``--run deep24``: relation24 with 7 layers; ``--run deep32``: deep24 continued from its final state in a second
schedule cycle, `mimdm.pipelines.long_run.CONTINUES`; ``--run hard30``: relation24 continued the same way on puzzles
that singles do not solve) in ``--state-dir`` (default ``checkpoints/<the run's folder>``:
``sudoku_cpu_long``, ``sudoku_cpu_relation``, ``sudoku_cpu_relation24``, ``sudoku_cpu_deep24``, ``sudoku_cpu_deep32``
or ``sudoku_cpu_hard30``), checkpointing ``state.pt`` atomically every 500 steps and
appending the solve-rate curve to ``curve.jsonl`` every ``--eval-every`` steps. Run it again with
the same arguments to continue exactly where it stopped. Example (low priority, one core):

    nice -n 19 .venv/bin/python scripts/train_sudoku_long.py --run relation24 --threads 1 --hours 2.5
    .venv/bin/python scripts/train_sudoku_long.py --run deep24 --threads 2 --zoo-eval 1000   # evaluate, no training
    .venv/bin/python scripts/train_sudoku_long.py --run hard30 --threads 2 --dev-eval 200    # the development set
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimdm.pipelines.long_run import (CONTINUES, RUNS, run_long_training, state_dev_solve_rate,  # noqa: E402
                                      state_solve_rate)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=None, help="wall-clock budget of this call (default: until done)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--run", choices=sorted(RUNS), default="long",
                    help="which configuration (mimdm.pipelines.long_run.RUNS; default: long)")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="the run's folder (default: checkpoints/<the run's folder>)")
    ap.add_argument("--eval-every", type=int, default=1000, help="steps between solve-rate evaluations")
    ap.add_argument("--eval-puzzles", type=int, default=100, help="puzzles per evaluation set")
    ap.add_argument("--steps", type=int, default=None,
                    help="re-plan the run's total length (only before its final decay has started)")
    ap.add_argument("--device", default="cpu", help="torch device of this call, e.g. cuda (default cpu); a run may "
                    "move between CPU and GPU across calls")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="a continuation's source run folder (default: checkpoints/<the source run's folder>, "
                    "mimdm.pipelines.long_run.CONTINUES)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--zoo-eval", type=int, default=None, metavar="N",
                    help="do not train: print the zoo's solve rate of the run's current state on N 30-35-clue puzzles "
                    "(mimdm.pipelines.long_run.state_solve_rate) as JSON")
    ap.add_argument("--dev-eval", type=int, default=None, metavar="N",
                    help="do not train: print the solve rate of the run's current state on N development puzzles that "
                    "singles do not solve (mimdm.pipelines.long_run.state_dev_solve_rate) as JSON")
    args = ap.parse_args(argv)
    if args.zoo_eval is not None and args.dev_eval is not None:
        ap.error("give --zoo-eval or --dev-eval, not both")
    for flag, n in (("--zoo-eval", args.zoo_eval), ("--dev-eval", args.dev_eval)):
        if n is not None and n < 1:
            ap.error(f"{flag} must be >= 1")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.hours is not None and args.hours <= 0:
        ap.error("--hours must be > 0")
    torch.set_num_threads(args.threads)
    configs, folder = RUNS[args.run]
    model_cfg, train_cfg, curriculum = configs()
    state_dir = args.state_dir or ROOT / "checkpoints" / folder
    if args.zoo_eval is not None or args.dev_eval is not None:
        for attempt in range(2):  # a run training beside this may be replacing its state.pt and its checksum
            try:
                if args.zoo_eval is not None:
                    print(json.dumps(state_solve_rate(state_dir, args.zoo_eval, args.device)))
                else:
                    print(json.dumps(state_dev_solve_rate(state_dir, args.dev_eval, args.device)))
                return 0
            except FileNotFoundError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            except ValueError as e:
                if attempt:
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                time.sleep(5)
    if args.init_from is not None and args.run not in CONTINUES:
        ap.error(f"--init-from is for a continuation run ({', '.join(sorted(CONTINUES))}), not --run {args.run}")
    if args.steps is not None:
        if args.steps <= train_cfg.cycle_start:
            ap.error(f"--steps must exceed the run's cycle start {train_cfg.cycle_start}, got {args.steps}")
        train_cfg = replace(train_cfg, steps=args.steps)
    init_from = None
    if args.run in CONTINUES:
        init_from = args.init_from or ROOT / "checkpoints" / RUNS[CONTINUES[args.run]][1]
    curve = run_long_training(state_dir, model_cfg, train_cfg, curriculum, hours=args.hours,
                              eval_every=args.eval_every, eval_puzzles=args.eval_puzzles,
                              progress=not args.no_progress, allow_extend=args.steps is not None, run=args.run,
                              device=args.device,
                              init_from=init_from)
    if curve:
        print("last evaluation:", curve[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
