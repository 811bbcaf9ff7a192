#!/usr/bin/env python
"""Sweep MI-head variants on the shipped `cpu` Sudoku label set (issue 20: test Pearson >= 0.95), on a GPU.

Loads the shipped Sudoku MDM (`checkpoints/cpu/sudoku_mdm`) and unpacks its shipped label set
(`checkpoints/cpu/sudoku_labels`: hidden states recomputed in fp32) into a temporary folder, then trains each
variant on the training split (AdamW, one-cycle learning rate, `mimdm.heads.mi_head.mi_loss`, the head with the best
validation loss kept) and reports Pearson of predicted vs probed MI over masked pairs on the training, validation
and test splits (`mimdm.experiments.mi_head.accuracy`). Its training loop is not `mimdm.heads.mi_head.train_head`: it
clips gradients at norm 1, starts the one-cycle warm-up over the first 10% of steps and validates at twenty points of
the run, so its row "shipped training" compares with the other rows of the sweep, not with the book's head. Variants: the shipped bilinear head (`MIHead`) at the shipped
and at longer training, and `TrunkHead`s: K pre-norm transformer layers over the MDM's hidden states before the
same bilinear head, asking whether a head that can combine cells before pairing them fits what one bilinear form
on the last hidden states does not; and `AttentionPairHead`s, which add the MDM's own attention probabilities of every
layer and head (`mimdm.models.sudoku.SudokuMDM.attention_maps`, computed anyway by a decoding pass) and their two-hop
products to the pair features, asking whether the attention pattern tells the head what the hidden states do not;
and the shipped head trained on Sudoku-symmetry-augmented contexts (`mimdm.experiments.mi_head.sudoku_symmetry_augment`:
every epoch a fresh symmetry of each training context, hidden states recomputed by the MDM, MI labels permuted),
asking whether the bilinear head is short of data rather than of capacity. Results are written after each variant to ``--out``/head_sweep.json; a variant
is skipped when the time left (``--budget-s``) is under its estimate.

    PYTHONPATH=. python3 scripts/head_sweep.py --device cuda --out $OUT --budget-s 240
    .venv/bin/python scripts/head_sweep.py --device cpu --only attention --budget-s 1800   # the CPU record
    .venv/bin/python scripts/head_sweep.py --device cpu --only augmentation --threads 1 --budget-s 3600
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimdm.app.profiles import get_profile  # noqa: E402
from mimdm.core.artifacts import git_commit  # noqa: E402
from mimdm.experiments.mi_head import accuracy, head_config_for, sudoku_symmetry_augment  # noqa: E402
from mimdm.heads.mi_head import MIHead, mi_loss  # noqa: E402
from mimdm.pipelines.labels import PACKED, load_labels, unpack_labels  # noqa: E402
from mimdm.pipelines.zoo import load_sudoku_mdm  # noqa: E402


class TrunkHead(nn.Module):
    """``layers`` pre-norm transformer layers (width ``d_model``, 4 heads, all 81 cells attended) over the projected
    hidden states plus a learned position and masked-or-not embedding, then the bilinear `MIHead` on the result."""

    def __init__(self, d_in: int, d_model: int, layers: int, head_cfg):
        super().__init__()
        self.proj = nn.Linear(d_in, d_model)
        self.pos = nn.Parameter(torch.randn(81, d_model) * 0.02)
        self.kind = nn.Parameter(torch.zeros(2, d_model))
        layer = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.trunk = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = MIHead(replace(head_cfg, d_in=d_model))

    def forward(self, hidden_BLD, masked_BL, entropy_BL):
        x = self.proj(hidden_BLD.float()) + self.pos + self.kind[masked_BL.long()]
        return self.head(self.trunk(x), masked_BL, entropy_BL)


class AttentionPairHead(nn.Module):
    """Pair features from the MDM's attention (``n_maps`` = 0: none, the same MLP on the bilinear units alone): for every layer and head n, log(A^n_ij + 1e-4) and log(A^n_ji + 1e-4),
    and (``two_hop``) log((S^n S^nᵀ)_ij + 1e-4) with S^n = A^n + A^nᵀ summed over masked k only; (``hidden``) plus the
    shipped head's bilinear units, SiLU(a_ic · a_jc / √r + e_ic · e_jc) for C channels of rank r from the last hidden
    states. A two-layer MLP of width ``width`` maps each pair's features to a logit s_ij (symmetrised), and
    MI_ij = (H_i + H_j)/2 · sigmoid(s_ij) on masked pairs, as the shipped head's ``bound="mean"``."""

    uses_attention = True

    def __init__(self, n_maps: int, d_in: int, hidden: bool, two_hop: bool, channels: int = 8, rank: int = 16,
                 width: int = 32):
        super().__init__()
        self.n_maps, self.hidden, self.two_hop, self.channels, self.rank = n_maps, hidden, two_hop, channels, rank
        n_in = n_maps * (3 if two_hop else 2) + (channels if hidden else 0)
        if hidden:
            self.norm = nn.LayerNorm(d_in)
            self.feat = nn.Sequential(nn.Linear(d_in, 128), nn.GELU(), nn.Linear(128, channels * rank))
            self.pos = nn.Parameter(torch.randn(81, channels, 4) * 0.5)
        self.mlp = nn.Sequential(nn.Linear(n_in, width), nn.SiLU(), nn.Linear(width, 1))
        nn.init.constant_(self.mlp[-1].bias, -4.0)

    def forward(self, hidden_BLD, masked_BL, entropy_BL, attn_BNLL):
        B, L, _ = hidden_BLD.shape
        feats = []
        if self.n_maps:
            A = attn_BNLL.float()
            logA = torch.log(A + 1e-4)
            feats += [logA, logA.transpose(-1, -2)]
        if self.two_hop and self.n_maps:
            S = (A + A.transpose(-1, -2)) * masked_BL[:, None, None, :].float()
            feats.append(torch.log(S @ S.transpose(-1, -2) + 1e-4))
        if self.hidden:
            a = self.feat(self.norm(hidden_BLD.float())).view(B, L, self.channels, self.rank).transpose(1, 2)
            a = a * self.rank ** -0.25
            e = self.pos.transpose(0, 1)
            feats.append(F.silu(a @ a.transpose(-1, -2) + e @ e.transpose(-1, -2)))
        s = self.mlp(torch.cat(feats, 1).permute(0, 2, 3, 1)).squeeze(-1)  # [B, L, L]
        s = (s + s.transpose(1, 2)) / 2
        pairs = masked_BL[:, :, None] & masked_BL[:, None, :] & ~torch.eye(L, dtype=torch.bool, device=s.device)
        return (entropy_BL[:, :, None] + entropy_BL[:, None, :]) / 2 * torch.sigmoid(s) * pairs


def to_device(data: dict, layer: int, mask_id: int, device, model=None) -> dict:
    """A label split on ``device``: ``h`` hidden states [N, L, D], ``m`` masked [N, L] bool, ``e`` entropies [N, L] nats,
    ``mi`` probed MI [N, L, L] nats; with ``model``, also ``a``: its attention probabilities [N, layers·heads, L, L]
    (float16, `SudokuMDM.attention_maps`)."""
    d = {"h": data[f"hidden_{layer}"].to(device), "m": (data["tokens"] == mask_id).to(device),
         "e": data["entropy"].to(device), "mi": data["mi"].to(device)}
    if model is not None:
        tok = data["tokens"].long().to(device)
        d["a"] = torch.cat([model.attention_maps(tok[s:s + 64])[0].flatten(1, 2).half() for s in range(0, len(tok), 64)])
    return d


def call(net, d: dict, b) -> torch.Tensor:
    """``net`` on the rows ``b`` (a slice or an index tensor) of split ``d``."""
    if getattr(net, "uses_attention", False):
        return net(d["h"][b], d["m"][b], d["e"][b], d["a"][b])
    return net(d["h"][b], d["m"][b], d["e"][b])


@torch.no_grad()
def predict(net, d: dict, bs: int = 128) -> torch.Tensor:
    """Predicted MI [N, L, L] nats (on the CPU) of a split from `to_device`, in batches of ``bs``."""
    net.eval()
    return torch.cat([call(net, d, slice(s, s + bs)).cpu() for s in range(0, len(d["h"]), bs)])


def fit(net, tr: dict, va: dict, epochs: int, lr: float, bs: int = 32, wd: float = 0.01, seed: int = 0,
        augment=None) -> float:
    """Train ``net`` in place on split ``tr`` (see the module docstring); returns the best validation `mi_loss` on ``va``,
    whose weights ``net`` ends with. ``augment``: if given, ``augment(rng)`` returns each epoch's training split in
    place of ``tr`` (as many contexts; ``rng`` seeded with ``[seed, 1]``). Raises FloatingPointError when no
    validation loss was finite."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    aug_rng = np.random.default_rng([seed, 1])
    stored = tr
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=wd)
    n = len(tr["h"])
    steps = math.ceil(n / bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * steps, pct_start=0.1)
    best, best_state = math.inf, None
    for ep in range(epochs):
        if augment is not None:
            tr = augment(aug_rng)
            assert len(tr["h"]) == len(stored["h"])
        net.train()
        perm = torch.from_numpy(rng.permutation(n)).to(tr["h"].device)
        for s in range(0, n, bs):
            b = perm[s:s + bs]
            loss = mi_loss(call(net, tr, b), tr["mi"][b], tr["m"][b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
        if (ep + 1) % max(1, epochs // 20) == 0 or ep == epochs - 1:
            net.eval()
            with torch.no_grad():
                v = float(mi_loss(predict(net, va).to(va["h"].device), va["mi"], va["m"]))
            if v < best:
                best, best_state = v, {k: x.detach().clone() for k, x in net.state_dict().items()}
    if best_state is None:
        raise FloatingPointError("the validation loss was never finite")
    net.load_state_dict(best_state)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("head_sweep_out"))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every variant's epochs (a CPU dry run: 0.02)")
    ap.add_argument("--only", default=None, help="run only the variants whose name contains this text")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    profile = get_profile("cpu")
    model, _ = load_sudoku_mdm(ROOT / "checkpoints/cpu/sudoku_mdm/model.pt", device=dev)
    model.set_precision("fp32")
    tmp = Path(tempfile.mkdtemp())
    (tmp / PACKED).write_bytes((ROOT / "checkpoints/cpu/sudoku_labels" / PACKED).read_bytes())
    unpack_labels(model, profile.labels, tmp)
    layer, mask_id = profile.head_train.layer, model.mask_id
    cpu = {s: load_labels(tmp, s) for s in ("train", "val", "test")}
    hcfg = head_config_for(profile, model)
    rec = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "commit": git_commit(), "only": args.only, "threads": torch.get_num_threads(),
           "labels": {s: int(len(cpu[s]["tokens"])) for s in cpu}, "head_config": hcfg.to_dict(),
           "shipped_train": profile.head_train.to_dict(), "setup_s": time.perf_counter() - t0, "variants": []}
    print(json.dumps({k: rec[k] for k in ("device", "labels", "setup_s")}), flush=True)
    lr0 = profile.head_train.lr
    variants = [  # (name, builder, epochs, lr, estimated seconds on an H200)
        ("shipped bilinear, shipped training", lambda: MIHead(hcfg), profile.head_train.epochs, lr0, 10),
        ("shipped bilinear, 300 epochs", lambda: MIHead(hcfg), 300, lr0, 60),
        ("trunk 2x64 + bilinear, 150 epochs", lambda: TrunkHead(hcfg.d_in, 64, 2, hcfg), 150, 2e-3, 40),
        ("trunk 4x64 + bilinear, 150 epochs", lambda: TrunkHead(hcfg.d_in, 64, 4, hcfg), 150, 2e-3, 50),
        ("trunk 2x128 + bilinear, 150 epochs", lambda: TrunkHead(hcfg.d_in, 128, 2, hcfg), 150, 1e-3, 45),
        ("trunk 4x128 + bilinear, 200 epochs", lambda: TrunkHead(hcfg.d_in, 128, 4, hcfg), 200, 1e-3, 70),
        ("attention maps only, 40 epochs", lambda: AttentionPairHead(n_maps, hcfg.d_in, False, False), 40, 5e-3, 8),
        ("attention maps + bilinear units, 40 epochs", lambda: AttentionPairHead(n_maps, hcfg.d_in, True, False), 40,
         5e-3, 10),
        ("attention maps + two-hop + bilinear units, 40 epochs",
         lambda: AttentionPairHead(n_maps, hcfg.d_in, True, True), 40, 5e-3, 12),
        ("attention-head MLP on the bilinear units alone (no maps), 40 epochs",
         lambda: AttentionPairHead(0, hcfg.d_in, True, False), 40, 5e-3, 8),
        ("shipped bilinear + symmetry augmentation, 200 epochs", lambda: MIHead(hcfg), 200, lr0, 120),
    ]
    n_maps = model.config.n_layers * model.config.n_heads
    if args.only is not None:
        variants = [v for v in variants if args.only in v[0]]
        if not variants:
            ap.error(f"no variant's name contains {args.only!r}")
    attention = any("attention" in v[0] for v in variants)
    gpu = {s: to_device(cpu[s], layer, mask_id, dev, model if attention else None) for s in cpu}
    rec["setup_s"] = time.perf_counter() - t0
    for name, build, epochs, lr, est in variants:
        epochs = max(2, int(round(epochs * args.scale)))
        left = args.budget_s - (time.perf_counter() - t0)
        if left < est * args.scale:
            print(f"skip {name}: {left:.0f} s left", flush=True)
            rec["variants"].append({"name": name, "skipped": f"{left:.0f} s left"})
            continue
        t1 = time.perf_counter()
        torch.manual_seed(0)
        net = build().to(dev)
        augment = None
        if "symmetry augmentation" in name:  # a fresh Sudoku symmetry of every training context each epoch
            def augment(rng):
                return to_device(sudoku_symmetry_augment(model, cpu["train"], layer, rng), layer, mask_id, dev)
        best_val = fit(net, gpu["train"], gpu["val"], epochs, lr, augment=augment)
        row = {"name": name, "parameters": sum(p.numel() for p in net.parameters()), "epochs": epochs, "lr": lr,
               "best_val_loss": best_val}
        for s in ("train", "val", "test"):
            acc = accuracy(predict(net, gpu[s]), cpu[s], mask_id)
            row[f"{s}_pearson"] = acc["overall"]["pearson"]
            if s == "test":
                row["test_by_rate"] = [{k: r[k] for k in ("mask_rate_lo", "mask_rate_hi", "pearson")} for r in acc["by_rate"]]
        row["seconds"] = time.perf_counter() - t1
        rec["variants"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "test_by_rate"}), flush=True)
        rec["total_s"] = time.perf_counter() - t0
        (args.out / "head_sweep.json").write_text(json.dumps(rec, indent=1) + "\n")
    rec["total_s"] = time.perf_counter() - t0
    (args.out / "head_sweep.json").write_text(json.dumps(rec, indent=1) + "\n")  # with the variants skipped at the end
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
