"""Training precision and autocast: the one place that turns "bf16" / "fp32" into an autocast context."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("bf16", "fp32")
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # --dtype of convert and generate


def autocast_dtype(precision: str) -> torch.dtype | None:
    """bf16 -> torch.bfloat16 (autocast), fp32 -> None (no autocast)."""
    return torch.bfloat16 if precision == "bf16" else None


def autocast(device: torch.device | str, precision: str):
    """bf16 autocast on `device` for precision "bf16" (fp32 master weights stay fp32), else nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def autocast_off(device: torch.device):
    """Autocast disabled inside (entering the context costs ~10 us, so only when it is on)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()
