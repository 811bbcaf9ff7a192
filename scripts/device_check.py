"""Device check: a short, timed slice of every chapter's computation, with throughput in passes/s and ratios.

    python scripts/device_check.py --profile paper --device cuda --out "$OUT"    # lent GPU (scripts/device_check.sh)
    python scripts/device_check.py --profile smoke --device cpu --out /tmp/dc    # CI form: well under a minute

Steps (each timed; units: passes = forward passes of a model on one sequence, i.e. NFE; seconds wall-clock):

1. ``sudoku_forward``   the profile's Sudoku MDM architecture (paper: 4 layers, d=384, 12 heads, FF 512),
                        forward passes/s at the probing batch size on contexts with 50 masked cells.
2. ``sudoku_probing``   `mimdm.probing.exact.probe_mi` on such contexts (1 + 50·9 = 451 passes each, no pruning):
                        passes/s and the ratio to raw forward throughput; the same probing under bf16
                        autocast and its MI error against fp32 (nats; the noise floor next to the ε swept;
                        `probe_mi` itself probes in fp32 unless told otherwise).
3. ``mi_head``          the profile's MI head: seconds of one head pass against one MDM forward per context
                        (`mimdm.experiments.mi_head.head_cost`), and forward + head against probing.
4. ``sudoku_training``  a few hundred masked-diffusion training steps (`mimdm.models.training.train_mdm`) at the
                        profile's batch size: examples/s (training data are generated on the CPU, timed apart).
5. ``decoding``         every unmasking rule on the same partial grids: wall-clock per grid, NFE, head passes,
                        ratios to sequential decoding.
6. ``likelihood``       the time-free I-MDCE estimator (`mimdm.evaluation.likelihood.time_free_nll`) on complete grids: NFE/s.
7. ``esmc_forward``     the ESM-C architecture of the profile (paper: ESM C 300M, 960/15/30) at random init at
                        L residues, forward passes/s in fp32 and under bf16 autocast.
8. ``protein_probing``  probing of one fully masked L-residue sequence with that model (1 + 20·L passes), fp32
                        and bf16 autocast, and the bf16 MI error against fp32.
9. ``protein_head``     the profile's protein MI head against one ESM-C forward at L residues.

Weights: every model is randomly initialised (seed 0); nothing is read from the artifact cache and nothing is
downloaded (the ESM C 300M weights are not available on the device machine, so only its architecture is timed).
Throughput does not depend on the weights; the decoding and likelihood steps use the Sudoku MDM after the
training slice, whose solve rate is not meaningful: those steps report cost, not quality. The NFE of adaptive
rules (threshold, EB, MI) depends on the weights and is only indicative.

``<out>/device_check.json`` is rewritten after every step, so a run stopped at its time limit still reports the
steps it finished; steps that would start after ``--budget-s`` are recorded as skipped. The JSON is printed at
the end; the exit status is 0 only when every step ran without error.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from mimdm.app.profiles import PROFILES, get_profile  # noqa: E402
from mimdm.core.artifacts import git_commit  # noqa: E402
from mimdm.core.device import resolve_device  # noqa: E402
from mimdm.core.timing import seconds_per_call, sync  # noqa: E402
from mimdm.data import sudoku as sd  # noqa: E402

#: Slice sizes per profile. ``forward_batch`` None: the profile's probing batch (probe_batch_tokens / 81).
SETTINGS = {
    "smoke": dict(repeats=2, forward_batch=256, probe_contexts=2, head_batch=16, train_steps=10, decode_grids=8,
                  decode_clues=30, nll_grids=4, nll_draws=8, esmc=dict(d_model=32, n_heads=2, n_layers=2),
                  esmc_length=48, esmc_batch=4, protein_probe_length=24, budget_s=300),
    "cpu": dict(repeats=3, forward_batch=None, probe_contexts=4, head_batch=64, train_steps=50, decode_grids=32,
                decode_clues=30, nll_grids=16, nll_draws=16, esmc=dict(d_model=128, n_heads=4, n_layers=4),
                esmc_length=160, esmc_batch=8, protein_probe_length=48, budget_s=1800),
    "paper": dict(repeats=10, forward_batch=None, probe_contexts=64, head_batch=256, train_steps=300,
                  decode_grids=64, decode_clues=30, nll_grids=64, nll_draws=64,
                  esmc=dict(d_model=960, n_heads=15, n_layers=30), esmc_length=160, esmc_batch=32,
                  protein_probe_length=160, budget_s=420),
}
STEPS = ("sudoku_forward", "sudoku_probing", "mi_head", "sudoku_training", "decoding", "likelihood", "esmc_forward",
         "protein_probing", "protein_head")
RATIO_KEYS = ("probing_over_forward", "head_over_forward", "forward_plus_head_speedup_vs_probing",
              "training_examples_per_s", "decoding_time_ratio_vs_sequential", "likelihood_over_forward",
              "esmc_bf16_speedup", "protein_probing_bf16_speedup", "probing_bf16_max_abs_mi_error",
              "protein_probing_bf16_max_abs_mi_error", "protein_head_over_forward")


# ------------------------------------------------------------------------------------------ helpers
def _precision(model, dev: torch.device, bf16: bool):
    """bf16 through the package (`MaskedModel.set_precision`) on CUDA; on the CPU (smoke runs) a bf16 autocast context."""
    import contextlib

    if dev.type == "cuda":
        model.set_precision("bf16" if bf16 else "fp32")
        return contextlib.nullcontext()
    return torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


#: MI thresholds (nats) at which bf16 decision flips are counted: the ε values the chapters sweep.
EPS_CHECKED = (3e-4, 1e-3, 1e-2)


def mi_precision_error(mi_ref: torch.Tensor, mi_low: torch.Tensor, masked: torch.Tensor) -> dict:
    """Error of probed MI under reduced precision against fp32, over the pairs of masked positions.

    Args:
        mi_ref, mi_low: ``[B, L, L]`` MI in nats (fp32 forward passes; bf16 autocast).
        masked: ``[B, L]`` bool.

    Returns:
        ``{"pairs", "max_abs_nats", "mean_abs_nats", "mean_mi_nats", "decision_flips": {ε: fraction of pairs
        on different sides of ε}}``.
    """
    pair = masked[:, :, None] & masked[:, None, :]
    pair &= ~torch.eye(pair.shape[-1], dtype=torch.bool, device=pair.device)
    a, b = mi_ref[pair].double().cpu(), mi_low[pair].double().cpu()
    if a.numel() == 0:
        return {"pairs": 0}
    d = (a - b).abs()
    return {"pairs": int(a.numel()), "max_abs_nats": float(d.max()), "mean_abs_nats": float(d.mean()),
            "mean_mi_nats": float(a.mean()),
            "decision_flips": {str(e): float(((a <= e) != (b <= e)).double().mean()) for e in EPS_CHECKED}}


def _partial_grids(n: int, clues: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([sd.random_partial(s, clues, rng) for s in sd.random_solutions(n, rng)])


def _peak_mib(dev: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(dev) / 2 ** 20, 1) if dev.type == "cuda" else None


def environment(dev: torch.device, profile: str) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "torch_cuda": torch.version.cuda, "device": str(dev), "cpu_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "profile": profile, "commit": git_commit(),
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if dev.type == "cuda":
        prop = torch.cuda.get_device_properties(dev)
        env.update({"gpu": prop.name, "gpu_memory_gib": round(prop.total_memory / 2 ** 30, 1),
                    "compute_capability": f"{prop.major}.{prop.minor}", "bf16_supported": torch.cuda.is_bf16_supported()})
    try:
        import esm

        env["esm"] = getattr(esm, "__version__", "installed")
    except ImportError as e:
        env["esm"] = f"not importable: {e}"
    return env


# ------------------------------------------------------------------------------------------ steps
def step_sudoku_forward(ctx: dict) -> dict:
    from mimdm.models.sudoku import SudokuMDM
    from mimdm.pipelines.zoo import grids_to_tokens

    P, S, dev = ctx["P"], ctx["S"], ctx["dev"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SudokuMDM(P.sudoku_model).to(dev).eval()
    ctx["sudoku"] = model
    B = S["forward_batch"] or P.probe_batch_tokens // 81
    x = grids_to_tokens(_partial_grids(B, 31, 0), dev)  # 50 masked cells
    with torch.no_grad():
        sec = seconds_per_call(lambda: model.log_probs(x), dev, S["repeats"])
        sec64 = seconds_per_call(lambda: model.log_probs(x[:64]), dev, S["repeats"])
    ctx["forward_passes_per_s"] = B / sec
    return {"n_parameters": model.n_parameters(), "config": P.sudoku_model.to_dict(), "weights": "random init (seed 0)",
            "batch": B, "seconds_per_batch": sec, "passes_per_s": B / sec,
            "batch_64_seconds": sec64, "batch_64_passes_per_s": min(64, B) / sec64, "peak_mib": _peak_mib(dev)}


def step_sudoku_probing(ctx: dict) -> dict:
    from mimdm.pipelines.zoo import grids_to_tokens
    from mimdm.probing.exact import probe_mi

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["sudoku"]
    x = grids_to_tokens(_partial_grids(S["probe_contexts"], 31, 1), dev)
    probe_mi(model, x[:1], batch_tokens=P.probe_batch_tokens)  # warm-up
    res = probe_mi(model, x, batch_tokens=P.probe_batch_tokens)
    nfe = int(res.nfe.sum())
    rate = nfe / res.seconds
    peak = _peak_mib(dev)
    with _precision(model, dev, True):
        low = probe_mi(model, x, batch_tokens=P.probe_batch_tokens, precision=None)  # the model's / context's bf16
    model.precision = "fp32"
    return {"contexts": len(x), "masked_per_context": 50, "delta": 0.0, "batch_tokens": P.probe_batch_tokens,
            "nfe_total": nfe, "nfe_per_context": nfe / len(x), "seconds": res.seconds,
            "seconds_per_context": res.seconds / len(x), "nfe_per_s": rate,
            "probing_over_forward": rate / ctx["forward_passes_per_s"], "peak_mib": peak,
            "bf16_seconds": low.seconds, "bf16_mi_error": mi_precision_error(res.mi, low.mi, res.masked)}


def step_mi_head(ctx: dict) -> dict:
    from mimdm.experiments import mi_head as mh
    from mimdm.heads.mi_head import MIHead

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["sudoku"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = MIHead(mh.head_config_for(P, model)).to(dev).eval()
    ctx["head"] = head
    c = mh.head_cost(model, head, batch=S["head_batch"], repeats=S["repeats"], layer=P.head_train.layer)
    return {"n_parameters": head.n_parameters(), "config": head.config.to_dict(), "weights": "random init (seed 0)",
            "batch": S["head_batch"], **c,
            "note": "seconds per context: mdm_forward_s (one forward + entropies), head_s (one head pass), "
                    "probing_s (probe_mi of 8 contexts, per context)"}


def step_sudoku_training(ctx: dict) -> dict:
    from mimdm.models.training import TrainConfig, train_mdm
    from mimdm.pipelines.zoo import sudoku_batch

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["sudoku"]
    steps, B = S["train_steps"], P.sudoku_train.batch_size
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(5):
        sudoku_batch(rng, B)
    data_s = (time.perf_counter() - t0) / 5
    cfg = TrainConfig(steps=steps, batch_size=B, lr=P.sudoku_train.lr, warmup=max(1, steps // 10),
                      ckpt_every=steps, log_every=max(1, steps // 5), seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        sync(dev)
        t0 = time.perf_counter()
        log = train_mdm(model, sudoku_batch, cfg, Path(tmp) / "train_state.pt", progress=False)
        sync(dev)
        sec = time.perf_counter() - t0
    model.eval()
    return {"steps": steps, "batch_size": B, "seconds": sec, "steps_per_s": steps / sec,
            "examples_per_s": steps * B / sec, "data_seconds_per_batch": data_s,
            "data_fraction": min(1.0, data_s * steps / sec), "first_loss": log[0]["loss"], "last_loss": log[-1]["loss"],
            "note": "includes CPU data generation and one checkpoint save", "peak_mib": _peak_mib(dev)}


def step_decoding(ctx: dict) -> dict:
    from mimdm.pipelines.zoo import grids_to_tokens, tokens_to_grids
    from mimdm.sampling.decoding import EBSampler, MIGuided, Sequential, Threshold, TopK, decode, head_mi_fn

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["sudoku"]
    grids = _partial_grids(S["decode_grids"], S["decode_clues"], 2)
    x = grids_to_tokens(grids, dev)
    rules = [("sequential", None, Sequential("confidence")), ("top-k", 2, TopK(2)), ("threshold", 0.9, Threshold(0.9)),
             ("eb", 0.1, EBSampler(0.1))]
    if "head" in ctx:
        rules.append(("mi", 0.01, MIGuided(head_mi_fn(ctx["head"], P.head_train.layer), eps=0.01)))
    decode(model, x[:2], rules[0][2])  # warm-up
    rows = {}
    for name, knob, rule in rules:
        sync(dev)
        out = decode(model, x, rule)
        sync(dev)
        o = tokens_to_grids(out.tokens)
        valid = sd.is_valid_solution_batch(o) & np.all((grids == 0) | (o == grids), axis=1)
        nfe = float(out.nfe.float().mean())
        rows[name] = {"knob": knob, "seconds": out.seconds, "seconds_per_grid": out.seconds / len(x),
                      "nfe_mean": nfe, "head_passes_per_grid": out.extra_passes.get("head_passes", 0) / len(x),
                      "seconds_per_step": out.seconds / max(1.0, float(out.nfe.max())),
                      "valid_rate": float(valid.mean())}
    seq = rows["sequential"]
    for r in rows.values():
        r["time_ratio_vs_sequential"] = seq["seconds"] / r["seconds"]
        r["nfe_ratio_vs_sequential"] = seq["nfe_mean"] / r["nfe_mean"]
    return {"grids": len(x), "blanks_per_grid": 81 - S["decode_clues"], "batch": len(x),
            "weights": f"Sudoku MDM after the {S['train_steps']}-step training slice (quality not meaningful)",
            "rules": rows}


def step_likelihood(ctx: dict) -> dict:
    from mimdm.evaluation.likelihood import time_free_nll
    from mimdm.pipelines.zoo import grids_to_tokens

    S, dev, model = ctx["S"], ctx["dev"], ctx["sudoku"]
    x = grids_to_tokens(sd.random_solutions(S["nll_grids"], np.random.default_rng(3)), dev)
    time_free_nll(model, x[:1], n_samples=2)  # warm-up
    sync(dev)
    t0 = time.perf_counter()
    est = time_free_nll(model, x, n_samples=S["nll_draws"], seed=0)
    sync(dev)
    sec = time.perf_counter() - t0
    nfe = int(est.nfe.sum())
    return {"grids": len(x), "draws_per_grid": S["nll_draws"], "nfe_total": nfe, "seconds": sec, "nfe_per_s": nfe / sec,
            "likelihood_over_forward": nfe / sec / ctx["forward_passes_per_s"],
            "mean_nll_nats": float(est.value.mean()), "mean_stderr_nats": float(est.stderr.mean())}


def step_esmc_forward(ctx: dict) -> dict:
    from mimdm.models.esmc import ESMCMDM

    S, dev = ctx["S"], ctx["dev"]
    arch = S["esmc"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ESMCMDM.from_config(**arch).to(dev).eval()
    ctx["esmc"] = model
    L, B = S["esmc_length"], S["esmc_batch"]
    g = torch.Generator().manual_seed(0)
    v = torch.randint(0, 20, (B, L), generator=g).to(dev)
    x = model.value_token_ids[v]
    x[torch.rand(B, L, generator=g).to(dev) < 0.15] = model.mask_id
    out = {"config": arch, "n_parameters": model.n_parameters(), "weights": "random init (seed 0); no weights available",
           "length": L, "batch": B}
    for tag, bf16 in (("fp32", False), ("bf16_autocast", True)):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        with torch.no_grad(), _precision(model, dev, bf16):
            sec = seconds_per_call(lambda: model(x), dev, ctx["S"]["repeats"])
        out[tag] = {"seconds_per_batch": sec, "passes_per_s": B / sec, "tokens_per_s": B * L / sec,
                    "peak_mib": _peak_mib(dev)}
    model.precision = "fp32"
    out["bf16_speedup"] = out["fp32"]["seconds_per_batch"] / out["bf16_autocast"]["seconds_per_batch"]
    ctx["esmc_forward_s"] = out["fp32"]["seconds_per_batch"] / B
    return out


def step_protein_probing(ctx: dict) -> dict:
    from mimdm.core.device import auto_batch_tokens
    from mimdm.probing.exact import probe_mi

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["esmc"]
    L = S["protein_probe_length"]
    x = torch.full((1, L), model.mask_id, dtype=torch.long, device=dev)  # fully masked: the chapter-4 MI map
    bt = P.protein_labels.batch_tokens  # the profile's rows per pass ("auto": from free GPU memory, below)
    bt = 64 * L if bt == "auto" else max(L, bt // P.protein_labels.window * L)
    out = {"length": L, "masked": L, "batch_tokens": bt, "rows_per_pass": bt // L}
    mis = {}
    with torch.no_grad():
        probe_mi(model, x[:, :min(L, 8)], batch_tokens=bt)  # warm-up on a short sequence
    for tag, bf16 in (("fp32", False), ("bf16_autocast", True)):
        note = None
        with _precision(model, dev, bf16):
            tokens = auto_batch_tokens(model, L, default=bt)  # from free GPU memory on CUDA; the profile's on the CPU
        out[f"{tag}_auto_batch_tokens"] = tokens
        while True:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
            try:
                with _precision(model, dev, bf16):
                    res = probe_mi(model, x, batch_tokens=tokens, precision=None)  # as set by _precision
                break
            except torch.cuda.OutOfMemoryError:
                # ESM-C keeps the hidden states of every layer ([n_layers, B, L, D]): memory grows with rows x layers
                note = f"out of memory at {tokens // L} rows per pass; retried with fewer"
                if tokens // L <= 1:
                    raise
                tokens = max(L, tokens // 4)
        nfe = int(res.nfe.sum())
        out[tag] = {"nfe": nfe, "seconds": res.seconds, "nfe_per_s": nfe / res.seconds, "rows_per_pass": tokens // L,
                    "max_mi_nats": float(res.mi.max()), "peak_mib": _peak_mib(dev), **({"note": note} if note else {})}
        mis[tag] = res
    model.precision = "fp32"
    out["bf16_speedup"] = out["fp32"]["seconds"] / out["bf16_autocast"]["seconds"]
    out["bf16_mi_error"] = mi_precision_error(mis["fp32"].mi, mis["bf16_autocast"].mi, mis["fp32"].masked)
    return out


def step_protein_head(ctx: dict) -> dict:
    from mimdm.experiments.mi_head import protein_head_config_for
    from mimdm.heads.mi_head import MIHead, forward_and_head_seconds

    P, S, dev, model = ctx["P"], ctx["S"], ctx["dev"], ctx["esmc"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = MIHead(protein_head_config_for(P, model)).to(dev).eval()
    L, B = S["esmc_length"], min(S["esmc_batch"], 8)
    x = torch.full((B, L), model.mask_id, dtype=torch.long, device=dev)
    x[:, ::2] = model.value_token_ids[0]  # half masked
    with torch.no_grad():
        fwd, hs = forward_and_head_seconds(model, head, x, repeats=S["repeats"])
    return {"n_parameters": head.n_parameters(), "config": head.config.to_dict(), "length": L, "batch": B,
            "mdm_forward_s": fwd / B, "head_s": hs / B, "head_over_forward": hs / fwd, "peak_mib": _peak_mib(dev)}


STEP_FNS = {name: globals()[f"step_{name}"] for name in STEPS}
#: The earlier steps whose results a step reads: it is skipped, naming them, when one of them failed or was skipped.
NEEDS = {"sudoku_probing": ("sudoku_forward",), "mi_head": ("sudoku_forward",), "sudoku_training": ("sudoku_forward",),
         "decoding": ("sudoku_forward", "mi_head"),
         "likelihood": ("sudoku_forward",), "protein_probing": ("esmc_forward",), "protein_head": ("esmc_forward",)}


# ------------------------------------------------------------------------------------------ driver
def summary(steps: dict) -> dict:
    """The headline ratios (None where a step did not run)."""
    def get(step, *keys):
        v = steps.get(step, {})
        for k in keys:
            if not isinstance(v, dict) or k not in v:
                return None
            v = v[k]
        return v

    dec = get("decoding", "rules") or {}
    return {"probing_over_forward": get("sudoku_probing", "probing_over_forward"),
            "head_over_forward": get("mi_head", "head_over_forward"),
            "forward_plus_head_speedup_vs_probing": get("mi_head", "speedup_vs_probing"),
            "training_examples_per_s": get("sudoku_training", "examples_per_s"),
            "decoding_time_ratio_vs_sequential": {k: r["time_ratio_vs_sequential"] for k, r in dec.items()} or None,
            "likelihood_over_forward": get("likelihood", "likelihood_over_forward"),
            "esmc_bf16_speedup": get("esmc_forward", "bf16_speedup"),
            "protein_probing_bf16_speedup": get("protein_probing", "bf16_speedup"),
            "probing_bf16_max_abs_mi_error": get("sudoku_probing", "bf16_mi_error", "max_abs_nats"),
            "protein_probing_bf16_max_abs_mi_error": get("protein_probing", "bf16_mi_error", "max_abs_nats"),
            "protein_head_over_forward": get("protein_head", "head_over_forward")}


def _clean(obj):
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _done(step: dict) -> bool:
    """Whether a step's record is a result (not an error or a skip)."""
    return "error" not in step and "skipped" not in step


def run(profile: str, device: str, out_dir: Path, budget_s: float | None = None, only: list[str] | None = None) -> dict:
    """Run the steps, writing ``out_dir/device_check.json`` after each; returns the record."""
    P = get_profile(profile)
    S = SETTINGS.get(profile, SETTINGS["smoke"])
    dev = resolve_device(device)
    budget = S["budget_s"] if budget_s is None else budget_s
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "device_check.json"
    t_start = time.perf_counter()
    rec = {"profile": profile, "device": str(dev), "settings": S, "budget_s": budget,
           "environment": environment(dev, profile), "units": {
               "passes": "forward passes of a model on one sequence (NFE)", "seconds": "wall-clock",
               "nats": "MI and NLL"},
           "note": __doc__.split("Weights:", 1)[1].split("\n\n")[0].replace("\n", " ").strip(),
           "steps": {}, "timings_s": {}}
    ctx = {"P": P, "S": S, "dev": dev}
    for name in STEPS:
        if only and name not in only:
            continue
        elapsed = time.perf_counter() - t_start
        if elapsed > budget:
            rec["steps"][name] = {"skipped": f"time budget of {budget:.0f} s used ({elapsed:.0f} s)"}
            continue
        failed = [n for n in NEEDS.get(name, ()) if n in rec["steps"] and not _done(rec["steps"][n])]
        if failed:
            why = "; ".join(f'{n}: {rec["steps"][n].get("error") or rec["steps"][n].get("skipped")}' for n in failed)
            rec["steps"][name] = {"skipped": f"needs {', '.join(failed)}, which did not run ({why})"}
            continue
        print(f"[device_check] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            rec["steps"][name] = STEP_FNS[name](ctx)
        except Exception as e:  # one failing step must not lose the others
            rec["steps"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        rec["timings_s"][name] = round(time.perf_counter() - t0, 3)
        print(f"[device_check] {name} done in {rec['timings_s'][name]:.1f} s", flush=True)
        rec["ratios"] = summary(rec["steps"])
        rec["total_seconds"] = round(time.perf_counter() - t_start, 3)
        rec["ok"] = not any("error" in s or "skipped" in s for s in rec["steps"].values())
        path.write_text(json.dumps(_clean(rec), indent=1))
    rec["ratios"] = summary(rec["steps"])
    rec["total_seconds"] = round(time.perf_counter() - t_start, 3)
    rec["ok"] = not any("error" in s or "skipped" in s for s in rec["steps"].values())
    path.write_text(json.dumps(_clean(rec), indent=1))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--profile", default="smoke", choices=sorted(PROFILES), help="run profile: architectures and batch "
                    "sizes of mimdm/profiles.py, slice sizes of SETTINGS (default: smoke)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default: cpu)")
    ap.add_argument("--out", default=os.environ.get("OUT", "device_check_out"),
                    help="folder for device_check.json (default: $OUT or ./device_check_out)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="do not start a step after this many seconds (default: per profile, paper 420)")
    ap.add_argument("--only", action="append", choices=STEPS, help="run only this step (repeatable; later steps "
                    "need earlier ones: decoding needs sudoku_forward, protein steps need esmc_forward)")
    args = ap.parse_args(argv)
    try:
        resolve_device(args.device)
    except (ValueError, RuntimeError) as e:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "device_check.json").write_text(json.dumps({"ok": False, "error": str(e), "device": args.device}))
        print(f"device_check: error: {e}", file=sys.stderr)
        return 2
    rec = run(args.profile, args.device, Path(args.out), args.budget_s, args.only)
    print(json.dumps(_clean({k: v for k, v in rec.items() if k != "note"}), indent=1))
    print(f"[device_check] {'all steps ran' if rec['ok'] else 'SOME STEPS FAILED OR WERE SKIPPED'} in "
          f"{rec['total_seconds']:.1f} s -> {Path(args.out) / 'device_check.json'}", flush=True)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
