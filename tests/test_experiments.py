"""The chapter measurements on tiny models and hand-made inputs."""
import numpy as np
import pytest
import torch

from mimdm.data import sudoku as sd
from mimdm.experiments import ground_truth as gt
from mimdm.experiments import mi_head as mh
from mimdm.models.sudoku import SudokuMDM, SudokuMDMConfig

TINY = SudokuMDMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)


def test_oracle_exactness_is_exact():
    r = gt.oracle_exactness(n_contexts=10, seed=1)
    assert r["max_abs_error"] < 1e-9 and r["max_asymmetry"] < 1e-9 and r["max_mi"] > 0.05


def test_probe_levels_and_puzzles_summaries():
    m = SudokuMDM(TINY).eval()
    lv = gt.probe_levels(m, [1.0, 0.5], n_contexts=2, seed=0)
    assert [x["n_masked"] for x in lv] == [81, 40]
    assert lv[0]["nfe_per_context"] == 1 + 81 * 9 and lv[1]["nfe_per_context"] == 1 + 40 * 9
    assert all(0 <= x["auroc"] <= 1 for x in lv)
    pz = gt.probe_puzzles(m, 2, clues=(34, 35))
    assert 46 <= pz["n_masked"] <= 47 and len(pz["difficulty"]) == 2


def _fake_labels(n=6, seed=0):
    rng = np.random.default_rng(seed)
    sols = sd.random_solutions(n, rng)
    tokens = torch.from_numpy(sols.astype(np.int64) - 1)
    masked = torch.rand(n, 81, generator=torch.Generator().manual_seed(seed)) < torch.linspace(0.3, 1.0, n)[:, None]
    tokens[masked] = 9
    graph = torch.from_numpy(sd.constraint_graph()).float()
    pair = masked[:, :, None] & masked[:, None, :]
    mi = (0.1 * graph + 0.01 * torch.rand(n, 81, 81)) * pair
    mi = (mi + mi.transpose(1, 2)) / 2
    return {"tokens": tokens, "mi": mi}


def test_accuracy_of_perfect_and_shuffled_predictions():
    data = _fake_labels()
    perfect = mh.accuracy(data["mi"], data, 9)
    assert perfect["overall"]["pearson"] == pytest.approx(1.0) and perfect["overall"]["topk_recall"] == pytest.approx(1.0)
    assert perfect["overall"]["mae"] == 0
    noise = torch.rand_like(data["mi"])
    bad = mh.accuracy((noise + noise.transpose(1, 2)) / 2, data, 9)
    assert abs(bad["overall"]["pearson"]) < 0.1 and bad["overall"]["topk_recall"] < 0.5
    assert sum(r["n_contexts"] for r in perfect["by_rate"]) == 6
    cal = mh.calibration(perfect["pred_pairs"], perfect["true_pairs"], n_bins=5)
    assert all(c["pred_mean"] == pytest.approx(c["true_mean"]) for c in cal)


def test_constraint_recovery_of_graph_shaped_maps():
    data = _fake_labels()
    masked = data["tokens"] == 9
    rec = mh.constraint_recovery(data["mi"], masked)
    assert all(r["auroc"] == 1.0 for r in rec)
    rates = masked.float().mean(1).numpy()
    rows = mh.recovery_by_rate(rec, rec, rates)
    assert sum(r["n_contexts"] for r in rows) == 6 and all(r["pred_auroc"] == 1.0 for r in rows)
