"""Any Hugging Face masked language model as an MDM: `HFMaskedLM` wraps an ``AutoModelForMaskedLM`` (ESM-2 through
``EsmForMaskedLM``, BERT-style protein models, ...) behind the `MaskedModel` contract, over a value set (default the
20 amino acids, `mimdm.data.protein.AMINO_ACIDS`).

Inputs hold the sequence positions only: the adapter adds the tokenizer's start token (``<cls>``/``[CLS]``) and end
token (``<eos>``/``[SEP]``) around them, reads the logits of the value tokens only (ESM-2's 33-token vocabulary is
restricted to the 20 amino acids: ``X``, ``B``, ``U``, ``Z``, ``O``, gaps and special tokens are never predicted)
and the hidden states of a chosen layer (0: embeddings, k: after block k, -1: the model's final hidden state).

Weights are read from the local Hugging Face cache or a folder written by ``save_pretrained`` (`load_hf_masked_lm`);
nothing is downloaded, and a missing model is an error that says where it looked.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from mimdm.core.contract import MaskedModel, MDMOutput
from mimdm.core.device import resolve_device
from mimdm.data.protein import AMINO_ACIDS, MASK_CHAR, validate_sequence


class HFMaskedLM(MaskedModel):
    """A Hugging Face masked LM as an MDM over ``vocab`` (one token of the tokenizer per value).

    Args:
        hf_model: a ``transformers`` masked-LM module (``AutoModelForMaskedLM``), set to eval mode here.
        tokenizer: its tokenizer; must have a mask token and a token for every value of ``vocab``.
        vocab: the value set (default the 20 amino acids, in `AMINO_ACIDS` order).
        max_len: longest input in positions (default: the model's ``max_position_embeddings`` less the start and
            end tokens; without that setting, 1024).
        source: what it was loaded from (for messages).

    Raises:
        ValueError: the tokenizer has no mask token, a value has no token of its own (unknown to the tokenizer),
            or the model's vocabulary is smaller than the tokenizer's ids.
    """

    def __init__(self, hf_model, tokenizer, vocab: Sequence[str] = tuple(AMINO_ACIDS), max_len: int | None = None,
                 source: str = "model"):
        super().__init__()
        if tokenizer.mask_token_id is None:
            raise ValueError(f"{source}: the tokenizer has no mask token; not a masked language model")
        vocab = tuple(vocab)
        ids = tokenizer.convert_tokens_to_ids(list(vocab))
        unknown = [v for v, i in zip(vocab, ids) if i is None or i == tokenizer.unk_token_id]
        if unknown:
            raise ValueError(f"{source}: the tokenizer has no token of its own for {unknown[:5]} (values {''.join(vocab)})")
        cfg = hf_model.config
        if max(ids + [tokenizer.mask_token_id]) >= cfg.vocab_size:
            raise ValueError(f"{source}: token ids reach {max(ids)} but the model's vocabulary has {cfg.vocab_size}")
        self.hf = hf_model.eval()
        self.source = source
        self.vocab = vocab
        self.mask_id = int(tokenizer.mask_token_id)
        self.n_tokens = int(cfg.vocab_size)
        self.hidden_dim = int(cfg.hidden_size)
        self.n_layers = int(cfg.num_hidden_layers)
        start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        self.prefix = [] if start is None else [int(start)]
        self.suffix = [] if end is None else [int(end)]
        n_pos = getattr(cfg, "max_position_embeddings", None)
        self.max_len = int(max_len if max_len is not None else
                           (n_pos - len(self.prefix) - len(self.suffix) if n_pos else 1024))
        self.register_buffer("value_token_ids", torch.tensor(ids, dtype=torch.long), persistent=False)
        allowed = torch.zeros(self.n_tokens, dtype=torch.bool)
        allowed[ids] = True
        allowed[self.mask_id] = True
        self.register_buffer("_allowed", allowed, persistent=False)
        self._letters = {i: v for v, i in zip(vocab, ids)} | {self.mask_id: MASK_CHAR}

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())

    # ------------------------------------------------------------------ tokens
    def encode(self, seqs: str | Sequence[str]) -> Tensor:
        """Sequences -> ``[B, L]`` long token ids on the model's device; ``_`` (`MASK_CHAR`) encodes the mask.

        Raises:
            ValueError: no sequence, unequal lengths, or an invalid sequence (for the amino-acid value set:
                `validate_sequence`; otherwise a character outside ``vocab``), named with its position.
        """
        seqs = [seqs] if isinstance(seqs, str) else list(seqs)
        if not seqs:
            raise ValueError("no sequences to encode")
        table = {v: i for i, v in self._letters.items()}
        for n, s in enumerate(seqs):
            if self.vocab == tuple(AMINO_ACIDS):
                try:
                    validate_sequence(s, max_len=self.max_len, allow_mask=True)
                except ValueError as e:
                    raise ValueError(f"sequence {n}: {e}") from None
            bad = next((j for j, c in enumerate(s) if c not in table), None)
            if bad is not None:
                raise ValueError(f"sequence {n}: {s[bad]!r} at position {bad} is not one of {''.join(self.vocab)} "
                                 f"or the mask {MASK_CHAR!r}")
        lens = sorted({len(s) for s in seqs})
        if len(lens) > 1:
            raise ValueError(f"sequences must have equal lengths to form a [B, L] batch, got lengths {lens}")
        return torch.tensor([[table[c] for c in s] for s in seqs], dtype=torch.long, device=self.device)

    def decode(self, tokens_BL: Tensor) -> list[str]:
        """``[B, L]`` (or ``[L]``) token ids -> strings (``_`` for the mask).

        Raises:
            ValueError: an id that is neither a value nor the mask.
        """
        if tokens_BL.dim() == 1:
            tokens_BL = tokens_BL[None]
        self._check_value_ids(tokens_BL)
        return ["".join(self._letters[i] for i in row) for row in tokens_BL.tolist()]

    def _check_value_ids(self, tokens_BL: Tensor) -> None:
        if tokens_BL.numel() == 0:
            return
        bad = ~self._allowed.to(tokens_BL.device)[tokens_BL.clamp(0, self.n_tokens - 1)]
        if bad.any():
            b, j = (int(x) for x in torch.nonzero(bad)[0])
            raise ValueError(f"token id {int(tokens_BL[b, j])} at [{b}, {j}] is not a value ({''.join(self.vocab)}) "
                             f"or the mask ({self.mask_id}); inputs hold sequence positions only (the adapter adds "
                             "the start and end tokens)")

    def check_tokens(self, tokens_BL: Tensor) -> None:
        """`MaskedModel.check_tokens`, and every id must be a value token or the mask."""
        super().check_tokens(tokens_BL)
        self._check_value_ids(tokens_BL)

    # ------------------------------------------------------------------ forward
    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:
        if not -1 <= layer <= self.n_layers:
            raise ValueError(f"layer must be -1 or in [0, {self.n_layers}], got {layer}")
        B, L = tokens_BL.shape
        parts = ([tokens_BL.new_full((B, 1), self.prefix[0])] if self.prefix else []) + [tokens_BL] + \
            ([tokens_BL.new_full((B, 1), self.suffix[0])] if self.suffix else [])
        x = torch.cat(parts, dim=1)
        out = self.hf(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True)
        p = len(self.prefix)
        hidden = out.hidden_states[-1 if layer == -1 else layer][:, p:p + L]
        logits = out.logits[:, p:p + L][..., self.value_token_ids]
        return MDMOutput(logits=logits, hidden=hidden)


def load_hf_masked_lm(name_or_path: str | Path, vocab: Sequence[str] = tuple(AMINO_ACIDS), device="cpu",
                      cache_dir: str | Path | None = None) -> HFMaskedLM:
    """A Hugging Face masked LM from a local folder (``save_pretrained``) or the local Hugging Face cache, as an
    `HFMaskedLM` on ``device`` (checked by `mimdm.core.device.resolve_device`). Never downloads.

    Raises:
        FileNotFoundError: neither a folder nor a cached model of that name (the message says where it looked and
            how to provide it).
        ValueError: as `HFMaskedLM` (not a masked LM, values without tokens).
    """
    # transformers takes seconds to import: only when a model is loaded
    from huggingface_hub import constants
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    dev = resolve_device(device)
    name = str(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True, cache_dir=cache_dir)
        hf = AutoModelForMaskedLM.from_pretrained(name, local_files_only=True, cache_dir=cache_dir)
    except (OSError, ValueError) as e:
        where = cache_dir or os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
        raise FileNotFoundError(
            f"no Hugging Face masked LM {name!r}: not a folder written by save_pretrained and not in the local cache "
            f"{where} ({type(e).__name__}). On a machine with network access run `huggingface-cli download {name}` "
            "and copy the cache here (or set HF_HUB_CACHE), or pass the folder of `save_pretrained`") from None
    return HFMaskedLM(hf, tok, vocab, source=name).to(dev).eval()
