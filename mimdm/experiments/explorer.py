"""The book's interactive MI explorer: a cell's MI row, probed beside predicted, switched in the browser.

The book is static HTML without a kernel, so nothing may run Python when the reader moves a
control. Every view is therefore computed while the notebook executes and the controls only
switch between them, client-side:

- `sudoku_contexts` draws a few solution grids and masks each at several levels, *nested* (a
  cell masked at a lower level stays masked at the higher ones, so one cell can be followed
  across levels);
- `sudoku_views` measures, for every context, the ground-truth MI by probing
  (`mimdm.probing.exact.probe_mi`, 1 + |M|·9 passes) and the MI head's prediction
  (`mimdm.heads.mi_head.predict_mi`, one pass);
- `mi_row_table` draws one MI row (81 values, nats) as a compact 9×9 HTML table: a colour class
  per cell (16 levels of the ``magma`` map, as in `mimdm.experiments.plotting.plot_cell_mi_grid`), the value
  in nats in the ``title`` attribute (shown on hover), givens printed in grey, the chosen cell
  outlined;
- `build_explorer` nests ipywidgets 8 ``Stack`` containers (puzzle → masking level → row →
  column) and ties each control's ``index`` to the ``selected_index`` of the stacks below it
  with ``jslink``. Links run in the browser, so the embedded widget state that papermill/nbclient
  saves in the notebook metadata is enough for the built HTML to switch views (with the vendored
  ``@jupyter-widgets/html-manager`` script; see ``_config.yml``). Only core widgets
  (``@jupyter-widgets/controls``/``base``, bundled in that script) are used, so nothing is fetched;
- `static_figure` draws the same rows with matplotlib for readers without JavaScript.

Size: a view is one HTML string of about 4 kB; the views share one ``Layout`` and one style, so
the saved widget state grows by about 4-5 kB per masked cell shown (2 puzzles × masking
35/60/85 % = 292 views: 1.3 MB with the cpu-profile model, 1.5 MB with the smoke one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mimdm.core.contract import MaskedModel
from mimdm.data import sudoku as sd
from mimdm.data.sudoku import cell_name
from mimdm.experiments.plotting import plot_cell_mi_grid
from mimdm.heads.mi_head import MIHead, predict_mi
from mimdm.pipelines.zoo import grids_to_tokens
from mimdm.probing.exact import probe_mi

#: Colour levels of the tables (class ``q0`` = 0 nats … ``q15`` = the view's colour-scale maximum).
N_LEVELS = 16
#: Default masking levels (fraction of the 81 cells masked).
DEFAULT_RATES = (0.35, 0.6, 0.85)


def _palette(n: int = N_LEVELS, cmap: str = "magma") -> list[str]:
    import matplotlib

    cm = matplotlib.colormaps[cmap]
    return [matplotlib.colors.to_hex(cm(k / (n - 1))) for k in range(n)]


#: Hex colours of the levels, dark (no MI) to light (high MI), like `mimdm.experiments.plotting.plot_cell_mi_grid`.
PALETTE = _palette()


def table_css(scope: str = "mimx") -> str:
    """The ``<style>`` block the tables need (colour classes, box borders), scoped to ``.<scope>``."""
    s = f".{scope}"
    rules = [
        f"{s} table{{border-collapse:collapse;margin:2px 10px 6px 0;table-layout:fixed}}",
        f"{s} caption{{caption-side:top;font:12px sans-serif;padding:2px;text-align:center}}",
        f"{s} td{{width:20px;height:20px;min-width:20px;padding:0!important;border:1px solid #bbb!important;"
        f"text-align:center;vertical-align:middle;font:11px sans-serif;line-height:20px;background:{PALETTE[0]}}}",
        f"{s} tr:nth-child(3n) td{{border-bottom:2px solid #333!important}}",
        f"{s} tr:first-child td{{border-top:2px solid #333!important}}",
        f"{s} td:nth-child(3n){{border-right:2px solid #333!important}}",
        f"{s} td:first-child{{border-left:2px solid #333!important}}",
        f"{s} td.g{{background:#eee;color:#777}}",
        f"{s} td.s{{outline:3px solid #00e5ff;outline-offset:-3px}}",
        f"{s} .cap{{font:12px sans-serif;margin:4px 0}}",
        f"{s} .bar span{{display:inline-block;width:12px;height:12px}}",
    ]
    rules += [f"{s} .q{k}{{background:{c}}}" for k, c in enumerate(PALETTE)]
    return "<style>" + "".join(rules) + "</style>"


def color_levels(row_81, vmax: float) -> np.ndarray:
    """``[81]`` int colour level in ``0..N_LEVELS-1`` of each value: ``round(v / vmax · 15)``, clipped."""
    v = np.asarray(row_81, dtype=np.float64)
    if vmax <= 0:
        return np.zeros(v.shape, dtype=np.int64)
    return np.clip(np.rint(v / vmax * (N_LEVELS - 1)), 0, N_LEVELS - 1).astype(np.int64)


def mi_row_table(row_81, givens_81, vmax: float, cell: int | None = None, caption: str = "") -> str:
    """One MI row as a 9×9 HTML table (needs `table_css` on the page).

    Args:
        row_81: ``[81]`` MI (nats) of every cell with the chosen cell (0 at givens).
        givens_81: ``[81]`` int grid, 0 = masked, 1..9 = a given digit (printed, class ``g``).
        vmax: MI (nats) of the lightest colour; larger values are clipped to it.
        cell: the chosen cell (class ``s``: outlined), or None.
        caption: table caption (plain text, escaped).

    Returns:
        ``<table class=mimt>`` with 9 rows of 9 ``<td>``: a masked cell gets class ``q<level>``
        (`color_levels`; none for level 0, the default background) and ``title=<MI in nats>``; a
        given gets class ``g`` and its digit.
        Optional closing tags are left out to keep the notebook small.
    """
    import html

    row = np.asarray(row_81, dtype=np.float64).reshape(-1)
    giv = np.asarray(givens_81).reshape(-1)
    if row.shape != (81,) or giv.shape != (81,):
        raise ValueError(f"need 81 MI values and 81 grid cells, got {row.shape} and {giv.shape}")
    lev = color_levels(row, vmax)
    out = ["<table class=mimt>"]
    if caption:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    for r in range(9):
        out.append("<tr>")
        for c in range(9):
            i = 9 * r + c
            sel = " s" if i == cell else ""
            if giv[i]:
                out.append(f"<td class='g{sel}'>{int(giv[i])}" if sel else f"<td class=g>{int(giv[i])}")
            else:  # level 0 is the cells' default background (`table_css`): no class, a smaller notebook
                cls = " ".join(x for x in (f"q{lev[i]}" if lev[i] else "", sel.strip()) if x)
                out.append(f"<td class='{cls}' title={row[i]:.3g}>" if " " in cls else
                           f"<td class={cls} title={row[i]:.3g}>" if cls else f"<td title={row[i]:.3g}>")
    out.append("</table>")
    return "".join(out)


# ------------------------------------------------------------------------------------ data
def sudoku_contexts(n_puzzles: int = 2, rates=DEFAULT_RATES, seed: int = 0, solutions=None) -> dict:
    """Random solution grids (or the first ``n_puzzles`` of ``solutions``: ``[N, 81]`` or ``[N, 9, 9]`` digits, e.g.
    the solutions of a reader's puzzle file), each masked at several nested levels.

    Each puzzle gets a random order of its 81 cells (all starting with the same cell, so one cell
    is masked in every context); level ``k`` masks the first ``round(81 · rates[k])`` cells of
    that order, so the masked sets are nested.

    Returns:
        ``{"solutions": [P, 81] int8 digits 1..9, "grids": [P, R, 81] int8 (0 = masked),
        "order": [P, 81] int cell order, "rates": tuple of R floats, "n_masked": [R] int}``.

    Raises:
        ValueError: no puzzle, no level, a rate outside (0, 1], or fewer than ``n_puzzles`` ``solutions`` (or one
            that is not a valid complete grid).
    """

    rates = tuple(float(r) for r in rates)
    if n_puzzles < 1 or not rates or not all(0 < r <= 1 for r in rates):
        raise ValueError(f"need n_puzzles >= 1 and rates in (0, 1], got {n_puzzles} and {rates}")
    rng = np.random.default_rng(seed)
    if solutions is None:
        sols = sd.random_solutions(n_puzzles, rng)
    else:
        sols = np.asarray(solutions).reshape(len(solutions), 81)[:n_puzzles]
        if len(sols) < n_puzzles:
            raise ValueError(f"need {n_puzzles} solutions, got {len(sols)}")
        bad = [i for i, g in enumerate(sols) if not sd.is_valid_solution(g)]
        if bad:
            raise ValueError(f"solutions {bad[:5]} are not valid complete grids")
    order = np.stack([rng.permutation(81) for _ in range(n_puzzles)])
    for p in range(1, n_puzzles):  # every order starts with the same cell: masked in every context
        j = int(np.flatnonzero(order[p] == order[0, 0])[0])
        order[p, [0, j]] = order[p, [j, 0]]
    n_masked = np.array([max(1, int(round(81 * r))) for r in rates])
    grids = np.repeat(sols[:, None, :], len(rates), axis=1).copy()
    for p in range(n_puzzles):
        for k, n in enumerate(n_masked):
            grids[p, k, order[p, :n]] = 0
    return {"solutions": sols, "grids": grids, "order": order, "rates": rates, "n_masked": n_masked}


@dataclass
class SudokuViews:
    """Everything the explorer shows (P puzzles, R masking levels).

    Attributes:
        grids: ``[P, R, 81]`` int8, 0 = masked, 1..9 = given.
        gt: ``[P, R, 81, 81]`` float32 probed (ground-truth) MI in nats, symmetrised.
        pred: ``[P, R, 81, 81]`` float32 MI predicted by the head, nats.
        rates: the R masking fractions; ``order``: ``[P, 81]`` cell orders (`sudoku_contexts`).
        nfe: ``[P, R]`` forward passes probing spent per context (the head needs one).
    """

    grids: np.ndarray
    gt: np.ndarray
    pred: np.ndarray
    rates: tuple
    order: np.ndarray
    nfe: np.ndarray

    @property
    def masked(self) -> np.ndarray:
        """``[P, R, 81]`` bool."""
        return self.grids == 0

    @property
    def n_views(self) -> int:
        """Number of (puzzle, level, masked cell) views."""
        return int(self.masked.sum())

    def vmax(self, p: int, k: int) -> float:
        """Colour-scale maximum (nats) of context (p, k): its largest probed MI."""
        return max(float(self.gt[p, k].max()), 1e-6)

    def common_cell(self) -> int:
        """A cell masked in every context (the first such of puzzle 0's order), else puzzle 0's first."""
        allm = self.masked.all(axis=(0, 1))
        for c in self.order[0]:
            if allm[c]:
                return int(c)
        return int(self.order[0, 0])


    def opening_view(self) -> tuple[int, int]:
        """``(level index, cell)`` the explorer opens on: of puzzle 0's cells masked at every level (all masked cells
        if none is), the (level, cell) whose probed MI row carries the most MI (nats), so the first view shows
        dependence rather than an empty map."""
        allm = self.masked[0].all(axis=0)
        cand = np.nonzero(allm)[0] if allm.any() else np.nonzero(self.masked[0].any(axis=0))[0]
        tot = self.gt[0][:, cand, :].sum(-1) * self.masked[0][:, cand]  # [R, n] row sums where masked
        k, j = np.unravel_index(int(np.argmax(tot)), tot.shape)
        return int(k), int(cand[j])


def sudoku_views(model: MaskedModel, head: MIHead, layer: int, contexts: dict,
                 batch_tokens: int = 81 * 512) -> SudokuViews:
    """Probe and predict the MI of every context of `sudoku_contexts` (exact probing, no pruning).

    Args:
        model: the Sudoku MDM (`mimdm.models.sudoku.SudokuMDM`); ``head`` an `MIHead` trained on its
            hidden layer ``layer``.
        batch_tokens: probing memory budget (see `mimdm.probing.exact.probe_mi`).
    """

    grids = np.asarray(contexts["grids"])
    P, R, _ = grids.shape
    tokens = grids_to_tokens(grids.reshape(P * R, 81), model.device)
    res = probe_mi(model, tokens, delta=0.0, batch_tokens=batch_tokens)
    pred = predict_mi(model, head, tokens, layer)
    return SudokuViews(grids=grids.astype(np.int8), gt=res.mi.float().cpu().numpy().reshape(P, R, 81, 81),
                       pred=pred.float().cpu().numpy().reshape(P, R, 81, 81), rates=tuple(contexts["rates"]),
                       order=np.asarray(contexts["order"]), nfe=res.nfe.cpu().numpy().reshape(P, R))


def _row_pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def view_html(views: SudokuViews, p: int, k: int, cell: int) -> str:
    """HTML of one view: a caption and the probed and predicted rows of ``cell`` side by side."""
    g = views.grids[p, k]
    m = g == 0
    others = m.copy()
    others[cell] = False
    gt, pr = views.gt[p, k, cell], views.pred[p, k, cell]
    vmax = views.vmax(p, k)
    r = _row_pearson(gt[others], pr[others])
    cap = (f"<div class=cap><b>{cell_name(cell)}</b>, {int(m.sum())} cells masked: strongest dependence "
           f"{gt.max():.3g} nats probed, {pr.max():.3g} predicted; Pearson r of the row {r:.2f}; "
           f"colour scale 0 to {vmax:.3g} nats</div>")
    return ("<div class=mimx>" + cap + "<div style=display:flex;flex-wrap:wrap>"
            + mi_row_table(gt, g, vmax, cell, f"probed ({int(views.nfe[p, k])} passes)")
            + mi_row_table(pr, g, vmax, cell, "predicted (1 pass + head)") + "</div></div>")


def _given_html(views: SudokuViews, p: int, k: int) -> str:
    g = views.grids[p, k]
    return ("<div class=mimx><div class=cap>This cell is a given here; pick a masked (coloured) cell.</div>"
            + mi_row_table(np.zeros(81), g, 1.0, None, f"puzzle {p + 1}, {int((g == 0).sum())} cells masked")
            + "</div>")


def build_explorer(views: SudokuViews):
    """The explorer widget: controls (puzzle, masking level, row, column) above the chosen view.

    Structure: ``VBox([header, HBox([puzzle, level]), HBox([row, column]), Stack_p])`` where ``Stack_p`` has one child per puzzle,
    each a ``Stack`` over levels, each a ``Stack`` over the 9 rows, each a ``Stack`` over the 9
    columns whose children are the views (`view_html`; a given cell shows the grid instead). The
    control ``index`` traits are ``jslink``-ed to the stacks' ``selected_index``, so switching runs
    in the browser, with or without a kernel.

    Returns:
        the ``ipywidgets.VBox``; ``.links`` holds the ``jslink`` objects and ``.view_widgets`` the
        ``HTML`` widget of every (puzzle, level, masked cell), keyed ``(p, k, cell)``.
    """
    import ipywidgets as w
    from ipywidgets.widgets.widget_string import HTMLStyle

    P, R, _ = views.grids.shape
    lay = w.Layout()
    sty = HTMLStyle()
    box_lay = w.Layout()

    def html(value: str):
        return w.HTML(value, layout=lay, style=sty)

    k0, cell0 = views.opening_view()
    r0, c0 = divmod(cell0, 9)
    puzzle = w.Dropdown(options=[f"puzzle {p + 1}" for p in range(P)], index=0, description="puzzle")
    level = w.SelectionSlider(options=[f"{r:.0%}" for r in views.rates], index=k0, description="masked")
    row = w.SelectionSlider(options=[str(i) for i in range(1, 10)], index=r0, description="row")
    col = w.SelectionSlider(options=[str(i) for i in range(1, 10)], index=c0, description="column")
    links, view_widgets, per_puzzle = [], {}, []
    for p in range(P):
        per_level = []
        for k in range(R):
            given = html(_given_html(views, p, k))
            rows = []
            for r in range(9):
                kids = []
                for c in range(9):
                    i = 9 * r + c
                    if views.grids[p, k, i] == 0:
                        view_widgets[(p, k, i)] = html(view_html(views, p, k, i))
                        kids.append(view_widgets[(p, k, i)])
                    else:
                        kids.append(given)
                cs = w.Stack(kids, selected_index=c0, layout=box_lay)
                links.append(w.jslink((col, "index"), (cs, "selected_index")))
                rows.append(cs)
            rs = w.Stack(rows, selected_index=r0, layout=box_lay)
            links.append(w.jslink((row, "index"), (rs, "selected_index")))
            per_level.append(rs)
        ls = w.Stack(per_level, selected_index=k0, layout=box_lay)
        links.append(w.jslink((level, "index"), (ls, "selected_index")))
        per_puzzle.append(ls)
    ps = w.Stack(per_puzzle, selected_index=0, layout=box_lay)
    links.append(w.jslink((puzzle, "index"), (ps, "selected_index")))
    bar = "".join(f"<span class=q{k}></span>" for k in range(N_LEVELS))
    header = html(table_css() + "<div class=mimx><div class=cap>MI of the chosen cell (outlined) with every other "
                  f"masked cell, in nats (hover a cell for its value). Colour: 0 <span class=bar>{bar}</span> "
                  "the largest probed MI of the context. Grey digits are givens.</div></div>")
    ui = w.VBox([header, w.HBox([puzzle, level]), w.HBox([row, col]), ps])
    ui.links = links
    ui.view_widgets = view_widgets
    return ui


def static_figure(views: SudokuViews, p: int = 0, cell: int | None = None):
    """Matplotlib stand-in for the explorer: probed (top) and predicted (bottom) row of ``cell`` at every level.

    ``cell`` defaults to the cell of `SudokuViews.opening_view`. Returns the figure (2 × R panels, colour scale per level as in the explorer).
    """
    import matplotlib.pyplot as plt

    cell = views.opening_view()[1] if cell is None else int(cell)
    R = len(views.rates)
    fig, axes = plt.subplots(2, R, figsize=(3.6 * R, 6.4), squeeze=False)
    for k in range(R):
        g = views.grids[p, k]
        vmax = views.vmax(p, k)
        n = int((g == 0).sum())
        if g[cell] != 0:
            for a in axes[:, k]:
                a.set_axis_off()
            axes[0, k].set_title(f"{n} masked: {cell_name(cell)} is given", fontsize=9)
            continue
        plot_cell_mi_grid(views.gt[p, k, cell], g, cell, axes[0, k], f"probed, {n} masked", vmax=vmax)
        plot_cell_mi_grid(views.pred[p, k, cell], g, cell, axes[1, k], "predicted (head)", vmax=vmax)
    fig.suptitle(f"puzzle {p + 1}: MI of {cell_name(cell)} with the other cells (nats)", fontsize=10)
    fig.tight_layout()
    return fig


def agreement_by_level(views: SudokuViews) -> list[dict]:
    """Per masking level: Pearson r of predicted vs probed MI over the masked pairs of all puzzles.

    Returns ``[{"masked_fraction", "n_masked", "pairs", "pearson", "probing_passes"}]``
    (probing passes: mean per context; the head needs one).
    """
    out = []
    P, R, _ = views.grids.shape
    iu = np.triu_indices(81, 1)
    for k in range(R):
        gts, prs = [], []
        for p in range(P):
            m = views.masked[p, k]
            sel = m[iu[0]] & m[iu[1]]
            gts.append(views.gt[p, k][iu][sel])
            prs.append(views.pred[p, k][iu][sel])
        a, b = np.concatenate(gts), np.concatenate(prs)
        out.append({"masked_fraction": views.rates[k], "n_masked": int(views.masked[0, k].sum()), "pairs": len(a),
                    "pearson": _row_pearson(a, b), "probing_passes": float(views.nfe[:, k].mean())})
    return out


def widget_state_models(ui) -> set[str]:
    """The ``_model_module`` of every widget reachable from ``ui`` (children, layouts, styles, links)."""
    import ipywidgets as w

    seen, todo, mods = set(), [ui, *getattr(ui, "links", [])], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        mods.add(x._model_module)
        for name in x.keys:
            v = getattr(x, name, None)
            for u in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(u, w.Widget):
                    todo.append(u)
    return mods
