"""Wall-clock timing of model passes: one copy of the CUDA-synchronised timer every benchmark and chapter uses."""
from __future__ import annotations

import time
from typing import Callable

import torch


def sync(device: torch.device | str) -> None:
    """Wait for the queued work of a CUDA ``device`` (nothing on the CPU), so a clock read after it is meaningful."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], object], device: torch.device | str, repeats: int, warmup: int = 1) -> float:
    """Mean wall-clock seconds of ``fn()`` over ``repeats`` calls, after ``warmup`` untimed calls, the device
    synchronised (`sync`) before and after the timed calls.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats
