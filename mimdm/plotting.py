"""Figures of the study (matplotlib)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .metrics import as_numpy


def plot_mi_matrix(mi_LL, ax=None, title: str = "", block: int | None = 9, vmax: float | None = None, cmap="viridis"):
    """Draw an ``[L, L]`` MI matrix (nats) as a heatmap; ``block`` draws grid lines every ``block`` positions."""
    ax = ax or plt.gca()
    m = as_numpy(mi_LL)
    im = ax.imshow(m, cmap=cmap, vmin=0, vmax=vmax if vmax is not None else max(1e-9, float(m.max())),
                   interpolation="nearest")
    if block:
        for k in range(block, m.shape[0], block):
            ax.axhline(k - 0.5, color="w", lw=0.3)
            ax.axvline(k - 0.5, color="w", lw=0.3)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label="MI (nats)")
    return ax


def plot_cell_mi_grid(mi_row_81, grid_81, cell: int, ax=None, title: str = "", vmax: float | None = None):
    """A Sudoku grid coloured by the MI (nats) of every cell with ``cell``; givens are printed, ``cell`` is outlined."""
    ax = ax or plt.gca()
    v = as_numpy(mi_row_81).reshape(9, 9)
    g = np.asarray(grid_81).reshape(9, 9)
    im = ax.imshow(v, cmap="magma", vmin=0, vmax=vmax if vmax is not None else max(1e-9, float(v.max())))
    for r in range(9):
        for c in range(9):
            if g[r, c]:
                ax.text(c, r, str(g[r, c]), ha="center", va="center", fontsize=7, color="0.6")
    for k in (2.5, 5.5):
        ax.axhline(k, color="w", lw=1.2)
        ax.axvline(k, color="w", lw=1.2)
    r, c = divmod(cell, 9)
    ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="cyan", lw=2))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label="MI (nats)")
    return ax
