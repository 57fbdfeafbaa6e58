"""Precision strategies: ``fp32``, ``tf32``, ``autocast``, ``autocast_gradscaler``, ``autocast_bf16``.

Each is a small frozen object in ``REGISTRY``, the one registry every stage, the CLI, the config
checks and DVC's matrix read their names from; the training loop never branches on it.
``torch.autocast(..., enabled=False)`` and ``GradScaler(enabled=False)`` are no-ops, so one step
serves all of them. ``fp32`` is true fp32: TF32 is switched off for matmuls and cuDNN (PyTorch
enables TF32 convolutions by default on Ampere and newer); ``tf32`` is fp32 weights and
activations with TF32 tensor-core math for convolutions and matmuls, the baseline most users run
without knowing. Every precision sets both flags in ``setup``, so an fp32 run after a tf32 one in
the same process is true fp32 again, and what was really used is reported.

A strategy is stateless and shared by every run. ``setup(model, device)`` returns a
``PrecisionRun``: one run's state (the GradScaler) behind the few calls the step, the loop and
checkpoints make, and ``wrap(model)``, the model computing in the precision. The model knows
nothing of precision: ``AutocastForward`` enters autocast in its own forward, and the parallel
strategy wraps that, so every DataParallel replica (a thread, where autocast state is thread-local)
and every DDP process runs the configured dtype, for any model. The scaler is owned here, so its
private tensors (the scale and the found-inf flags, read without a host sync) are read in this
module only.

Adding a precision that autocast and GradScaler can express (say, fp16 without channels_last) is
one ``Precision(...)`` entry below. One that needs other machinery (fp8 through an extension) is a
new class with the ``PrecisionStrategy`` interface, and a ``PrecisionRun`` of its own, registered here.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

log = logging.getLogger(__name__)

# CPU autocast runs bfloat16: float16 kernels are missing or emulated for much of it on CPUs. A
# float16 precision therefore runs bfloat16 on a CPU, and its runs record amp_dtype=bfloat16.
CPU_AUTOCAST_DTYPE = torch.bfloat16


class PrecisionRun(Protocol):
    """One run's precision state: what the step, the loop and checkpoints ask of it.

    ``backward`` and ``optimizer_step`` run inside the training step, which never syncs the host
    and may be captured whole in a CUDA graph: they must stay on the device.
    """

    facts: dict  # what is really in use, for logging: autocast_used, amp_dtype, grad_scaler_used, tf32

    def wrap(self, model: nn.Module) -> nn.Module:
        """`model` computing in this precision (the parallel strategy wraps what this returns)."""
        ...

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

    @property
    def tf32(self) -> bool: ...  # TF32 tensor-core math for fp32 convolutions and matmuls

    def tf32_on(self, device: torch.device) -> bool:
        """Whether this precision runs TF32 on `device` (setup sets the flags so)."""
        ...

    def setup(self, model: torch.nn.Module, device: torch.device) -> PrecisionRun:
        """Set the backend flags this precision needs; return the run's state (``wrap`` it)."""
        ...


class AutocastForward(nn.Module):
    """Calls `net` inside ``torch.autocast(device_type, dtype)``: the precision's forward context.

    Plain attributes, so DataParallel's replicas copy them (replicate copies ``__dict__``) and each
    replica thread enters its own autocast with the dtype, not only the enabled flag the threads
    inherit. Entering autocast inside a forward is capturable in a CUDA graph and compilable.
    Logits come back in float32 whatever the dtype (the loss and the statistics read them).
    """

    def __init__(self, net: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        # Not named `module`: that would pass for the DataParallel / DDP wrapper's model.
        self.net = net
        self.device_type, self.dtype = device_type, dtype

    def forward(self, *args, **kwargs) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.net(*args, **kwargs).float()


class AmpRun:
    """A ``PrecisionRun`` over one GradScaler, enabled or not (a disabled one passes everything
    through, so one implementation serves every precision autocast and GradScaler can express)."""

    def __init__(
        self, scaler: torch.amp.GradScaler, facts: dict, device: torch.device, dtype: torch.dtype | None
    ) -> None:
        self._scaler, self.facts, self._device, self._dtype = scaler, facts, device, dtype

    def wrap(self, model: nn.Module) -> nn.Module:
        """`model` inside an ``AutocastForward``, or as is without autocast: fp32 enters none at
        all, not even a disabled one, which would switch a caller's off (dp_autocast_outside.py)."""
        if self._dtype is None:
            return model
        return AutocastForward(model, self._device.type, self._dtype)

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
    """Autocast to ``dtype`` (None: no autocast, fp32) around the model's forward, optionally
    GradScaler, which keeps fp16 gradients from underflowing (bf16 has fp32's range: no need), and
    TF32 math for what runs in fp32 (off: true fp32)."""

    name: str
    dtype: torch.dtype | None
    grad_scaler: bool = False
    tf32: bool = False

    def dtype_on(self, device: torch.device) -> torch.dtype | None:
        """The autocast dtype this precision runs on `device` (None: fp32)."""
        if self.dtype is None or device.type == "cuda":
            return self.dtype
        return CPU_AUTOCAST_DTYPE

    def tf32_on(self, device: torch.device) -> bool:
        """TF32 on `device`: a CUDA tensor-core mode; a CPU runs true fp32 (see setup)."""
        return self.tf32 and device.type == "cuda"

    def setup(self, model: torch.nn.Module, device: torch.device) -> AmpRun:
        """Set TF32 as this precision says; return the run's state (its ``wrap`` adds autocast).
        `model` is not changed: the precision's context lives in the wrapper."""
        dtype = self.dtype_on(device)
        if dtype is not None and not torch.amp.is_autocast_available(device.type):
            log.warning("autocast is not available on %s: running without it", device.type)
            dtype = None
        scaler, facts = self._scaler(device, dtype)
        # TF32 is a CUDA tensor-core mode. Its matmul flag is the process's float32 matmul
        # precision, which CPU kernels may read too (oneDNN's reduced-precision paths): a CPU runs
        # true fp32, so that the tf32 rows of a CPU run are the fp32 rows, not something else.
        if self.tf32 and device.type != "cuda":
            _say_once(f"{self.name}: TF32 is a CUDA tensor-core mode; on {device.type} this runs true fp32")
        tf32 = set_tf32(self.tf32_on(device))
        return AmpRun(scaler, {**facts, **tf32}, device, dtype)

    def _scaler(self, device: torch.device, dtype: torch.dtype | None) -> tuple[torch.amp.GradScaler, dict]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = torch.amp.GradScaler(device.type, enabled=self.grad_scaler)
        for w in caught:
            log.warning("GradScaler: %s", w.message)
        if self.grad_scaler and not scaler.is_enabled():
            log.warning("GradScaler requested but disabled by PyTorch on %s", device.type)
        facts = {
            "autocast_used": dtype is not None,
            "amp_dtype": str(dtype or torch.float32).removeprefix("torch."),
            "grad_scaler_used": scaler.is_enabled(),
        }
        return scaler, facts


REGISTRY: dict[str, PrecisionStrategy] = {
    p.name: p
    for p in (
        Precision("fp32", dtype=None),  # true fp32: the study's baseline
        Precision("tf32", dtype=None, tf32=True),  # PyTorch's default for convolutions on Ampere+
        Precision("autocast", dtype=torch.float16),  # the tutorial's: autocast's CUDA default
        Precision("autocast_gradscaler", dtype=torch.float16, grad_scaler=True),
        Precision("autocast_bf16", dtype=torch.bfloat16),  # bf16 has fp32's range: no scaler
    )
}


def set_tf32(on: bool) -> dict[str, bool]:
    """TF32 on or off for matmuls and cuDNN alike (process-wide); return the settings for logging.
    Both flags, always: PyTorch's own defaults differ (cuDNN's on, matmul's off)."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }


def disable_tf32() -> dict[str, bool]:
    """Switch TF32 off everywhere (true fp32 baseline); return the settings for logging."""
    return set_tf32(False)


@functools.cache
def _say_once(warning: str) -> None:
    """Once a process (hostile pass Z: the same line for each seed, and twice in evaluate)."""
    log.warning("%s", warning)
