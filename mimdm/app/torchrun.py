"""``[torchrun --nproc_per_node N] python -m mimdm.app.torchrun {labels,head}``: the profile's MI labels and MI head
on several processes (`mimdm.pipelines.distributed` holds the protocol)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mimdm.app.profiles import PROFILES, get_profile
from mimdm.core.distributed import DistInfo, barrier, broadcast, init_distributed
from mimdm.core.keys import mi_head_dir
from mimdm.experiments.mi_head import head_config_for, sudoku_symmetry_augment, with_marginals
from mimdm.heads.mi_head import train_head
from mimdm.pipelines.distributed import generate_labels_distributed
from mimdm.pipelines.labels import label_dir, load_labels
from mimdm.pipelines.zoo import profile_sudoku_mdm


def _model_of_profile(profile, info: DistInfo, device: str | None):
    """The profile's Sudoku MDM on every rank: rank 0 loads or trains it first, the others then load it."""
    if device is None:
        device = f"cuda:{info.local_rank}" if torch.cuda.is_available() else "cpu"
    if info.is_main:
        out = profile_sudoku_mdm(profile, device=device, progress=True)
    barrier(info)
    if not info.is_main:
        out = profile_sudoku_mdm(profile, device=device, progress=False, train=False)
    return out


def main(argv: list[str] | None = None) -> int:
    """``[torchrun --nproc_per_node N] python -m mimdm.app.torchrun {labels,head} --profile P [--device D]``.

    ``labels``: the profile's MDM (rank 0 trains it if it is not cached, the others wait), then its
    label set in `mimdm.pipelines.labels.label_dir`, shards spread over the ranks. ``head``: the label set
    (generated first if incomplete), then the profile's main MI head with `mimdm.heads.mi_head.train_head`, saved
    by rank 0 at `head_artifact_path`. Prints the paths on rank 0.
    """
    ap = argparse.ArgumentParser(prog="python -m mimdm.app.torchrun",
                                 description="MI labels / MI head on several processes (run under torchrun).")
    ap.add_argument("what", choices=["labels", "head"])
    ap.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    ap.add_argument("--device", default=None, help="cpu | cuda:N (default: cuda:LOCAL_RANK if CUDA is available, else cpu)")
    ap.add_argument("--backend", default=None, help="gloo | nccl (default: nccl for CUDA devices, else gloo)")
    ap.add_argument("--max-new-shards", type=int, default=None, help="labels: compute at most this many shards now")
    args = ap.parse_args(argv)

    p = get_profile(args.profile)
    dev = args.device
    if dev is None:
        dev = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("nccl" if str(dev).startswith("cuda") else "gloo")
    info = init_distributed(backend)
    model, rec = _model_of_profile(p, info, dev)
    model_dir = Path(rec["path"]).parent
    if info.is_main:
        label_dir(model_dir, p.labels)  # creates the folder and its config.json once
    barrier(info)
    labels = label_dir(model_dir, p.labels)
    rep = generate_labels_distributed(model, p.labels, labels, max_new_shards=args.max_new_shards)
    if info.is_main:
        print(f"[mimdm] MI labels ({'complete' if rep.complete else 'incomplete'}; computed now "
              f"{rep.all_computed} on {info.world_size} process(es)) -> {labels}", flush=True)
    if args.what == "head":
        if not rep.complete:
            raise SystemExit("the label set is incomplete (--max-new-shards?): run `labels` until it is complete")
        hcfg = head_config_for(p, model)
        path = mi_head_dir(labels, hcfg.to_dict(), p.head_train.to_dict(), world_size=info.world_size) / "head.pt" if info.is_main else None
        path = broadcast(path, info)
        if path.exists():
            if info.is_main:
                print(f"[mimdm] MI head already trained -> {path}", flush=True)
        else:
            # alone: on the CPU, like load_or_train_head (bit-identical, so the shared cache path is right)
            train_dev = dev if (backend == "nccl" and info.active) else "cpu"
            augment = None
            if p.head_train.augment == "sudoku_symmetry":
                augment = lambda split, rng: sudoku_symmetry_augment(model, split, p.head_train.layer, rng)  # noqa: E731
            train, val = load_labels(labels, "train"), load_labels(labels, "val")
            if hcfg.constraint_feature:
                train, val = with_marginals(model, train), with_marginals(model, val)
            train_head(train, val, hcfg, p.head_train, model.mask_id, progress=info.is_main, save_path=path,
                       device=train_dev, augment=augment)
            if info.is_main:
                print(f"[mimdm] MI head (DDP x{info.world_size}) -> {path}", flush=True)
    if info.active:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
