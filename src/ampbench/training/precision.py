"""Precision strategies: ``fp32``, ``autocast``, ``autocast_gradscaler`` and ``autocast_bf16``.

Each is a small frozen object in ``PRECISIONS``, the one registry every stage, the CLI, the
config checks and DVC's matrix read their names from; the training loop never branches on it.
``torch.autocast(..., enabled=False)`` and ``GradScaler(enabled=False)`` are no-ops, so one step
serves all of them. ``fp32`` is true fp32: TF32 is switched off for matmuls and cuDNN (PyTorch
enables TF32 convolutions by default on Ampere and newer), and what was really used is reported.

Adding a precision that autocast and GradScaler can express (say, fp16 without channels_last) is
one ``Precision(...)`` entry below. One that needs other machinery (fp8 through an extension) is a
new class with the ``PrecisionStrategy`` interface, registered here.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Protocol

import torch

log = logging.getLogger(__name__)

# CPU autocast runs bfloat16: float16 kernels are missing or emulated for much of it on CPUs. A
# float16 precision therefore runs bfloat16 on a CPU, and its runs record amp_dtype=bfloat16.
CPU_AUTOCAST_DTYPE = torch.bfloat16


class PrecisionStrategy(Protocol):
    """What the loop, evaluation, bench and estimates ask of a precision."""

    name: str

    def apply(self, model: torch.nn.Module, device: torch.device) -> tuple[torch.amp.GradScaler, dict]:
        """Make the model compute in this precision (in its own forward); return the scaler the step
        uses (disabled if none) and the facts to log: autocast_used, amp_dtype, grad_scaler_used."""
        ...


@dataclass(frozen=True)
class Precision:
    """Autocast to ``dtype`` (None: no autocast, fp32) inside the model's forward, and optionally
    GradScaler, which keeps fp16 gradients from underflowing (bf16 has fp32's range: no need)."""

    name: str
    dtype: torch.dtype | None
    grad_scaler: bool = False

    def dtype_on(self, device: torch.device) -> torch.dtype | None:
        """The autocast dtype this precision runs on `device` (None: fp32)."""
        if self.dtype is None or device.type == "cuda":
            return self.dtype
        return CPU_AUTOCAST_DTYPE

    def apply(self, model: torch.nn.Module, device: torch.device) -> tuple[torch.amp.GradScaler, dict]:
        dtype = self.dtype_on(device)
        autocast_ok = torch.amp.is_autocast_available(device.type)
        if dtype is not None and not autocast_ok:
            log.warning("autocast is not available on %s: running without it", device.type)
        # Read by AlexNet.forward; plain attributes, so DataParallel replicas copy them.
        model.amp_enabled = dtype is not None and autocast_ok
        if dtype is not None:
            model.amp_dtype = dtype
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = torch.amp.GradScaler(device.type, enabled=self.grad_scaler)
        for w in caught:
            log.warning("GradScaler: %s", w.message)
        if self.grad_scaler and not scaler.is_enabled():
            log.warning("GradScaler requested but disabled by PyTorch on %s", device.type)
        facts = {
            "autocast_used": model.amp_enabled,
            "amp_dtype": str(dtype if model.amp_enabled else torch.float32).removeprefix("torch."),
            "grad_scaler_used": scaler.is_enabled(),
        }
        return scaler, facts


PRECISIONS: dict[str, PrecisionStrategy] = {
    p.name: p
    for p in (
        Precision("fp32", dtype=None),
        Precision("autocast", dtype=torch.float16),  # the tutorial's: autocast's CUDA default
        Precision("autocast_gradscaler", dtype=torch.float16, grad_scaler=True),
        Precision("autocast_bf16", dtype=torch.bfloat16),  # bf16 has fp32's range: no scaler
    )
}


def disable_tf32() -> dict[str, bool]:
    """Switch TF32 off everywhere (true fp32 baseline); return the settings for logging."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }


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
