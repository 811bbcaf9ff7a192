"""Figures (matplotlib) and tables of the study."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mimdm.evaluation.metrics import as_numpy
from mimdm.experiments.speedup import pareto_front


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


#: One colour per decoding rule, the same in every chapter's figures.
RULE_COLORS = {"sequential": "black", "top-k": "#1f77b4", "threshold": "#ff7f0e", "EB-sampler": "#2ca02c",
               "entropy cap": "#9467bd", "MI-guided": "#d62728", "MI-oracle": "#8c564b"}
#: Axis labels, with units, of the metrics the sweeps report.
METRIC_LABELS = {"solve_rate": "puzzles solved (fraction)", "valid_rate": "valid grids (fraction)",
                 "nll": "NLL (nats per grid)", "bit_score": "HMM bit score (bits)",
                 "recovery": "recovery of masked positions (fraction)", "nfe": "mean NFE (forward passes)"}


#: Short headers of the book's tables (`book_table`); other columns keep their name with spaces for underscores.
TABLE_LABELS = {"entropy_cap": "cap (nats)", "mi_budget": "MI budget", "solve_rate": "solved", "valid_rate": "valid",
                "nfe": "NFE", "nfe_reduction": "NFE ×", "wallclock_reduction": "wall-clock ×",
                "paired_difference": "Δ vs sequential", "mcnemar_p": "McNemar p", "neg_nll": "−NLL (nats)",
                "dev_nfe": "NFE (dev)", "dev_solve_rate": "solved (dev)", "nfe_budget": "NFE budget",
                "head_passes": "head passes", "probe_passes": "probing passes", "eps": "ε (nats)",
                "head_solve_rate": "solved, head", "oracle_solve_rate": "solved, oracle", "head_nfe": "NFE, head",
                "oracle_nfe": "NFE, oracle", "solve_rate_gap": "solved gap", "nfe_gap": "NFE gap",
                "over_forward": "cost (× one forward)", "n_contexts": "contexts"}


def book_table(rows, columns=None, intervals: dict | None = None, digits: int = 3, missing: str = "–"):
    """A compact table for the book: no index, short headers (`TABLE_LABELS`), numbers to ``digits`` significant
    digits, intervals in the value's cell, missing values shown as ``missing``.

    Args:
        rows: a DataFrame or a list of dicts.
        columns: the columns to show, in order (default: all).
        intervals: ``{column: (low column, high column)}``: the cell becomes ``"v (low–high)"`` and the two bound
            columns are left out (a missing bound leaves ``v`` alone).
        digits: significant digits of floats (0.00012 stays 0.00012, 56.14 shows 56.1).
        missing: what None and NaN show as (e.g. a rule without a knob, a budget a rule never reaches).

    Returns:
        A pandas ``Styler`` (rendered as an HTML table by Jupyter); its ``.data`` holds the shown columns under
        their headers, intervals already as text.

    Raises:
        KeyError: a named column (or interval bound) is not in ``rows``.
    """
    df = pd.DataFrame(rows)
    intervals = intervals or {}
    bounds = [b for lo_hi in intervals.values() for b in lo_hi]
    want = list(df.columns) if columns is None else list(columns)
    absent = [c for c in dict.fromkeys(want + list(intervals) + bounds) if c not in df.columns]
    if absent:
        raise KeyError(f"book_table: no column(s) {absent} (have {list(df.columns)})")

    def cell(x):
        if x is None or (isinstance(x, (float, np.floating)) and np.isnan(x)):
            return missing
        if isinstance(x, (float, np.floating)):
            return f"{x:.{digits}g}"
        return x

    df = df.astype(object)
    for col, (lo, hi) in intervals.items():
        df[col] = [cell(v) if missing in (cell(v), cell(a), cell(b)) else f"{cell(v)} ({cell(a)}–{cell(b)})"
                   for v, a, b in zip(df[col], df[lo], df[hi])]
    df = df[[c for c in want if c not in set(bounds)]]
    df = df.rename(columns=lambda c: TABLE_LABELS.get(c, str(c).replace("_", " ")))
    return (df.style.hide(axis="index").format(cell)
            .set_table_styles([{"selector": "th, td", "props": [("padding", "0.15em 0.7em"), ("text-align", "left")]}]))


def rule_color(name: str) -> str:
    """The colour of a rule in every figure (`RULE_COLORS`; grey for a rule not listed)."""
    return RULE_COLORS.get(name, "gray")


def plot_pareto_sweep(rows, metric: str, ax=None, title: str = "", higher_is_better: bool = True):
    """A decoding sweep (rows of `mimdm.experiments.speedup.sweep`, a DataFrame or list of dicts): every setting of a
    rule as a faint point at (mean NFE, ``metric``), each rule's Pareto frontier as a line, sequential as a star;
    colours from `RULE_COLORS`, the y label from `METRIC_LABELS`."""
    ax = ax or plt.gca()
    df = pd.DataFrame(rows)
    for name, g in df.groupby("rule", sort=False):
        col = rule_color(name)
        if name == "sequential":
            ax.plot(g.nfe, g[metric], "*", c=col, ms=10, label=name)
            continue
        ax.plot(g.nfe, g[metric], "o", c=col, ms=3, alpha=0.35)
        f = pd.DataFrame(pareto_front(g.to_dict(orient="records"), metric, higher_is_better=higher_is_better))
        if len(f):
            ax.plot(f.nfe, f[metric], "o-", c=col, ms=4, label=name)
    ax.set_xlabel("mean NFE (forward passes) per grid")
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_held_out(sets: dict, metric: str = "solve_rate", ax=None, title: str = ""):
    """Held-out rows (`mimdm.experiments.speedup.report_held_out`) of one or more puzzle sets, ``{label: rows}``:
    each rule's chosen setting at (mean NFE, ``metric``) with its Wilson interval as an error bar, colour per rule
    (`RULE_COLORS`), one marker per set (circle, square, triangle, ...); the legend names rules and sets."""
    ax = ax or plt.gca()
    markers = "osv^D"
    for k, (label, rows) in enumerate(sets.items()):
        m = markers[k % len(markers)]
        for r in rows:
            y, lo, hi = r[metric], r[f"{metric}_ci_low"], r[f"{metric}_ci_high"]
            ax.errorbar(r["nfe"], y, yerr=[[y - lo], [hi - y]], fmt=m, c=rule_color(r["rule"]), ms=6, capsize=2,
                        mfc="none" if k else rule_color(r["rule"]))
        ax.plot([], [], m, c="gray", mfc="none" if k else "gray", label=label)
    for name in dict.fromkeys(r["rule"] for rows in sets.values() for r in rows):
        ax.plot([], [], "-", c=rule_color(name), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("mean NFE (forward passes) per puzzle")
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_nfe_sweep(rows, metric: str, ax=None, title: str = "", ylabel: str = ""):
    """A decoding sweep as one line per rule against mean NFE on a log scale (sequential as a star)."""
    ax = ax or plt.gca()
    for name, g in pd.DataFrame(rows).groupby("rule", sort=False):
        ax.plot(g.nfe, g[metric], "*" if name == "sequential" else "o-", ms=9 if name == "sequential" else 4, label=name,
                c=rule_color(name))
    ax.set_xscale("log")
    ax.set_xlabel("mean NFE per sequence (log scale)")
    ax.set_ylabel(ylabel or METRIC_LABELS.get(metric, metric))
    ax.set_title(title, fontsize=10)
    return ax


def plot_unmask_steps(step_of_81, ax=None, title: str = ""):
    """A Sudoku grid coloured by the decoding step at which each cell was unmasked (givens, step -1, left blank)."""
    ax = ax or plt.gca()
    steps = as_numpy(step_of_81).reshape(9, 9)
    im = ax.imshow(np.where(steps < 0, np.nan, steps), cmap="viridis")
    for r in range(9):
        for c in range(9):
            ax.text(c, r, "·" if steps[r, c] < 0 else str(steps[r, c]), ha="center", va="center", fontsize=7, color="w")
    for k in (2.5, 5.5):
        ax.axhline(k, color="k", lw=1.2)
        ax.axvline(k, color="k", lw=1.2)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    plt.colorbar(im, ax=ax, fraction=0.046)
    return ax


def plot_run_curves(runs: dict, ax=None):
    """Solve rates (%) against training examples seen (millions) of several runs (`mimdm.pipelines.long_run.run_curves`):
    30-35 clues solid, 24-26 clues dashed, one colour per run."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    for i, (name, run) in enumerate(runs.items()):
        c = pd.DataFrame(run["curve"])
        ax.plot(c.examples_seen / 1e6, 100 * c.solve_30_35, "o-", ms=3, color=f"C{i}", label=f"{name}: 30-35 clues")
        ax.plot(c.examples_seen / 1e6, 100 * c.solve_hard, "s--", ms=3, color=f"C{i}", label=f"{name}: 24-26 clues")
    ax.set_xlabel("training examples seen (millions)")
    ax.set_ylabel("solved (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    return ax


def plot_training(log, curve, n_parameters: int, train_seconds: float, axes=None):
    """Two panels: training loss against step (``log``: rows with ``step``, ``loss``) with the uniform-guess level
    ln 9, and, if ``curve`` has rows (``examples_seen``, ``solve_30_35``, ``solve_hard``), the solve rates during
    training."""
    log, curve = pd.DataFrame(log), pd.DataFrame(curve)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    axes[0].plot(log.step, log.loss)
    axes[0].set_xlabel("training step")
    axes[0].set_ylabel("loss (nats per masked cell)")
    axes[0].axhline(np.log(9), ls=":", c="gray", label="uniform guess (ln 9)")
    axes[0].legend()
    axes[0].set_title(f"{n_parameters:,} parameters, {train_seconds / 60:.0f} min of training")
    if len(curve):
        axes[1].plot(curve.examples_seen / 1e6, 100 * curve.solve_30_35, "o-", ms=3, label="30-35 clues")
        axes[1].plot(curve.examples_seen / 1e6, 100 * curve.solve_hard, "o-", ms=3, label="24-26 clues")
        axes[1].set_xlabel("training examples seen (millions)")
        axes[1].set_ylabel("solved (%)")
        axes[1].set_ylim(0, 100)
        axes[1].set_title("solve rate during training (100 puzzles each)")
        axes[1].legend()
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "no solve-rate curve recorded for this model", ha="center")
    return axes
