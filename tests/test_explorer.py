"""The book's interactive MI explorer (`mimdm.experiments.explorer`) and its vendored widget JavaScript."""
import re
from html.parser import HTMLParser

import matplotlib
import numpy as np
import pytest
import torch
import yaml

from mimdm.core.artifacts import REPO_ROOT
from mimdm.experiments import explorer as ex
from mimdm.heads.mi_head import MIHead, MIHeadConfig
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig

matplotlib.use("Agg")


class _Cells(HTMLParser):
    """Collects the ``<td>`` of a table (attributes and text), closing tags optional."""

    def __init__(self):
        super().__init__()
        self.cells, self.caption, self._in_caption = [], "", False

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self.cells.append({**dict(attrs), "text": ""})
        self._in_caption = tag == "caption"

    def handle_endtag(self, tag):
        if tag == "caption":
            self._in_caption = False

    def handle_data(self, data):
        if self._in_caption:
            self.caption += data
        elif self.cells:
            self.cells[-1]["text"] += data


def _cells(html: str):
    p = _Cells()
    p.feed(html)
    return p


def _level(td) -> int:
    m = re.search(r"\bq(\d+)\b", td.get("class") or "")
    return int(m.group(1)) if m else 0


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_mi_row_table_has_81_cells_ordered_colours_values_and_givens():
    row = np.linspace(0.0, 0.8, 81)
    givens = np.zeros(81, int)
    givens[[0, 10, 40]] = [5, 3, 9]
    row[[0, 10, 40]] = 0.0
    html = ex.mi_row_table(row, givens, vmax=0.8, cell=20, caption="probed <x>")
    p = _cells(html)
    assert html.count("<tr>") == 9 and len(p.cells) == 81
    assert p.caption == "probed <x>"  # escaped in the HTML, intact once parsed
    for i in (0, 10, 40):
        assert "g" in p.cells[i]["class"].split() and p.cells[i]["text"] == str(givens[i]) and "title" not in p.cells[i]
    masked = [i for i in range(81) if not givens[i]]
    levels = [_level(p.cells[i]) for i in masked]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] == ex.N_LEVELS - 1
    assert np.allclose([float(p.cells[i]["title"]) for i in masked], row[masked], rtol=5e-3, atol=1e-12)
    assert "s" in p.cells[20]["class"].split() and sum("s" in (c.get("class") or "").split() for c in p.cells) == 1
    # the palette runs dark (no MI) to light (high MI), so colour order follows MI order
    lum = [_luminance(c) for c in ex.PALETTE]
    assert len(ex.PALETTE) == ex.N_LEVELS and lum == sorted(lum)
    css = ex.table_css()
    assert all(f".q{k}{{background:{c}}}" in css for k, c in enumerate(ex.PALETTE))


def test_color_levels_clip_and_handle_zero_scale():
    assert ex.color_levels([0, 0.5, 1, 3], 1.0).tolist() == [0, 8, 15, 15]
    assert ex.color_levels([0.2, 0.4], 0.0).tolist() == [0, 0]
    with pytest.raises(ValueError):
        ex.mi_row_table(np.zeros(80), np.zeros(81, int), 1.0)


def test_sudoku_contexts_are_nested():
    ctx = ex.sudoku_contexts(2, (0.2, 0.5, 0.9), seed=1)
    masked = ctx["grids"] == 0
    assert masked.shape == (2, 3, 81) and masked.sum(-1).tolist() == [[16, 40, 73]] * 2
    assert (masked[:, :-1] <= masked[:, 1:]).all()  # masked at a level -> masked at the higher ones
    assert ((ctx["grids"] == ctx["solutions"][:, None]) | masked).all()
    with pytest.raises(ValueError):
        ex.sudoku_contexts(1, (0.0,))


@pytest.fixture(scope="module")
def tiny_views():
    torch.manual_seed(0)
    model = SudokuMDM(SudokuMDMConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    head = MIHead(MIHeadConfig(16, d_hidden=16, rank=8)).eval()
    return ex.sudoku_views(model, head, -1, ex.sudoku_contexts(2, (0.15, 0.3), seed=0))


def test_sudoku_views_on_a_tiny_random_model(tiny_views):
    v = tiny_views
    assert v.gt.shape == v.pred.shape == (2, 2, 81, 81)
    assert v.n_views == int(v.masked.sum()) == 2 * (12 + 24)
    assert (v.gt >= 0).all() and np.allclose(v.gt, v.gt.transpose(0, 1, 3, 2), atol=1e-6)
    given = ~v.masked
    assert (v.gt[given[..., :, None].repeat(81, -1)] == 0).all() and (v.pred[given[..., :, None].repeat(81, -1)] == 0).all()
    assert v.nfe.tolist() == [[1 + 12 * 9, 1 + 24 * 9]] * 2
    c = v.common_cell()
    assert v.masked[:, :, c].all()
    rows = ex.agreement_by_level(v)
    assert [r["pairs"] for r in rows] == [2 * 12 * 11 // 2, 2 * 24 * 23 // 2]


def test_build_explorer_stacks_links_and_core_widgets_only(tiny_views):
    import ipywidgets as w

    v = tiny_views
    ui = ex.build_explorer(v)
    header, puzzle_level, row_col, ps = ui.children
    puzzle, level = puzzle_level.children
    row, col = row_col.children
    assert isinstance(ps, w.Stack) and len(ps.children) == 2
    assert "<style>" in header.value
    n_view_children = 0
    for p, ls in enumerate(ps.children):
        assert isinstance(ls, w.Stack) and len(ls.children) == 2
        for k, rs in enumerate(ls.children):
            assert isinstance(rs, w.Stack) and len(rs.children) == 9 and rs.selected_index == row.index
            for r, cs in enumerate(rs.children):
                assert isinstance(cs, w.Stack) and len(cs.children) == 9 and cs.selected_index == col.index
                for c, child in enumerate(cs.children):
                    i = 9 * r + c
                    if v.masked[p, k, i]:
                        assert child is ui.view_widgets[(p, k, i)]
                        assert f"<b>{ex.cell_name(i)}</b>" in child.value and child.value.count("<table") == 2
                        n_view_children += 1
                    else:
                        assert "is a given here" in child.value
    assert n_view_children == len(ui.view_widgets) == v.n_views  # one stack child per view
    # it opens on the view of puzzle 1 whose probed MI row carries the most MI, of cells masked at every level
    k0, cell0 = v.opening_view()
    assert (9 * row.index + col.index, level.index) == (cell0, k0) and all(ls.selected_index == k0 for ls in ps.children)
    assert v.masked[0, :, cell0].all()
    best = max((v.gt[0, k, c].sum(), k, c) for k in range(2) for c in range(81) if v.masked[0, :, c].all())
    assert (best[1], best[2]) == (k0, cell0) and best[0] > 0
    # every stack is driven by a browser-side link from one control's index
    links = ui.links
    assert len(links) == 1 + 2 + 2 * 2 + 2 * 2 * 9
    assert all(type(x).__name__ == "Link" and x._model_name == "LinkModel" and x.source[1] == "index" and x.target[1] == "selected_index" for x in links)
    by_source = {}
    for x in links:
        by_source.setdefault(id(x.source[0]), []).append(x.target[0])
    assert [len(by_source[id(c)]) for c in (puzzle, level, row, col)] == [1, 2, 4, 36]
    assert ex.widget_state_models(ui) <= {"@jupyter-widgets/controls", "@jupyter-widgets/base"}
    # all views share one Layout and one style (a smaller saved widget state)
    assert len({id(x.layout) for x in ui.view_widgets.values()}) == 1
    assert len({id(x.style) for x in ui.view_widgets.values()}) == 1


def test_static_figure(tiny_views):
    import matplotlib.pyplot as plt

    fig = ex.static_figure(tiny_views, 1)
    assert len(fig.axes) >= 4  # 2 x 2 panels (+ colour bars)
    plt.close(fig)


def test_config_loads_vendored_widget_javascript_only():
    cfg = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())["sphinx"]["config"]
    static = [REPO_ROOT / p for p in cfg["html_static_path"]]
    js = cfg["nb_ipywidgets_js"]
    assert len(js) == 2
    names = list(js)
    assert names[0].endswith("require.js") and names[1].endswith("embed-amd.js")  # requirejs first
    for path, attrs in js.items():
        assert "://" not in path and not path.startswith("/")
        files = [d / path for d in static if (d / path).is_file()]
        assert files, f"{path} is not under html_static_path {cfg['html_static_path']}"
        assert (files[0].parent / "LICENSE").is_file()
        assert all("://" not in str(v) for v in attrs.values())
        assert files[0].resolve().is_relative_to((REPO_ROOT / "book" / "_static" / "vendor").resolve())
    embed = next(d / names[1] for d in static if (d / names[1]).is_file()).read_text()
    for module in ("@jupyter-widgets/base", "@jupyter-widgets/controls"):  # bundled: nothing fetched
        assert f'define("{module}"' in embed


def test_nbclient_saves_widget_state_in_notebook_metadata(tmp_path):
    """The static book renders widgets from the state that papermill/nbclient stores while executing."""
    import nbformat
    import papermill as pm

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import ipywidgets as w\nw.Stack([w.HTML('a'), w.HTML('b')], selected_index=1)")]
    src, out = tmp_path / "w.ipynb", tmp_path / "w_out.ipynb"
    nbformat.write(nb, src)
    pm.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False)
    done = nbformat.read(out, 4)
    state = done.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert {s["model_name"] for s in state.values()} >= {"StackModel", "HTMLModel"}
    view = done.cells[0].outputs[0]["data"]["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] in state
