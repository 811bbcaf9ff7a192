"""Benchmark: probing throughput against raw batched forward throughput, and the MI head against one forward.

    .venv/bin/python benchmarks/probing_throughput.py --profile cpu
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mimdm.app.profiles import get_profile
from mimdm.core.device import resolve_device
from mimdm.data import sudoku as sd
from mimdm.experiments import ground_truth as gt
from mimdm.experiments import mi_head as mh
from mimdm.pipelines.zoo import grids_to_tokens, profile_sudoku_mdm
from mimdm.probing.exact import probe_mi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--contexts", type=int, default=8)
    args = ap.parse_args()
    P = get_profile(args.profile)
    dev = resolve_device(args.device)
    model, rec = profile_sudoku_mdm(P, device=dev)
    rng = np.random.default_rng(0)
    grids = np.stack([sd.random_partial(s, 31, rng) for s in sd.random_solutions(args.contexts, rng)])  # 50 masked
    x = grids_to_tokens(grids, dev)
    fwd = gt.forward_throughput(model, batch=P.probe_batch_tokens // 81)
    res = probe_mi(model, x, batch_tokens=P.probe_batch_tokens)
    probe_rate = float(res.nfe.sum()) / res.seconds
    print(f"raw forward: {fwd:,.0f} passes/s; probing: {probe_rate:,.0f} passes/s (ratio {probe_rate / fwd:.2f}); "
          f"{float(res.nfe.float().mean()):.0f} passes and {res.seconds / len(x):.3f} s per 50-masked context")
    head = mh.prepare(P, model, rec["path"], ablations=False)["head"]
    c = mh.head_cost(model, head, layer=P.head_train.layer)
    print(f"MI head: {head.n_parameters():,} parameters; head pass / MDM forward = {c['head_over_forward']:.2f}; "
          f"forward + head is {c['speedup_vs_probing']:.0f}x faster than probing ({c['probing_nfe']:.0f} passes)")
    print(f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
