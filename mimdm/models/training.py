"""Masked-diffusion training of any `MaskedModel`, resumable, with a progress bar.

Objective (MDLM, Sahoo et al. 2024; MD4, Shi et al. 2024): for each example draw a masking rate
t ~ U(0, 1], mask every position independently with probability t (at least one position), and
minimise the cross-entropy of the true values at the masked positions. Weightings:

- ``"none"`` (used for the study's Sudoku models): the mean cross-entropy over all masked
  positions of the batch, no 1/t weight. It trains the conditionals p(x_i | x_unmasked) that
  decoding and probing use, with the lowest gradient variance; examples with many masked positions weigh
  more.
- ``"example"``: the mean over each example's masked positions, averaged over the batch: every
  masking rate weighs the same, as under the ELBO's 1/t weighting (Σ_masked CE / (t·L) ≈ the
  per-example mean), without the 1/t variance.
- ``"mdlm"``: the continuous-time NELBO weighting (per-example sum over masked positions / (t·L)).

Forced masks (curriculum): a sample function may return ``(values_BL, forced_BL)``; each example
whose ``forced_BL`` row has a True position is masked exactly there (e.g. the blanks of a unique
puzzle) instead of at random. The random draws are made for every example either way, so a run
without forced masks is bit-identical to one with plain tensors.

Learning-rate schedules (``TrainConfig.schedule``): ``"cosine"`` (linear warmup, cosine decay to
``min_lr_ratio`` over the rest of the run) and ``"wsd"`` (warmup-stable-decay: linear warmup,
constant, then a cosine decay to ``min_lr_ratio`` over the last ``decay_frac`` of the steps), which
suits a run whose length may be extended: checkpoints before the decay are all at the same LR.
``cycle_start`` > 0 makes the schedule a second cycle over steps ``cycle_start .. steps`` (warmup and
decay counted from there) that continues a finished run's state (`mimdm.pipelines.long_run`): re-warming
after a decay, as in continued pre-training (e.g. Gupta et al. 2023, arXiv 2308.04014).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from mimdm.core.artifacts import atomic_save, load_checkpoint
from mimdm.core.contract import MaskedModel


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (steps and batch in examples; lr per step)."""

    steps: int = 4500
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 200
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    weighting: str = "none"  # "none" | "example" | "mdlm"
    min_t: float = 1e-3
    seed: int = 0
    ckpt_every: int = 250
    log_every: int = 50
    schedule: str = "cosine"  # "cosine" | "wsd"
    decay_frac: float = 0.2  # wsd only: the last fraction of the steps decays
    cycle_start: int = 0  # the schedule's first step: > 0 continues a run finished at this step

    def __post_init__(self):
        for name in ("steps", "batch_size", "ckpt_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.min_t < 1:
            raise ValueError(f"TrainConfig.min_t must be in (0, 1), got {self.min_t}")
        if self.schedule not in ("cosine", "wsd"):
            raise ValueError(f"TrainConfig.schedule must be 'cosine' or 'wsd', got {self.schedule!r}")
        if not 0 < self.decay_frac <= 1:
            raise ValueError(f"TrainConfig.decay_frac must be in (0, 1], got {self.decay_frac}")
        if not 0 <= self.cycle_start < self.steps:
            raise ValueError(f"TrainConfig.cycle_start must be in [0, steps={self.steps}), got {self.cycle_start}")

    def to_dict(self) -> dict:
        """The settings as a dict; ``schedule``/``decay_frac`` are left out under the default cosine
        schedule, and ``cycle_start`` at 0, so cache keys and state files of earlier runs stay valid."""
        d = asdict(self)
        if self.schedule == "cosine":
            del d["schedule"], d["decay_frac"]
        if not self.cycle_start:
            del d["cycle_start"]
        return d

    def decay_start(self) -> int:
        """First step of the final decay (``wsd``); the end of the warmup under ``cosine``."""
        n = self.steps - self.cycle_start
        if self.schedule == "wsd":
            return self.cycle_start + max(self.warmup, n - int(round(self.decay_frac * n)))
        return self.cycle_start + self.warmup


#: Bump when the objective or the optimiser set-up changes, so cached models are not reused.
OBJECTIVE_VERSION = "mdm-ce-adamw-v2"


def mask_tokens(values_BL: Tensor, model: MaskedModel, t_B: Tensor, generator: torch.Generator,
                maskable_BL: Tensor | None = None, forced_BL: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Forward (absorbing) noising: mask each maskable position with probability ``t``.

    Args:
        values_BL: ``[B, L]`` long clean values (indices into the value set).
        t_B: ``[B]`` masking rates in (0, 1].
        generator: RNG of the masks; the draws are made on its device and moved to that of ``values_BL``.
        maskable_BL: ``[B, L]`` bool positions that may be masked (default: all).
        forced_BL: ``[B, L]`` bool, optional: an example whose row has any True position is
            masked exactly there (``maskable_BL`` does not apply to it); the random draws are
            made for all examples regardless, so the other examples are unaffected.

    Returns:
        ``(tokens_BL, masked_BL)``: model input with masks, and the bool mask. Every example with
        at least one maskable position has at least one masked position.

    Raises:
        ValueError: ``forced_BL`` is not a bool tensor of shape ``[B, L]``.
    """
    B, L = values_BL.shape
    if maskable_BL is None:
        maskable_BL = torch.ones(B, L, dtype=torch.bool, device=values_BL.device)
    u = torch.rand(B, L, generator=generator, device=generator.device).to(values_BL.device)
    masked = (u < t_B[:, None]) & maskable_BL
    # guarantee one masked position: the maskable position with the smallest u
    none = ~masked.any(1) & maskable_BL.any(1)
    if none.any():
        first = u.masked_fill(~maskable_BL, 2.0).argmin(1)
        masked[none, first[none]] = True
    if forced_BL is not None:
        if forced_BL.dtype != torch.bool or tuple(forced_BL.shape) != (B, L):
            raise ValueError(f"forced_BL must be a bool tensor of shape {(B, L)}, got {forced_BL.dtype} "
                             f"{tuple(forced_BL.shape)}")
        forced_BL = forced_BL.to(masked.device)
        masked = torch.where(forced_BL.any(1, keepdim=True), forced_BL, masked)
    tokens = model.value_token_ids[values_BL]
    tokens = tokens.masked_fill(masked, model.mask_id)
    return tokens, masked


def mdm_loss(model: MaskedModel, values_BL: Tensor, generator: torch.Generator, weighting: str = "none",
             min_t: float = 1e-3, maskable_BL: Tensor | None = None, forced_BL: Tensor | None = None) -> Tensor:
    """Masked-diffusion loss of one batch (nats per masked position; see module docstring).

    Each example draws t ~ U[min_t, 1], masks each maskable position with probability t and scores the
    cross-entropy at the masked positions. ``weighting``: ``"none"`` (mean over all masked positions of
    the batch), ``"example"`` (mean per example, then over examples) or ``"mdlm"`` (Σ CE / (t·L), the
    MDLM ELBO weight 1/t; Sahoo et al. 2024).

    Args:
        values_BL: ``[B, L]`` long clean values (indices into the value set).
        generator: RNG of t and of the masks; it may live on another device than ``values_BL`` (the draws
            are made on the generator's device and moved), so a CPU generator gives the same masks on any device.
        maskable_BL: ``[B, L]`` bool positions that may be masked (default all).
        forced_BL: ``[B, L]`` bool, optional forced masks (see `mask_tokens`); under ``"mdlm"`` a
            forced example's t is its masked fraction.

    Returns:
        Scalar loss tensor (nats).

    Raises:
        ValueError: unknown ``weighting``.
    """
    B, L = values_BL.shape
    t = min_t + (1 - min_t) * torch.rand(B, generator=generator, device=generator.device).to(values_BL.device)
    tokens, masked = mask_tokens(values_BL, model, t, generator, maskable_BL, forced_BL)
    if forced_BL is not None:
        t = torch.where(forced_BL.to(t.device).any(1), masked.float().mean(1), t)
    logits = model(tokens).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), values_BL, reduction="none")  # [B, L]
    ce = ce * masked
    if weighting == "example":
        return (ce.sum(1) / masked.sum(1).clamp_min(1)).mean()
    if weighting == "none":
        return ce.sum() / masked.sum().clamp_min(1)
    if weighting == "mdlm":
        return (ce.sum(1) / (t * L)).mean()
    raise ValueError(f"unknown weighting {weighting!r}; use 'example', 'none' or 'mdlm'")


def _lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of step ``step`` (0-based) under ``cfg.schedule`` (its cycle from ``cfg.cycle_start``)."""
    if step < cfg.cycle_start + cfg.warmup:
        return cfg.lr * (step - cfg.cycle_start + 1) / cfg.warmup
    if cfg.schedule == "wsd":
        start = cfg.decay_start()
        if step < start:
            return cfg.lr
        frac = (step - start) / max(1, cfg.steps - start)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
    frac = (step - cfg.decay_start()) / max(1, cfg.steps - cfg.decay_start())
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def state_segments(state: dict) -> list[dict]:
    """The device segments of a `train_mdm` state: ``[{"from_step", "device", "torch"}, ...]``, one per change of
    device type, in order. A state written before segments were recorded gets one, ``{"from_step": 0, "device": its
    device type}`` (its torch version was not recorded)."""
    if "segments" in state:
        return json.loads(state["segments"])
    return [{"from_step": 0, "device": state["device_type"]}]


def train_mdm(model: MaskedModel, sample_batch: Callable[[np.random.Generator, int], Tensor], cfg: TrainConfig,
              state_path: Path, progress: bool = True, max_seconds: float | None = None,
              stop_after: int | None = None, allow_extend: bool = False,
              penalty: Callable[[MaskedModel], Tensor] | None = None,
              val_fn: Callable[[MaskedModel], float] | None = None, val_every: int = 50,
              patience: int | None = None) -> list[dict]:
    """Train ``model`` in place with the masked-diffusion objective; resumable.

    Args:
        model: a `MaskedModel` (parameters on its device).
        sample_batch: ``(rng, batch_size) -> values [B, L] long`` clean training examples, or
            ``(values [B, L] long, forced [B, L] bool)`` with forced masks (see `mask_tokens`).
        cfg: `TrainConfig`.
        state_path: resumable training state (model, optimiser, RNG states, log); written every
            ``cfg.ckpt_every`` steps and at the end. If it exists, training continues from it and
            reproduces the uninterrupted run: exactly on the CPU; on another device type (a run moved
            between CPU and GPU), and on a GPU, with the same data, masks and schedule, since every random
            draw of the loop is made on the CPU (models without dropout; dropout on a GPU draws from its
            own generator, which is not saved), and arithmetic that may differ in rounding. The state
            records each device segment (`state_segments`).
        progress: show a tqdm progress bar.
        max_seconds: stop (after checkpointing) once this much wall-clock has passed; a later call
            continues.
        stop_after: stop (after checkpointing) at this step; a later call continues. Together
            with ``max_seconds`` this simulates an interruption.
        allow_extend: accept a ``"wsd"`` state file whose config differs from ``cfg`` only in
            ``steps`` (the run was lengthened or shortened), provided its step has passed neither
            ``cfg.decay_start()`` nor the decay start of the stored plan: the run so far was at constant
            LR, so it continues as if it had been planned with ``cfg.steps`` from the start (a finished
            or decaying run cannot be lengthened this way).
        penalty: optional ``model -> scalar`` added to the loss (e.g. an L2 penalty on couplings);
            the logged ``loss`` is the cross-entropy alone.
        val_fn: optional ``model -> held-out loss`` (the model is in eval mode during the call),
            evaluated every ``val_every`` steps and at the end: its value is logged as ``val_loss``,
            the best weights so far are kept in the state file, and the model ends with the best
            weights (early stopping by checkpoint selection). ``patience``: stop once this many
            evaluations in a row did not improve on the best (None: run all steps).

    Returns:
        The training log: a list of ``{"step", "loss", "lr", "seconds", "examples_per_s"}``.

    Raises:
        ValueError: the state file was written with another config (or, with ``allow_extend``, is
            already past the stored or the new decay start); ``cfg.cycle_start`` > 0 and no state file at
            (or after) that step.
        RuntimeError: the state file holds a CUDA generator's state (written before the random draws
            moved to the CPU), which cannot be resumed.
    """
    state_path = Path(state_path)
    device = model.device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)  # device-independent draws (see mask_tokens)
    step, log, elapsed, window_loss, segments = 0, [], 0.0, [], []
    best = {"val": math.inf, "step": 0, "model": None, "bad": 0}  # early stopping (val_fn)
    if state_path.exists():
        st = load_checkpoint(state_path)
        stored = json.loads(st["train_config"])
        if stored != cfg.to_dict():
            only_steps = {**stored, "steps": cfg.steps} == cfg.to_dict()
            if not (allow_extend and only_steps and cfg.schedule == "wsd"):
                raise ValueError(f"{state_path} was written with another training config; delete it or use that config")
            start = min(cfg.decay_start(), TrainConfig(**stored).decay_start())  # the stored run's own decay, too
            if st["step"] > start:
                raise ValueError(f"{state_path} is at step {st['step']}, past the decay start {start} "
                                 f"of its {stored['steps']}-step or the new {cfg.steps}-step plan; it cannot be "
                                 "re-planned to that length")
        if st.get("rng_device", st["device_type"]) != "cpu":
            raise RuntimeError(f"{state_path} holds the state of a {st['device_type']} random generator, written before "
                               "training drew its randomness on the CPU; it cannot be resumed: delete it to retrain")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        for g in opt.param_groups:  # the saved groups carry the writer's weight decay; a continuation sets its own
            g["weight_decay"] = cfg.weight_decay
        rng.bit_generator.state = json.loads(st["numpy_rng"])
        gen.set_state(st["torch_rng"].cpu())
        torch.set_rng_state(st["global_rng"].cpu())
        step, log, elapsed = st["step"], json.loads(st["log"]), st["seconds"]
        window_loss = json.loads(st["window_loss"])
        segments = state_segments(st)
        if "best_val" in st:
            best = {"val": st["best_val"], "step": st["best_step"], "model": st["best_model"], "bad": st["best_bad"]}
    if step < cfg.cycle_start:
        raise ValueError(f"a schedule cycle from step {cfg.cycle_start} continues a run's state at that step; "
                         f"{state_path} is at step {step}" if state_path.exists() else
                         f"a schedule cycle from step {cfg.cycle_start} continues a run's state at that step; "
                         f"{state_path} does not exist")

    def save():
        atomic_save({
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "numpy_rng": json.dumps(rng.bit_generator.state), "torch_rng": gen.get_state(),
            "global_rng": torch.get_rng_state(), "window_loss": json.dumps(window_loss),
            "log": json.dumps(log), "seconds": elapsed, "train_config": json.dumps(cfg.to_dict()),
            "device_type": device.type, "rng_device": "cpu", "segments": json.dumps(segments),
            **({"best_val": best["val"], "best_step": best["step"], "best_model": best["model"], "best_bad": best["bad"]}
               if val_fn is not None else {}),
        }, state_path)

    def validate() -> bool:
        """Evaluate, keep the best weights; True when patience has run out."""
        model.eval()
        v = float(val_fn(model))
        model.train()
        if not math.isfinite(v):
            raise FloatingPointError(f"the held-out loss is {v} at step {step}: training diverged")
        log.append({"step": step, "val_loss": v, "seconds": round(elapsed, 2)})
        if v < best["val"]:
            best.update(val=v, step=step, model={k: t.detach().clone().cpu() for k, t in model.state_dict().items()}, bad=0)
        else:
            best["bad"] += 1
        return patience is not None and best["bad"] >= patience


    if not segments or segments[-1]["device"] != device.type:
        segments.append({"from_step": step, "device": device.type, "torch": torch.__version__})
    precision, model.precision = getattr(model, "precision", "fp32"), "fp32"  # training always runs in fp32
    model.train()
    t0, seen = time.perf_counter(), 0
    start_elapsed = elapsed
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="train MDM", unit="step", mininterval=2.0)
    done = val_fn is not None and patience is not None and best["bad"] >= patience  # stopped early before
    while step < cfg.steps and not done:
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        values = sample_batch(rng, cfg.batch_size)
        forced = None
        if isinstance(values, tuple):
            values, forced = values
            forced = forced.to(device)
        values = values.to(device)
        loss = mdm_loss(model, values, gen, cfg.weighting, cfg.min_t, forced_BL=forced)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the training loss is {loss.item()} at step {step}: training diverged")
        opt.zero_grad(set_to_none=True)
        (loss if penalty is None else loss + penalty(model)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        seen += values.shape[0]
        window_loss.append(loss.item())
        elapsed = start_elapsed + time.perf_counter() - t0
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            entry = {"step": step, "loss": float(np.mean(window_loss)), "lr": _lr_at(step - 1, cfg),
                     "seconds": round(elapsed, 2), "examples_per_s": seen / max(1e-9, time.perf_counter() - t0)}
            log.append(entry)
            window_loss = []
            bar.set_postfix(loss=f"{entry['loss']:.3f}")
        stop = False
        if val_fn is not None and (step % val_every == 0 or step == cfg.steps):
            stop = validate()
        if step % cfg.ckpt_every == 0 or step == cfg.steps or stop:
            save()
        if stop:
            break
        if (max_seconds is not None and time.perf_counter() - t0 > max_seconds) or step == stop_after:
            save()
            break
    bar.close()
    if val_fn is not None and best["model"] is not None and (step >= cfg.steps or best["bad"] >= (patience or math.inf)):
        model.load_state_dict(best["model"])  # finished: end with the best held-out weights
    model.eval()
    model.precision = precision
    return log
