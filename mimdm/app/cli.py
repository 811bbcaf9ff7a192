"""Command line of the study: ``mimdm <command> --help`` documents each command.

Commands, in pipeline order:

    mimdm train     train the Sudoku and/or protein MDM (and, by default, their MI labels and MI heads)
    mimdm probe     MI labels: ground-truth pairwise MI of sampled contexts by probing (resumable shards)
    mimdm fit-head  train (or load) the MI head on those labels
    mimdm decode    decode Sudoku puzzles (or masked proteins) with an unmasking rule
    mimdm nll       time-free I-MDCE negative log-likelihood of complete Sudoku grids
    mimdm book      the main job: train what is missing, execute every chapter, build the HTML book

Everything trained is cached by configuration under ``$MIMDM_ARTIFACTS`` (default ``<repo>/artifacts``,
see `mimdm.core.artifacts`): a command finds what an earlier command of the same profile made, and an
interrupted training or labelling run resumes where it stopped when the same command is run again.

Units: NFE = forward passes of the MDM; MI and NLL in nats; times are wall-clock seconds.
Errors in the input (malformed puzzle, non-amino-acid letter, bad device, unknown profile) and
missing artifacts end the command with a one-line message on stderr (exit status 2 for bad
input, 1 for a missing artifact), not a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

#: Names of the run profiles (`mimdm.app.profiles.PROFILES`), listed here so that ``--help`` and input errors
#: answer without importing torch (tests/test_cli.py checks that the two agree).
PROFILE_NAMES = ("cpu", "paper", "smoke")
RULES = ("sequential", "top-k", "threshold", "eb", "mi")
#: Default knob of each rule (the `mimdm.sampling.decoding` defaults).
DEFAULT_KNOBS = {"top-k": 2, "threshold": 0.9, "eb": 0.1, "mi": 0.01}


# ------------------------------------------------------------------------------------------ helpers
def _seed(text: str) -> int:
    """argparse type of ``--seed``: an integer torch's generators accept (0 to 2^63 - 1)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2^63-1, got {text}")
    return v


def _count(text: str) -> int:
    """argparse type of a count option (``--max-new-shards``, ``--samples``): an integer >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


# ------------------------------------------------------------------------------------------ parser
def _inputs(sp, what: str, proteins: bool = True) -> None:
    """``--file``, ``--protein-file``, ``--model`` and ``--jsonl``: the same on decode, probe and nll."""
    sp.add_argument("--file", metavar="PATH", help=f"read the {what} from a file, '-' for standard input: one 81-character "
                    "grid per line ('.' or '0' blanks; '#' comments; fields after the grid ignored) or the CSV layout "
                    "puzzle,solution[,...] (mimdm.data.sudoku.parse_puzzles)")
    if proteins:
        sp.add_argument("--protein-file", metavar="PATH",
                        help="read protein sequences ('_' at masked positions) from a file, '-' for standard input: "
                             "one per line or FASTA (mimdm.data.protein.parse_sequences)")
    sp.add_argument("--model", metavar="MODEL",
                    help="the model to use instead of the profile's: for Sudoku a Sudoku MDM checkpoint (.pt) written "
                         "by this package" + ("; for proteins esmc_300m, an ESM-C weights path, a protein MDM "
                                              "checkpoint (.pt) or hf:<model id or local folder>" if proteins else ""))
    sp.add_argument("--jsonl", action="store_true", help="print one JSON object per input, one per line (JSON lines)")


def _desc(*paragraphs: str) -> str:
    """Paragraphs wrapped to 88 columns (for `argparse.RawDescriptionHelpFormatter`)."""
    import textwrap

    return "\n\n".join(textwrap.fill(p, 88) for p in paragraphs)


def _common(sp, device_help: str = "cpu | cuda | cuda:N | auto (default: cpu)") -> None:
    sp.add_argument("--profile", default="cpu", choices=PROFILE_NAMES,
                    help="run profile of mimdm/profiles.py: smoke (tiny, CI), cpu (default), paper (GPU scale)")
    sp.add_argument("--device", default="cpu", help=device_help)


def build_parser() -> argparse.ArgumentParser:
    """The ``mimdm`` argument parser: sub-commands train, probe, fit-head, decode, nll, book."""
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(prog="mimdm", formatter_class=fmt, description=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    b = sub.add_parser("book", help="train what is missing, execute every chapter with papermill, build the HTML book",
                       description="The main job: train what is missing, execute every chapter with papermill, "
                                   "build the HTML book.")
    b.add_argument("--profile", default="cpu", choices=PROFILE_NAMES, help="run profile (default: cpu)")
    b.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default: cpu)")
    b.add_argument("--chapter", action="append", help="only this chapter notebook (repeatable), e.g. book/01_ground_truth_mi.ipynb")
    b.add_argument("--no-execute", action="store_true", help="only build the HTML from the notebooks as they are")
    b.add_argument("--retrain", action="store_true",
                   help="ignore the shipped checkpoints (checkpoints/<profile>/) and train everything from scratch")
    b.add_argument("--no-build", action="store_true", help="only execute the chapters")
    b.set_defaults(func="cmd_book")

    t = sub.add_parser("train", formatter_class=fmt, help="train (or resume training of) the models of a profile",
                       description=_desc(
                           "Train (or find in the cache, or resume) the models of a profile, with progress bars.",
                           "--what all (default) trains what `mimdm book` needs: the Sudoku MDM, its MI labels, MI "
                           "head and ablation heads, and the protein MDM with its labels and head. A rerun loads "
                           "everything from the cache; an interrupted MDM training resumes from its last checkpoint, "
                           "a labelling run from its last finished shard."))
    _common(t)
    t.add_argument("--what", choices=["all", "sudoku", "protein"], default="all",
                   help="which models (default: all)")
    t.add_argument("--no-heads", action="store_true",
                   help="train the MDM(s) only; MI labels and heads later with `mimdm probe` / `mimdm fit-head`")
    t.add_argument("--no-ablations", action="store_true", help="skip the Sudoku ablation heads (chapter 3)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.set_defaults(func="cmd_train")

    pr = sub.add_parser("probe", formatter_class=fmt, help="generate the MI-head labels by probing (resumable)",
                        description=_desc(
                            "Ground-truth MI labels (nats) of the profile's trained MDM by probing "
                            "(mimdm.probing.exact.probe_mi: 1 + |masked| x V forward passes per context, V = 9 digits or "
                            "20 amino acids). Prints shards, contexts, probing NFE (forward passes) and seconds.",
                            "The label set is written in shards to its cache folder; a rerun skips finished shards, "
                            "so an interrupted run resumes. Needs the trained MDM (`mimdm train`).",
                            "With --file (puzzles) or --protein-file (sequences, '_' masked), probe those inputs "
                            "instead: for each, the exact MI (nats) between its masked positions (0-based indices), "
                            "their entropies and the probing NFE; --jsonl prints the whole matrix."),
                        epilog="example:\n  mimdm probe --file puzzles.txt --jsonl > mi.jsonl")
    _common(pr)
    pr.add_argument("--what", choices=["sudoku", "protein"], default="sudoku", help="which model's labels (default: sudoku)")
    pr.add_argument("--max-new-shards", type=_count, default=None, metavar="N",
                    help="Sudoku: compute at most N new shards now (a later call continues)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")
    _inputs(pr, "puzzles to probe")
    pr.add_argument("--top", type=_count, default=5, metavar="N",
                    help="with an input file: the N pairs of highest MI printed per input in text output (default 5)")
    pr.set_defaults(func="cmd_probe")

    f = sub.add_parser("fit-head", formatter_class=fmt, help="train (or load) the MI head on the labels",
                       description=_desc(
                           "Train the profile's MI head on its labels (probing missing label shards first, as "
                           "`mimdm probe`), or load it from the cache. Prints its parameter count, best validation "
                           "loss (the head's training loss, mimdm.heads.mi_head.mi_loss, on the validation split) and path.",
                           "Head training runs on the CPU from the stored hidden states; --device places the MDM "
                           "for any probing and the loaded head."))
    _common(f)
    f.add_argument("--what", choices=["sudoku", "protein"], default="sudoku", help="which model's head (default: sudoku)")
    f.add_argument("--no-progress", action="store_true", help="no progress bars")
    f.set_defaults(func="cmd_fit_head")

    d = sub.add_parser("decode", formatter_class=fmt, help="decode Sudoku puzzles (or masked proteins) with an unmasking rule",
                       description=_desc(
                           "Decode with the profile's trained MDM (`mimdm train` first) and an unmasking rule.",
                           "Rules and --knob: sequential (no knob: one position per forward pass, by confidence); "
                           "top-k (k positions per forward pass, default 2); threshold (every position with max "
                           "probability >= tau, default 0.9); eb (entropy-bounded sampler, gamma in nats, default "
                           "0.1); mi (MI-guided: admit a position only if its predicted MI with every position chosen "
                           "in the step is <= eps nats, default 0.01, and, with --entropy-cap, only if its entropy is "
                           "at most the cap; needs the MI head, `mimdm fit-head`).",
                           "Prints each decoded grid, its NFE (forward passes of the MDM), MI-head passes, whether it "
                           "is a valid solution keeping the givens, and the wall-clock seconds of the batched call."),
                       epilog="example:\n  mimdm decode --profile cpu --rule mi --knob 0.01 \\\n    "
                              "'53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79'")
    _common(d)
    d.add_argument("puzzles", nargs="*", metavar="PUZZLE",
                   help="81-character Sudoku string, row by row: digits 1-9, '.' or '0' for blanks (whitespace ignored)")
    d.add_argument("--protein", action="append", metavar="SEQ",
                   help="instead of puzzles: a protein over the 20 amino-acid letters with '_' at the positions to "
                        "generate (repeatable), decoded with the profile's protein MDM")
    d.add_argument("--rule", choices=RULES, default="sequential", help="unmasking rule (default: sequential)")
    d.add_argument("--knob", type=float, default=None, help="the rule's parameter (see above; default per rule)")
    d.add_argument("--entropy-cap", type=float, default=None, metavar="NATS",
                   help="mi rule only: admit a position (after the step's first) only if its entropy is <= NATS (default: no cap)")
    d.add_argument("--temperature", type=float, default=0.0, help="0: argmax values (default); > 0: sample at this temperature")
    d.add_argument("--seed", type=_seed, default=0, help="seed of the sampling, 0 to 2^63-1 (default 0)")
    d.add_argument("--pretty", action="store_true", help="print grids as 9 rows instead of one 81-character line")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    _inputs(d, "puzzles")
    d.add_argument("--head", metavar="PATH",
                   help="--rule mi with --model: the MI head checkpoint trained for that model (mimdm.heads.mi_head)")
    d.set_defaults(func="cmd_decode")

    n = sub.add_parser("nll", formatter_class=fmt, help="time-free I-MDCE NLL (nats) of complete Sudoku grids",
                       description=_desc(
                           "Negative log-likelihood -log p(x) in nats of complete grids under the profile's trained "
                           "Sudoku MDM, estimated without a time variable by the I-MDCE identity "
                           "(mimdm.evaluation.likelihood.time_free_nll): K mask draws per grid, one forward pass each, so "
                           "NFE = K per grid. Prints the estimate +- its standard error (over the K draws)."))
    _common(n)
    n.add_argument("grids", nargs="*", metavar="GRID", help="complete 81-digit Sudoku grid (digits 1-9, row by row)")
    n.add_argument("--samples", type=int, default=None, metavar="K",
                   help="mask draws per grid = NFE per grid (default: the profile's nll_draws)")
    n.add_argument("--sizes", choices=["harmonic", "uniform"], default="uniform",
                   help="mask-size distribution, both unbiased for the I-MDCE identity's harmonic sum: uniform "
                        "(m uniform, weight n/m; lower variance on Sudoku, the library's default) or harmonic "
                        "(m ~ 1/m, weight H_n) (default: uniform)")
    n.add_argument("--seed", type=_seed, default=0, help="seed of the mask draws, 0 to 2^63-1 (default 0)")
    n.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    _inputs(n, "complete grids", proteins=False)
    n.set_defaults(func="cmd_nll")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run ``mimdm`` with ``argv`` (default: ``sys.argv[1:]``); returns 0 or raises `SystemExit` on error."""
    args = build_parser().parse_args(argv)
    # The commands pull in torch, scikit-learn and papermill (seconds to import): importing them only after the
    # arguments parsed keeps `--help` and usage errors instant.
    from mimdm.app import commands
    from mimdm.core.contract import NonFiniteOutputError
    from mimdm.core.shipped import ShippedCheckpointError

    try:
        return getattr(commands, args.func)(args)
    except commands.CLIError as e:
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(e.code) from None
    except FileNotFoundError as e:  # missing weights/checkpoints: the messages say how to produce them
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except ShippedCheckpointError as e:  # a shipped checkpoint altered or not matching the profile: says how to retrain
        print(f"mimdm {args.cmd}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ValueError, NonFiniteOutputError) as e:  # bad input or checkpoints (2), non-finite model output (1)
        if os.environ.get("MIMDM_DEBUG"):
            raise
        first = str(e).strip().partition("\n")[0]
        print(f"mimdm {args.cmd}: error: {first} (MIMDM_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(1 if isinstance(e, NonFiniteOutputError) else 2) from None
    except KeyboardInterrupt:
        print(f"\nmimdm {args.cmd}: interrupted; run the same command again to resume from the last checkpoint/shard",
              file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
