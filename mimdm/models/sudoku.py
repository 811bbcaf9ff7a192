"""A bidirectional transformer MDM for Sudoku with row/column/box embeddings.

Tokens: 0..8 are the digits 1..9, 9 is the mask. Every cell gets the sum of a token embedding
and learned row, column and box embeddings (without them the model must learn the grid's geometry from
positions alone, which is far slower); then pre-norm transformer
encoder blocks with full (bidirectional) attention, a final LayerNorm, and a linear read-out to
the 9 digits.

With ``relation_bias`` each attention head of each layer also adds one learned logit per cell relation
(same cell, row, column, box; `RELATIONS`) to its attention scores, so attending to a cell's peers
needs no learning from embeddings (an attention bias on the constraint graph, as in relation-aware
attention, Shaw et al. 2018).

Configurations (`SudokuMDMConfig`): ``paper()`` is the paper's 4 layers, d=384, 12 heads, FF 512
(3.97M parameters here; the paper reports 4.16M for its variant); ``cpu()`` is a ~1M-parameter model sized
for CPU training (chapter 1 reports its training and solve rates).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mimdm.core.contract import MaskedModel, MDMOutput

N_CELLS = 81
MASK_ID = 9
DIGITS = tuple("123456789")


@dataclass(frozen=True)
class SudokuMDMConfig:
    """Architecture of the Sudoku MDM (all sizes in units, dropout a probability)."""

    d_model: int = 128
    n_layers: int = 5
    n_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    relation_bias: bool = False

    @classmethod
    def paper(cls) -> "SudokuMDMConfig":
        """The paper's configuration: 4 layers, d=384, 12 heads, FF 512."""
        return cls(d_model=384, n_layers=4, n_heads=12, d_ff=512)

    @classmethod
    def cpu(cls) -> "SudokuMDMConfig":
        """~1M parameters; trains on 2 CPU cores in ~20 min to >= 90% solve rate."""
        return cls(d_model=128, n_layers=5, n_heads=4, d_ff=512)

    def to_dict(self) -> dict:
        """The configuration as a dict (``relation_bias`` only when set, so earlier keys stay unchanged)."""
        d = asdict(self)
        if not self.relation_bias:
            del d["relation_bias"]
        return d


#: The cell relations of the attention bias, in the order of ``SudokuMDM.rel_bias``'s last axis.
RELATIONS = ("self", "row", "column", "box")


def relation_masks() -> Tensor:
    """``[4, 81, 81]`` float 0/1 masks: cell pairs that are the same cell, share a row, share a column,
    share a box (`RELATIONS`; a pair can share a row and a box)."""
    row, col, box = _cell_coords()
    same = lambda a: (a[:, None] == a[None, :])  # noqa: E731
    return torch.stack([torch.eye(N_CELLS, dtype=torch.bool), same(row), same(col), same(box)]).float()


def _cell_coords() -> tuple[Tensor, Tensor, Tensor]:
    idx = torch.arange(N_CELLS)
    row, col = idx // 9, idx % 9
    box = (row // 3) * 3 + col // 3
    return row, col, box


def _biased_block(block: nn.TransformerEncoderLayer, h_BLD: Tensor, bias_HLL: Tensor) -> Tensor:
    """A pre-norm encoder block with an additive attention bias ``[H, L, L]`` shared by the batch.

    Written out with the block's own weights (in-projection, `F.scaled_dot_product_attention`, out-projection,
    feed-forward) instead of calling the block, because the block's inference fast path does not apply a
    per-head float mask (measured with torch 2.13: in eval mode the output ignored it)."""
    B, L, D = h_BLD.shape
    mha = block.self_attn
    H = mha.num_heads
    x = block.norm1(h_BLD)
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).view(B, L, 3, H, D // H).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias_HLL.to(q.dtype),
                                       dropout_p=mha.dropout if block.training else 0.0)
    h_BLD = h_BLD + block.dropout1(mha.out_proj(o.transpose(1, 2).reshape(B, L, D)))
    x = block.norm2(h_BLD)
    return h_BLD + block.dropout2(block.linear2(block.dropout(block.activation(block.linear1(x)))))


class SudokuMDM(MaskedModel):
    """Sudoku MDM (see module docstring). Input ``[B, 81]`` tokens in 0..9, output logits ``[B, 81, 9]``."""

    vocab = DIGITS
    mask_id = MASK_ID
    max_len = N_CELLS
    n_tokens = 10

    def __init__(self, config: SudokuMDMConfig = SudokuMDMConfig()):
        super().__init__()
        self.config = config
        d = config.d_model
        self.hidden_dim = d
        self.register_buffer("value_token_ids", torch.arange(9), persistent=False)
        row, col, box = _cell_coords()
        self.register_buffer("row", row, persistent=False)
        self.register_buffer("col", col, persistent=False)
        self.register_buffer("box", box, persistent=False)
        self.tok_emb = nn.Embedding(self.n_tokens, d)
        self.row_emb = nn.Embedding(9, d)
        self.col_emb = nn.Embedding(9, d)
        self.box_emb = nn.Embedding(9, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, config.n_heads, config.d_ff, config.dropout,
                activation="gelu", batch_first=True, norm_first=True,
            )
            for _ in range(config.n_layers)
        )
        if config.relation_bias:
            # per layer and head, one learned additive attention logit per relation (zero at start)
            self.rel_bias = nn.Parameter(torch.zeros(config.n_layers, config.n_heads, len(RELATIONS)))
            self.register_buffer("relations", relation_masks(), persistent=False)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 9)
        for emb in (self.tok_emb, self.row_emb, self.col_emb, self.box_emb):
            nn.init.normal_(emb.weight, std=0.02)

    def n_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters())

    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:
        L = tokens_BL.shape[1]
        if L != N_CELLS:
            raise ValueError(f"a Sudoku grid has 81 cells, got sequences of length {L}")
        n = len(self.blocks)
        if not -1 <= layer <= n:
            raise ValueError(f"layer must be -1 or in [0, {n}], got {layer}")
        h = self.tok_emb(tokens_BL) + (self.row_emb(self.row) + self.col_emb(self.col) + self.box_emb(self.box))
        hidden = h if layer == 0 else None
        for k, block in enumerate(self.blocks, start=1):
            if self.config.relation_bias:
                h = _biased_block(block, h, torch.einsum("hr,rij->hij", self.rel_bias[k - 1], self.relations))
            else:
                h = block(h)
            if k == layer:
                hidden = h
        h = self.norm(h)
        if hidden is None:
            hidden = h
        return MDMOutput(logits=self.out(h), hidden=hidden)

    @torch.no_grad()
    def attention_maps(self, tokens_BL: Tensor) -> tuple[Tensor, Tensor]:
        """Every layer's and head's attention probabilities, with the logits of the same pass.

        The forward pass written out with explicit attention (softmax(q·kᵀ/√d_head + relation bias), then
        probabilities @ v) instead of `F.scaled_dot_product_attention`, which does not return the probabilities; the
        logits equal `forward`'s up to float rounding. Costs about one forward pass plus the L×L score matrices of
        every head (for the `cpu` model about 5% more arithmetic). Used to ask whether the attention pattern, which a
        decoding pass computes anyway, tells the MI head more than the last hidden states (`scripts/head_sweep.py`).

        Args:
            tokens_BL: ``[B, 81]`` tokens in 0..9 (9 = mask).

        Returns:
            ``(attn_BNHLL, logits_BLV)``: ``[B, n_layers, n_heads, 81, 81]`` float32 attention probabilities (row i:
            where cell i attends; each row sums to 1) and ``[B, 81, 9]`` logits.

        Raises:
            ValueError: sequences not of length 81; RuntimeError: a non-finite attention probability or logit.
        """
        if tokens_BL.dim() != 2 or tokens_BL.shape[1] != N_CELLS:
            raise ValueError(f"tokens must be [B, 81], got {tuple(tokens_BL.shape)}")
        tokens_BL = tokens_BL.long().to(self.tok_emb.weight.device)
        h = self.tok_emb(tokens_BL) + (self.row_emb(self.row) + self.col_emb(self.col) + self.box_emb(self.box))
        B, L, D = h.shape
        maps = []
        for k, block in enumerate(self.blocks):
            mha = block.self_attn
            H = mha.num_heads
            x = block.norm1(h)
            q, kk, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).view(B, L, 3, H, D // H).permute(2, 0, 3, 1, 4)
            scores = q @ kk.transpose(-1, -2) / (D // H) ** 0.5  # [B, H, L, L]
            if self.config.relation_bias:
                scores = scores + torch.einsum("hr,rij->hij", self.rel_bias[k], self.relations)
            attn = torch.softmax(scores, -1)
            maps.append(attn)
            h = h + mha.out_proj((attn @ v).transpose(1, 2).reshape(B, L, D))
            h = h + block.linear2(block.activation(block.linear1(block.norm2(h))))
        attn_BNHLL, logits_BLV = torch.stack(maps, 1), self.out(self.norm(h))
        if not (torch.isfinite(attn_BNHLL).all() and torch.isfinite(logits_BLV).all()):
            raise RuntimeError("non-finite attention probabilities or logits")
        return attn_BNHLL, logits_BLV
