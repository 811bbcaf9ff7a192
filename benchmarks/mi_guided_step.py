"""Benchmark: the parts of one MI-guided decoding step that read only the candidates, against the full ones.

Records the decoding steps of hard puzzles under MI-guided decoding (the profile's MDM and MI head; batches as
chapter 5 times them), then times on exactly those steps, in one process:

- the MI head with ``candidates`` (the masked positions within the entropy cap; the bilinear head computes only
  their rows' units) against the full masked matrix masked afterwards;
- the set admission, `mimdm.sampling.decoding.greedy_admission` (rounds over the candidates), against the
  position-by-position loop it replaced (kept below as the reference);

and prints milliseconds per step and the ratios full / restricted, after checking that both give the same sets.

    .venv/bin/python benchmarks/mi_guided_step.py --profile cpu --n 32
"""
from __future__ import annotations

import argparse
import math

import torch
from decode_rules import hard_puzzle_setup  # benchmarks/ is the script's folder, first on sys.path

from mimdm.core.timing import seconds_per_call
from mimdm.experiments import speedup as sp
from mimdm.sampling.decoding import MIGuided, decode, greedy_admission, head_mi_fn


def per_position_loop(mi, order, masked, ent, eps, budget, cap):
    """`MIGuided`'s admission before 2026-12-05: one visit per masked position, vectorised over the batch."""
    B = masked.shape[0]
    rows = torch.arange(B)
    sel = torch.zeros_like(masked)
    total = torch.zeros(B, dtype=mi.dtype)
    for k in range(int(masked.sum(1).max())):
        pos = order[:, k]
        cand = masked[rows, pos]
        first = ~sel.any(1)
        row_mi = mi[rows, pos] * sel
        ok = cand & (first | ((row_mi.max(1).values <= eps) & (total + row_mi.sum(1) <= budget)
                              & (ent[rows, pos] <= cap)))
        total = total + torch.where(ok, row_mi.sum(1), torch.zeros_like(total))
        sel[rows, pos] |= ok
    return sel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=sp.TIMING_ITEMS, help="hard puzzles decoded together (one batch)")
    ap.add_argument("--eps", type=float, default=0.03, help="MI threshold, nats")
    ap.add_argument("--cap", type=float, default=0.1, help="entropy cap, nats (inf: none)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    P, dev, model, head, _, x = hard_puzzle_setup(args.profile, args.device, args.n)
    steps = []
    source = head_mi_fn(head, P.head_train.layer)

    def recording(info, model, candidates=None):
        steps.append((info, candidates))
        return source(info, model, candidates=candidates)

    recording.layer, recording.takes_candidates = source.layer, True
    decode(model, x, MIGuided(recording, eps=args.eps, entropy_cap=args.cap))
    t = {"head, full matrix": 0.0, "head, candidates": 0.0, "admission, per position": 0.0, "admission, rounds": 0.0}
    with torch.no_grad():
        for info, cand in steps:
            ent = info.entropy.masked_fill(~info.masked, math.inf)
            order, within = ent.argsort(1), info.masked & (ent <= args.cap)
            full = head(info.hidden, info.masked, info.entropy, info.probs)
            mi = head(info.hidden, info.masked, info.entropy, info.probs, candidates_BL=cand)
            keep = cand[:, :, None] & cand[:, None, :]
            if not torch.allclose(mi, full * keep, rtol=1e-4, atol=1e-6):
                raise SystemExit("the head's MI between candidates differs from the full matrix's")
            a = per_position_loop(mi, order, info.masked, ent, args.eps, math.inf, args.cap)
            if not torch.equal(a, greedy_admission(mi, order, info.masked, within, args.eps)):
                raise SystemExit("greedy_admission chose another set than the per-position loop")
            for name, fn in (("head, full matrix",
                              lambda: head(info.hidden, info.masked, info.entropy, info.probs) * keep),
                             ("head, candidates", lambda: head(info.hidden, info.masked, info.entropy, info.probs,
                                                                  candidates_BL=cand)),
                             ("admission, per position",
                              lambda: per_position_loop(mi, order, info.masked, ent, args.eps, math.inf, args.cap)),
                             ("admission, rounds", lambda: greedy_admission(mi, order, info.masked, within, args.eps))):
                t[name] += seconds_per_call(fn, dev, args.repeats)
    forward = sum(seconds_per_call(lambda: model(info.tokens, layer=P.head_train.layer), dev, args.repeats)
                  for info, _ in steps)
    print(f"{len(steps)} steps of MI-guided decoding (eps {args.eps:g}, cap {args.cap:g}) of {args.n} hard puzzles; "
          f"same sets and MI between candidates from both versions")
    print(f"{'part':26s} {'ms/step':>8s} {'/ MDM forward':>14s}")
    for name, s in [("MDM forward", forward)] + list(t.items()):
        print(f"{name:26s} {1e3 * s / len(steps):8.2f} {s / forward:14.3f}")
    print(f"ratios full / restricted: head {t['head, full matrix'] / t['head, candidates']:.2f}, "
          f"admission {t['admission, per position'] / t['admission, rounds']:.2f}")
    print(f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
