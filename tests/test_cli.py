"""The `mimdm` command line (smoke profile) and the device-check script in its CI form."""
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mimdm.app import commands
from mimdm.app.cli import PROFILE_NAMES, main
from mimdm.app.profiles import PROFILES
from mimdm.core.artifacts import REPO_ROOT
from mimdm.data import sudoku as sd

PUZZLE = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
COMMANDS = ["train", "probe", "fit-head", "decode", "nll", "book"]


def run(argv, capsys):
    """``main(argv)`` -> (return code, stdout, stderr); a `SystemExit` becomes its code."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The smoke Sudoku MDM trained through the CLI, in the session's artifact folder (the one conftest sets).

    Module-scoped fixtures run before the autouse function fixture, so the variable is set here too.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIMDM_ARTIFACTS", str(tmp_path_factory.getbasetemp() / "artifacts"))
        assert main(["train", "--profile", "smoke", "--what", "sudoku", "--no-heads", "--no-progress"]) == 0
    return True


def test_profile_names_match_the_profiles():
    assert PROFILE_NAMES == tuple(sorted(PROFILES))


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_of_every_command(cmd, capsys):
    code, out, _ = run([cmd, "--help"], capsys)
    assert code == 0
    assert out.startswith(f"usage: mimdm {cmd}")
    assert "--profile" in out and "--device" in out


def test_help_states_units(capsys):
    assert "forward passes" in run(["decode", "--help"], capsys)[1]
    nll = run(["nll", "--help"], capsys)[1]
    assert "nats" in nll and "NFE" in nll
    assert "train" in run(["--help"], capsys)[1]


@pytest.mark.parametrize("puzzle, message", [
    (PUZZLE[:40] + "x" + PUZZLE[41:], "bad character 'x' at position 40"),
    (PUZZLE[:-1], "grid has 80 characters, expected 81"),
    ("55" + PUZZLE[2:], "givens break a rule: digit 5 appears twice in row 1"),
])
def test_malformed_puzzle_is_a_clean_error(puzzle, message, capsys):
    code, out, err = run(["decode", "--profile", "smoke", PUZZLE, puzzle], capsys)
    assert code == 2
    assert "mimdm decode: error: puzzle 2" in err and message in err
    assert "Traceback" not in err + out


@pytest.mark.parametrize("argv, message", [
    (["--profile", "huge"], "invalid choice: 'huge'"),
    (["--device", "gpu"], "bad --device 'gpu'"),
    (["--rule", "top-k", "--knob", "1.5"], "integer --knob k >= 1"),
    (["--rule", "threshold", "--knob", "2"], "tau in (0, 1]"),
    (["--rule", "sequential", "--knob", "2"], "has no knob"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0: argmax), got nan"),
    (["--seed", "99999999999999999999999"], "argument --seed: must be between 0 and 2^63-1"),
    (["--seed", "-1"], "argument --seed: must be between 0 and 2^63-1"),
])
def test_bad_options_are_clean_errors(argv, message, capsys):
    code, out, err = run(["decode", PUZZLE, "--profile", "smoke", *argv], capsys)  # the last --profile wins
    assert code == 2 and message in err and "Traceback" not in err


def test_non_amino_acid_letter_is_a_clean_error(capsys):
    code, _, err = run(["decode", "--profile", "smoke", "--protein", "MKVX__A"], capsys)
    assert code == 2
    assert "--protein sequence 1" in err and "'X' at position 3" in err and "Traceback" not in err
    code, _, err = run(["decode", "--profile", "smoke", "--protein", "MKV1__A"], capsys)
    assert code == 2 and "'1' at position 3: not an amino-acid letter" in err


def test_missing_checkpoint_tells_to_train(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path / "empty"))
    for argv in (["decode", "--profile", "smoke", PUZZLE], ["probe", "--profile", "smoke"],
                 ["nll", "--profile", "smoke", sd.format_grid(sd.random_solutions(1, np.random.default_rng(0))[0])]):
        code, _, err = run(argv, capsys)
        assert code == 1, argv
        assert "no trained Sudoku MDM for profile 'smoke'" in err and "run `mimdm train --profile smoke" in err
        assert "Traceback" not in err
    for argv in (["decode", "--profile", "smoke", "--rule", "mi", PUZZLE], ["decode", "--profile", "smoke", "--protein",
                                                                              "MKV__A"]):
        assert run(argv, capsys)[0] == 1, argv
    assert not (tmp_path / "empty").exists()  # read-only commands create no artifact folder


def test_unsolvable_puzzle_and_negative_counts_are_one_line_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIMDM_ARTIFACTS", str(tmp_path / "empty"))
    # givens that break no rule, but cell 9 can hold neither 1-8 (its row) nor 9 (its column)
    unsolvable = "12345678." + "........9" + "." * 63
    code, _, err = run(["decode", "--profile", "smoke", PUZZLE, unsolvable], capsys)
    assert code == 2 and "puzzle 2 ('12345678.........9............') has no solution" in err
    code, _, err = run(["probe", "--profile", "smoke", "--max-new-shards", "-5"], capsys)
    assert code == 2 and "argument --max-new-shards: must be >= 0, got -5" in err
    assert "Traceback" not in err and not (tmp_path / "empty").exists()


def test_run_as_a_module_errors_are_one_line(tmp_path):
    import subprocess
    import sys

    env = {**__import__("os").environ, "MIMDM_ARTIFACTS": str(tmp_path / "empty")}
    out = subprocess.run([sys.executable, "-m", "mimdm.app.cli", "decode", "--profile", "smoke", PUZZLE],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [l for l in out.stderr.strip().splitlines() if "error:" in l]


def _decode_json(argv, capsys):
    code, out, err = run(["decode", "--profile", "smoke", "--json", *argv], capsys)
    assert code == 0, err
    return json.loads(out)


def test_decode_fills_the_grid_and_keeps_the_givens(trained, capsys):
    given = sd.parse_grid(PUZZLE)
    blanks = int((given == 0).sum())
    for rule, knob, nfe in (("sequential", None, blanks), ("top-k", 3, math.ceil(blanks / 3)),
                            ("threshold", 0.5, None), ("eb", 1.0, None)):
        res = _decode_json(["--rule", rule, *([] if knob is None else ["--knob", str(knob)]),
                            PUZZLE, PUZZLE.replace(".", "0")], capsys)
        assert res["rule"] == rule and "seconds" in res
        for r in res["results"]:
            g = r["grid"]
            assert len(g) == 81 and set(g) <= set("123456789")
            assert all(p == "." or p == c for p, c in zip(PUZZLE, g))
            assert r["keeps_givens"] and r["head_passes"] == 0 and r["blanks"] == blanks
            assert 1 <= r["nfe"] <= blanks and (nfe is None or r["nfe"] == nfe)
            assert r["valid"] == sd.is_valid_solution(sd.parse_grid(g, check=False))
    # same seed, same sample; the text output names the NFE and the validity
    a = _decode_json(["--temperature", "1.0", "--seed", "3", PUZZLE], capsys)
    b = _decode_json(["--temperature", "1.0", "--seed", "3", PUZZLE], capsys)
    assert a["results"] == b["results"]
    code, out, _ = run(["decode", "--profile", "smoke", "--rule", "top-k", "--knob", "2", PUZZLE], capsys)
    assert code == 0 and f"NFE {math.ceil(blanks / 2)} forward passes, 0 MI-head passes" in out
    assert "valid solution keeping the givens:" in out


def test_decode_mi_needs_the_head(trained, capsys, monkeypatch, tmp_path):
    # whether another test already trained the smoke head does not matter: the head is looked for elsewhere
    monkeypatch.setattr(commands, "_head_path", lambda *a, **k: tmp_path / "no-head" / "head.pt")
    code, _, err = run(["decode", "--profile", "smoke", "--rule", "mi", PUZZLE], capsys)
    assert code == 1 and "run `mimdm fit-head --profile smoke`" in err


def test_nll_of_complete_grids(trained, capsys):
    grids = sd.random_solutions(2, np.random.default_rng(1))
    strings = [sd.format_grid(g) for g in grids]
    code, out, err = run(["nll", "--profile", "smoke", "--samples", "4", "--json", *strings], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert [r["grid"] for r in res["results"]] == strings
    for r in res["results"]:
        assert r["nfe"] == 4 and r["nll_nats"] > 0 and r["stderr_nats"] >= 0 and r["valid"]
    # the library's estimator with its default (uniform) mask sizes, same seed: the same numbers
    import torch

    from mimdm.evaluation.likelihood import time_free_nll
    from mimdm.pipelines.zoo import grids_to_tokens

    assert res["sizes"] == "uniform" and res["seed"] == 0
    model, _ = commands._load_sudoku(PROFILES["smoke"], torch.device("cpu"))
    est = time_free_nll(model, grids_to_tokens(grids), n_samples=4, seed=0)
    assert [r["nll_nats"] for r in res["results"]] == pytest.approx(est.value.tolist(), rel=1e-9)
    code, out, _ = run(["nll", "--profile", "smoke", "--samples", "4", strings[0]], capsys)
    assert code == 0 and "nats" in out and "NFE 4 forward passes" in out
    code, _, err = run(["nll", "--profile", "smoke", PUZZLE], capsys)
    assert code == 2 and "grid 1 has 51 blank cells" in err
    code, _, err = run(["nll", "--profile", "smoke", "--samples", "100000000", strings[0]], capsys)
    assert code == 2 and "100,000,000 mask draws" in err and "lower the number of draws" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, err = run(["nll", "--profile", "smoke", "--samples", "1", "--json", strings[0]], capsys)
    assert code == 0 and json.loads(out)["results"][0]["stderr_nats"] is None  # valid JSON: null, not NaN
    code, out, err = run(["nll", "--profile", "smoke", "--samples", "1", strings[0]], capsys)
    assert code == 0 and "± n/a nats" in out
    code, out, err = run(["nll", "--profile", "smoke", "--samples", "4", "--device", "cpu:0", strings[0]], capsys)
    assert code == 0, err


def test_corrupt_checkpoint_and_non_finite_output_are_one_line_errors(trained, capsys, monkeypatch):
    from mimdm.pipelines.zoo import profile_sudoku_mdm

    path = profile_sudoku_mdm(PROFILES["smoke"], train=False, progress=False)[1]["path"]
    good = Path(path).read_bytes()
    try:
        Path(path).write_bytes(good[:len(good) // 3])
        code, _, err = run(["decode", "--profile", "smoke", PUZZLE], capsys)
        assert code == 2 and "model.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    finally:
        Path(path).write_bytes(good)
    from mimdm.models.sudoku import SudokuMDM

    real = SudokuMDM._forward

    def nan_forward(self, tokens_BL, layer):
        out = real(self, tokens_BL, layer)
        out.logits[:, 0, 0] = float("nan")
        return out

    monkeypatch.setattr(SudokuMDM, "_forward", nan_forward)
    code, _, err = run(["decode", "--profile", "smoke", PUZZLE], capsys)
    assert code == 1 and "non-finite logits" in err and "Traceback" not in err


def test_probe_fit_head_and_mi_decoding(trained, capsys):
    code, out, err = run(["probe", "--profile", "smoke", "--max-new-shards", "1", "--no-progress"], capsys)
    assert code == 0, err
    assert "Sudoku MI labels:" in out and "probing NFE" in out
    code, out, err = run(["fit-head", "--profile", "smoke", "--no-progress"], capsys)  # probes the other shard
    assert code == 0, err
    assert "MI head:" in out and "parameters" in out and "validation loss" in out and "head.pt" in out
    code, out, _ = run(["fit-head", "--profile", "smoke", "--no-progress"], capsys)
    assert code == 0 and "loaded from the cache" in out
    res = _decode_json(["--rule", "mi", "--knob", "0.05", PUZZLE], capsys)
    r = res["results"][0]
    assert r["keeps_givens"] and set(r["grid"]) <= set("123456789")
    assert r["head_passes"] == r["nfe"] >= 1 and res["head_passes_total"] == r["nfe"]
    blanks = PUZZLE.count(".")
    free = _decode_json(["--rule", "mi", "--knob", "1e9", PUZZLE], capsys)["results"][0]
    assert free["nfe"] == 1  # no MI limit, no cap: every blank in one step
    capped = _decode_json(["--rule", "mi", "--knob", "1e9", "--entropy-cap", "0", PUZZLE], capsys)["results"][0]
    assert capped["keeps_givens"] and 1 < capped["nfe"] <= blanks  # only zero-entropy cells join a step's first
    code, _, err = run(["decode", "--profile", "smoke", "--rule", "eb", "--entropy-cap", "0.5", PUZZLE], capsys)
    assert code == 2 and "--entropy-cap belongs to --rule mi" in err
    code, _, err = run(["decode", "--profile", "smoke", "--rule", "mi", "--entropy-cap", "-1", PUZZLE], capsys)
    assert code == 2 and "--entropy-cap must be >= 0" in err


# ------------------------------------------------------------------------------------------ files, stdin, --model, JSON lines
PUZZLE2 = "..9748...7.........2.1.9.....7...24..64.1.59..98...3.....8.3.2.........6...2759.."


def _jsonl(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_decode_and_nll_read_files_and_stdin_and_print_json_lines(trained, capsys, tmp_path, monkeypatch):
    import io

    f = tmp_path / "set.txt"
    f.write_text(f"# two puzzles\n{PUZZLE} rating 3\n\n{PUZZLE2.replace('.', '0')},7\n")
    by_args = _decode_json(["--rule", "top-k", "--knob", "3", PUZZLE, PUZZLE2], capsys)
    lines = _jsonl(["decode", "--profile", "smoke", "--rule", "top-k", "--knob", "3", "--file", str(f), "--jsonl"],
                   capsys)
    assert [r["grid"] for r in lines] == [r["grid"] for r in by_args["results"]]
    assert [r["nfe"] for r in lines] == [r["nfe"] for r in by_args["results"]]
    assert all(r["rule"] == "top-k" and r["knob"] == 3 and "batch_seconds" in r for r in lines)
    monkeypatch.setattr("sys.stdin", io.StringIO(f.read_text()))
    piped = _jsonl(["decode", "--profile", "smoke", "--rule", "top-k", "--knob", "3", "--file", "-", "--jsonl"], capsys)
    assert [r["grid"] for r in piped] == [r["grid"] for r in lines]

    grids = [sd.format_grid(g) for g in sd.random_solutions(2, np.random.default_rng(1))]
    g = tmp_path / "grids.txt"
    g.write_text("grid\n" + "\n".join(grids) + "\n")
    one = _jsonl(["nll", "--profile", "smoke", "--samples", "4", "--file", str(g), "--jsonl"], capsys)
    ref = json.loads(run(["nll", "--profile", "smoke", "--samples", "4", "--json", *grids], capsys)[1])["results"]
    assert [r["nll_nats"] for r in one] == [r["nll_nats"] for r in ref] and [r["grid"] for r in one] == grids
    assert all(r["samples"] == 4 for r in one)


@pytest.mark.parametrize("text, message", [
    ("", "no puzzle with a unique solution"),
    (PUZZLE[:80] + "\n", "line 1:"),
    (f"# ok\n{PUZZLE}\n{PUZZLE[:40]}x{PUZZLE[41:]}\n", "line 3:"),
    ("55" + PUZZLE[2:] + "\n", "line 1:"),
    ("puzzle,solution\n" + PUZZLE + "\n", "line 2: 1 columns, the header names 2"),
    (f"{PUZZLE}\n{'12345678.' + '........9' + '.' * 63}\n", "line 2: the puzzle has no solution"),
])
def test_bad_puzzle_files_name_the_line(text, message, capsys, tmp_path):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    code, _, err = run(["decode", "--profile", "smoke", "--file", str(f)], capsys)
    assert code == 2 and message in err and "bad.txt" in err and len(err.strip().splitlines()) == 1


def test_input_and_model_options_are_checked(trained, capsys, tmp_path):
    cases = [
        (["decode", "--file", str(tmp_path / "none.txt")], "--file " + str(tmp_path / "none.txt") + ": no such file"),
        (["decode", "--file", "x.txt", PUZZLE], "give exactly one input"),
        (["decode", PUZZLE, "--json", "--jsonl"], "--json and --jsonl: choose one"),
        (["decode", PUZZLE, "--head", "h.pt"], "--head goes with --model and --rule mi"),
        (["nll"], "give exactly one input"),
        (["probe", "--jsonl"], "--model and --jsonl go with an input"),
        (["decode", PUZZLE, "--model", str(tmp_path / "none.pt")], "--model"),
    ]
    for argv, message in cases:
        code, _, err = run([argv[0], "--profile", "smoke", *argv[1:]], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_model_by_path_and_its_head(trained, capsys, tmp_path):
    import shutil

    from mimdm.heads.mi_head import HeadTrainConfig, MIHead, MIHeadConfig, save_head
    from mimdm.pipelines.zoo import profile_sudoku_mdm

    src = Path(profile_sudoku_mdm(PROFILES["smoke"], train=False, progress=False)[1]["path"])
    mine = tmp_path / "mine.pt"
    shutil.copy(src, mine)
    a = _decode_json([PUZZLE2], capsys)["results"]
    b = _decode_json(["--model", str(mine), PUZZLE2], capsys)
    assert b["model_path"] == str(mine) and b["results"] == a
    code, _, err = run(["decode", "--profile", "smoke", "--model", str(mine), "--rule", "mi", PUZZLE2], capsys)
    assert code == 2 and "--rule mi with --model needs --head PATH" in err
    save_head(MIHead(MIHeadConfig(7, max_len=81)), tmp_path / "head7.pt", HeadTrainConfig(), [])
    code, _, err = run(["decode", "--profile", "smoke", "--model", str(mine), "--rule", "mi", "--head",
                        str(tmp_path / "head7.pt"), PUZZLE2], capsys)
    assert code == 2 and "hidden states of width 7" in err and "trained for another model" in err
    code, _, err = run(["decode", "--profile", "smoke", "--model", str(tmp_path / "head7.pt"), PUZZLE2], capsys)
    assert code == 2 and "not a Sudoku MDM checkpoint" in err
    # a head of the right width is used (its MI decides the steps: a huge eps decodes in one step)
    model, _ = commands._load_sudoku(PROFILES["smoke"], torch.device("cpu"))
    save_head(MIHead(MIHeadConfig(model.hidden_dim, max_len=81)), tmp_path / "head.pt", HeadTrainConfig(), [])
    res = _decode_json(["--model", str(mine), "--rule", "mi", "--knob", "1e9", "--head", str(tmp_path / "head.pt"),
                        PUZZLE2], capsys)
    assert res["results"][0]["nfe"] == 1 and res["head_passes_total"] == 1


def test_probe_an_input_file_gives_the_exact_mi(trained, capsys, tmp_path):
    from mimdm.pipelines.zoo import grids_to_tokens
    from mimdm.probing.exact import probe_mi

    solved = sd.solve(sd.parse_grid(PUZZLE2))
    ctx = sd.parse_grid(PUZZLE2).copy()
    ctx[ctx == 0] = solved[ctx == 0]
    ctx.reshape(-1)[[0, 1, 40, 80]] = 0  # four blanks: 1 + 4 x 9 probing passes at most
    f = tmp_path / "ctx.txt"
    f.write_text(sd.format_grid(ctx) + "\n")
    (row,) = _jsonl(["probe", "--profile", "smoke", "--file", str(f), "--jsonl"], capsys)
    assert row["masked_positions"] == [0, 1, 40, 80] and row["input"] == sd.format_grid(ctx)
    model, _ = commands._load_sudoku(PROFILES["smoke"], torch.device("cpu"))
    ref = probe_mi(model, grids_to_tokens(ctx[None]))
    idx = [0, 1, 40, 80]
    assert np.allclose(row["mi_nats"], ref.mi[0][idx][:, idx].numpy(), atol=1e-12)
    assert row["nfe"] == int(ref.nfe[0]) and row["entropy_nats"] == pytest.approx(ref.entropy[0, idx].tolist())
    code, out, err = run(["probe", "--profile", "smoke", "--file", str(f), "--top", "2"], capsys)
    assert code == 0 and "input 1/1: 4 masked" in out and out.count(": ") >= 3, err


def test_protein_files_and_hugging_face_models_by_option(esm2_dir, capsys, tmp_path):
    from mimdm.models.hf_mlm import load_hf_masked_lm
    from mimdm.probing.exact import probe_mi

    f = tmp_path / "seqs.fasta"
    f.write_text(">one\nMKV_\nA_D\n>two\nAC__DE\n")
    out = _jsonl(["decode", "--profile", "smoke", "--protein-file", str(f), "--model", f"hf:{esm2_dir}", "--jsonl"],
                 capsys)
    assert [r["input"] for r in out] == ["MKV_A_D", "AC__DE"] and [r["nfe"] for r in out] == [2, 2]
    assert all(r["keeps_unmasked"] and "_" not in r["sequence"] for r in out)
    (row, _) = _jsonl(["probe", "--profile", "smoke", "--protein-file", str(f), "--model", f"hf:{esm2_dir}",
                       "--jsonl"], capsys)
    m = load_hf_masked_lm(esm2_dir)
    ref = probe_mi(m, m.encode("MKV_A_D"))
    assert row["masked_positions"] == [3, 5] and row["nfe"] == 1 + 2 * 20
    assert row["mi_nats"][0][1] == pytest.approx(ref.mi[0, 3, 5].item(), abs=1e-9)
    f.write_text(">one\nMKV_\n>two\n")
    code, _, err = run(["decode", "--profile", "smoke", "--protein-file", str(f), "--model", f"hf:{esm2_dir}"], capsys)
    assert code == 2 and "seqs.fasta line 3: FASTA header with no sequence" in err
    f.write_text("MKV_\nMKZ_\n")
    code, _, err = run(["decode", "--profile", "smoke", "--protein-file", str(f), "--model", f"hf:{esm2_dir}"], capsys)
    assert code == 2 and "seqs.fasta line 2:" in err and "'Z'" in err


# ------------------------------------------------------------------------------------------ device check
def _device_check_module():
    spec = importlib.util.spec_from_file_location("device_check", REPO_ROOT / "scripts" / "device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_check_smoke_cpu(tmp_path, capsys):
    dc = _device_check_module()
    assert dc.main(["--profile", "smoke", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "device_check.json").read_text())
    assert rec["ok"] and rec["profile"] == "smoke" and rec["device"] == "cpu"
    assert set(rec["steps"]) == set(dc.STEPS) == set(rec["timings_s"])
    assert set(rec["ratios"]) == set(dc.RATIO_KEYS)
    for k, v in rec["ratios"].items():
        assert v is not None, k
    s = rec["steps"]
    assert s["sudoku_forward"]["passes_per_s"] > 0 and s["sudoku_forward"]["weights"].startswith("random init")
    assert s["sudoku_probing"]["nfe_per_context"] == 1 + 50 * 9 and s["sudoku_probing"]["nfe_per_s"] > 0
    for step in ("sudoku_probing", "protein_probing"):
        err = s[step]["bf16_mi_error"]
        assert err["pairs"] > 0 and 0 <= err["mean_abs_nats"] <= err["max_abs_nats"]
        assert set(err["decision_flips"]) == {str(e) for e in dc.EPS_CHECKED}
    assert s["mi_head"]["head_over_forward"] > 0
    assert s["sudoku_training"]["examples_per_s"] > 0
    assert set(s["decoding"]["rules"]) == {"sequential", "top-k", "threshold", "eb", "mi"}
    assert s["decoding"]["rules"]["sequential"]["nfe_mean"] == 51
    assert s["likelihood"]["nfe_total"] == 4 * 8
    for tag in ("fp32", "bf16_autocast"):
        assert s["esmc_forward"][tag]["passes_per_s"] > 0
        assert s["protein_probing"][tag]["nfe"] == 1 + 20 * 24
    assert s["protein_head"]["head_over_forward"] > 0
    assert rec["environment"]["torch"] and "units" in rec
    assert '"ratios"' in capsys.readouterr().out


def test_device_check_skips_the_steps_of_a_failed_prerequisite(tmp_path):
    """Without the esm package (the lent GPU machine has none) the protein steps say what they needed, not KeyError."""
    dc = _device_check_module()

    def no_esm(ctx):
        raise ModuleNotFoundError("No module named 'esm'")

    dc.STEP_FNS["esmc_forward"] = no_esm
    rec = dc.run("smoke", "cpu", tmp_path, only=["esmc_forward", "protein_probing", "protein_head"])
    assert rec["steps"]["esmc_forward"]["error"] == "ModuleNotFoundError: No module named 'esm'"
    for step in ("protein_probing", "protein_head"):
        assert rec["steps"][step] == {"skipped": "needs esmc_forward, which did not run "
                                                 "(esmc_forward: ModuleNotFoundError: No module named 'esm')"}
    assert rec["ok"] is False and set(rec["timings_s"]) == {"esmc_forward"}


def test_mi_precision_error_counts_decision_flips():
    dc = _device_check_module()
    ref = torch.zeros(1, 3, 3)
    ref[0, 0, 1] = ref[0, 1, 0] = 0.02
    low = ref.clone()
    low[0, 0, 1] = low[0, 1, 0] = 0.005  # crosses ε = 0.01 only
    err = dc.mi_precision_error(ref, low, torch.tensor([[True, True, False]]))
    assert err["pairs"] == 2 and err["max_abs_nats"] == pytest.approx(0.015)
    assert err["decision_flips"] == {"0.0003": 0.0, "0.001": 0.0, "0.01": 1.0}


def test_device_check_bad_device(tmp_path, capsys):
    dc = _device_check_module()
    assert dc.main(["--device", "gpu", "--out", str(tmp_path)]) == 2
    assert json.loads((tmp_path / "device_check.json").read_text())["ok"] is False
