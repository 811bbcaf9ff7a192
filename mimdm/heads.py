"""The MI head: the whole pairwise conditional-MI matrix of an MDM in one forward pass.

A light network on the MDM's hidden states predicts I(X_i; X_j | c) for all masked pairs from a
single forward of the MDM, replacing the 1 + |M|·V passes of probing (`mimdm.probing`). It is
trained on probed ground-truth MI (`mimdm.labels`).

Architecture (`MIHead`): per-position features a_i = W2 GELU(W1 LayerNorm(h_i)) ∈ R^r; a symmetric
pair score s_ij = w · GELU(U (a_i ⊙ a_j) + c) + b; and the prediction

    MI_ij = min(H_i, H_j) · sigmoid(s_ij)      (entropy bound, default)
    MI_ij = softplus(s_ij)                      (``entropy_bound=False``)

where H_i is the model's marginal entropy at i, read from the same forward pass. I(X_i; X_j) ≤
min(H(X_i), H(X_j)) holds for any distribution, so the bound is exact, and it lets the head learn
a *fraction* of the possible dependence. The output is symmetric, non-negative, zero on the
diagonal and at unmasked positions by construction. Sizes: ``d_hidden`` 224, ``rank`` 64 give
~106K parameters at D=384 (paper: ~100K for its Sudoku MDM).

Loss (`mi_loss`): most masked pairs have MI near zero and a few are large; plain MSE is dominated
by the many near-zero pairs' noise and underfits the large values that decoding depends on. We
use MSE on the scale log1p(MI/s) (s = 0.01 nats: differences among small values still count, large
values are compressed) with a weight 1 + MI/s_w that emphasises large true MI (s_w = 0.05 nats).
The chapter compares it with plain MSE.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .artifacts import atomic_save, load_checkpoint
from .models.base import MaskedModel


@dataclass(frozen=True)
class MIHeadConfig:
    """MI head architecture: input width ``d_in`` (the MDM's hidden size), feature widths, output form."""

    d_in: int
    d_hidden: int = 224
    rank: int = 64
    entropy_bound: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class MIHead(nn.Module):
    """Hidden states ``[B, L, D]`` (+ masked ``[B, L]`` bool, entropy ``[B, L]`` nats) → MI ``[B, L, L]`` nats."""

    def __init__(self, config: MIHeadConfig):
        super().__init__()
        self.config = config
        r = config.rank
        self.norm = nn.LayerNorm(config.d_in)
        self.feat = nn.Sequential(nn.Linear(config.d_in, config.d_hidden), nn.GELU(), nn.Linear(config.d_hidden, r))
        self.pair = nn.Linear(r, r)
        self.out = nn.Linear(r, 1)
        nn.init.constant_(self.out.bias, -4.0)  # start near zero MI, where most pairs are

    def n_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters())

    def scores(self, hidden_BLD: Tensor) -> Tensor:
        """Symmetric pair scores ``[B, L, L]`` (logits of the MI fraction)."""
        a = self.feat(self.norm(hidden_BLD.float()))  # [B, L, r]
        z = a[:, :, None, :] * a[:, None, :, :]  # [B, L, L, r], symmetric in (i, j)
        return self.out(nn.functional.gelu(self.pair(z))).squeeze(-1)

    def forward(self, hidden_BLD: Tensor, masked_BL: Tensor, entropy_BL: Tensor | None = None) -> Tensor:
        """Predicted MI in nats.

        Args:
            hidden_BLD: ``[B, L, D]`` hidden states of the MDM layer the head was trained on.
            masked_BL: ``[B, L]`` bool, the masked positions.
            entropy_BL: ``[B, L]`` marginal entropies (nats); required when ``entropy_bound``.

        Returns:
            ``[B, L, L]`` float32, symmetric, ≥ 0, zero on the diagonal and at unmasked positions.

        Raises:
            ValueError: ``entropy_BL`` missing with ``entropy_bound``, or shapes disagree.
        """
        B, L, D = hidden_BLD.shape
        if D != self.config.d_in:
            raise ValueError(f"hidden size {D} does not match the head's d_in={self.config.d_in}")
        if masked_BL.shape != (B, L):
            raise ValueError(f"masked must have shape {(B, L)}, got {tuple(masked_BL.shape)}")
        s = self.scores(hidden_BLD)
        if self.config.entropy_bound:
            if entropy_BL is None:
                raise ValueError("this head bounds MI by the marginal entropies: pass entropy_BL")
            e = entropy_BL.float().clamp_min(0)
            mi = torch.minimum(e[:, :, None], e[:, None, :]) * torch.sigmoid(s)
        else:
            mi = nn.functional.softplus(s)
        m = masked_BL[:, :, None] & masked_BL[:, None, :]
        m = m & ~torch.eye(L, dtype=torch.bool, device=m.device)
        return mi * m


@torch.no_grad()
def head_inputs(model: MaskedModel, tokens_BL: Tensor, layer: int = -1) -> tuple[Tensor, Tensor, Tensor]:
    """One MDM forward pass → ``(hidden [B, L, D], masked [B, L], entropy [B, L] nats)`` for the head."""
    out = model(tokens_BL, layer=layer)
    legal = model.legal_values(tokens_BL.shape[1])
    logp = torch.log_softmax(out.logits.float().masked_fill(~legal, float("-inf")), -1)
    ent = -(logp.exp() * logp.clamp_min(-1e30)).sum(-1)
    masked = model.is_masked(tokens_BL)
    return out.hidden, masked, ent * masked


@torch.no_grad()
def predict_mi(model: MaskedModel, head: MIHead, tokens_BL: Tensor, layer: int = -1, batch_size: int = 256) -> Tensor:
    """Predicted MI ``[B, L, L]`` (nats) from one MDM forward pass per context (plus one head pass)."""
    outs = []
    for s in range(0, tokens_BL.shape[0], batch_size):
        h, m, e = head_inputs(model, tokens_BL[s:s + batch_size], layer)
        outs.append(head(h, m, e))
    return torch.cat(outs)


def mi_loss(pred_BLL: Tensor, target_BLL: Tensor, masked_BL: Tensor, kind: str = "log1p_weighted",
            scale: float = 0.01, weight_scale: float = 0.05) -> Tensor:
    """Loss over masked pairs (i < j) of a batch.

    ``kind``: ``"log1p_weighted"`` (default; see module docstring), ``"log1p"`` (no weight) or
    ``"mse"`` (plain squared error in nats²).

    Raises:
        ValueError: unknown ``kind``.
    """
    B, L, _ = pred_BLL.shape
    pairs = masked_BL[:, :, None] & masked_BL[:, None, :]
    pairs = pairs & torch.ones(L, L, dtype=torch.bool, device=pairs.device).triu(1)
    p, t = pred_BLL[pairs], target_BLL[pairs].float()
    if p.numel() == 0:
        return pred_BLL.sum() * 0.0  # no masked pair in the batch
    if kind == "mse":
        return ((p - t) ** 2).mean()
    err = (torch.log1p(p / scale) - torch.log1p(t / scale)) ** 2
    if kind == "log1p":
        return err.mean()
    if kind == "log1p_weighted":
        w = 1 + t / weight_scale
        return (w * err).sum() / w.sum()
    raise ValueError(f"unknown loss kind {kind!r}; use 'log1p_weighted', 'log1p' or 'mse'")


@dataclass(frozen=True)
class HeadTrainConfig:
    """Head training settings (epochs over the training split; early stopping on validation loss)."""

    layer: int = -1
    epochs: int = 30
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    loss: str = "log1p_weighted"
    patience: int = 5
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _batches(n: int, bs: int, rng: np.random.Generator | None):
    idx = rng.permutation(n) if rng is not None else np.arange(n)
    for s in range(0, n, bs):
        yield torch.from_numpy(idx[s:s + bs])


def evaluate_loss(head: MIHead, data: dict, layer: int, kind: str, mask_id: int, batch_size: int = 64) -> float:
    """Mean loss of ``head`` on a label split (``data`` from `mimdm.labels.load_labels`)."""
    head.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for b in _batches(len(data["tokens"]), batch_size, None):
            h = data[f"hidden_{layer}"][b]
            masked = data["tokens"][b] == mask_id
            pred = head(h, masked, data["entropy"][b])
            tot += mi_loss(pred, data["mi"][b], masked, kind).item() * len(b)
            n += len(b)
    return tot / max(1, n)


def train_head(train: dict, val: dict, head_cfg: MIHeadConfig, cfg: HeadTrainConfig, mask_id: int,
               progress: bool = True) -> tuple[MIHead, list[dict]]:
    """Train an `MIHead` on stored labels with early stopping on the validation loss.

    Args:
        train, val: label splits from `mimdm.labels.load_labels` (must contain ``hidden_<layer>``).
        mask_id: the MDM's mask token id (to recover the masked positions from ``tokens``).

    Returns:
        ``(head with the best validation loss, log)``; log entries ``{"epoch", "train_loss",
        "val_loss", "seconds"}``.

    Raises:
        KeyError: the labels do not hold hidden states of ``cfg.layer``.
    """
    key = f"hidden_{cfg.layer}"
    if key not in train:
        raise KeyError(f"labels hold no hidden states of layer {cfg.layer} (have: {[k for k in train if k.startswith('hidden_')]})")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    head = MIHead(head_cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    best, best_state, bad, log = float("inf"), None, 0, []
    t0 = time.perf_counter()
    for epoch in tqdm(range(cfg.epochs), desc="train MI head", unit="epoch", disable=not progress):
        head.train()
        losses = []
        for b in _batches(len(train["tokens"]), cfg.batch_size, rng):
            masked = train["tokens"][b] == mask_id
            pred = head(train[key][b], masked, train["entropy"][b])
            loss = mi_loss(pred, train["mi"][b], masked, cfg.loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        v = evaluate_loss(head, val, cfg.layer, cfg.loss, mask_id)
        log.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "val_loss": v,
                    "seconds": time.perf_counter() - t0})
        if v < best - 1e-6:
            best, best_state, bad = v, {k: x.clone() for k, x in head.state_dict().items()}, 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is None:
        raise RuntimeError("the validation loss was never finite: check the labels (empty validation split?)")
    head.load_state_dict(best_state)
    head.eval()
    return head, log


def save_head(head: MIHead, path: Path, train_cfg: HeadTrainConfig, log: list[dict], extra: dict | None = None) -> None:
    """Save a head checkpoint with its configs and training log (loadable with ``weights_only=True``)."""
    atomic_save({"kind": "mi_head", "state_dict": head.state_dict(), "head_config": json.dumps(head.config.to_dict()),
                 "train_config": json.dumps(train_cfg.to_dict()), "log": json.dumps(log),
                 "extra": json.dumps(extra or {})}, Path(path))


def load_head(path: Path, device="cpu") -> tuple[MIHead, dict]:
    """Load a head saved by `save_head`.

    Raises:
        FileNotFoundError: missing file. ValueError: not an MI-head checkpoint.
    """
    ck = load_checkpoint(path, device)
    if ck.get("kind") != "mi_head":
        raise ValueError(f"{path} is not an MI-head checkpoint (kind={ck.get('kind')!r})")
    head = MIHead(MIHeadConfig(**json.loads(ck["head_config"])))
    head.load_state_dict(ck["state_dict"])
    head.to(device).eval()
    rec = {k: json.loads(ck[k]) for k in ("head_config", "train_config", "log", "extra")}
    return head, rec
