"""Benchmark: NFE and wall-clock of every unmasking rule against sequential decoding, in one process.

Prints one line per rule setting with its solve rate, NFE and wall-clock per puzzle and the ratios
sequential / rule (so the ratios are comparable: same machine, same process, same puzzles).

    .venv/bin/python benchmarks/decode_rules.py --profile cpu --n 100
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mimdm.app.profiles import get_profile
from mimdm.core.device import resolve_device
from mimdm.experiments import mi_head as mh
from mimdm.experiments import speedup as sp
from mimdm.pipelines.zoo import grids_to_tokens, profile_sudoku_mdm


def hard_puzzle_setup(profile: str, device: str, n: int, seed: int = 0):
    """The profile's Sudoku MDM and MI head, ``n`` hard puzzles (`mimdm.experiments.speedup.hard_puzzles`) and their
    ``[n, 81]`` tokens: ``(P, dev, model, head, puzzles, tokens)`` (shared with `mi_guided_step.py`)."""
    P = get_profile(profile)
    dev = resolve_device(device)
    model, rec = profile_sudoku_mdm(P, device=dev)
    head = mh.prepare(P, model, rec["path"], ablations=False)["head"]
    puzzles = sp.hard_puzzles(n, P.hard_clues, np.random.default_rng(seed))
    return P, dev, model, head, puzzles, grids_to_tokens(np.stack([p.puzzle for p in puzzles]), dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=100, help="puzzles")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    P, dev, model, head, puzzles, x = hard_puzzle_setup(args.profile, args.device, args.n, args.seed)
    rows = sp.sweep(model, x, sp.rule_grid(head, P.head_train.layer), lambda t: sp.score_solving(t, puzzles), progress=True)
    seq = rows[0]
    print(f"{'rule':12s} {'knob':>7s} {'H cap':>6s} {'solve':>6s} {'NFE':>7s} {'ms/puzzle':>10s} {'NFE ratio':>10s} {'time ratio':>10s}")
    for r in rows:
        cap = "-" if r["entropy_cap"] is None else f"{r['entropy_cap']:g}"
        print(f"{r['rule']:12s} {r['knob']:7.4g} {cap:>6s} {r['solve_rate']:6.3f} {r['nfe']:7.2f} {1e3 * r['seconds']:10.2f} "
              f"{seq['nfe'] / r['nfe']:10.2f} {seq['seconds'] / r['seconds']:10.2f}")
    print(f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
