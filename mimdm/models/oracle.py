"""Oracle MDMs whose conditionals come from an explicit, enumerable joint distribution.

`TableJointMDM` holds log p(x) for every state of a short sequence (V^L states) and answers
p(x_i | observed positions) exactly by enumeration. Because its conditionals are those of one
joint, everything computed from it has a closed form: probing must reproduce the exact
conditional MI, and the likelihood estimators must reproduce −log p(x). Used in tests and in the
exactness checks of the book.
"""
from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from mimdm.core.contract import MaskedModel, MDMOutput
from mimdm.core.information import pairwise_mi


def potts_chain_log_joint(length: int, n_values: int, coupling: float = 1.0, field_scale: float = 0.5,
                          generator: torch.Generator | None = None) -> Tensor:
    """Log-joint ``[V]*L`` of a Potts chain: log p(x) = Σ_i h_i(x_i) + Σ_i J·[x_i = x_{i+1}] + Σ_i W_i(x_i, x_{i+2}) − log Z.

    Fields h and second-neighbour couplings W are Gaussian (scale ``field_scale``), so the
    distribution has full support and dependence at distance 1 and 2.

    Raises:
        ValueError: V^L above 10^6 (too large to enumerate).
    """
    if n_values ** length > 10 ** 6:
        raise ValueError(f"V^L = {n_values}^{length} is too large to enumerate (limit 1e6 states)")
    g = generator or torch.Generator().manual_seed(0)
    h = torch.randn(length, n_values, generator=g, dtype=torch.float64) * field_scale
    W = torch.randn(max(0, length - 2), n_values, n_values, generator=g, dtype=torch.float64) * field_scale
    states = torch.tensor(list(itertools.product(range(n_values), repeat=length)), dtype=torch.long)
    e = h[torch.arange(length), states].sum(1)
    e = e + coupling * (states[:, 1:] == states[:, :-1]).double().sum(1)
    for i in range(length - 2):
        e = e + W[i, states[:, i], states[:, i + 2]]
    return (e - torch.logsumexp(e, 0)).reshape([n_values] * length)


class TableJointMDM(MaskedModel):
    """An exact MDM for an explicit distribution over a finite set of length-L states.

    Tokens: values 0..V-1, mask id V. Logits are log p(x_i = a | observed) in float64 (for an
    observed position, the log of a one-hot; values impossible given the context get -inf);
    hidden states are the one-hot input tokens ``[B, L, V+1]``.

    Args:
        states: ``[S, L]`` long, the support (distinct states, values in 0..V-1).
        log_p: ``[S]`` log-probabilities of the states (normalised).
        n_values: V.

    Use `from_table` for a dense ``[V]*L`` table and `from_samples` for a uniform distribution over
    given states (e.g. all completions of a partial Sudoku).

    Raises:
        ValueError: shapes disagree, values out of range, ``log_p`` not normalised; at call time,
            a context with probability 0.
    """

    def __init__(self, states: Tensor, log_p: Tensor, n_values: int):
        super().__init__()
        if states.dim() != 2 or log_p.shape != (states.shape[0],):
            raise ValueError(f"need states [S, L] and log_p [S], got {tuple(states.shape)}, {tuple(log_p.shape)}")
        if int(states.min()) < 0 or int(states.max()) >= n_values:
            raise ValueError(f"state values must lie in [0, {n_values})")
        if abs(torch.logsumexp(log_p.double(), 0).item()) > 1e-9:
            raise ValueError("log_p is not normalised (logsumexp != 0)")
        V, L = n_values, states.shape[1]
        self.vocab = tuple(str(a) for a in range(V))
        self.mask_id = V
        self.n_tokens = V + 1
        self.max_len = L
        self.hidden_dim = V + 1
        self.register_buffer("value_token_ids", torch.arange(V), persistent=False)
        self.register_buffer("states", states.long(), persistent=False)  # [S, L]
        self.register_buffer("log_p", log_p.double(), persistent=False)  # [S]

    @classmethod
    def from_table(cls, log_joint: Tensor) -> "TableJointMDM":
        """From a dense log-joint of shape ``[V] * L`` (natural log, normalised or not).

        Raises:
            ValueError: the dimensions of ``log_joint`` are not all equal; no finite entry (zero mass)
                or a NaN / +inf entry.
        """
        L, V = log_joint.dim(), log_joint.shape[0]
        if any(s != V for s in log_joint.shape):
            raise ValueError(f"log_joint must have shape [V]*L, got {tuple(log_joint.shape)}")
        lp = log_joint.double().flatten()
        if torch.isnan(lp).any() or torch.isposinf(lp).any() or not torch.isfinite(lp).any():
            raise ValueError("log_joint must hold finite log-weights (-inf for impossible states) and at least one finite one")
        states = torch.tensor(list(itertools.product(range(V), repeat=L)), dtype=torch.long)
        return cls(states, lp - torch.logsumexp(lp, 0), V)

    @classmethod
    def from_samples(cls, states: Tensor, n_values: int) -> "TableJointMDM":
        """Uniform distribution over the given distinct ``[S, L]`` states.

        Raises:
            ValueError: repeated states (they would be weighted twice).
        """
        S = states.shape[0]
        if len(torch.unique(states, dim=0)) != S:
            raise ValueError("states must be distinct (repeated states would be weighted twice)")
        return cls(states, torch.full((S,), -math.log(S), dtype=torch.float64), n_values)

    def _forward(self, tokens_BL: Tensor, layer: int) -> MDMOutput:
        B, L = tokens_BL.shape
        if L != self.max_len:
            raise ValueError(f"this oracle models sequences of length {self.max_len}, got {L}")
        V = len(self.vocab)
        obs = tokens_BL != self.mask_id  # [B, L]
        agree = (self.states[None] == tokens_BL[:, None]) | ~obs[:, None]  # [B, S, L]
        logw = self.log_p[None].expand(B, -1).masked_fill(~agree.all(-1), float("-inf"))  # [B, S]
        logz = torch.logsumexp(logw, 1, keepdim=True)
        if torch.isinf(logz).any():
            raise ValueError("a context has probability 0 under the joint")
        w = (logw - logz).exp()  # [B, S] conditional probabilities of the states
        onehot = torch.nn.functional.one_hot(self.states, V).double().reshape(-1, L * V)  # [S, L*V]
        logits = (w @ onehot).reshape(B, L, V).log()  # log p(x_i = a | obs), -inf if impossible
        hidden = torch.nn.functional.one_hot(tokens_BL, V + 1).double()
        return MDMOutput(logits=logits, hidden=hidden)

    def conditional(self, tokens_L: Tensor) -> tuple[Tensor, Tensor]:
        """States consistent with a context and their conditional probabilities.

        Returns:
            ``(states [S', L], probs [S'])`` for the context ``tokens_L`` (``[L]``).
        """
        obs = tokens_L != self.mask_id
        agree = ((self.states == tokens_L) | ~obs).all(1)
        lp = self.log_p[agree]
        return self.states[agree], (lp - torch.logsumexp(lp, 0)).exp()

    def exact_mi(self, tokens_L: Tensor) -> Tensor:
        """Exact conditional MI ``[L, L]`` (nats) between positions given the context ``tokens_L``.

        Computed from the joint (not from the model's conditionals); zero on the diagonal and
        for observed positions.
        """

        states, probs = self.conditional(tokens_L)
        return pairwise_mi(states, probs, len(self.vocab))
