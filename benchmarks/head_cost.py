"""Benchmark: one MI-head pass against one MDM forward pass (and both against probing), in one process.

For each batch size, times (a) one MDM forward that yields the head's inputs (hidden states and marginal
entropies, `mimdm.heads.mi_head.head_inputs`) and (b) one head pass on them, and prints seconds per context and
the ratio head / forward; then the cost of probing the same contexts (`mimdm.probing.exact.probe_mi`, 1 + |M|·9
forward passes each) and the speedup of forward + head over probing. Contexts: 75% of the cells masked.

    .venv/bin/python benchmarks/head_cost.py --profile cpu
    .venv/bin/python benchmarks/head_cost.py --profile paper --device cuda --random-init   # no training needed

By default the profile's trained MDM and MI head are used (trained now if missing, as `mimdm train` would);
``--random-init`` times the same architectures at random initialisation instead (cost does not depend on the
weights). ``--what protein`` times the profile's protein MDM architecture (always random init) with its head
at ``--length`` residues. ``--reference DAMPING ROUNDS`` (Sudoku) also times the training-free propagated-constraint
reference of chapter 2 (`mimdm.probing.sudoku_mi.propagated_mi` on the forward's marginals, top 4 digits) in the
same loop and prints its ratio to the forward:

    .venv/bin/python benchmarks/head_cost.py --profile cpu --reference 0.5 7
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mimdm.app.profiles import PROFILES, get_profile
from mimdm.core.device import resolve_device
from mimdm.data import sudoku as sd
from mimdm.experiments.mi_head import protein_head_config_for
from mimdm.heads.mi_head import MIHead, forward_and_head_seconds


def sudoku_setup(P, dev, random_init: bool):
    from mimdm.experiments import mi_head as mh
    from mimdm.models.sudoku import SudokuMDM
    from mimdm.pipelines.zoo import grids_to_tokens, profile_sudoku_mdm

    if random_init:
        torch.manual_seed(0)
        model = SudokuMDM(P.sudoku_model).to(dev).eval()
        head = MIHead(mh.head_config_for(P, model)).to(dev).eval()
        what = "random init"
    else:
        model, rec = profile_sudoku_mdm(P, device=dev)
        head = mh.prepare(P, model, rec["path"], ablations=False)["head"]
        what = f"trained ({rec['path']})"

    def contexts(n):
        rng = np.random.default_rng(0)
        return grids_to_tokens(np.stack([sd.random_partial(s, 20, rng) for s in sd.random_solutions(n, rng)]), dev)

    return model, head, contexts, what


def protein_setup(P, dev, length: int):
    from mimdm.models.esmc import ESMC_300M, ESMCMDM

    arch = dict(ESMC_300M) if P.protein_backbone == "esmc_300m" else {
        "d_model": P.protein_model.d_model, "n_heads": P.protein_model.n_heads, "n_layers": P.protein_model.n_layers}
    torch.manual_seed(0)
    model = ESMCMDM.from_config(**arch).to(dev).eval()
    head = MIHead(protein_head_config_for(P, model)).to(dev).eval()

    def contexts(n):
        g = torch.Generator().manual_seed(0)
        x = model.value_token_ids[torch.randint(0, 20, (n, length), generator=g)].to(dev)
        x[torch.rand(n, length, generator=g).to(dev) < 0.75] = model.mask_id
        return x

    return model, head, contexts, f"random init, ESM-C {arch['d_model']}/{arch['n_heads']}/{arch['n_layers']}, L={length}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--what", choices=["sudoku", "protein"], default="sudoku")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="contexts per pass (default: 1 64)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repetitions per measurement")
    ap.add_argument("--probe-contexts", type=int, default=2, help="contexts probed for the probing comparison (0: skip)")
    ap.add_argument("--length", type=int, default=160, help="protein length in residues (--what protein)")
    ap.add_argument("--random-init", action="store_true", help="Sudoku: time the architectures without training")
    ap.add_argument("--reference", nargs=2, type=float, metavar=("DAMPING", "ROUNDS"),
                    help="Sudoku: also time propagated_mi at this damping and number of rounds (chapter 2's reference)")
    args = ap.parse_args(argv)
    if args.reference and (args.what != "sudoku" or args.reference[1] != int(args.reference[1])):
        ap.error("--reference is for --what sudoku, with a whole number of rounds")
    P = get_profile(args.profile)
    dev = resolve_device(args.device)
    if args.what == "sudoku":
        model, head, contexts, what = sudoku_setup(P, dev, args.random_init)
    else:
        model, head, contexts, what = protein_setup(P, dev, args.length)
    layer = P.head_train.layer if args.what == "sudoku" else P.protein_head_train.layer
    print(f"{args.what} MDM ({sum(p.numel() for p in model.parameters()):,} parameters, {what}); MI head "
          f"{head.n_parameters():,} parameters; layer {layer}")
    ref_cols = f" {'reference s/ctx':>16s} {'reference/forward':>18s}" if args.reference else ""
    print(f"{'batch':>6s} {'forward s/ctx':>14s} {'head s/ctx':>12s} {'head/forward':>13s}{ref_cols}")
    per_ctx = None
    with torch.no_grad():
        for B in args.batch:
            x = contexts(B)
            fwd, hd = forward_and_head_seconds(model, head, x, layer, args.repeats)
            line = f"{B:6d} {fwd / B:14.3e} {hd / B:12.3e} {hd / fwd:13.3f}"
            if args.reference:
                from mimdm.core.timing import seconds_per_call
                from mimdm.heads.mi_head import head_inputs
                from mimdm.probing.sudoku_mi import propagated_mi

                inputs = head_inputs(model, x, layer)
                lam, rounds = args.reference[0], int(args.reference[1])
                ref = seconds_per_call(lambda: propagated_mi(inputs.probs, inputs.masked, rounds, lam, top_k=4), dev,
                                       max(1, args.repeats // 5))
                line += f" {ref / B:16.3e} {ref / fwd:18.1f}"
            print(line)
            per_ctx = (fwd + hd) / B
    if args.probe_contexts > 0:
        from mimdm.probing.exact import probe_mi

        x = contexts(args.probe_contexts)
        bt = P.probe_batch_tokens if args.what == "sudoku" else P.protein_labels.batch_tokens
        res = probe_mi(model, x, batch_tokens=bt)
        ps = res.seconds / len(x)
        print(f"probing: {float(res.nfe.float().mean()):,.0f} forward passes and {ps:.3e} s per context; forward + head "
              f"(batch {args.batch[-1]}) is {ps / per_ctx:,.0f}x faster")
    print(f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
