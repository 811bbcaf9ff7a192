"""Findings at a glance: each verdict rule on made-up records, and the table the intro gets from the committed one."""
import json

from mimdm.app import findings as fd
from mimdm.core.artifacts import REPO_ROOT


def _held(mi_red=3.5, mi_rate=0.55, hi=0.01, eb=None, thr=(3.0, 0.55), cap=(3.2, 0.55)):
    rows = [{"rule": "sequential", "nfe": 56.0, "solve_rate": 0.56, "nfe_reduction": 1.0},
            {"rule": "MI-guided", "nfe": 56.0 / mi_red, "solve_rate": mi_rate, "nfe_reduction": mi_red,
             "paired_difference": mi_rate - 0.56, "paired_ci_high": hi}]
    for name, v in (("EB-sampler", eb), ("threshold", thr), ("entropy cap", cap)):
        if v is not None:
            rows.append({"rule": name, "nfe_reduction": v[0], "solve_rate": v[1]})
    return {"held_out": rows, "hard_set": {"n": 1000}}


def test_decoding_verdict_needs_three_times_fewer_passes_at_preserved_quality():
    assert fd.decoding_row(_held(3.5, hi=0.01))["verdict"] == "reproduced"
    assert fd.decoding_row(_held(3.5, hi=-0.02))["verdict"] == "partly"  # fewer passes, lower quality
    assert fd.decoding_row(_held(2.0, hi=0.01))["verdict"] == "partly"
    assert fd.decoding_row(_held(1.2, hi=0.01))["verdict"] == "not reproduced"
    assert fd.decoding_row(None)["verdict"] == "not tested"
    assert "20.0 vs 56.0 passes on 1,000 held-out hard puzzles (2.80× fewer)" in fd.decoding_row(_held(2.8))["study"]


def test_baselines_verdict_counts_only_wins_at_comparable_quality():
    assert fd.baselines_row(_held(3.5, 0.55))["verdict"] == "reproduced"  # EB never matched, threshold beaten
    assert fd.baselines_row(_held(3.5, 0.50))["verdict"] == "partly"  # threshold solves 5 points more
    assert fd.baselines_row(_held(3.5, 0.55, eb=(4.0, 0.55)))["verdict"] == "partly"
    r = fd.baselines_row(_held(3.5, 0.55, eb=(4.0, 0.55), thr=(3.6, 0.55)))
    assert r["verdict"] == "not reproduced" and "entropy cap alone" not in r["study"]
    assert "the entropy cap alone does at least as well" in fd.baselines_row(_held(3.0, cap=(3.2, 0.55)))["study"]


def test_head_contacts_and_exactness_verdicts():
    est = lambda p, c: {"accuracy": {"pearson": p}, "head": {"head_over_forward": c, "n_parameters": 100}}  # noqa: E731
    assert [fd.head_row(est(*a))["verdict"] for a in ((0.96, 0.2), (0.96, 0.3), (0.85, 0.1), (0.7, 0.1))] == \
        ["reproduced", "partly", "partly", "not reproduced"]
    prot = lambda mi, aln, plm: {"family": {"alignment": "a.fa"}, "headline": {  # noqa: E731
        "mi_long_range_p_at_l": mi, "alignment_mi_long_range_p_at_l": aln, "plm_potts_long_range_p_at_l": plm,
        "mi_guided_nfe_reduction": None, "eb_nfe_reduction": 2.0}}
    assert [fd.contacts_row(prot(*a))["verdict"] for a in ((0.6, 0.4, 0.5), (0.45, 0.4, 0.5), (0.3, 0.4, 0.5))] == \
        ["reproduced", "partly", "not reproduced"]
    assert fd.protein_decoding_row(prot(0.5, 0.4, 0.5))["verdict"] == "not reproduced"
    assert fd.probing_row({"oracle": {"max_abs_error": 1e-3}})["verdict"] == "not reproduced"
    assert fd.likelihood_row({"oracle": {"exhaustive_max_error": 1e-12}})["verdict"] == "reproduced"


def test_findings_table_of_the_committed_record():
    results = REPO_ROOT / "book" / "results"
    rows = fd.findings_rows(results)
    assert len(rows) == 8 and all(r["verdict"] in ("reproduced", "partly", "not reproduced", "not tested") for r in rows)
    spd = json.loads((results / "speedup.json").read_text())["values"]
    mi = next(r for r in spd["held_out"] if r["rule"] == "MI-guided")
    assert f"({mi['nfe_reduction']:.2f}× fewer)" in rows[2]["study"]
    text = fd.findings_markdown(results)
    assert text.count("\n| ") == 9 and "{doc}`chapter 5 <05_speedup_analysis>`" in text and "profile `cpu`" in text


def test_findings_of_an_empty_record_are_not_tested(tmp_path):
    assert {r["verdict"] for r in fd.findings_rows(tmp_path)} == {"not tested"}
    assert "no date" in fd.findings_markdown(tmp_path)
