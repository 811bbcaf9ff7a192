"""Command line: ``mimdm book`` (the main job) and ``mimdm train``."""
from __future__ import annotations

import argparse
import sys

from .profiles import PROFILES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mimdm", description="Pairwise MI in masked diffusion models: the study's entry point.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("book", help="train what is missing, execute every chapter with papermill, build the HTML book")
    b.add_argument("--profile", default="cpu", choices=sorted(PROFILES), help="run profile (default: cpu)")
    b.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default: cpu)")
    b.add_argument("--chapter", action="append", help="only this chapter notebook (repeatable), e.g. book/01_ground_truth_mi.ipynb")
    b.add_argument("--no-execute", action="store_true", help="only build the HTML from the notebooks as they are")
    b.add_argument("--no-build", action="store_true", help="only execute the chapters")

    t = sub.add_parser("train", help="train (or resume training of) the models of a profile")
    t.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    t.add_argument("--device", default="cpu")

    args = ap.parse_args(argv)
    if args.cmd == "book":
        from .book import run_book

        run_book(args.profile, args.device, chapters=args.chapter, execute=not args.no_execute, build=not args.no_build)
    elif args.cmd == "train":
        from .book import prepare_artifacts

        prepare_artifacts(args.profile, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
