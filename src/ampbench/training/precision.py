"""Precision strategies: ``fp32``, ``autocast``, ``autocast_gradscaler`` and ``autocast_bf16``.

Each is a small frozen object in ``REGISTRY``, the one registry every stage, the CLI, the config
checks and DVC's matrix read their names from; the training loop never branches on it.
``torch.autocast(..., enabled=False)`` and ``GradScaler(enabled=False)`` are no-ops, so one step
serves all of them. ``fp32`` is true fp32: TF32 is switched off for matmuls and cuDNN (PyTorch
enables TF32 convolutions by default on Ampere and newer), and what was really used is reported.

A strategy is stateless and shared by every run. ``setup(model, device)`` makes the model compute
in its precision and returns a ``PrecisionRun``: one run's state (the GradScaler) behind the few
calls the step, the loop and checkpoints make. The scaler is owned here, so its private tensors
(the scale and the found-inf flags, read without a host sync) are read in this module only.

Adding a precision that autocast and GradScaler can express (say, fp16 without channels_last) is
one ``Precision(...)`` entry below. One that needs other machinery (fp8 through an extension) is a
new class with the ``PrecisionStrategy`` interface, and a ``PrecisionRun`` of its own, registered here.
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


class PrecisionRun(Protocol):
    """One run's precision state: what the step, the loop and checkpoints ask of it.

    ``backward`` and ``optimizer_step`` run inside the training step, which never syncs the host
    and may be captured whole in a CUDA graph: they must stay on the device.
    """

    facts: dict  # what is really in use, for logging: autocast_used, amp_dtype, grad_scaler_used

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate `loss` (scaled first where loss scaling is on)."""
        ...

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """Step `optimizer` on the true (unscaled) gradients unless they hold inf/NaN, then adapt
        the scale. Returns a device tensor, 1.0 if the step was skipped else 0.0; None without
        loss scaling (no step is ever skipped)."""
        ...

    def scale(self) -> torch.Tensor:
        """The current loss scale as a device tensor (1 without loss scaling); no host sync."""
        ...

    def diverged(self, nonfinite_losses: float, scale_floor: float) -> bool:
        """Whether an epoch with `nonfinite_losses` inf/NaN losses means no later step can succeed."""
        ...

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this state (saved under the key ``scaler``)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        ...


class PrecisionStrategy(Protocol):
    """A precision as the registry holds it: a name, and how a run sets it up."""

    @property
    def name(self) -> str: ...  # read-only: the registry's objects are frozen

    def setup(self, model: torch.nn.Module, device: torch.device) -> PrecisionRun:
        """Make the model compute in this precision (in its own forward); return the run's state."""
        ...


class AmpRun:
    """A ``PrecisionRun`` over one GradScaler, enabled or not (a disabled one passes everything
    through, so one implementation serves every precision autocast and GradScaler can express)."""

    def __init__(self, scaler: torch.amp.GradScaler, facts: dict, device: torch.device) -> None:
        self._scaler, self.facts, self._device = scaler, facts, device

    def backward(self, loss: torch.Tensor) -> None:
        """Scale the loss (a no-op when disabled) and backpropagate it."""
        self._scaler.scale(loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """Unscale once, step (skipped on inf/NaN gradients), read the skip flag, update the scale."""
        # Unscale explicitly: one pass checks and unscales the gradients. Left to step(), the
        # scaler makes a check-only pass and fused SGD then unscales and writes every gradient
        # again (profiled on an H200: 0.14 ms per step instead of 0.08). No-op when disabled.
        self._scaler.unscale_(optimizer)
        self._scaler.step(optimizer)
        skipped = self._found_inf(optimizer)  # read before update() resets it
        self._scaler.update()
        return skipped

    def _found_inf(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        # The scaler's own flags (one per device, valid between step() and update()): counting
        # skips adds no kernels of our own beyond one add, and no host sync.
        if not self._scaler.is_enabled():
            return None
        flags = list(self._scaler._found_inf_per_device(optimizer).values())
        return flags[0] if len(flags) == 1 else sum(flags)

    def scale(self) -> torch.Tensor:
        """The scaler's own scale tensor (created lazily on the first ``backward``), else 1."""
        # Not GradScaler.get_scale(): it calls .item(), which the hot loop must not.
        if self._scaler.is_enabled() and self._scaler._scale is not None:
            return self._scaler._scale
        return torch.ones((), device=self._device)

    def diverged(self, nonfinite_losses: float, scale_floor: float) -> bool:
        """Without a scaler any non-finite loss went into the weights. With one, skipped steps are
        the scaler doing its job; only a scale collapsed below `scale_floor` means no step can
        succeed any more. Reads the scale (a host sync): call it between epochs."""
        if not self._scaler.is_enabled():
            return nonfinite_losses > 0
        return float(self.scale()) < scale_floor

    def state_dict(self) -> dict:
        """GradScaler's state dict (empty when disabled)."""
        return self._scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore GradScaler's state (ignored when disabled, as GradScaler does)."""
        self._scaler.load_state_dict(state)


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

    def setup(self, model: torch.nn.Module, device: torch.device) -> AmpRun:
        """Make `model` autocast in its own forward (or not); return the run's scaler state."""
        return AmpRun(*self._convert(model, device), device)

    def _convert(self, model: torch.nn.Module, device: torch.device) -> tuple[torch.amp.GradScaler, dict]:
        dtype = self.dtype_on(device)
        autocast_ok = torch.amp.is_autocast_available(device.type)
        if dtype is not None and not autocast_ok:
            log.warning("autocast is not available on %s: running without it", device.type)
        # Read by AlexNet.forward; plain attributes, so DataParallel replicas copy them.
        model.amp_enabled = dtype is not None and autocast_ok  # type: ignore[assignment]
        if dtype is not None:
            model.amp_dtype = dtype  # type: ignore[assignment]
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


REGISTRY: dict[str, PrecisionStrategy] = {
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
