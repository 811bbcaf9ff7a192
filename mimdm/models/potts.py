"""An aligned-column Potts MDM: the offline protein model of the study.

Positions are the *reference columns* of a family alignment: the match columns in which a chosen
reference row (by default the protein whose structure is given) holds a residue
(`mimdm.data.protein.reference_columns`; DHFR/P0ABQ4.1: 158 columns). Each position takes one of
21 values, the 20 amino acids (`AMINO_ACIDS` order) and the gap ``-`` (value 20); token ids are the
value indices, and id 21 is the mask.

Model (a Potts model read as a masked diffusion model): for a context ``x`` with masked set M,

    logits_i(a) = h_i(a) + Σ_{j ∉ M, j ≠ i} J_ij(a, x_j),        J_ij(a, b) = J_ji(b, a),

so p(x_i | x_unmasked) is the Potts conditional with the masked positions marginalised out by
dropping their terms (the "mean-field-free" conditional that a masked-diffusion objective trains
directly). With one masked position this is exactly the pseudo-likelihood conditional of plmDCA
(Ekeberg et al. 2013, Phys. Rev. E 87:012707); training with t ~ U(0, 1] masking (MDLM, Sahoo et
al. 2024) makes every masking rate a conditional the model is asked for, which is what probing
and decoding read. Couplings are symmetric by construction (``J = (W + Wᵀ) / 2``) with zero
diagonal blocks. Sizes: L·21 fields and (L·21)² coupling entries (DHFR: 11.0M).

Hidden states (what the MI head reads), ``[B, L, D]`` with D = 21 + ``embed_dim``:

* the first 21 channels are the position's conditional log-probabilities in this context (the
  model's only context-dependent quantity: it carries how sure the model is of x_i given what is
  unmasked);
* the other ``embed_dim`` channels are a fixed, context-free *coupling embedding* of the column:
  the leading eigenvectors of the APC-corrected coupling-norm matrix ‖J_ij‖ over the 20 amino
  acids, each scaled by √|eigenvalue| (a spectral embedding, so e_i·e_j approximates the coupling
  strength of the pair). It is recomputed from J whenever the weights change (`refresh_embedding`).

``layer`` = -1 (or 1) returns these; ``layer`` = 0 returns the embedding with a zero log-probability
part (the "input" layer).

Training (`train_potts_mdm`): the masked-diffusion loss of `mimdm.models.training` with rows drawn
in proportion to their 80%-identity redundancy weights (`mimdm.data.protein.sequence_weights`;
sampling by weight is the weighted objective in expectation), an L2 penalty on J
(``l2 · Σ J² / N_eff``, the plmDCA convention of a per-alignment penalty), no weight decay, and
early stopping on the held-out masked cross-entropy.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from mimdm.core.artifacts import artifact_dir, atomic_save, load_checkpoint
from mimdm.core.contract import MaskedModel, MDMOutput
from mimdm.core.device import resolve_device
from mimdm.data import protein as pr
from mimdm.models.training import OBJECTIVE_VERSION, TrainConfig, train_mdm

ALIGNED_VOCAB = tuple(pr.AMINO_ACIDS) + ("-",)
"""The 21 values of an aligned column: the 20 amino acids, then the gap (value 20)."""
GAP = 20
N_ALIGNED = 21
ALIGNED_MASK_ID = 21


@dataclass(frozen=True)
class PottsMDMConfig:
    """The Potts MDM and its training (see the module docstring).

    Attributes:
        embed_dim: width of the coupling embedding in the hidden states.
        l2: L2 penalty on the couplings, ``l2 · Σ J² / N_eff``.
        l2_fields: the same on the fields h.
        masking: ``"mdm"`` (t ~ U(0, 1], the masked-diffusion objective) or ``"one"`` (exactly one masked
            column per row: the pseudo-likelihood objective of plmDCA, the study's Potts baseline).
        val_every: steps between held-out evaluations (early stopping keeps the best); ``patience``:
            evaluations without improvement before training stops (None: all steps).
        val_rates: masking rates averaged in the held-out masked cross-entropy.
    """

    embed_dim: int = 32
    l2: float = 0.1
    l2_fields: float = 0.01
    masking: str = "mdm"
    val_every: int = 50
    patience: int | None = 3
    val_rates: tuple[float, ...] = (0.15, 0.5, 1.0)

    def __post_init__(self):
        if self.masking not in ("mdm", "one"):
            raise ValueError(f"masking must be 'mdm' or 'one', got {self.masking!r}")
        if self.l2 < 0 or self.l2_fields < 0:
            raise ValueError(f"l2 penalties must be >= 0, got {self.l2}, {self.l2_fields}")

    def to_dict(self) -> dict:
        return asdict(self)


class PottsMDM(MaskedModel):
    """Aligned-column Potts MDM over 21 values (20 amino acids + gap); see the module docstring.

    Args:
        length: L, the number of aligned columns.
        embed_dim: width of the coupling embedding in the hidden states.
        columns: optional ``[L]`` alignment column indices the positions stand for (recorded only).

    Raises:
        ValueError: ``length < 2`` or ``embed_dim < 0``.
    """

    def __init__(self, length: int, embed_dim: int = 32, columns: np.ndarray | None = None):
        super().__init__()
        if length < 2:
            raise ValueError(f"a Potts MDM needs at least 2 columns, got {length}")
        if embed_dim < 0:
            raise ValueError(f"embed_dim must be >= 0, got {embed_dim}")
        L, V = length, N_ALIGNED
        self.vocab = ALIGNED_VOCAB
        self.mask_id = ALIGNED_MASK_ID
        self.n_tokens = N_ALIGNED + 1
        self.max_len = L
        self.length = L
        self.embed_dim = embed_dim
        self.hidden_dim = V + embed_dim
        self.register_buffer("value_token_ids", torch.arange(V))
        self.h = nn.Parameter(torch.zeros(L, V))
        self.W = nn.Parameter(torch.zeros(L * V, L * V))
        off = 1.0 - torch.block_diag(*[torch.ones(V, V)] * L)
        self.register_buffer("offdiag_half", 0.5 * off, persistent=False)  # [L·V, L·V]: symmetrise and zero i = j
        self.register_buffer("embedding", torch.zeros(L, embed_dim))
        self.register_buffer("columns", torch.as_tensor(np.arange(L) if columns is None else np.asarray(columns),
                                                         dtype=torch.long))

    # ------------------------------------------------------------------------------------ couplings
    def couplings(self) -> Tensor:
        """``[L·V, L·V]`` symmetric couplings J (zero diagonal blocks); entry (i·V + a, j·V + b) is J_ij(a, b).

        Without autograd the result is cached until ``W`` changes (probing and decoding run many passes
        on fixed weights).
        """
        if torch.is_grad_enabled() and self.W.requires_grad:
            J = (self.W + self.W.T) * self.offdiag_half
            self._train_j = (self.W._version, J)  # `penalty` reuses it within the same training step
            return J
        key = (self.W.data_ptr(), self.W._version, self.W.device, self.W.dtype)
        if getattr(self, "_j_key", None) != key:
            with torch.no_grad():
                self._j_cache = (self.W + self.W.T) * self.offdiag_half
            self._j_key = key
        return self._j_cache

    def penalty(self, n_eff: float) -> Tensor:
        """``(Σ J²) / n_eff`` and ``(Σ h²) / n_eff`` as a pair of scalars (weights set by the config).

        In training it reuses the couplings of the step's forward pass (one symmetrisation per step)."""
        cached = getattr(self, "_train_j", None)
        J = cached[1] if cached is not None and cached[0] == self.W._version and torch.is_grad_enabled() \
            else self.couplings()
        return (J ** 2).sum() / n_eff, (self.h ** 2).sum() / n_eff

    @torch.no_grad()
    def coupling_norm(self, states: int = 20) -> np.ndarray:
        """``[L, L]`` float64 Frobenius norms of the zero-sum-gauge couplings over the first ``states`` values.

        The gauge: J_ij(a, b) − mean_a − mean_b + mean_ab over the 20 amino acids (``states=20``: the gap
        left out, as contact scoring requires) — the standard DCA score before APC (Ekeberg et al. 2013).
        """
        L, V = self.length, N_ALIGNED
        J = self.couplings().double().reshape(L, V, L, V).permute(0, 2, 1, 3)[:, :, :states, :states]
        J = J - J.mean(2, keepdim=True) - J.mean(3, keepdim=True) + J.mean((2, 3), keepdim=True)
        F = torch.sqrt((J ** 2).sum((2, 3))).cpu().numpy()
        np.fill_diagonal(F, 0.0)
        return F

    @torch.no_grad()
    def refresh_embedding(self) -> None:
        """Recompute the coupling embedding (spectral embedding of APC'd `coupling_norm`; see the module docstring)."""
        if self.embed_dim == 0:
            return
        F = pr.apc(self.coupling_norm())
        vals, vecs = np.linalg.eigh(F)
        top = np.argsort(-np.abs(vals))[:self.embed_dim]
        emb = vecs[:, top] * np.sqrt(np.abs(vals[top]))[None, :]
        out = np.zeros((self.length, self.embed_dim))
        out[:, :emb.shape[1]] = emb
        scale = np.abs(out).max()
        self.embedding.copy_(torch.from_numpy(out / scale if scale > 0 else out).float())

    # -------------------------------------------------------------------------------------- forward
    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:
        if layer not in (-1, 0, 1):
            raise ValueError(f"a Potts MDM has layers 0 (embedding) and 1 (= -1, output); got layer={layer}")
        B, L = tokens_BL.shape
        if L != self.length:
            raise ValueError(f"this Potts MDM reads {self.length} aligned columns, got length {L}")
        V = N_ALIGNED
        # Σ_j J_ij(·, x_j) over unmasked j: a sum of L rows of J per example (an embedding bag), about
        # V times cheaper than the one-hot product; masked positions enter with weight 0
        unmasked = tokens_BL != self.mask_id
        rows = torch.arange(L, device=tokens_BL.device) * V + tokens_BL.clamp_max(V - 1)
        field = torch.nn.functional.embedding_bag(rows, self.couplings(), mode="sum",
                                                   per_sample_weights=unmasked.to(self.W.dtype))
        logits = self.h + field.reshape(B, L, V)
        emb = self.embedding.expand(B, L, self.embed_dim)
        if layer == 0:
            hidden = torch.cat([torch.zeros_like(logits), emb], -1)
        else:
            hidden = torch.cat([torch.log_softmax(logits.detach().float(), -1), emb], -1)
        return MDMOutput(logits, hidden)

    # ------------------------------------------------------------------------------ text <-> tokens
    def encode(self, rows: str | list[str]) -> Tensor:
        """``[B, L]`` tokens of aligned rows already restricted to this model's columns (`aligned_rows`).

        Each row is a string of L characters over the 20 amino acids (upper case), ``-`` (gap) and
        ``_`` (masked).

        Raises:
            ValueError: a row of another length, or a character that is not one of those (the message
                names the row and column).
        """
        rows = [rows] if isinstance(rows, str) else list(rows)
        lut = np.full(256, -1, dtype=np.int64)
        for k, c in enumerate(pr.AMINO_ACIDS):
            lut[ord(c)] = k
        lut[ord("-")] = GAP
        lut[ord(pr.MASK_CHAR)] = ALIGNED_MASK_ID
        out = np.empty((len(rows), self.length), dtype=np.int64)
        for r, s in enumerate(rows):
            if len(s) != self.length:
                raise ValueError(f"aligned row {r} has {len(s)} columns; this model reads {self.length}")
            b = np.frombuffer(s.encode("latin-1", errors="replace"), dtype=np.uint8)
            v = lut[b]
            if (v < 0).any():
                c = int(np.argmax(v < 0))
                raise ValueError(f"aligned row {r} has {s[c]!r} at column {c}: use the 20 amino acids in upper case, "
                                 f"'-' for a gap or '{pr.MASK_CHAR}' for a masked column")
            out[r] = v
        return torch.from_numpy(out).to(self.device)

    def decode(self, tokens_BL: Tensor) -> list[str]:
        """Aligned rows (``-`` for a gap, ``_`` for a masked column) of ``[B, L]`` tokens."""
        chars = np.array(list(pr.AMINO_ACIDS) + ["-", pr.MASK_CHAR])
        return ["".join(chars[r]) for r in tokens_BL.cpu().numpy()]

    def n_parameters(self) -> int:
        """Trainable parameters (W counts in full, although only its symmetric off-diagonal part acts)."""
        return sum(p.numel() for p in self.parameters())


# ----------------------------------------------------------------------------------------- data
def aligned_rows(aligned: list[str], columns: np.ndarray) -> list[str]:
    """Rows of an alignment restricted to ``columns``, upper case, ``.`` → ``-`` (aligned-model input text)."""
    A = np.frombuffer("".join(aligned).encode("ascii"), dtype=np.uint8).reshape(len(aligned), -1)[:, columns]
    return [r.tobytes().decode("ascii").upper().replace(".", "-") for r in A]


def weighted_rows(values_NL: np.ndarray, weights_N: np.ndarray, one_masked: bool = False):
    """A ``sample_batch(rng, B)`` for `train_mdm`: rows drawn with probability ∝ weight.

    Returns ``values [B, L]``, or with ``one_masked`` ``(values, forced [B, L] bool)`` with exactly one
    forced masked column per row, drawn uniformly (the pseudo-likelihood objective).
    """
    p = np.asarray(weights_N, dtype=np.float64)
    p = p / p.sum()
    vals = torch.from_numpy(np.ascontiguousarray(values_NL))
    L = vals.shape[1]

    def sample(rng: np.random.Generator, B: int):
        x = vals[rng.choice(len(p), B, p=p)]
        if not one_masked:
            return x
        forced = torch.zeros(B, L, dtype=torch.bool)
        forced[torch.arange(B), torch.from_numpy(rng.integers(L, size=B))] = True
        return x, forced

    return sample


@torch.no_grad()
def held_out_ce(model: PottsMDM, values_NL: np.ndarray, weights_N: np.ndarray | None = None,
                rates=(0.15, 0.5, 1.0), seed: int = 0, batch_size: int = 512) -> dict:
    """Weighted masked cross-entropy (nats per masked column) at fixed masking rates.

    Each row masks each column with probability ``rate`` (at least one); the mean is weighted by
    the row weights (uniform when None).

    Returns:
        ``{"ce_<rate>": nats, ..., "ce": mean over the rates}``.
    """
    g = torch.Generator().manual_seed(seed)
    v = torch.from_numpy(np.ascontiguousarray(values_NL)).to(model.device)
    w = torch.ones(len(v)) if weights_N is None else torch.as_tensor(weights_N, dtype=torch.float64)
    w = w.double().to(model.device)
    was = model.training
    model.eval()
    out = {}
    for rate in rates:
        tot, den = 0.0, 0.0
        for s in range(0, len(v), batch_size):
            x = v[s:s + batch_size]
            u = torch.rand(x.shape, generator=g).to(model.device)
            m = u < rate
            m[torch.arange(len(x)), u.argmin(1)] = True
            tok = x.masked_fill(m, model.mask_id)
            lp = torch.log_softmax(model(tok).logits.double(), -1)
            ce = -(lp.gather(2, x.unsqueeze(2)).squeeze(2) * m).sum(1)  # [b]
            tot += float((ce * w[s:s + batch_size]).sum())
            den += float((m.sum(1) * w[s:s + batch_size]).sum())
        out[f"ce_{rate:g}"] = tot / den
    out["ce"] = float(np.mean([out[f"ce_{r:g}"] for r in rates]))
    model.train(was)
    return out


def site_log_frequencies(values_NL: np.ndarray, weights_N: np.ndarray, pseudocount: float = 0.5) -> np.ndarray:
    """``[L, 21]`` log of the weighted value frequencies of each column, with ``pseudocount`` (in weighted rows)
    spread evenly over the 21 values, centred per column (zero-sum gauge)."""
    L = values_NL.shape[1]
    f = np.zeros((L, N_ALIGNED))
    w = np.asarray(weights_N, dtype=np.float64)
    for v in range(N_ALIGNED):
        f[:, v] = ((values_NL == v) * w[:, None]).sum(0)
    f = (f + pseudocount / N_ALIGNED) / (w.sum() + pseudocount)
    lf = np.log(f)
    return lf - lf.mean(1, keepdims=True)


def potts_dir(cfg: PottsMDMConfig, train_cfg: TrainConfig, data_id: str, columns_id: str, root: Path | None = None,
              create: bool = True) -> Path:
    """Artifact folder of a Potts MDM of these configurations and data (``create=False``: only the path)."""
    c = {"model": cfg.to_dict(), "train": train_cfg.to_dict(), "data": data_id, "columns": columns_id,
         "objective": OBJECTIVE_VERSION, "arch": "potts-v3"}  # v3: couplings stored packed in float16
    return artifact_dir("protein_mdm", f"potts-{cfg.masking}", c, root, create)


def train_potts_mdm(values_train: np.ndarray, weights_train: np.ndarray, values_val: np.ndarray,
                    weights_val: np.ndarray, cfg: PottsMDMConfig, train_cfg: TrainConfig, state_path: Path,
                    columns: np.ndarray | None = None, device="cpu", progress: bool = True) -> tuple[PottsMDM, dict]:
    """Train a Potts MDM (resumable; early stopping on held-out masked CE; see the module docstring).

    Args:
        values_train, values_val: ``[N, L]`` aligned values (0..20) of the training and validation rows.
        weights_train, weights_val: their redundancy weights (N_eff = sum).
        cfg: `PottsMDMConfig`; train_cfg: `TrainConfig` (``weight_decay`` should be 0: the penalty is L2).
        state_path: resumable state (`mimdm.models.training.train_mdm`).

    Returns:
        ``(model with the best held-out weights, record)``; the record has ``log`` (training log with
        ``val_loss`` entries: the mean held-out CE over ``cfg.val_rates``), ``best_step``, ``val`` and ``train`` held-out-style CE at the best step.

    Raises:
        ValueError: empty splits or mismatched shapes.
    """
    if len(values_train) == 0 or len(values_val) == 0:
        raise ValueError("the Potts MDM needs training and validation rows; a split is empty")
    if values_train.shape[1] != values_val.shape[1]:
        raise ValueError(f"train and validation rows have {values_train.shape[1]} and {values_val.shape[1]} columns")
    dev = resolve_device(device)
    L = values_train.shape[1]
    model = PottsMDM(L, cfg.embed_dim, columns).to(dev)
    n_eff = float(np.sum(weights_train))
    with torch.no_grad():  # fields start at the weighted column log-frequencies (the independent-site model)
        model.h.copy_(torch.from_numpy(site_log_frequencies(values_train, weights_train)).float())

    def penalty(m):
        pj, ph = m.penalty(n_eff)
        return cfg.l2 * pj + cfg.l2_fields * ph

    def val_fn(m):
        return held_out_ce(m, values_val, weights_val, cfg.val_rates)["ce"]

    log = train_mdm(model, weighted_rows(values_train, weights_train, cfg.masking == "one"), train_cfg, state_path,
                    progress=progress, penalty=penalty, val_fn=val_fn, val_every=cfg.val_every, patience=cfg.patience)
    with torch.no_grad():  # round to the stored precision (`save_potts`): every number below is of the saved model
        model.W.copy_(unpack_couplings(pack_couplings(model.couplings(), L), L).to(model.W.device))
    model.refresh_embedding()
    model.eval()
    vals = [e for e in log if "val_loss" in e]
    best = min(vals, key=lambda e: e["val_loss"]) if vals else None
    rec = {"log": log, "best_step": best["step"] if best else None,
           "val": held_out_ce(model, values_val, weights_val, (0.15, 0.5, 1.0)),
           "train": held_out_ce(model, values_train, weights_train, (0.15, 0.5, 1.0)),
           "n_eff_train": n_eff, "n_parameters": model.n_parameters(),
           "train_seconds": log[-1]["seconds"] if log else 0.0}
    return model, rec


def pack_couplings(J: Tensor, length: int) -> Tensor:
    """The upper blocks of a symmetric ``[L·V, L·V]`` coupling matrix as ``[L(L-1)/2, V, V]`` float16.

    Block k is J_ij for the k-th pair i < j in `torch.triu_indices` order; the lower blocks are their
    transposes and the diagonal blocks are zero, so nothing else is needed to rebuild J (`unpack_couplings`).
    Storage: 5.5M values (11 MB) for DHFR's 158 columns instead of 44 MB for the full float32 matrix;
    float16 keeps ~3 significant digits (relative error <= 2^-11).
    """
    V = N_ALIGNED
    iu = torch.triu_indices(length, length, 1)
    J4 = J.detach().reshape(length, V, length, V).permute(0, 2, 1, 3)
    return J4[iu[0], iu[1]].to(torch.float16).cpu().contiguous()


def unpack_couplings(packed: Tensor, length: int) -> Tensor:
    """``[L·V, L·V]`` float32 symmetric couplings with zero diagonal blocks from `pack_couplings`' output.

    Raises:
        ValueError: ``packed`` does not have shape ``[L(L-1)/2, V, V]``.
    """
    V = N_ALIGNED
    n = length * (length - 1) // 2
    if tuple(packed.shape) != (n, V, V):
        raise ValueError(f"packed couplings must have shape {(n, V, V)} for {length} columns, got {tuple(packed.shape)}")
    iu = torch.triu_indices(length, length, 1)
    J4 = torch.zeros(length, length, V, V, dtype=torch.float32, device=packed.device)
    J4[iu[0], iu[1]] = packed.float()
    J4[iu[1], iu[0]] = packed.float().transpose(-1, -2)
    return J4.permute(0, 2, 1, 3).reshape(length * V, length * V)


def save_potts(model: PottsMDM, path: Path, cfg: PottsMDMConfig, train_cfg: TrainConfig, record: dict,
               extra: dict | None = None) -> None:
    """Write a Potts MDM checkpoint (kind ``potts_mdm``, format 2, loadable with ``weights_only``).

    Stores the fields h (float32), the couplings J packed to their upper blocks in float16
    (`pack_couplings`), the hidden-state embedding and the column indices: the saved model *is*
    the model (`load_potts` rebuilds it exactly from the file, and every number is measured on it).
    """
    atomic_save({"kind": "potts_mdm", "format": 2, "h": model.h.detach().float().cpu(),
                 "J_packed": pack_couplings(model.couplings(), model.length),
                 "embedding": model.embedding.detach().cpu(), "columns": model.columns.cpu(),
                 "length": model.length, "embed_dim": model.embed_dim, "config": json.dumps(cfg.to_dict()),
                 "train_config": json.dumps(train_cfg.to_dict()), "record": json.dumps(record),
                 "extra": json.dumps(extra or {})}, path)


def load_potts(path: Path, device="cpu") -> tuple[PottsMDM, dict]:
    """Load a Potts MDM checkpoint (``weights_only=True``).

    Raises:
        FileNotFoundError, ValueError: as `mimdm.core.artifacts.load_checkpoint`; not a Potts MDM checkpoint.
    """
    dev = resolve_device(device)
    ck = load_checkpoint(path, dev)
    if ck.get("kind") != "potts_mdm":
        raise ValueError(f"{path} is not a Potts MDM checkpoint (kind={ck.get('kind')!r})")
    L = int(ck["length"])
    model = PottsMDM(L, int(ck["embed_dim"])).to(dev)
    if ck.get("format") == 2:  # W = J: the forward's (W + W^T)/2 off the diagonal blocks gives J back exactly
        state = {"h": ck["h"], "W": unpack_couplings(ck["J_packed"], L), "embedding": ck["embedding"],
                 "columns": ck["columns"], "value_token_ids": model.value_token_ids}
        model.load_state_dict(state)
    else:
        model.load_state_dict(ck["state_dict"])
    model.eval()
    rec = json.loads(ck["record"])
    rec.update({"config": json.loads(ck["config"]), "train_config": json.loads(ck["train_config"]),
                "extra": json.loads(ck["extra"]), "path": str(path)})
    return model, rec
