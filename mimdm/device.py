"""Device selection with clear errors."""
from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """Turn ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"auto"``/None into a usable `torch.device`.

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
    return dev
