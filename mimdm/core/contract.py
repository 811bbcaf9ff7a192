"""The `MaskedModel` interface that every model of the study meets.

A masked diffusion model (MDM) reads integer tokens ``tokens_BL`` in which some positions hold
the mask id, and returns, for every position, logits over that position's *value set* (the V
values a position can take: 9 digits for Sudoku, 20 amino acids for proteins) together with
hidden states. Probing, the MI head, the samplers and the likelihood estimators only use this
interface, so any model that meets it (the Sudoku transformer, ESM-C, an oracle built from an
explicit joint distribution) can be studied the same way.

Token space vs value space: a model's tokens may include ids that are not values (mask, padding,
special tokens). ``value_token_ids[v]`` is the token id that writes value ``v`` into a position,
so filling position j with value v is ``tokens[:, j] = value_token_ids[v]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class MDMOutput:
    """What a `MaskedModel` returns.

    Attributes:
        logits: ``[B, L, V]`` float, unnormalised log-probabilities over the value set.
        hidden: ``[B, L, D]`` float, hidden states of the requested layer.
    """

    logits: Tensor
    hidden: Tensor


class NonFiniteOutputError(RuntimeError):
    """A model returned NaN or +inf logits, or no possible value at a masked position: an error, never a silent
    result (`MaskedModel.check_logits`)."""


class MaskedModel(nn.Module):
    """Base class of every MDM in the study.

    Subclasses set ``vocab`` (names of the V values), ``mask_id``, ``max_len``, ``hidden_dim``,
    register a buffer ``value_token_ids`` (``[V]`` long) and implement `_forward`.

    Calling the model validates its input (see `check_tokens`) and returns an `MDMOutput`.
    """

    vocab: tuple[str, ...]
    mask_id: int
    max_len: int
    hidden_dim: int
    value_token_ids: Tensor
    n_tokens: int  # size of the token space (ids 0..n_tokens-1 are accepted as input)
    precision: str = "fp32"  # "fp32" or "bf16" (autocast on CUDA); see `set_precision`

    @property
    def n_values(self) -> int:
        """V, the size of the value set."""
        return len(self.vocab)

    @property
    def device(self) -> torch.device:
        return self.value_token_ids.device

    def legal_values(self, length: int) -> Tensor:
        """Which values are legal at each position: ``[L, V]`` bool (all True by default)."""
        return torch.ones(length, self.n_values, dtype=torch.bool, device=self.device)

    def is_masked(self, tokens_BL: Tensor) -> Tensor:
        """``[B, L]`` bool, True where the token is the mask id."""
        return tokens_BL == self.mask_id

    def check_tokens(self, tokens_BL: Tensor) -> None:
        """Validate model input.

        Raises:
            TypeError: tokens are not an integer tensor.
            ValueError: wrong number of dimensions, length above ``max_len``, ids out of range.
            RuntimeError: tokens on a different device from the model.
        """
        if not isinstance(tokens_BL, Tensor) or tokens_BL.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be an int64/int32 tensor, got {getattr(tokens_BL, 'dtype', type(tokens_BL))}")
        if tokens_BL.dim() != 2:
            raise ValueError(f"tokens must have shape [B, L], got {tuple(tokens_BL.shape)}")
        if tokens_BL.shape[1] > self.max_len:
            raise ValueError(
                f"sequence length {tokens_BL.shape[1]} exceeds the model's maximum {self.max_len}; "
                "nothing is truncated silently: shorten the input"
            )
        if tokens_BL.device != self.device:
            raise RuntimeError(
                f"tokens are on {tokens_BL.device} but the model is on {self.device}; "
                "move one of them (e.g. tokens.to(model.device))"
            )
        if tokens_BL.numel() and (int(tokens_BL.min()) < 0 or int(tokens_BL.max()) >= self.n_tokens):
            raise ValueError(
                f"token ids must lie in [0, {self.n_tokens}), got range "
                f"[{int(tokens_BL.min())}, {int(tokens_BL.max())}]"
            )

    def set_precision(self, precision: str) -> "MaskedModel":
        """Compute forward passes in ``"fp32"`` or under ``"bf16"`` autocast (CUDA only).

        Under bf16 the matrix products run in bfloat16 and the returned logits and hidden states
        are cast back to float32, so everything computed from them downstream (softmax
        probabilities, entropies, probed MI, NLL) is computed in float32 or float64.
        `mimdm.probing.exact.probe_mi` switches to fp32 for its own passes (bf16 rounding would put an
        error floor near the smallest MI thresholds) and restores the setting after.
        `mimdm.models.training.train_mdm` always trains in fp32 and restores the precision after.

        Returns:
            the model (for chaining).

        Raises:
            ValueError: unknown precision.
            RuntimeError: ``"bf16"`` on a model that is not on a CUDA device with bf16 support.
        """
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
        if precision == "bf16":
            if self.device.type != "cuda":
                raise RuntimeError(f"bf16 autocast needs a CUDA device; this model is on {self.device}. Use 'fp32'")
            if not torch.cuda.is_bf16_supported():
                raise RuntimeError(f"the GPU {torch.cuda.get_device_name(self.device)} does not support bf16; use 'fp32'")
        self.precision = precision
        return self

    def forward(self, tokens_BL: Tensor, layer: int = -1) -> MDMOutput:
        """Run the MDM.

        Args:
            tokens_BL: ``[B, L]`` long token ids; masked positions hold ``mask_id``.
            layer: which layer's hidden states to return (-1: the final, normalised one;
                0: the embeddings; k: after block k).

        Returns:
            `MDMOutput` with ``logits [B, L, V]`` and ``hidden [B, L, D]``.
        """
        self.check_tokens(tokens_BL)
        if self.precision == "bf16":
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                out = self._forward(tokens_BL.long(), layer)
            out = MDMOutput(out.logits.float(), out.hidden.float())
        else:
            out = self._forward(tokens_BL.long(), layer)
        self.check_logits(out.logits, tokens_BL)
        return out

    def check_logits(self, logits_BLV: Tensor, tokens_BL: Tensor | None = None) -> None:
        """Refuse non-finite model output: every forward pass (`forward`) goes through it, so decoding, probing,
        the MI head's inputs, likelihood estimates and training all stop at the first bad pass.

        -inf is a valid logit (probability 0, e.g. an exact model ruling a value out), so only NaN, +inf, and a
        masked position of ``tokens_BL`` whose legal values (`legal_values`) are all -inf (no distribution) are
        refused.

        Raises:
            NonFiniteOutputError: NaN or +inf in ``logits_BLV`` ``[B, L, V]``, or a masked position without a
                value of positive probability.
        """
        with torch.no_grad():
            bad_BL = (torch.isnan(logits_BLV) | (logits_BLV == float("inf"))).any(-1)
            if tokens_BL is not None:
                legal = self.legal_values(logits_BLV.shape[1])
                dead_BL = (logits_BLV.masked_fill(~legal, float("-inf")) == float("-inf")).all(-1)
                bad_BL = bad_BL | (dead_BL & self.is_masked(tokens_BL))
            if bad_BL.any():
                n_seq = int(bad_BL.any(-1).sum())
                raise NonFiniteOutputError(
                    f"{type(self).__name__} returned non-finite logits (NaN, +inf, or -inf at every legal value of a "
                    f"masked position) at {int(bad_BL.sum())} positions of {n_seq} of {logits_BLV.shape[0]} sequences; "
                    "check the weights (a corrupted or diverged checkpoint) and the input")

    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:  # pragma: no cover
        raise NotImplementedError

    @torch.no_grad()
    def log_probs(self, tokens_BL: Tensor) -> Tensor:
        """``[B, L, V]`` log-probabilities (float32, or float64 if the model computes in float64), illegal values -inf."""
        return self.log_probs_from_logits(self(tokens_BL).logits)

    def log_probs_from_logits(self, logits_BLV: Tensor) -> Tensor:
        """``[B, L, V]`` log-probabilities from this model's ``[B, L, V]`` logits: float32 (float64 kept),
        illegal values (`legal_values`) -inf, log-softmax over V. `log_probs` and the decoding loop
        (`mimdm.sampling.decoding.decode`) both go through it, so a decoding step's log-probabilities are the
        ones probing would compute from the same pass."""
        if logits_BLV.dtype != torch.float64:
            logits_BLV = logits_BLV.float()
        legal = self.legal_values(logits_BLV.shape[1])
        return torch.log_softmax(logits_BLV.masked_fill(~legal, float("-inf")), dim=-1)
