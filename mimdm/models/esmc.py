"""ESM-C (EvolutionaryScale's ESM Cambrian protein language model) behind the `MaskedModel` interface.

ESM-C is a bidirectional transformer trained with a masked-language-model objective, i.e. a
masked diffusion model over amino acids. `ESMCMDM` wraps ``esm.models.esmc.ESMC`` (package
``esm`` 3.2.1.post1, built with ``use_flash_attn=False``) so that callers see only the protein:

* input tokens ``[B, L]`` are ESM-C token ids of the L residues: the 20 amino-acid ids
  (``value_token_ids``, `AMINO_ACIDS` order: A5 C23 D13 E9 F18 G6 H21 I12 K15 L4 M20 N17 P14
  Q16 R10 S8 T11 V7 W22 Y19) or the mask id 32 (``<mask>``); any other id (``<cls>`` 0,
  ``<pad>`` 1, ``<eos>`` 2, ``<unk>`` 3, X/B/U/Z/O, gaps, ``|``) is refused;
* the adapter adds ``<cls>`` before and ``<eos>`` after the sequence and strips them from the
  outputs;
* logits are ESM-C's sequence logits restricted to the 20 amino-acid columns: ``[B, L, 20]``;
* hidden states follow the `MaskedModel` convention: ``layer=-1`` the final embeddings (after
  the last LayerNorm), ``layer=0`` the token embeddings, ``layer=k`` (1..n_layers) the output
  of block k (ESM-C's ``hidden_states[k - 1]``).

Weights: ESM C 300M (d_model 960, 15 heads, 30 layers; 332,997,184 parameters) under the
Cambrian Open License, Hugging Face repository ``EvolutionaryScale/esmc-300m-2024-12``, file
``data/weights/esmc_300m_2024_12_v0.pth``. `ESMCMDM.load` reads it from a local path or the
Hugging Face cache; nothing is downloaded when the hub is offline (``HF_HUB_OFFLINE=1``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from mimdm.core.contract import MaskedModel, MDMOutput
from mimdm.core.device import resolve_device
from mimdm.data.protein import AMINO_ACIDS, MASK_CHAR, validate_sequence

CLS_ID, PAD_ID, EOS_ID, MASK_ID = 0, 1, 2, 32
N_ESMC_TOKENS = 33  # ESM-C vocabulary (the embedding has 64 rows; ids >= 33 are unused)
ESMC_300M = {"d_model": 960, "n_heads": 15, "n_layers": 30}
HF_REPO_300M = "EvolutionaryScale/esmc-300m-2024-12"
WEIGHTS_300M = "data/weights/esmc_300m_2024_12_v0.pth"
# residues: a 2048-token window minus <cls>/<eos>. ESM-C uses rotary position embeddings, so this is
# the study's limit (memory, and lengths beyond those seen in training), not one stored in the weights.
DEFAULT_MAX_LEN = 2046


@lru_cache(maxsize=1)
def _tokenizer():
    """The ESM-C sequence tokenizer (built once; about a second)."""
    from esm.tokenization import get_esmc_model_tokenizers

    return get_esmc_model_tokenizers()


class ESMCMDM(MaskedModel):
    """ESM-C as an MDM over the 20 standard amino acids (see the module docstring).

    Args:
        d_model, n_heads, n_layers: ESM-C architecture (300M: 960, 15, 30).
        max_len: longest protein accepted, in residues (the base class refuses longer input).

    Attributes:
        esmc: the wrapped ``ESMC`` module (its ``state_dict`` is the official weights' format).
        config: ``{"d_model", "n_heads", "n_layers"}``.
    """

    vocab = tuple(AMINO_ACIDS)
    mask_id = MASK_ID
    n_tokens = N_ESMC_TOKENS

    def __init__(self, d_model: int, n_heads: int, n_layers: int, max_len: int = DEFAULT_MAX_LEN):
        super().__init__()
        from esm.models.esmc import ESMC

        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        tok = _tokenizer()
        ids = tok.convert_tokens_to_ids(list(AMINO_ACIDS))
        specials = (tok.cls_token_id, tok.pad_token_id, tok.eos_token_id, tok.mask_token_id)
        if specials != (CLS_ID, PAD_ID, EOS_ID, MASK_ID) or len(tok.get_vocab()) != N_ESMC_TOKENS:
            raise RuntimeError(f"unexpected ESM-C tokenizer (special ids {specials}); this adapter expects esm 3.2.1")
        self.esmc = ESMC(d_model, n_heads, n_layers, tok, use_flash_attn=False)
        self.config = {"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers}
        self.hidden_dim = d_model
        self.max_len = max_len
        self.register_buffer("value_token_ids", torch.tensor(ids, dtype=torch.long), persistent=False)
        allowed = torch.zeros(N_ESMC_TOKENS, dtype=torch.bool)
        allowed[ids] = True
        allowed[MASK_ID] = True
        self.register_buffer("_allowed", allowed, persistent=False)
        letters = [""] * N_ESMC_TOKENS
        for c, i in zip(AMINO_ACIDS, ids):
            letters[i] = c
        letters[MASK_ID] = MASK_CHAR
        self._letters = letters

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_config(cls, d_model: int, n_heads: int, n_layers: int, max_len: int = DEFAULT_MAX_LEN) -> "ESMCMDM":
        """Randomly initialised ESM-C of the given architecture (uses the global torch RNG)."""
        return cls(d_model, n_heads, n_layers, max_len=max_len)

    @classmethod
    def tiny(cls, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, seed: int = 0,
             max_len: int = DEFAULT_MAX_LEN) -> "ESMCMDM":
        """A small randomly initialised ESM-C for tests (d=64, 2 layers: ~144K parameters).

        The initialisation depends only on ``seed``; the global RNG state is left unchanged.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(d_model, n_heads, n_layers, max_len=max_len).eval()

    @classmethod
    def load(cls, name_or_path: str | Path = "esmc_300m", device: str | torch.device | None = "cpu",
             d_model: int | None = None, n_heads: int | None = None, n_layers: int | None = None,
             max_len: int = DEFAULT_MAX_LEN, cache_dir: str | Path | None = None,
             local_files_only: bool | None = None) -> "ESMCMDM":
        """Load pretrained ESM-C weights, in eval mode.

        Args:
            name_or_path: ``"esmc_300m"`` (the Hugging Face repository ``EvolutionaryScale/esmc-300m-2024-12``,
                read from the local Hugging Face cache, downloaded only if the hub is reachable
                and not offline); a state-dict file (``.pth``/``.pt``, ESM-C keys as in the
                official file, or this adapter's ``state_dict()`` with ``esmc.`` prefixes); or a
                directory holding ``data/weights/esmc_300m_2024_12_v0.pth`` (a snapshot of the
                repository).
            device: ``"cpu"``, ``"cuda"``, ``"auto"`` (see `mimdm.core.device.resolve_device`).
            d_model, n_heads, n_layers: architecture of a local state dict (default: 300M,
                960/15/30).
            max_len: longest protein accepted, in residues.
            cache_dir: Hugging Face cache directory for ``"esmc_300m"`` (default: the hub's,
                ``$HF_HOME/hub``).
            local_files_only: never use the network (default: the hub's ``HF_HUB_OFFLINE``).

        Returns:
            `ESMCMDM` on ``device``, float32, eval mode.

        Raises:
            FileNotFoundError: ``name_or_path`` is not "esmc_300m" and does not exist; the directory lacks the weights file; the
                300M weights are neither in the cache nor downloadable (the message names where it
                looked and how to provide them).
            ValueError: the file is not a state dict; the state dict does
                not match the architecture (the message gives the d_model / n_layers it holds).
        """
        dev = resolve_device(device)
        arch = dict(ESMC_300M)
        for k, v in (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers)):
            if v is not None:
                arch[k] = v
        p = Path(name_or_path)
        if str(name_or_path) == "esmc_300m":
            weights = _hub_weights(cache_dir, local_files_only)
        elif p.is_dir():
            weights = p / WEIGHTS_300M
            if not weights.is_file():
                raise FileNotFoundError(f"directory {p} has no ESM-C weights file {WEIGHTS_300M} (expected {weights})")
        elif p.is_file():
            weights = p
        else:
            raise FileNotFoundError(f"ESM-C weights not found: {str(p)!r} is neither the model name 'esmc_300m' "
                                    "nor an existing state-dict file or snapshot directory")
        try:
            sd = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as e:  # unpickling errors of non-state-dict files
            raise ValueError(f"{weights} is not a loadable state dict: {e}") from e
        model = cls(arch["d_model"], arch["n_heads"], arch["n_layers"], max_len=max_len)
        model.load_esmc_state_dict(sd, source=str(weights))
        return model.to(dev).eval()

    def load_esmc_state_dict(self, sd: Mapping[str, Tensor], source: str = "state dict") -> None:
        """Load ESM-C weights (official key names, or with this adapter's ``esmc.`` prefix).

        Raises:
            ValueError: not a mapping of tensors, or keys/shapes do not match this architecture.
        """
        if not isinstance(sd, Mapping) or not all(isinstance(v, Tensor) for v in sd.values()):
            raise ValueError(f"{source} is not a state dict (a mapping of parameter names to tensors)")
        if sd and all(k.startswith("esmc.") for k in sd):
            sd = {k[len("esmc."):]: v for k, v in sd.items()}
        try:
            self.esmc.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            found = _describe_state_dict(sd)
            raise ValueError(
                f"{source} does not match the ESM-C architecture d_model={self.config['d_model']}, "
                f"n_heads={self.config['n_heads']}, n_layers={self.config['n_layers']} (it holds {found}); "
                f"pass the matching d_model/n_heads/n_layers. Details: {str(e).splitlines()[0]}"
            ) from e

    def save(self, path: str | Path) -> Path:
        """Write the wrapped ESM-C's state dict (official key names) to ``path``; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.esmc.state_dict(), path)
        return path

    def n_parameters(self) -> int:
        """Number of parameters of the wrapped ESM-C."""
        return sum(p.numel() for p in self.esmc.parameters())

    # ------------------------------------------------------------------ tokens
    def encode(self, seqs: str | Sequence[str]) -> Tensor:
        """Amino-acid strings -> ``[B, L]`` long ESM-C token ids on the model's device.

        ``_`` (`MASK_CHAR`) encodes the mask. Each sequence is checked with `validate_sequence`
        (upper-case standard amino acids, length <= ``max_len``).

        Raises:
            ValueError: an invalid sequence (the message names it and the position), no
                sequence, or sequences of different lengths.
        """
        if isinstance(seqs, str):
            seqs = [seqs]
        seqs = list(seqs)
        if not seqs:
            raise ValueError("no sequences to encode")
        for n, s in enumerate(seqs):
            try:
                validate_sequence(s, max_len=self.max_len, allow_mask=True)
            except ValueError as e:
                raise ValueError(f"sequence {n}: {e}") from None
        lens = sorted({len(s) for s in seqs})
        if len(lens) > 1:
            raise ValueError(f"sequences must have equal lengths to form a [B, L] batch, got lengths {lens}")
        table = {c: i for i, c in enumerate(self._letters) if c}
        return torch.tensor([[table[c] for c in s] for s in seqs], dtype=torch.long, device=self.device)

    def decode(self, tokens_BL: Tensor) -> list[str]:
        """``[B, L]`` (or ``[L]``) token ids -> strings (``_`` for the mask).

        Raises:
            ValueError: an id that is neither an amino acid nor the mask.
        """
        if tokens_BL.dim() == 1:
            tokens_BL = tokens_BL[None]
        self._check_protein_ids(tokens_BL)
        return ["".join(self._letters[i] for i in row) for row in tokens_BL.tolist()]

    def _check_protein_ids(self, tokens_BL: Tensor) -> None:
        if tokens_BL.numel() == 0:
            return
        lo, hi = int(tokens_BL.min()), int(tokens_BL.max())
        if lo < 0 or hi >= N_ESMC_TOKENS:
            raise ValueError(f"token ids must lie in [0, {N_ESMC_TOKENS}), got range [{lo}, {hi}]")
        bad = ~self._allowed.to(tokens_BL.device)[tokens_BL]
        if bad.any():
            b, j = (int(x) for x in torch.nonzero(bad)[0])
            raise ValueError(
                f"token id {int(tokens_BL[b, j])} at [{b}, {j}] is not an amino acid or the mask ({MASK_ID}); "
                "inputs hold protein positions only (<cls>/<eos> are added by the adapter; padding, <unk>, "
                "X/B/U/Z/O and gaps are not accepted)")

    def check_tokens(self, tokens_BL: Tensor) -> None:
        """`MaskedModel.check_tokens`, and every id must be one of the 20 amino acids or the mask."""
        super().check_tokens(tokens_BL)
        self._check_protein_ids(tokens_BL)

    # ------------------------------------------------------------------ forward
    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:
        n = self.config["n_layers"]
        if not -1 <= layer <= n:
            raise ValueError(f"layer must be -1 or in [0, {n}], got {layer}")
        B = tokens_BL.shape[0]
        x = torch.cat([tokens_BL.new_full((B, 1), CLS_ID), tokens_BL, tokens_BL.new_full((B, 1), EOS_ID)], dim=1)
        out = self.esmc(sequence_tokens=x)
        if layer == 0:
            hidden = self.esmc.embed(x)
        else:
            hidden = out.embeddings if layer == -1 else out.hidden_states[layer - 1]
        logits = out.sequence_logits[:, 1:-1][..., self.value_token_ids]
        return MDMOutput(logits=logits, hidden=hidden[:, 1:-1])


def _describe_state_dict(sd: Mapping[str, Tensor]) -> str:
    emb = sd.get("embed.weight")
    d = f"d_model={emb.shape[1]}" if emb is not None and emb.dim() == 2 else "no embed.weight"
    blocks = {k.split(".")[2] for k in sd if k.startswith("transformer.blocks.")}
    return f"{d}, n_layers={len(blocks)}"


def _hub_weights(cache_dir: str | Path | None, local_files_only: bool | None) -> Path:
    from huggingface_hub import constants, hf_hub_download

    where = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    offline = constants.HF_HUB_OFFLINE if local_files_only is None else local_files_only
    try:
        return Path(hf_hub_download(HF_REPO_300M, WEIGHTS_300M, cache_dir=cache_dir, local_files_only=offline))
    except (OSError, ValueError) as e:  # LocalEntryNotFoundError, OfflineModeIsEnabled, HTTP/connection errors
        raise FileNotFoundError(
            f"ESM C 300M weights not available: looked for {HF_REPO_300M}/{WEIGHTS_300M} in the Hugging Face "
            f"cache {where}{' (offline, no download tried)' if offline else ' and could not download it'}. "
            f"Provide them by downloading the repository {HF_REPO_300M} (e.g. `huggingface-cli download "
            f"{HF_REPO_300M}` on a machine with internet, then copy the cache or the snapshot folder) and pass "
            f"ESMCMDM.load(<snapshot folder or the .pth file>). Cause: {type(e).__name__}: {str(e)[:300]}"
        ) from e
