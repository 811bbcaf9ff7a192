"""The MI head: the whole pairwise conditional-MI matrix of an MDM in one forward pass.

A light network on the MDM's hidden states predicts I(X_i; X_j | c) for all masked pairs from a
single forward of the MDM, replacing the 1 + |M|·V passes of probing (`mimdm.probing.exact`). It is
trained on probed ground-truth MI (`mimdm.pipelines.labels`).

Architecture (`MIHead`), for each masked pair i < j (the pair MLPs run only on masked pairs; the
two-hop product below is a dense [L, L] matrix product per channel):

1. **Per-position features** a_i = W2 GELU(W1 LayerNorm(h_i)) ∈ R^r from the hidden state h_i of
   the chosen MDM layer, paired symmetrically as a_i ⊙ a_j.
2. **Position pairs** (``positions="absolute"``): learned embeddings e_i ∈ R^p (``max_len ×
   pos_dim``) enter as e_i ⊙ e_j, a low-rank learned table of which positions can depend at all
   (on Sudoku: the constraint graph). For sequences of varying length trained on crops
   (proteins), ``positions="relative"`` uses an embedding of the separation min(|i−j|, max_len−1)
   instead, which accepts any length.
3. A pair MLP z_ij = GELU(U [a_i ⊙ a_j, e_i ⊙ e_j] + c) ∈ R^q.
4. **Two-hop update** (``tri_rounds`` rounds, ``tri_channels`` channels; cf. the triangle updates of
   AlphaFold 2, Jumper et al. 2021, Alg. 11-12): each masked pair sends messages m_ij ∈ R^c and
   receives t_ij = Σ_k m_ik m_kj / √L over masked k — one [L, L] matrix product per channel — so
   dependence carried by a chain i–k–j through a third masked position is expressible (in the
   cpu Sudoku labels, pairs that share no unit hold 28% of the probed MI mass in contexts under
   75% masked, 16% above):
   z_ij ← z_ij + GELU(V [z_ij, t_ij]).
5. **Entropy bound**: MI_ij = bound(H_i, H_j) · sigmoid(s_ij), s_ij = MLP(z_ij), with H the model's
   marginal entropy from the same forward. For one joint distribution I(X_i; X_j) ≤ min(H_i, H_j),
   but probed MI comes from the MDM's conditionals, which need not be consistent with one joint:
   in the cpu Sudoku labels 1.6% of masked pairs (6% of the MI mass) exceed min(H_i, H_j) and
   none exceed max(H_i, H_j). The
   default bound is therefore the mean (H_i + H_j)/2; ``bound="min"`` is the strict one,
   ``"none"`` uses softplus(s_ij) without entropies.
6. **Constraint feature** (``constraint_feature``; Sudoku, bilinear head): log1p(I^c_ij / 0.01), with I^c the MI
   of a constraint model built from the marginals of the same MDM forward
   (`mimdm.probing.sudoku_mi.constraint_mi_among`: fixing x_j = v excludes v from j's peers and, for i not a peer,
   moves v's mass within each unit of i onto its cells that are not peers of j), and the marginals' overlap
   Σ_v p_i(v) p_j(v) enter the hidden pair layer and the logit. Without them most of the cpu head's squared error
   sits in pairs that share no unit, whose dependence runs through a digit in this way. With ``constraint_hops`` = n
   the two features' walk sums over 2 .. n+1 hops through masked cells (f^(2)_ij = Σ_k f_ik f_kj / 81, f^(3) =
   f^(2) f / 81, ...: one [Lm, Lm] matrix product per feature and hop; walks, so f^(2) has a diagonal and f^(3)
   backtracking terms) enter as more features: dependence of i on j along chains of cells that the constraint model
   couples, which the propagated reference (chapter 2) follows.
7. **Graph rounds** (``graph_rounds`` = R; Sudoku, bilinear head with a hidden pair layer): the hidden pair layer h_ij
   (i: the cell asked about, j: the cell conditioned on) is propagated R times along the constraint graph,
   h_ij ← h_ij + U_r SiLU(V_r [h_ij, mean_{k ∈ peers(i), masked, k ≠ j} h_kj] + c_r), one [Lm, Lm] @ [Lm, Lm] product per
   channel and round: a learned form of the propagated reference's rounds (fixing x_j moves j's peers, then theirs),
   in which the pair state of (k, j) informs (i, j) when k constrains i. The logit is symmetrised by the bound.

The output is symmetric, non-negative, zero on the diagonal and at unmasked positions by
construction. Sizes: ``d_hidden`` 224, ``rank`` 64 give ~62K parameters at D=128; the paper
profile's ``d_hidden`` 192 gives ~105K at D=384 (paper: ~100K for its Sudoku MDM). Each
component's contribution is measured in the chapter "Estimator accuracy" (ablations at equal epochs).

Decoding needs MI only between the positions a rule can admit (`mimdm.sampling.decoding.MIGuided` with an
entropy cap: a few per step); given those ``candidates`` the pair network runs on the pairs with a
candidate end (``pairs="bilinear"``: the units of the candidate rows against every masked row) and returns the
same values between candidates, up to float rounding (`MIHead.forward`), several times cheaper than the full
matrix.

Length: the two-hop sum runs over the masked positions and is scaled by 1/√L, so its magnitude
grows with the number of masked positions; a head trained on crops of one length (proteins) and
applied to longer sequences sees larger two-hop inputs than in training.

Loss (`mi_loss`): most masked pairs have MI near zero and a few are large; plain MSE is dominated
by the many near-zero pairs' noise and underfits the large values that decoding depends on. We
use MSE on the scale log1p(MI/s) (s = 0.01 nats: differences among small values still count, large
values are compressed) with a weight 1 + MI/s_w that emphasises large true MI (s_w = 0.05 nats).
The chapter compares it with plain MSE.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F
from tqdm.auto import tqdm

from mimdm.core.artifacts import atomic_save, load_checkpoint
from mimdm.core.contract import MaskedModel
from mimdm.core.distributed import DistInfo, allreduce_sum, barrier, init_distributed
from mimdm.core.information import entropy_from_log_probs
from mimdm.core.timing import seconds_per_call
from mimdm.data import sudoku as sd
from mimdm.probing.sudoku_mi import constraint_mi_among

BOUNDS = ("mean", "min", "max", "none")
#: Scale s (nats) of the ``constraint_feature`` log1p(I^c / s), the scale of the head's loss.
CONSTRAINT_FEATURE_SCALE = 0.01
#: Channels of the ``constraint_feature``: log1p(I^c / s) and the marginals' overlap.
N_CONSTRAINT_FEATURES = 2
POSITIONS = ("absolute", "relative")
PAIRS = ("gather", "bilinear")


@dataclass(frozen=True)
class MIHeadConfig:
    """MI head architecture (see the module docstring).

    Attributes:
        d_in: the MDM's hidden size D.
        d_hidden, rank: per-position feature MLP widths (features a_i ∈ R^rank).
        pair_hidden: width q of the pair representation.
        positions: ``"absolute"`` (e_i ⊙ e_j; sequences up to ``max_len``) or ``"relative"``
            (embedding of min(|i−j|, max_len−1); any length).
        max_len: size of the position table.
        pos_dim: position-pair embedding width p; 0 disables position pairs.
        tri_channels, tri_rounds: the two-hop pair update; ``tri_channels=0`` disables it.
        bound: ``"mean"`` ((H_i+H_j)/2), ``"min"``, ``"max"`` or ``"none"`` (softplus, no entropies).
        out_bias: initial bias of the output layer (the head starts near ``bound · sigmoid(out_bias)``; lower it
            when the MI labels are small, e.g. proteins, so training does not start far above them).
        pairs: ``"gather"`` (the pair network on the masked pairs, gathered; see the module docstring) or
            ``"bilinear"`` (the cheap head: for every pair at once, ``channels`` units
            g^c_ij = SiLU(a_ic · a_jc / √rank + e_ic · e_jc + b_c) from per-position features a_ic ∈ R^rank and
            position features e_ic ∈ R^(pos_dim/channels) (``"relative"``: a learned bias per separation and
            channel), a logit s_ij = Σ_c v_c g^c_ij + Σ_{c < tri_channels} u_c (g^c g^c)_ij / √L (the two-hop
            term over masked k) + b, then the same bound. Batched matrix products on [B, C, L, L] instead of
            gathered pair MLPs: several times cheaper).
        channels: number C of units of ``pairs="bilinear"``.
        mix_channels: ``pairs="bilinear"`` only: width M of a hidden pair layer between the units and the logit,
            h^m_ij = SiLU(Σ_c W_mc g^c_ij + β_m), the logit then Σ_m v_m h^m_ij + two-hop + b (a 1×1 convolution
            over the [C, L, L] units, one batched matrix product; 0: none, the logit reads the units directly).
        constraint_feature: ``pairs="bilinear"`` on Sudoku (81 positions, 9 values) only: two pair features from
            the MDM's marginals p_i of the same forward, f_ij = (log1p(I^c_ij / 0.01), Σ_v p_i(v) p_j(v)), with I^c
            the MI of a constraint model (`mimdm.probing.sudoku_mi.constraint_mi_among`: exclusion between peers,
            and for non-peers the shift of a digit's mass within i's units when j takes it) and the second the
            marginals' overlap, enter the hidden pair layer as more inputs (h^m_ij = SiLU(Σ_c W_mc g^c_ij +
            Σ_k w_mk f^k_ij + β_m)) and the logit directly (+ Σ_k u_k f^k_ij); the head then needs the marginals
            (``probs_BLV`` of `MIHead.forward`).
        constraint_top_k: the feature's ``top_k`` (each direction conditions on the conditioning cell's
            ``constraint_top_k`` most likely digits; 9: all): fewer terms, a cheaper head pass.
        constraint_hops: with ``constraint_feature``: also the features' walk sums over 2 .. ``constraint_hops`` + 1
            hops through the masked cells (f^(h+1) = f^(h) f / 81; 2 · (1 + ``constraint_hops``) features). On
            candidates (`MIHead.forward`) the feature is then computed among all masked cells, not the candidates
            only.
        graph_rounds: ``pairs="bilinear"`` on Sudoku with a hidden pair layer (``mix_channels`` ≥ 1) only: rounds of
            propagation of the hidden pair layer along the constraint graph, h_ij ← h_ij + U_r SiLU(V_r [h_ij,
            mean_{k ∈ peers(i), masked, k ≠ j} h_kj] + c_r) (module docstring, 7). On candidates (`MIHead.forward`)
            the full matrix is computed (the rounds read every masked pair) and returned among the candidates.
    """

    d_in: int
    d_hidden: int = 224
    rank: int = 64
    pair_hidden: int = 64
    positions: str = "absolute"
    max_len: int = 81
    pos_dim: int = 32
    tri_channels: int = 8
    tri_rounds: int = 1
    bound: str = "mean"
    out_bias: float = -4.0
    pairs: str = "gather"
    channels: int = 8
    mix_channels: int = 0
    constraint_feature: bool = False
    constraint_top_k: int = 4
    constraint_hops: int = 0
    graph_rounds: int = 0

    def to_dict(self) -> dict:
        """The architecture as a dict (``out_bias``, ``pairs`` and ``channels`` left out at their defaults, so
        earlier heads' cache keys hold)."""
        d = asdict(self)
        if d["out_bias"] == -4.0:
            del d["out_bias"]
        if d["pairs"] == "gather":  # channels has no effect there
            del d["pairs"], d["channels"]
        if not d["mix_channels"]:  # earlier heads' keys
            del d["mix_channels"]
        if not d["constraint_feature"]:
            del d["constraint_feature"], d["constraint_top_k"]
        if not d["constraint_hops"]:  # earlier heads' keys
            del d["constraint_hops"]
        if not d["graph_rounds"]:  # earlier heads' keys
            del d["graph_rounds"]
        return d

    @property
    def n_features(self) -> int:
        """Number of pair features the head reads (0 without ``constraint_feature``; else 2 · (1 + ``constraint_hops``))."""
        return N_CONSTRAINT_FEATURES * (1 + self.constraint_hops) if self.constraint_feature else 0


class MIHead(nn.Module):
    """Hidden states ``[B, L, D]`` (+ masked ``[B, L]`` bool, entropy ``[B, L]`` nats) → MI ``[B, L, L]`` nats.

    Raises:
        ValueError: unknown ``bound``, ``positions`` or ``pairs``; a ``constraint_feature``, ``constraint_hops`` or
            ``graph_rounds`` setting its architecture does not allow (each message names the requirement).
    """

    def __init__(self, config: MIHeadConfig):
        super().__init__()
        c = self.config = config
        if c.bound not in BOUNDS:
            raise ValueError(f"bound must be one of {BOUNDS}, got {c.bound!r}")
        if c.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {c.positions!r}")
        if c.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {c.pairs!r}")
        if c.constraint_feature and (c.pairs != "bilinear" or c.positions != "absolute" or c.max_len != sd.N_CELLS):
            raise ValueError("constraint_feature is for Sudoku: it needs pairs='bilinear', positions='absolute' and "
                             f"max_len={sd.N_CELLS}")
        for name in ("constraint_hops", "graph_rounds"):
            n = getattr(c, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {n!r}")
        if c.constraint_hops and not c.constraint_feature:
            raise ValueError(f"constraint_hops={c.constraint_hops} needs constraint_feature=True")
        if c.graph_rounds and (c.pairs != "bilinear" or c.positions != "absolute" or c.max_len != sd.N_CELLS):
            raise ValueError("graph_rounds propagate along the Sudoku constraint graph: they need pairs='bilinear', "
                             f"positions='absolute' and max_len={sd.N_CELLS}")
        if c.graph_rounds and c.mix_channels < 1:
            raise ValueError("graph_rounds propagate the hidden pair layer: they need mix_channels >= 1")
        if c.constraint_feature and not 1 <= c.constraint_top_k <= 9:
            raise ValueError(f"constraint_top_k must be in 1..9, got {c.constraint_top_k}")
        if c.pairs == "bilinear":
            self._init_bilinear(c)
            return
        self.norm = nn.LayerNorm(c.d_in)
        self.feat = nn.Sequential(nn.Linear(c.d_in, c.d_hidden), nn.GELU(), nn.Linear(c.d_hidden, c.rank))
        n_pair = c.rank
        if c.pos_dim:
            self.pos = nn.Parameter(torch.randn(c.max_len, c.pos_dim) * 0.5)
            n_pair += c.pos_dim
        q = c.pair_hidden
        self.pair_in = nn.Sequential(nn.Linear(n_pair, q), nn.GELU())
        self.tri = nn.ModuleList(
            nn.ModuleDict({"msg": nn.Linear(q, c.tri_channels), "upd": nn.Linear(q + c.tri_channels, q)})
            for _ in range(c.tri_rounds if c.tri_channels else 0))
        self.out = nn.Sequential(nn.Linear(q, q), nn.GELU(), nn.Linear(q, 1))
        nn.init.constant_(self.out[-1].bias, c.out_bias)  # start near zero MI, where most pairs are

    def _init_bilinear(self, c: MIHeadConfig) -> None:
        C = c.channels
        if C < 1:
            raise ValueError(f"channels must be >= 1, got {C}")
        if c.positions == "absolute" and c.pos_dim % C:
            raise ValueError(f"pos_dim ({c.pos_dim}) must be a multiple of channels ({C}) for pairs='bilinear'")
        if c.mix_channels < 0:
            raise ValueError(f"mix_channels must be >= 0, got {c.mix_channels}")
        if c.tri_channels > C or c.tri_rounds > 1:
            raise ValueError(f"pairs='bilinear' takes at most one two-hop round on at most channels={C} channels")
        self.norm = nn.LayerNorm(c.d_in)
        self.feat = nn.Sequential(nn.Linear(c.d_in, c.d_hidden), nn.GELU(), nn.Linear(c.d_hidden, C * c.rank))
        if c.pos_dim:
            self.pos = nn.Parameter(torch.randn(c.max_len, C, c.pos_dim // C) * 0.5 if c.positions == "absolute"
                                    else torch.zeros(c.max_len, C))
        self.bias = nn.Parameter(torch.zeros(C))
        M = c.mix_channels
        if M:
            self.mix = nn.Parameter(torch.randn(M, C) / math.sqrt(C))
            self.mix_bias = nn.Parameter(torch.zeros(M))
        self.readout = nn.Parameter(torch.randn(M or C) / math.sqrt(M or C))
        self.tri_weight = nn.Parameter(torch.zeros(c.tri_channels if c.tri_rounds else 0))
        self.out_bias = nn.Parameter(torch.tensor(float(c.out_bias)))
        if c.constraint_feature:
            if M:
                self.feature_mix = nn.Parameter(torch.randn(M, c.n_features) * 0.3)  # w_mk
            self.feature_logit = nn.Parameter(torch.zeros(c.n_features))  # u_k
        if c.graph_rounds:
            R = c.graph_rounds
            self.graph_in = nn.Parameter(torch.randn(R, M, 2 * M) / math.sqrt(2 * M))  # V_r
            self.graph_bias = nn.Parameter(torch.zeros(R, M))  # c_r
            self.graph_out = nn.Parameter(torch.randn(R, M, M) * (0.5 / math.sqrt(M)))  # U_r
            self.register_buffer("peer", torch.from_numpy(sd.constraint_graph()).float(), persistent=False)

    def _forward_bilinear(self, hidden_BLD: Tensor, pairs_BLL: Tensor, entropy_BL: Tensor | None,
                          positions_BL: Tensor | None = None, length: int | None = None,
                          rows_BK: Tensor | None = None, feature_BLL: Tensor | None = None) -> Tensor:
        """The ``pairs="bilinear"`` head on every pair at once; ``pairs_BLL``: the masked pairs i != j.

        ``positions_BL``: the sequence position of each of the L rows when they are a gathered subset (the masked
        positions, `forward`); None: rows are positions 0..L-1. ``length``: the full sequence length that scales the
        two-hop sum (default L). ``rows_BK``: ``[B, K]`` long, return only the MI among these K of the L rows,
        ``[B, K, K]`` (the units are computed between them and all L rows, as the two-hop sum needs; the same values
        as the full matrix up to float rounding, at about K/L of its cost); None: ``[B, L, L]``. ``feature_BLL``: the
        ``constraint_feature`` among the returned rows (``[B, n_features, L, L]``; ``[B, n_features, K, K]`` with
        ``rows_BK``), or
        None."""
        c = self.config
        B, L, _ = hidden_BLD.shape
        C = c.channels
        a = self.feat(self.norm(hidden_BLD.float())).view(B, L, C, c.rank).transpose(1, 2)  # [B, C, L, r]
        a = a * c.rank ** -0.25  # so that a_i · a_j carries the 1/√rank
        if rows_BK is not None:
            return self._bilinear_rows(a, pairs_BLL, entropy_BL, positions_BL, length, rows_BK, feature_BLL)
        G = a @ a.transpose(-1, -2)  # [B, C, L, L]
        if c.pos_dim and c.positions == "absolute" and positions_BL is not None:
            e = self.pos[positions_BL].permute(0, 2, 1, 3)  # [B, C, L, p/C]
            G += e @ e.transpose(-1, -2) + self.bias[:, None, None]
        elif c.pos_dim and c.positions == "absolute":
            e = self.pos[:L].transpose(0, 1)  # [C, L, p/C]
            G += e @ e.transpose(-1, -2) + self.bias[:, None, None]
        elif c.pos_dim:
            idx = torch.arange(L, device=G.device)[None] if positions_BL is None else positions_BL  # [B or 1, L]
            sep = (idx[:, None, :] - idx[:, :, None]).abs().clamp_max(c.max_len - 1)  # [B or 1, L, L]
            G += self.pos[sep].permute(0, 3, 1, 2) + self.bias[:, None, None]
        else:
            G += self.bias[:, None, None]
        G = F.silu(G, inplace=not torch.is_grad_enabled())  # [B, C, L, L]
        s = self._bilinear_logit(G, feature_BLL, self._graph(pairs_BLL, positions_BL), pairs_BLL)
        k = self.tri_weight.numel()
        if k:
            Gm = G[:, :k] * pairs_BLL[:, None].to(G.dtype)
            two_hop = torch.bmm(self.tri_weight.expand(B, 1, k), (Gm @ Gm).view(B, k, L * L)).view(B, L, L)
            s = s + two_hop / math.sqrt(length or L)
        return self._bounded(s, pairs_BLL, entropy_BL)

    def _bilinear_rows(self, a: Tensor, pairs_BLL: Tensor, entropy_BL: Tensor | None, positions_BL: Tensor | None,
                       length: int | None, rows_BK: Tensor, feature_BKK: Tensor | None = None) -> Tensor:
        """`_forward_bilinear` among the rows ``rows_BK`` only; ``a``: the ``[B, C, L, r]`` position features."""
        c = self.config
        B, C, L, r = a.shape
        K = rows_BK.shape[1]
        G = a.gather(2, rows_BK[:, None, :, None].expand(B, C, K, r)) @ a.transpose(-1, -2)  # [B, C, K, L]
        if c.pos_dim:
            pos_BL = torch.arange(L, device=a.device).expand(B, L) if positions_BL is None else positions_BL
            q_BK = pos_BL.gather(1, rows_BK)  # sequence positions of the K rows
            if c.positions == "absolute":
                G += self.pos[q_BK].permute(0, 2, 1, 3) @ self.pos[pos_BL].permute(0, 2, 3, 1)  # [B,C,K,p/C] @ [B,C,p/C,L]
            else:
                sep = (q_BK[:, :, None] - pos_BL[:, None, :]).abs().clamp_max(c.max_len - 1)  # [B, K, L]
                G += self.pos[sep].permute(0, 3, 1, 2)
        G += self.bias[:, None, None]
        G = F.silu(G, inplace=not torch.is_grad_enabled())  # [B, C, K, L]
        pairs_BKL = pairs_BLL.gather(1, rows_BK[:, :, None].expand(B, K, L))
        pairs_BKK = pairs_BKL.gather(2, rows_BK[:, None, :].expand(B, K, K))
        s = self._bilinear_logit(G.gather(3, rows_BK[:, None, None, :].expand(B, C, K, K)), feature_BKK)
        k = self.tri_weight.numel()
        if k:  # Σ over every masked m of G_im G_mj = G_im G_jm (G is symmetric)
            Gm = G[:, :k] * pairs_BKL[:, None].to(G.dtype)  # [B, k, K, L]
            s = s + torch.bmm(self.tri_weight.expand(B, 1, k),
                              (Gm @ Gm.transpose(-1, -2)).view(B, k, K * K)).view(B, K, K) / math.sqrt(length or L)
        return self._bounded(s, pairs_BKK, None if entropy_BL is None else entropy_BL.gather(1, rows_BK))

    def _graph(self, pairs_BLL: Tensor, positions_BL: Tensor | None) -> Tensor | None:
        """The ``graph_rounds`` operator among the L rows: ``(A [B, L, L], inv_n [B, L, L])``, A_ik = 1 if k is a
        masked peer of i (rows are the cells ``positions_BL``, or 0..L-1 if None), else 0, and inv_n_ij = 1 / the
        number of i's masked peers other than j (at least 1), so that ((A h) · inv_n)_ij is the mean of h_kj over
        them (h_jj = 0); None without ``graph_rounds``."""
        if not self.config.graph_rounds:
            return None
        B, L, _ = pairs_BLL.shape
        pos = torch.arange(L, device=pairs_BLL.device).expand(B, L) if positions_BL is None else positions_BL
        rows = pairs_BLL.any(-1)  # masked rows (a lone masked cell has no pair, and nothing to propagate)
        A = self.peer[pos[:, :, None], pos[:, None, :]] * (rows[:, :, None] & rows[:, None, :]).float()
        return A, (A.sum(-1, keepdim=True) - A).clamp_min(1).reciprocal()

    def _bilinear_logit(self, G: Tensor, feature_BLL: Tensor | None = None, graph: tuple[Tensor, Tensor] | None = None,
                        pairs_BLL: Tensor | None = None) -> Tensor:
        """The logit ``[B, L, L']`` of the units ``G`` ``[B, C, L, L']`` (the hidden pair layer, if any, its
        ``graph_rounds`` along ``graph`` (`_graph`; L = L') among the pairs ``pairs_BLL``, and the readout;
        without the two-hop term), with the ``constraint_feature`` ``feature_BLL`` ``[B, n_features, L, L']`` if the head has
        one."""
        B, C, L, L2 = G.shape
        x = G.reshape(B, C, L * L2)
        f = None
        if self.config.constraint_feature:
            if feature_BLL is None:
                raise ValueError("this head reads a constraint feature: pass probs_BLV")
            f = feature_BLL.reshape(B, self.config.n_features, L * L2)
        # the [M, C] weights applied as batched products with expanded weights: several times faster on the CPU than
        # a broadcast matmul, which transposes [B, C, L·L'] to [B·L·L', C] and back
        M = self.config.mix_channels
        if M:  # hidden pair layer
            pre = torch.baddbmm(self.mix_bias[None, :, None].expand(B, M, 1), self.mix.expand(B, M, C), x)
            if f is not None:
                pre = torch.baddbmm(pre, self.feature_mix.expand(B, M, self.config.n_features), f)
            x, C = F.silu(pre), M
        if self.config.graph_rounds:
            if graph is None or pairs_BLL is None or L != L2:
                raise ValueError("graph_rounds needs the graph and the pairs among all L rows")
            A, inv_n = graph[0][:, None], graph[1][:, None]
            keep = pairs_BLL[:, None].to(x.dtype)  # [B, 1, L, L]
            z = x.view(B, M, L, L2) * keep
            for V, c, U in zip(self.graph_in, self.graph_bias, self.graph_out):
                msg = (A @ z) * inv_n  # [B, M, L, L]: the mean of h_kj over i's masked peers k != j
                pre = torch.baddbmm(c[None, :, None].expand(B, M, 1), V.expand(B, M, 2 * M),
                                    torch.cat([z, msg], 1).view(B, 2 * M, L * L2))
                z = z + torch.bmm(U.expand(B, M, M), F.silu(pre)).view(B, M, L, L2) * keep
            x = z.view(B, M, L * L2)
        s = torch.bmm(self.readout.expand(B, 1, C), x)  # [B, 1, L·L']
        if f is not None:
            s = torch.baddbmm(s, self.feature_logit.expand(B, 1, self.config.n_features), f)
        return s.view(B, L, L2) + self.out_bias

    def _bounded(self, s: Tensor, pairs_BLL: Tensor, entropy_BL: Tensor | None) -> Tensor:
        """MI ``[B, L, L]`` from the logit: the entropy bound (or softplus), zero off ``pairs_BLL``, symmetrised."""
        c = self.config
        if c.bound == "none":
            mi = F.softplus(s)
        else:
            e = entropy_BL.to(s.device).float().clamp_min(0)
            ei, ej = e[:, :, None], e[:, None, :]
            mi = {"min": torch.minimum(ei, ej), "mean": (ei + ej) / 2, "max": torch.maximum(ei, ej)}[c.bound] * torch.sigmoid(s)
        mi = mi * pairs_BLL
        return (mi + mi.transpose(1, 2)) / 2

    def _feature(self, probs_BLV: Tensor | None, masked_BL: Tensor, positions_BK: Tensor,
                 valid_BK: Tensor) -> Tensor | None:
        """The ``constraint_feature`` ``[B, 2, K, K]`` among the cells ``positions_BK`` (None if the head has none):
        log1p(I^c / 0.01) and the marginals' overlap Σ_v p_i(v) p_j(v), both zero off the valid masked pairs of
        distinct cells; computed without gradient (they depend on the MDM's marginals only)."""
        if not self.config.constraint_feature:
            return None
        with torch.no_grad():
            p = probs_BLV.float()
            mi = constraint_mi_among(p, masked_BL, positions_BK, valid_BK, top_k=self.config.constraint_top_k)
            K = positions_BK.shape[1]
            ok = (valid_BK & masked_BL.gather(1, positions_BK)).float()
            pk = p.gather(1, positions_BK[..., None].expand(-1, K, p.shape[-1])) * ok[..., None]
            distinct = positions_BK[:, :, None] != positions_BK[:, None, :]
            overlap = (pk @ pk.transpose(1, 2)) * distinct
            return torch.stack([torch.log1p(mi / CONSTRAINT_FEATURE_SCALE), overlap], 1)

    def _with_hops(self, f_BNLL: Tensor | None, rows_BK: Tensor | None = None) -> Tensor | None:
        """With ``constraint_hops`` = n: the feature ``f_BNLL`` ``[B, 2, Lm, Lm]`` among a grid's masked cells followed
        by its walk sums of 2 .. n+1 hops, f^(h+1) = f^(h) f / 81 over the masked intermediate cells
        (``[B, 2(n+1), Lm, Lm]``), among the rows ``rows_BK`` only if given (``[B, 2(n+1), K, K]``); without: ``f_BNLL``
        (among ``rows_BK`` if given)."""
        if f_BNLL is None:
            return None
        feats = [f_BNLL]
        for _ in range(self.config.constraint_hops):
            feats.append(feats[-1] @ f_BNLL / sd.N_CELLS)
        f = torch.cat(feats, 1) if len(feats) > 1 else f_BNLL
        if rows_BK is None:
            return f
        B, N, Lm, _ = f.shape
        K = rows_BK.shape[1]
        f = f.gather(2, rows_BK[:, None, :, None].expand(B, N, K, Lm))
        return f.gather(3, rows_BK[:, None, None, :].expand(B, N, K, K))

    def _bilinear_masked(self, hidden_BLD: Tensor, masked_BL: Tensor, entropy_BL: Tensor | None,
                         candidates_BL: Tensor | None = None, probs_BLV: Tensor | None = None) -> Tensor:
        """The bilinear head on the masked rows only: every sequence's masked positions are gathered (in order,
        padded to the batch's largest count Lm), the [B, C, Lm, Lm] head runs on them and the result is scattered
        back into [B, L, L]; the same values as on all L rows (unmasked rows contribute nothing) at (Lm/L)² of
        the cost. With ``candidates_BL`` (``[B, L]`` bool, masked positions), only the MI between candidates is
        computed (`_forward_bilinear`'s ``rows_BK``: the Kc candidate rows against the Lm masked ones) and returned,
        zero elsewhere."""
        B, L, _ = hidden_BLD.shape
        dev = hidden_BLD.device
        Lm = int(masked_BL.sum(1).max()) if B else 0
        Kc = int(candidates_BL.sum(1).max()) if candidates_BL is not None and B else Lm
        if Kc == Lm or self.config.graph_rounds:  # graph_rounds read every masked pair: the full matrix
            candidates_BL = None  # every masked position is a candidate somewhere: the full head
        if Lm == L and candidates_BL is None or B == 0:
            pm = masked_BL[:, :, None] & masked_BL[:, None, :] & ~torch.eye(L, dtype=torch.bool, device=dev)
            f = self._with_hops(self._feature(probs_BLV, masked_BL, torch.arange(L, device=dev).expand(B, L), masked_BL))
            return self._forward_bilinear(hidden_BLD, pm, entropy_BL, feature_BLL=f)
        out = hidden_BLD.new_zeros(B, L, L, dtype=torch.float32)
        if Lm < 2 or Kc < 2:
            if torch.is_grad_enabled():  # keep the graph connected to every parameter (DDP needs each one's gradient)
                out = out + 0.0 * sum(p.sum() for p in self.parameters())
            return out
        idx = torch.argsort((~masked_BL).to(torch.int8), dim=1, stable=True)[:, :Lm]  # masked positions first
        sub_m = masked_BL.gather(1, idx)  # [B, Lm]
        pm = sub_m[:, :, None] & sub_m[:, None, :] & ~torch.eye(Lm, dtype=torch.bool, device=dev)
        h = hidden_BLD.gather(1, idx[..., None].expand(B, Lm, hidden_BLD.shape[-1]))
        e = None if entropy_BL is None else entropy_BL.to(dev).gather(1, idx)
        if candidates_BL is None:
            f = self._with_hops(self._feature(probs_BLV, masked_BL, idx, sub_m))
            sub = self._forward_bilinear(h, pm, e, positions_BL=idx, length=L, feature_BLL=f)  # [B, Lm, Lm]
        else:
            cand = candidates_BL.to(dev).gather(1, idx)  # [B, Lm]
            rows = torch.argsort((~cand).to(torch.int8), dim=1, stable=True)[:, :Kc]  # candidates first
            keep = cand.gather(1, rows)
            if self.config.constraint_hops:  # the walk sums read the feature among every masked cell
                f = self._with_hops(self._feature(probs_BLV, masked_BL, idx, sub_m), rows)
                f = f * (keep[:, None, :, None] & keep[:, None, None, :])
            else:
                f = self._feature(probs_BLV, masked_BL, idx.gather(1, rows), keep)
            sub = self._forward_bilinear(h, pm, e, positions_BL=idx, length=L, rows_BK=rows,
                                         feature_BLL=f)  # [B, Kc, Kc]
            sub = sub * (keep[:, :, None] & keep[:, None, :])
            idx = idx.gather(1, rows)
        return out.index_put((torch.arange(B, device=dev)[:, None, None], idx[:, :, None], idx[:, None, :]), sub)

    def n_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, hidden_BLD: Tensor, masked_BL: Tensor, entropy_BL: Tensor | None = None,
                probs_BLV: Tensor | None = None, *, candidates_BL: Tensor | None = None) -> Tensor:
        """Predicted MI in nats.

        Args:
            hidden_BLD: ``[B, L, D]`` hidden states of the MDM layer the head was trained on.
            masked_BL: ``[B, L]`` bool, the masked positions.
            entropy_BL: ``[B, L]`` marginal entropies (nats); required unless ``bound="none"``.
            probs_BLV: ``[B, L, V]`` the MDM's marginals over the V values (`head_inputs`); required by a head with
                ``constraint_feature`` (Sudoku: L = 81, V = 9), ignored otherwise.
            candidates_BL: optional ``[B, L]`` bool: only the MI between masked candidates is wanted
                (a decoding rule that can admit only these positions, `mimdm.sampling.decoding.MIGuided`). The
                pair network then runs on the pairs with a candidate end (all masked pairs when
                ``tri_rounds`` > 1; ``pairs="bilinear"``: the candidate rows against every masked row) instead
                of all masked pairs: the same values between candidates up
                to float rounding (the two-hop sum over every masked k still runs), zero elsewhere
                (and everywhere in a sequence with fewer than two candidates). With |C| candidates
                among |M| masked positions this costs ~|C|·|M| pair evaluations instead of |M|²/2; a head with
                ``graph_rounds`` computes the full matrix (its rounds read every masked pair) and returns it among
                the candidates.

        Returns:
            ``[B, L, L]`` float32, symmetric, ≥ 0, zero on the diagonal and at unmasked positions (and,
            with ``candidates_BL``, off candidate pairs).

        Raises:
            ValueError: ``entropy_BL`` or a needed ``probs_BLV`` missing, L > ``max_len``, L other than 81 for
                ``graph_rounds``, or shapes disagree.
        """
        c = self.config
        B, L, D = hidden_BLD.shape
        if D != c.d_in:
            raise ValueError(f"hidden size {D} does not match the head's d_in={c.d_in}")
        if masked_BL.shape != (B, L):
            raise ValueError(f"masked must have shape {(B, L)}, got {tuple(masked_BL.shape)}")
        if c.pos_dim and c.positions == "absolute" and L > c.max_len:
            raise ValueError(f"sequence length {L} exceeds the head's max_len={c.max_len}; "
                             "train a head with a larger max_len")
        if c.graph_rounds and L != sd.N_CELLS:
            raise ValueError(f"a head with graph_rounds reads Sudoku grids of {sd.N_CELLS} cells, got length {L}")
        if c.bound != "none" and entropy_BL is None:
            raise ValueError("this head bounds MI by the marginal entropies: pass entropy_BL")
        if entropy_BL is not None and entropy_BL.shape != (B, L):
            raise ValueError(f"entropy must have shape {(B, L)}, got {tuple(entropy_BL.shape)}")
        if candidates_BL is not None and candidates_BL.shape != (B, L):
            raise ValueError(f"candidates must have shape {(B, L)}, got {tuple(candidates_BL.shape)}")
        if c.constraint_feature:
            if probs_BLV is None:
                raise ValueError("this head reads a constraint feature from the MDM's marginals: pass probs_BLV")
            if tuple(probs_BLV.shape) != (B, sd.N_CELLS, 9):
                raise ValueError(f"probs must have shape {(B, sd.N_CELLS, 9)} (Sudoku marginals), "
                                 f"got {tuple(probs_BLV.shape)}")
            probs_BLV = probs_BLV.to(hidden_BLD.device)
        dev = hidden_BLD.device
        masked_BL = masked_BL.to(dev)
        if c.pairs == "bilinear":
            cand = None
            if candidates_BL is not None:
                cand = candidates_BL.to(dev, torch.bool) & masked_BL
                cand = cand & (cand.sum(1, keepdim=True) >= 2)
            out = self._bilinear_masked(hidden_BLD, masked_BL, entropy_BL, cand, probs_BLV)
            return out if cand is None else out * (cand[:, :, None] & cand[:, None, :])
        pairs = masked_BL[:, :, None] & masked_BL[:, None, :] & torch.ones(L, L, dtype=torch.bool, device=dev).triu(1)
        keep = None  # [B, L, L]: the pairs whose value is returned (None: all masked pairs)
        if candidates_BL is not None:
            cand = candidates_BL.to(dev, torch.bool) & masked_BL
            cand = cand & (cand.sum(1, keepdim=True) >= 2)  # a lone candidate has no pair to ask about
            keep = cand[:, :, None] & cand[:, None, :]
            if len(self.tri) == 0:
                pairs = pairs & keep
            elif len(self.tri) == 1:  # the two-hop sum for a candidate pair (i, j) reads rows i and j: pairs with a candidate end
                pairs = pairs & (cand[:, :, None] | cand[:, None, :])
        bi, ii, jj = pairs.nonzero(as_tuple=True)
        out = torch.zeros(B, L, L, device=dev)
        if len(bi) == 0:
            if torch.is_grad_enabled():  # keep the graph connected to every parameter (DDP needs each one's gradient)
                out = out + 0.0 * sum(p.sum() for p in self.parameters())
            return out
        a = self.feat(self.norm(hidden_BLD.float()))  # [B, L, r]
        z = [a[bi, ii] * a[bi, jj]]
        if c.pos_dim and c.positions == "absolute":
            z.append(self.pos[ii] * self.pos[jj])
        elif c.pos_dim:
            z.append(self.pos[(jj - ii).clamp_max(c.max_len - 1)])
        h = self.pair_in(torch.cat(z, -1))  # [n_pairs, q]
        for r in self.tri:
            msg = r["msg"](h)
            M = torch.zeros(B, L, L, msg.shape[-1], device=dev, dtype=msg.dtype).index_put((bi, ii, jj), msg)
            M = M + M.transpose(1, 2)  # [B, L, L, c], symmetric, zero off the evaluated pairs
            sel = keep[bi, ii, jj] if keep is not None and len(self.tri) == 1 else None
            if sel is not None and int(sel.sum()) <= B * L:
                # only candidate pairs are returned and they are few (at most L per sequence on average):
                # from here on evaluate those alone, their two-hop sums as row dot products instead of
                # the dense [L, L] product
                h, bi, ii, jj = h[sel], bi[sel], ii[sel], jj[sel]
                t = (M[bi, ii] * M[bi, jj]).sum(1) / math.sqrt(L)
            else:
                Mc = M.permute(0, 3, 1, 2)  # [B, c, L, L]
                t = (Mc @ Mc)[bi, :, ii, jj] / math.sqrt(L)
            h = h + F.gelu(r["upd"](torch.cat([h, t], -1)))
        s = self.out(h).squeeze(-1).float()
        if c.bound == "none":
            mi = F.softplus(s)
        else:
            e = entropy_BL.to(dev).float().clamp_min(0)
            ei, ej = e[bi, ii], e[bi, jj]
            bnd = {"min": torch.minimum(ei, ej), "mean": (ei + ej) / 2, "max": torch.maximum(ei, ej)}[c.bound]
            mi = bnd * torch.sigmoid(s)
        out = out.index_put((bi, ii, jj), mi)
        out = out + out.transpose(1, 2)
        return out if keep is None else out * keep


class HeadInputs(NamedTuple):
    """The inputs of `MIHead.forward` from one MDM forward (`head_inputs`); ``head(*inputs)`` calls the head."""

    hidden: Tensor  #: ``[B, L, D]``
    masked: Tensor  #: ``[B, L]`` bool
    entropy: Tensor  #: ``[B, L]`` nats, 0 at unmasked positions
    probs: Tensor  #: ``[B, L, V]`` marginals over the V values (float32)


@torch.no_grad()
def head_inputs(model: MaskedModel, tokens_BL: Tensor, layer: int = -1) -> HeadInputs:
    """One MDM forward pass → the head's inputs.

    Args:
        model: any `MaskedModel`.
        tokens_BL: ``[B, L]`` contexts with ``model.mask_id`` at the masked positions.
        layer: the MDM layer whose hidden states are returned (-1: last).

    Returns:
        `HeadInputs` ``(hidden [B, L, D], masked [B, L] bool, entropy [B, L] float nats, probs [B, L, V])``: the
        entropy of each masked position's marginal over its legal values (0 at unmasked positions) and the
        marginals themselves.

    Raises:
        ValueError: as `MaskedModel.check_tokens` (bad shape, ids, length, device) and the model's
            layer check.
    """
    out = model(tokens_BL, layer=layer)
    log_probs = model.log_probs_from_logits(out.logits.float())
    ent = entropy_from_log_probs(log_probs)
    masked = model.is_masked(tokens_BL)
    return HeadInputs(out.hidden, masked, ent * masked, log_probs.exp())


@torch.no_grad()
def forward_and_head_seconds(model: MaskedModel, head: MIHead, tokens_BL: Tensor, layer: int = -1,
                             repeats: int = 3) -> tuple[float, float]:
    """``(forward s, head s)``: wall-clock seconds per call of one MDM forward that yields the head's inputs
    (`head_inputs`) and of one head pass on them, for the batch ``tokens_BL`` ``[B, L]``, timed one after the other in
    this call (so their ratio comes from one run; `mimdm.core.timing.seconds_per_call`, one warm-up call each)."""
    fwd = seconds_per_call(lambda: head_inputs(model, tokens_BL, layer), model.device, repeats)
    inputs = head_inputs(model, tokens_BL, layer)
    return fwd, seconds_per_call(lambda: head(*inputs), model.device, repeats)


@torch.no_grad()
def predict_mi(model: MaskedModel, head: MIHead, tokens_BL: Tensor, layer: int = -1, batch_size: int = 256) -> Tensor:
    """Predicted MI ``[B, L, L]`` (nats) from one MDM forward pass per context (plus one head pass).

    Args:
        tokens_BL: ``[B, L]`` contexts with ``model.mask_id`` at the masked positions.
        layer: the MDM layer whose hidden states the head was trained on.
        batch_size: contexts per forward pass.

    Raises:
        ValueError: as `MIHead.forward` (the head does not fit the model's hidden size or length).
    """
    outs = []
    for s in range(0, tokens_BL.shape[0], batch_size):
        outs.append(head(*head_inputs(model, tokens_BL[s:s + batch_size], layer)))
    return torch.cat(outs)


def mi_loss(pred_BLL: Tensor, target_BLL: Tensor, masked_BL: Tensor, kind: str = "log1p_weighted",
            scale: float = 0.01, weight_scale: float = 0.05) -> Tensor:
    """Loss over masked pairs (i < j) of a batch.

    Args:
        pred_BLL: ``[B, L, L]`` predicted MI (nats).
        target_BLL: ``[B, L, L]`` probed MI (nats).
        masked_BL: ``[B, L]`` bool, the masked positions; only pairs of masked positions count.
        kind: ``"log1p_weighted"`` (default; see module docstring):
            Σ w (log1p(p/s) − log1p(t/s))² / Σ w with s = ``scale`` and w = 1 + t / ``weight_scale``;
            ``"log1p"`` (w = 1) or ``"mse"`` (plain squared error in nats²).
        scale, weight_scale: s and the weight's scale, in nats.

    Returns:
        A scalar tensor (0 with gradient when the batch has no masked pair).

    Raises:
        ValueError: unknown ``kind``; shapes that are not ``[B, L, L]``, ``[B, L, L]``, ``[B, L]``.
    """
    if pred_BLL.dim() != 3 or pred_BLL.shape[1] != pred_BLL.shape[2] or target_BLL.shape != pred_BLL.shape \
            or tuple(masked_BL.shape) != tuple(pred_BLL.shape[:2]):
        raise ValueError(f"mi_loss needs pred [B, L, L], target [B, L, L] and masked [B, L]; got "
                         f"{tuple(pred_BLL.shape)}, {tuple(target_BLL.shape)}, {tuple(masked_BL.shape)}")
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


SCHEDULES = ("onecycle", "constant")
AUGMENTS = ("none", "sudoku_symmetry")


@dataclass(frozen=True)
class HeadTrainConfig:
    """Head training settings.

    AdamW over ``epochs`` passes of the training split, with a one-cycle learning-rate schedule
    (Smith & Topin 2019; `torch.optim.lr_scheduler.OneCycleLR`: warm-up over the first 10% of
    steps (at least 2 steps) to the peak ``lr``, cosine annealing after it, and AdamW's β1 cycled inversely between
    0.95 and 0.85, the scheduler's default) or a constant ``lr``.
    The head with the best validation loss is kept; with ``patience`` set, training also stops
    after that many epochs without improvement. ``augment``: ``"none"`` (the stored training split every epoch) or
    ``"sudoku_symmetry"`` (every epoch a fresh random Sudoku symmetry of each training context, its hidden states
    and entropies recomputed by the MDM and its MI labels permuted with it:
    `mimdm.experiments.mi_head.sudoku_symmetry_augment`).
    """

    layer: int = -1
    epochs: int = 40
    batch_size: int = 32
    lr: float = 5e-3
    weight_decay: float = 0.01
    loss: str = "log1p_weighted"
    schedule: str = "onecycle"
    patience: int | None = None
    seed: int = 0
    loss_scale: float = 0.01
    loss_weight_scale: float = 0.05
    augment: str = "none"

    def to_dict(self) -> dict:
        """The settings as a dict; the loss scales and ``augment`` are left out at their defaults (cache keys of
        earlier heads hold)."""
        d = asdict(self)
        for k, default in (("loss_scale", 0.01), ("loss_weight_scale", 0.05), ("augment", "none")):
            if d[k] == default:
                del d[k]
        return d


def make_optimizer(head: nn.Module, cfg: HeadTrainConfig, steps_per_epoch: int):
    """``(AdamW, scheduler or None)`` for ``cfg`` (shared by `train_head` and the DDP trainer).

    Raises:
        ValueError: unknown ``cfg.schedule``.
    """
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {cfg.schedule!r}; use one of {SCHEDULES}")
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.schedule == "constant":
        return opt, None
    total = cfg.epochs * steps_per_epoch
    if total < 4:  # too few steps for a warm-up phase: constant lr
        return opt, None
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, cfg.lr, total_steps=total, pct_start=max(0.1, 2 / total))


def evaluate_loss(head: MIHead, data: dict, layer: int, kind: str, mask_id: int, batch_size: int = 64,
                  scale: float = 0.01, weight_scale: float = 0.05) -> float:
    """Mean `mi_loss` of ``head`` over the contexts of a label split (``data`` from `mimdm.pipelines.labels.load_labels`:
    ``tokens [N, L]``, ``hidden_<layer> [N, L, D]``, ``entropy [N, L]`` nats, ``mi [N, L, L]`` nats), in batches of
    ``batch_size`` contexts on the head's device.

    Returns the context-weighted mean loss (units of ``kind``: log1p scale, or nats² for ``"mse"``).

    Raises:
        ValueError: an empty split.
    """
    if len(data["tokens"]) == 0:
        raise ValueError("the label split holds no contexts")
    device = next(head.parameters()).device
    tot, n = _val_loss_sum(head, data, layer, kind, mask_id, DistInfo(), device, batch_size, scale, weight_scale)
    return tot / n


def _probs(data: dict, b: Tensor, device) -> Tensor | None:
    """The marginals ``probs`` of the contexts ``b`` of a label split on ``device``, or None if it holds none."""
    return data["probs"][b].to(device) if "probs" in data else None


def _split(idx: np.ndarray, world: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s contiguous part of ``idx`` (``np.array_split`` into ``world`` parts)."""
    return np.array_split(idx, world)[rank] if world > 1 else idx


def _val_loss_sum(head: MIHead, data: dict, layer: int, kind: str, mask_id: int, info: DistInfo,
                  device: torch.device, batch_size: int = 64, scale: float = 0.01,
                  weight_scale: float = 0.05) -> tuple[float, int]:
    """Rank's share of the validation loss: batches ``i ≡ rank (mod world)`` of `evaluate_loss`'s batches.

    Returns ``(sum over its batches of loss × batch size, number of contexts)``.
    """
    head.eval()
    n = len(data["tokens"])
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i, s in enumerate(range(0, n, batch_size)):
            if i % info.world_size != info.rank:
                continue
            b = torch.arange(s, min(s + batch_size, n))
            h = data[f"hidden_{layer}"][b].to(device)
            masked = (data["tokens"][b] == mask_id).to(device)
            pred = head(h, masked, data["entropy"][b].to(device), _probs(data, b, device))
            tot += mi_loss(pred, data["mi"][b].to(device), masked, kind, scale, weight_scale).item() * len(b)
            cnt += len(b)
    return tot, cnt


def train_head(train: dict, val: dict, head_cfg: MIHeadConfig, cfg: HeadTrainConfig, mask_id: int,
                   progress: bool = True, save_path: Path | None = None, extra: dict | None = None,
                   device: str | torch.device | None = None,
                   augment: Callable[[dict, np.random.Generator], dict] | None = None) -> tuple[MIHead, list[dict]]:
    """Train an `MIHead` on stored labels; the head with the best validation loss is returned. Alone, or on the ranks
    of a ``torchrun`` job with `DistributedDataParallel`.

    Call it on every rank with the same label splits (each rank loads them). Joins the process
    group from the environment if none exists (`mimdm.core.distributed.init_distributed`); alone (no
    ``WORLD_SIZE`` > 1) no group is made and DDP is not used.

    Data split. Every rank draws the same permutation of the training contexts per epoch (numpy
    generator seeded with ``cfg.seed``, as `train_head`) and cuts it into the same global batches of
    ``cfg.batch_size``; each global batch is split into ``world_size`` contiguous parts
    (``np.array_split``), rank r taking part r, so in an epoch the ranks see disjoint slices whose
    union is the training split, in as many optimiser steps as `train_head`. Each rank's loss (the
    pair-weighted `mi_loss` over its part) is scaled by ``world_size × n_r / n_batch`` so that DDP's
    gradient average is the context-weighted mean of the parts' gradients. Validation: the batches
    of `mimdm.heads.mi_head.evaluate_loss` (64 contexts) are dealt round-robin to the ranks and the sums of
    loss × batch size and of contexts are all-reduced, so the validation loss is that of
    `evaluate_loss` up to float64 summation order, and identical on all ranks (so are the
    early-stopping decisions). The logged ``train_loss`` is the mean over steps of the
    context-weighted mean of the parts' losses.

    Alone, each epoch draws a permutation of the training contexts, takes batches of ``cfg.batch_size`` in
    that order, and validates with `evaluate_loss`. With ``cfg.augment`` set, each epoch first replaces the training
    split by ``augment(train, rng)`` (a generator seeded with ``[cfg.seed, 1]``, the same on every rank; the
    permutations' generator is unchanged), validating on the stored validation split. With N > 1 ranks the gradient of a step is the context-weighted mean of the
    gradients of the N parts' losses rather than the gradient of one pair-weighted loss over the
    whole batch (`mi_loss` weights pairs, not contexts), so results differ slightly from a run alone; they do not
    depend on anything but ``cfg``, the data and N. All ranks hold identical weights throughout
    (same initialisation, DDP-averaged gradients, same AdamW steps).

    Args:
        train, val: label splits from `mimdm.pipelines.labels.load_labels` (with ``hidden_<cfg.layer>``; with the
            marginals ``probs [N, L, V]`` for a ``constraint_feature`` head,
            `mimdm.experiments.mi_head.with_marginals`).
        head_cfg, cfg: head architecture and training settings.
        mask_id: the MDM's mask token id.
        progress: a progress bar on rank 0.
        save_path: if given, rank 0 saves the best head there (`save_head`, with ``extra`` plus
            ``{"world_size": N}``) before all ranks return.
        device: where to train; default ``cuda:LOCAL_RANK`` under an nccl group, else the CPU.
        augment: required when ``cfg.augment`` is not ``"none"``: ``(split, rng) -> split`` returning the epoch's
            training split (``tokens``, ``hidden_<cfg.layer>``, ``entropy``, ``mi``; as many contexts), e.g.
            `mimdm.experiments.mi_head.sudoku_symmetry_augment` bound to the MDM.

    Returns:
        ``(head with the best validation loss (unwrapped, eval mode, on ``device``), log)`` on
        every rank; log entries ``{"epoch", "train_loss", "val_loss", "seconds"}``.

    Raises:
        KeyError: the labels hold no hidden states of ``cfg.layer``, or no marginals ``probs`` for a
            ``constraint_feature`` head.
        ValueError: an empty training or validation split; an unknown ``cfg.augment``, or one set without
            ``augment``.
        RuntimeError: the validation loss was never finite.
    """
    key = f"hidden_{cfg.layer}"
    if cfg.augment not in AUGMENTS:
        raise ValueError(f"unknown augment {cfg.augment!r}; use one of {AUGMENTS}")
    if cfg.augment != "none" and augment is None:
        raise ValueError(f"augment={cfg.augment!r} needs an augment function (train_head(..., augment=...))")
    for name, split in (("training", train), ("validation", val)):
        if len(split.get("tokens", ())) == 0:
            raise ValueError(f"the {name} split holds no contexts: generate more label shards "
                             "(mimdm.pipelines.labels) or change the split")
    if key not in train:
        raise KeyError(f"labels hold no hidden states of layer {cfg.layer} (have: {[k for k in train if k.startswith('hidden_')]})")
    if head_cfg.constraint_feature and not ("probs" in train and "probs" in val):
        raise KeyError("a constraint_feature head needs the MDM's marginals in the labels (key 'probs'): add them "
                       "with mimdm.experiments.mi_head.with_marginals")
    info = init_distributed()
    if device is None:
        nccl = info.active and dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    head = MIHead(head_cfg).to(device)
    net = head
    if info.active:
        net = torch.nn.parallel.DistributedDataParallel(
            head, device_ids=[device.index] if device.type == "cuda" else None)
    n = len(train["tokens"])
    aug_rng = np.random.default_rng([cfg.seed, 1])
    stored = train
    opt, sched = make_optimizer(head, cfg, math.ceil(n / cfg.batch_size))
    best, best_state, bad, log = float("inf"), None, 0, []
    t0 = time.perf_counter()
    for epoch in tqdm(range(cfg.epochs), desc="train MI head" + (f" (DDP x{info.world_size})" if info.active else ""), unit="epoch",
                      disable=not (progress and info.is_main)):
        if cfg.augment != "none":
            train = augment(stored, aug_rng)
            if len(train["tokens"]) != n:
                raise ValueError(f"augment returned {len(train['tokens'])} contexts for {n}")
        net.train()
        losses = []
        perm = rng.permutation(n)
        for s in range(0, n, cfg.batch_size):
            glob = perm[s:s + cfg.batch_size]
            b = torch.from_numpy(_split(glob, info.world_size, info.rank))
            masked = (train["tokens"][b] == mask_id).to(device)
            pred = net(train[key][b].to(device), masked, train["entropy"][b].to(device), _probs(train, b, device))
            loss = mi_loss(pred, train["mi"][b].to(device), masked, cfg.loss, cfg.loss_scale, cfg.loss_weight_scale)
            if info.active:
                frac = len(b) / len(glob)
                losses.append(loss.item() * frac)
                loss = loss * (info.world_size * frac)
            else:
                losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
        if info.active:
            losses = allreduce_sum(losses, info)
        tot, cnt = _val_loss_sum(head, val, cfg.layer, cfg.loss, mask_id, info, device, scale=cfg.loss_scale,
                                 weight_scale=cfg.loss_weight_scale)
        tot, cnt = allreduce_sum([tot, float(cnt)], info)
        v = tot / max(1, int(cnt))
        log.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "val_loss": v,
                    "seconds": time.perf_counter() - t0})
        if v < best - 1e-6:
            best, best_state, bad = v, {k: x.clone() for k, x in head.state_dict().items()}, 0
        else:
            bad += 1
            if cfg.patience is not None and bad >= cfg.patience:
                break
    if best_state is None:
        raise RuntimeError("the validation loss was never finite: check the labels (empty validation split?)")
    head.load_state_dict(best_state)
    head.eval()
    if save_path is not None and info.is_main:
        save_head(head, Path(save_path), cfg, log, {**(extra or {}), "world_size": info.world_size})
    barrier(info)
    return head, log


def save_head(head: MIHead, path: Path, train_cfg: HeadTrainConfig, log: list[dict], extra: dict | None = None) -> None:
    """Save a head checkpoint with its configs and training log (loadable with ``weights_only=True``).

    Written atomically (a temporary file renamed into place), so an interrupted save leaves no torn file.

    Raises:
        OSError: the folder cannot be written.
    """
    atomic_save({"kind": "mi_head", "state_dict": head.state_dict(), "head_config": json.dumps(head.config.to_dict()),
                 "train_config": json.dumps(train_cfg.to_dict()), "log": json.dumps(log),
                 "extra": json.dumps(extra or {})}, Path(path))


def load_head(path: Path, device="cpu") -> tuple[MIHead, dict]:
    """Load a head saved by `save_head`.

    Args:
        path: the checkpoint file.
        device: where to put the head (checked by `mimdm.core.device.resolve_device`).

    Returns:
        ``(head in eval mode, record)``; the record holds ``head_config``, ``train_config``, ``log``, ``extra``
        and ``path``.

    Raises:
        FileNotFoundError: missing file. ValueError: not an MI-head checkpoint, one of an older head
        version, an unreadable file or not a device name. RuntimeError: CUDA asked for on a machine without it.
    """
    ck = load_checkpoint(path, device)
    if ck.get("kind") != "mi_head":
        raise ValueError(f"{path} is not an MI-head checkpoint (kind={ck.get('kind')!r})")
    hc = json.loads(ck["head_config"])
    unknown = set(hc) - set(MIHeadConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{path} was saved by an older MI head (config fields {sorted(unknown)}); "
                         "delete it and train the head again")
    head = MIHead(MIHeadConfig(**hc))
    head.load_state_dict(ck["state_dict"])
    head.to(device).eval()
    rec = {k: json.loads(ck[k]) for k in ("head_config", "train_config", "log", "extra")}
    rec["path"] = str(path)
    return head, rec
