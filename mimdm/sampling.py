"""Decoding (generation by unmasking) with any `MaskedModel`.

This module holds the one-at-a-time baseline used to measure a model's quality: at each step,
run the model once on the batch and unmask, in every sequence, the masked position whose
prediction is most confident (largest max-probability), with its argmax value (Ghazvininejad et
al. 2019 "Mask-Predict"; Chang et al. 2022 "MaskGIT" confidence order). NFE (number of function
evaluations: model forward passes) per sequence equals its number of masked positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .models.base import MaskedModel


@dataclass
class DecodeResult:
    """Output of a decoding run.

    Attributes:
        tokens: ``[B, L]`` long, fully unmasked.
        nfe: ``[B]`` long, model forward passes each sequence needed.
        order: ``[B, L]`` long, the step at which each position was unmasked (-1: given).
    """

    tokens: Tensor
    nfe: Tensor
    order: Tensor


@torch.no_grad()
def decode_sequential(model: MaskedModel, tokens_BL: Tensor, order: str = "confidence",
                      batch_size: int = 256) -> DecodeResult:
    """Unmask one position per step in every sequence, greedily (argmax value).

    Args:
        model: the MDM.
        tokens_BL: ``[B, L]`` long with ``model.mask_id`` at the positions to fill.
        order: ``"confidence"`` (largest max-probability first) or ``"entropy"`` (smallest
            entropy first).
        batch_size: sequences per forward pass.

    Returns:
        `DecodeResult`; ``nfe[b]`` = number of masked positions of sequence b.

    Raises:
        ValueError: unknown ``order``; and whatever `MaskedModel.check_tokens` raises.
    """
    if order not in ("confidence", "entropy"):
        raise ValueError(f"unknown order {order!r}; use 'confidence' or 'entropy'")
    model.check_tokens(tokens_BL)
    outs = []
    for s in range(0, tokens_BL.shape[0], batch_size):
        x = tokens_BL[s:s + batch_size].clone()
        B, L = x.shape
        step_of = torch.full((B, L), -1, dtype=torch.long, device=x.device)
        nfe = torch.zeros(B, dtype=torch.long, device=x.device)
        step = 0
        while True:
            masked = model.is_masked(x)
            active = masked.any(1)
            if not active.any():
                break
            logp = model.log_probs(x)  # [B, L, V]
            p = logp.exp()
            if order == "confidence":
                score = p.max(-1).values
            else:
                score = -(p * logp.clamp_min(-1e30)).sum(-1).nan_to_num(0.0)
                score = -score
            score = score.masked_fill(~masked, float("-inf"))
            pos = score.argmax(1)  # [B]
            val = logp.argmax(-1).gather(1, pos[:, None]).squeeze(1)
            rows = torch.nonzero(active).squeeze(1)
            x[rows, pos[rows]] = model.value_token_ids[val[rows]]
            step_of[rows, pos[rows]] = step
            nfe[rows] += 1
            step += 1
        outs.append(DecodeResult(x, nfe, step_of))
    return DecodeResult(*(torch.cat([getattr(o, f) for o in outs]) for f in ("tokens", "nfe", "order")))
