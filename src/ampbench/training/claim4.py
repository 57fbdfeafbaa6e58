"""The tutorial's claim 4, demonstrated: autocast entered around the model's call, not inside its
forward (``train.dp_autocast_outside_forward``, a param for this claim only; docs/FINDINGS.md).

The claim: "DataParallel needs autocast inside forward, or the replicas run in fp32". torch 2.14's
parallel_apply re-enters autocast in each replica thread with
`torch.amp.autocast(device_type, enabled=torch.is_autocast_enabled())`: the outer autocast's
*enabled* flag crosses into the thread, its dtype does not (autocast state is thread-local; a fresh
thread has the device's default, float16 on CUDA). So replicas run float16 under an outer float16
or bfloat16 autocast alike. ``model.DtypeProbe`` records, for every run, what the replicas ran.

Opt-in: ``build.setup`` calls ``autocast_outside`` only when the flag is set, so the default
variants' model and step carry no trace of this module.
"""

from __future__ import annotations

import torch
from torch import nn


class OuterAutocast(nn.Module):
    """Calls the (parallel-wrapped) model inside an autocast: the tutorial's placement.

    The tutorial also computes the loss inside it; here the loss is outside, which is the same
    maths: the model returns float32 logits and autocast runs cross-entropy in float32 anyway.
    """

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        # Not named `module`: that would pass for the DataParallel / DDP wrapper's AlexNet.
        self.inner = inner
        self.device_type, self.dtype = device_type, dtype

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The inner model's output, computed under this autocast."""
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.inner(images)


def autocast_outside(raw_model: nn.Module, model: nn.Module) -> tuple[nn.Module, dict[str, str]]:
    """Move `raw_model`'s autocast out of its forward, around `model` (raw_model as the parallel
    strategy wrapped it). Returns what the step calls instead of `model`, and the fact to log.

    A model without autocast (fp32) is left alone: nothing to move.
    """
    if not raw_model.amp_enabled:
        return model, {"autocast_placement": "none"}
    device_type = next(raw_model.parameters()).device.type
    # A disabled model enters no autocast at all in forward, so the outer one reaches its layers.
    raw_model.amp_enabled = False  # type: ignore[assignment]
    dtype: torch.dtype = raw_model.amp_dtype  # type: ignore[assignment]
    return OuterAutocast(model, device_type, dtype), {"autocast_placement": "outside_forward"}
