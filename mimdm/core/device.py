"""Device selection with clear errors, and batch sizes from free GPU memory."""
from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """Turn ``"cpu"`` (or ``"cpu:0"``), ``"cuda"``, ``"cuda:1"`` or ``"auto"``/None into a usable `torch.device`.

    Raises:
        ValueError: the string is not a device name.
        RuntimeError: CUDA was asked for but is not available, or the index does not exist.
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"not a device: {device!r} (use 'cpu', 'cuda', 'cuda:N' or 'auto')") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available on this machine; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device type {dev.type!r}; use 'cpu' or 'cuda'")
    else:
        dev = torch.device("cpu")  # "cpu:0" is the one CPU device; checkpoints cannot be mapped to "cpu:0"
    return dev


def tokens_for_budget(free_bytes: int, bytes_per_token: float, fraction: float = 0.5, cap: int = 1 << 22) -> int:
    """How many tokens one forward pass may hold: ``fraction`` of ``free_bytes`` over ``bytes_per_token``, in [1, cap].

    Raises:
        ValueError: ``bytes_per_token <= 0`` or ``fraction`` outside (0, 1].
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    return int(max(1, min(cap, free_bytes * fraction // bytes_per_token)))


@torch.no_grad()
def auto_batch_tokens(model, length: int, default: int, fraction: float = 0.5, probe_rows: int = 8) -> int:
    """A forward-pass budget in tokens (the ``batch_tokens`` of probing and label generation) for ``model``.

    On the CPU returns ``default``. On CUDA it measures the peak memory of one forward of
    ``probe_rows × length`` fully masked tokens (in the model's precision, see
    `mimdm.core.contract.MaskedModel.set_precision`), and returns `tokens_for_budget` of the free
    memory (``torch.cuda.mem_get_info``) at that cost per token, rounded down to a multiple of
    ``length``. Resets the peak-memory statistics of the device (``torch.cuda.reset_peak_memory_stats``).

    Returns:
        tokens per forward pass (≥ ``length``).
    """
    dev = model.device
    if dev.type != "cuda":
        return default
    x = torch.full((probe_rows, length), model.mask_id, dtype=torch.long, device=dev)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    model(x)
    torch.cuda.synchronize(dev)
    per_token = max(1.0, (torch.cuda.max_memory_allocated(dev) - base) / x.numel())
    free, _ = torch.cuda.mem_get_info(dev)
    n = tokens_for_budget(free, per_token, fraction)
    return max(length, n // length * length)


def apply_precision(model, precision: str = "auto"):
    """Set a `MaskedModel`'s forward precision; ``"auto"``: bf16 autocast on a CUDA device that supports it, else fp32.

    Probabilities, entropies and NLL are computed in float32/float64 from the returned logits in
    either case (`mimdm.core.contract.MaskedModel.set_precision`); probing switches the model to
    fp32 for its own passes (`mimdm.probing.exact.probe_mi`).

    Returns:
        the model.

    Raises:
        ValueError: unknown precision. RuntimeError: ``"bf16"`` off CUDA or without bf16 support.
    """
    if precision == "auto":
        cuda = model.device.type == "cuda"
        precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    return model.set_precision(precision)
