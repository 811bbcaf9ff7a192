#!/usr/bin/env python
"""How much of the probed MI can pair features computed from the MDM's marginals explain, and at what cost (issue 20).

The shipped `cpu` head reaches test Pearson ~0.92 against the 0.95 target, and wider or deeper heads, attention maps
and learned propagation add at most ~0.01 (`benchmarks/records/`). This script asks whether the missing part is
*information* a cheap head could read. On the shipped label set (`checkpoints/cpu/sudoku_labels`, unpacked with the
shipped MDM) it fits one gradient-boosted regressor per feature family (scikit-learn's
`HistGradientBoostingRegressor`, fixed seed) on the validation split's masked pairs and reports Pearson of its
predictions against probed MI on the test split's pairs, the head's own metric. Families:

- ``base``: the shipped head's constraint features (log1p(I^c / 0.01) of `mimdm.probing.sudoku_mi.constraint_mi`,
  top 4 digits, and the marginals' overlap), both entropies, whether the cells share a unit, the context's mask rate;
- ``base + propagated (λ, top_k, r)``: plus log1p(I^p / 0.01) of `mimdm.probing.sudoku_mi.propagated_mi` after r
  rounds, with that round count's cost per context over one MDM forward (`mimdm.experiments.mi_head.propagation_cost`,
  timed one after the other in this run);
- ``shipped head`` and ``shipped head + propagated``: the shipped head's prediction (log1p) alone and beside the
  propagated feature.

A regressor fitted on 80 contexts is a lower bound on what the features allow, not a head: the rows compare feature
families under one learner. Writes ``--out``/mi_feature_ceiling.json.

    .venv/bin/python scripts/mi_feature_ceiling.py --threads 1 --out benchmarks/records
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimdm.app.profiles import get_profile  # noqa: E402
from mimdm.core.artifacts import git_commit  # noqa: E402
from mimdm.data import sudoku as sd  # noqa: E402
from mimdm.experiments.mi_head import predict_from_labels, propagation_cost, with_marginals  # noqa: E402
from mimdm.heads.mi_head import load_head  # noqa: E402
from mimdm.pipelines.labels import PACKED, load_labels, unpack_labels  # noqa: E402
from mimdm.pipelines.zoo import load_sudoku_mdm  # noqa: E402
from mimdm.probing.sudoku_mi import constraint_mi, propagated_mi_rounds  # noqa: E402

#: (damping λ, top_k, rounds reported) of the propagated feature
PROPAGATION = ((1.0, 4, (1, 2, 3)), (1.0, 2, (2, 3)), (0.7, 4, (5,)))
SCALE = 0.01  # nats: the feature scale log1p(I / s), as the head's


def pair_table(split: dict, mask_id: int, head_pred: torch.Tensor) -> dict:
    """The masked pairs i < j of a split: their indices, probed MI and the ``base`` and head columns."""
    masked = split["tokens"] == mask_id
    probs = split["probs"].float()
    iu = torch.triu_indices(sd.N_CELLS, sd.N_CELLS, 1)
    b, k = (masked[:, iu[0]] & masked[:, iu[1]]).nonzero(as_tuple=True)
    i, j = iu[0][k], iu[1][k]
    peer = torch.from_numpy(sd.constraint_graph()).bool()
    cm = constraint_mi(probs, masked, top_k=4)
    ent = split["entropy"].float()
    base = torch.stack([torch.log1p(cm[b, i, j] / SCALE), (probs[b, i] * probs[b, j]).sum(-1), ent[b, i], ent[b, j],
                        peer[i, j].float(), masked.float().mean(1)[b]], 1)
    return {"idx": (b, i, j), "y": split["mi"][b, i, j].numpy(), "base": base,
            "head": torch.log1p(head_pred[b, i, j].clamp_min(0) / SCALE)[:, None], "probs": probs, "masked": masked}


def score(fit_x: torch.Tensor, fit_y: np.ndarray, test_x: torch.Tensor, test_y: np.ndarray) -> float:
    """Test Pearson of a gradient-boosted regressor fitted on (fit_x, fit_y)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    reg = HistGradientBoostingRegressor(max_iter=300, random_state=0).fit(fit_x.numpy(), fit_y)
    pred = reg.predict(test_x.numpy())
    if not np.isfinite(pred).all():
        raise FloatingPointError("the regressor predicted non-finite MI")
    return float(np.corrcoef(pred, test_y)[0, 1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("mi_feature_ceiling_out"))
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    profile = get_profile("cpu")
    model, _ = load_sudoku_mdm(ROOT / "checkpoints/cpu/sudoku_mdm/model.pt")
    model.set_precision("fp32")
    head, _ = load_head(ROOT / "checkpoints/cpu/sudoku_mi_head/head.pt")
    tmp = Path(tempfile.mkdtemp())
    try:
        (tmp / PACKED).write_bytes((ROOT / "checkpoints/cpu/sudoku_labels" / PACKED).read_bytes())
        unpack_labels(model, profile.labels, tmp)
        splits = {s: with_marginals(model, load_labels(tmp, s)) for s in ("val", "test")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    layer, mask_id = profile.head_train.layer, model.mask_id
    tab = {s: pair_table(d, mask_id, predict_from_labels(head, d, layer, mask_id)) for s, d in splits.items()}
    v, t = tab["val"], tab["test"]
    rows = [{"features": "base", "test_pearson": score(v["base"], v["y"], t["base"], t["y"])},
            {"features": "shipped head", "test_pearson": score(v["head"], v["y"], t["head"], t["y"]),
             "head_test_pearson": float(np.corrcoef(torch.expm1(t["head"][:, 0]).numpy() * SCALE, t["y"])[0, 1])}]
    print(json.dumps(rows), flush=True)
    for damping, top_k, rounds in PROPAGATION:
        feats = {s: propagated_mi_rounds(tab[s]["probs"], tab[s]["masked"], rounds, damping, top_k) for s in tab}
        for r in rounds:
            col = {s: torch.log1p(feats[s][r][tab[s]["idx"]] / SCALE)[:, None] for s in tab}
            cost = propagation_cost(model, damping, r, top_k)
            row = {"features": f"base + propagated (λ={damping}, top_k={top_k}, rounds={r})", "damping": damping,
                   "top_k": top_k, "rounds": r,
                   "test_pearson": score(torch.cat([v["base"], col["val"]], 1), v["y"],
                                         torch.cat([t["base"], col["test"]], 1), t["y"]),
                   "with_head_test_pearson": score(torch.cat([v["base"], v["head"], col["val"]], 1), v["y"],
                                                   torch.cat([t["base"], t["head"], col["test"]], 1), t["y"]),
                   "reference_over_forward": cost["reference_over_forward"]}
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    rec = {"commit": git_commit(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "pairs": {s: len(tab[s]["y"]) for s in tab}, "rows": rows, "seconds": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mi_feature_ceiling.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
