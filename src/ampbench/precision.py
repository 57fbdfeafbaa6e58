"""The three precision strategies: ``fp32``, ``autocast`` and ``autocast_gradscaler``.

Each is a small frozen object; the training loop never branches on it. ``torch.autocast(...,
enabled=False)`` and ``GradScaler(enabled=False)`` are no-ops, so one step serves all three.
``fp32`` is true fp32: TF32 is switched off for matmuls and cuDNN (PyTorch enables TF32
convolutions by default on Ampere and newer), and what was really used is reported.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    name: str
    autocast: bool
    grad_scaler: bool


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", autocast=False, grad_scaler=False),
        Precision("autocast", autocast=True, grad_scaler=False),
        Precision("autocast_gradscaler", autocast=True, grad_scaler=True),
    )
}


def amp_dtype(setting: str, device: torch.device) -> torch.dtype:
    """`auto` is float16 on CUDA (what the tutorial measured) and bfloat16 elsewhere."""
    if setting == "auto":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return getattr(torch, setting)


def disable_tf32() -> dict[str, bool]:
    """Switch TF32 off everywhere (true fp32 baseline); return the settings for logging."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }


def apply(precision: Precision, model: torch.nn.Module, device: torch.device, dtype_setting: str):
    """Configure the model's in-forward autocast and build the scaler.

    Returns (scaler, facts): facts say what is really in use, so nothing is logged as used
    when PyTorch silently disabled it.
    """
    dtype = amp_dtype(dtype_setting, device)
    autocast_ok = torch.amp.is_autocast_available(device.type)
    if precision.autocast and not autocast_ok:
        log.warning("autocast is not available on %s: running without it", device.type)
    model.amp_enabled = precision.autocast and autocast_ok
    model.amp_dtype = dtype
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = torch.amp.GradScaler(device.type, enabled=precision.grad_scaler)
    for w in caught:
        log.warning("GradScaler: %s", w.message)
    facts = {
        "autocast_used": model.amp_enabled,
        "amp_dtype": str(dtype).removeprefix("torch.") if model.amp_enabled else "float32",
        "grad_scaler_used": scaler.is_enabled(),
    }
    if precision.grad_scaler and not scaler.is_enabled():
        log.warning("GradScaler requested but disabled by PyTorch on %s", device.type)
    return scaler, facts


def scale_tensor(scaler: torch.amp.GradScaler, device: torch.device) -> torch.Tensor:
    """The scaler's current scale as a device tensor, without a host sync.

    ``GradScaler.get_scale()`` calls ``.item()``; the hot loop must not. A disabled scaler has
    scale 1. ``_scale`` is the scaler's own tensor (lazily created on the first ``scale()``).
    """
    if scaler.is_enabled() and scaler._scale is not None:
        return scaler._scale
    return torch.ones((), device=device)


def found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """1.0 if the step just taken was skipped for inf/NaN gradients, else 0.0 (a device tensor).

    Valid between ``scaler.step()`` and ``scaler.update()``; None for a disabled scaler. These are
    the scaler's own flags (one per device), so counting skips adds no kernels of our own beyond
    one add.
    """
    if not scaler.is_enabled():
        return None
    flags = list(scaler._found_inf_per_device(optimizer).values())
    return flags[0] if len(flags) == 1 else sum(flags)
