"""The tutorial's claim 4, demonstrated: the precision's autocast wrapper placed outside the
parallel strategy's wrapper instead of inside it (``train.dp_autocast_outside_forward``, a param
for this claim only; docs/FINDINGS.md).

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

from torch import nn

from ampbench.training.precision import PrecisionRun


def autocast_outside(run: PrecisionRun, model: nn.Module) -> tuple[nn.Module, dict[str, str]]:
    """The precision's forward wrapper around `model` (the model as the parallel strategy wrapped
    it), not inside it: the tutorial's placement. Returns what the step calls, and the fact to log.

    The tutorial also computes the loss inside the autocast; here the loss is outside, which is
    the same maths: the wrapper returns float32 logits and autocast runs cross-entropy in float32
    anyway. A precision without autocast (fp32, tf32) has nothing to move.
    """
    outer = run.wrap(model)
    if outer is model:
        return model, {"autocast_placement": "none"}
    return outer, {"autocast_placement": "outside_forward"}
