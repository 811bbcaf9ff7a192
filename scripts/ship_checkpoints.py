"""Train (or find in the cache) a profile's models and ship them as checkpoints under ``checkpoints/<profile>/``.

What is shipped and how each slot's evaluation is defined: `mimdm.experiments.ship`; the format and the
checks ``make book`` runs on them: `mimdm.core.shipped`. Run from the repository root, at low priority, e.g.

    nice -n 19 .venv/bin/python scripts/ship_checkpoints.py --profile cpu --what protein

then commit ``checkpoints/<profile>/`` (each file at most 20 MB; a slot is replaced, not versioned).
Trains with the shipped-only guard off, whatever ``$MIMDM_SHIPPED_ONLY`` says.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu", help="run profile (default cpu)")
    ap.add_argument("--what", choices=["sudoku", "sudoku-mdm", "sudoku-evals", "protein", "protein-evals"], action="append",
                    help="which models (repeatable; default sudoku and protein). sudoku: the Sudoku MDM already in "
                         "the cache (trained by `mimdm train` or adopted from the long run) with its label set, MI "
                         "head and ablation heads (built now if missing); sudoku-mdm: the MDM alone; sudoku-evals, protein-evals: "
                         "the stored decodes and NLL scores of chapters 1, 5, 6 / 4 on the shipped models (run them first)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    os.environ.pop("MIMDM_SHIPPED_ONLY", None)
    from mimdm.app.profiles import get_profile
    from mimdm.experiments import ship

    try:
        profile = get_profile(args.profile)
    except ValueError as e:
        print(f"ship_checkpoints: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    for what in args.what or ["sudoku", "protein"]:
        try:
            dirs = (ship.ship_evals(profile, args.device, what.split("-")[0]) if what.endswith("-evals") else
                    ship.ship_sudoku(profile, args.device, heads=what == "sudoku", progress=not args.no_progress)
                    if what.startswith("sudoku") else ship.ship_protein(profile, args.device,
                                                                        progress=not args.no_progress))
        except (FileNotFoundError, ValueError) as e:
            print(f"ship_checkpoints: error: {e}", file=sys.stderr)
            return 1
        for d in dirs:
            print(f"[ship] {d}", flush=True)
    from mimdm.core import shipped

    (shipped.profile_dir(profile.name) / "README.md").write_text(shipped.readme(profile.name))
    print(f"[ship] done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
