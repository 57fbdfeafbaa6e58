"""What one seed's training produced, typed: ``SeedResult``. Torch-free, so every layer reads it.

It flows loop -> train -> ``model.pt`` (``checkpoints.state.ModelFile.result``) -> evaluate's metrics
file -> compare. Each field says what it is and, beside it, how it is used:

- ``mlflow``: its name on the seed's MLflow run, as a metric (``metric``) or a param (``param``);
  a field without one is kept in the model file only.
- ``carried``: evaluate copies it into ``reports/metrics/<variant>.json`` (what compare and findings read).
- ``summarised``: mean and std over seeds, on the variant's run and in the comparison.
- ``part``: seconds of one part of a seed, summed per stage (``time/seeds_<name>`` on the variant run).

On disk it is the flat dict of older versions (``to_dict``; a field that was not measured is left
out), so model files written before this type load unchanged; keys it does not know (a new
strategy's or precision's facts) are kept in ``extra`` and logged as params.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self

# Evaluate's per-seed scores (not training results) that are summarised beside SeedResult's.
SCORES = ("test_accuracy", "f1_macro")


def _field(mlflow: str = "", kind: str = "", *, carried=False, summarised=False, part=False, default=MISSING):
    meta = {"mlflow": mlflow, "kind": kind, "carried": carried, "summarised": summarised, "part": part}
    return field(default=default, metadata=meta)


def _metric(name: str, **how):
    return _field(name, "metric", **how)


def _param(name: str, **how):
    return _field(name, "param", **how)


@dataclass(kw_only=True)
class SeedResult:
    """One seed's training: speed, memory, energy, divergence, where its seconds went, facts."""

    # What was measured
    train_seconds: float = _metric("train_seconds", carried=True, summarised=True, part=True)
    """Seconds of training steps over all epochs (evaluation, saves and logging excluded)."""
    first_epoch_seconds: float = _metric("first_epoch_seconds", carried=True)
    """The first epoch's seconds: warm-up (cuDNN autotuning, CUDA-graph capture, compilation)."""
    images_per_second: float = _metric("images_per_second", carried=True, summarised=True)
    """Mean training images/s over the epochs after the first (all of them when there is one)."""
    epochs_completed: int = _metric("epochs_completed", carried=True)
    """Epochs trained: train.epochs, fewer when the seed diverged."""
    peak_memory_mb: float = _metric("peak_memory_mb", carried=True, summarised=True)
    """Peak device memory allocated (GPU 0 / rank 0); on CPU the process's peak resident memory."""
    peak_reserved_mb: float | None = _metric("peak_reserved_mb", carried=True, default=None)
    """Peak memory the CUDA caching allocator reserved; None on CPU."""
    warmup_peak_memory_mb: float | None = _metric("warmup_peak_memory_mb", carried=True, default=None)
    """Peak allocated during the first epoch alone (CUDA); None on CPU or with one epoch."""
    epoch_cv: float | None = _metric("epoch_cv", carried=True, default=None)
    """Spread (CV) of the epochs' images/s after the first: the self-check's > 5% marks it noisy."""
    disturbed_epochs: int | None = _metric("disturbed_epochs", carried=True, default=None)
    """Timed epochs a slow metrics send overlapped."""
    train_joules: float | None = _metric("train_joules", carried=True, summarised=True, default=None)
    """GPU energy over all epochs (NVML, every GPU the seed used); None where not measured."""
    images_per_joule: float | None = _metric("images_per_joule", carried=True, summarised=True, default=None)
    """Images trained per joule; None where energy was not measured."""
    final_train_accuracy: float | None = _field(default=None)
    """The last epoch's training accuracy (its per-epoch curve is on the run already)."""
    final_test_accuracy: float | None = _field(default=None)
    """The last epoch's test accuracy in the loop (evaluate scores the saved model itself)."""
    compile_seconds: float | None = _metric("compile_seconds", default=None)
    """Seconds the first compiled step took (train.compile); None when not compiled."""
    recompiles: int | None = _metric("recompiles", default=None)
    """Graphs compiled after the first step: 0 when the model compiled once."""
    # Divergence
    diverged: bool = _metric("diverged", carried=True)
    """Non-finite weights, or the loss scale fell under train.scale_floor: training stopped."""
    diverged_epoch: int | None = _metric("diverged_epoch", default=None)
    """The 1-based epoch it diverged in; None when it did not."""
    diverged_step: int | None = _metric("diverged_step", default=None)
    """The step of that epoch where the first non-finite value appeared; None when it did not."""
    # Where the seed's seconds went
    eval_seconds: float = _metric("time/eval_seconds", part=True, default=0.0)
    """Seconds of the loop's test-accuracy evaluations."""
    checkpoint_seconds: float = _metric("time/checkpoint_seconds", part=True, default=0.0)
    """Seconds writing checkpoints (train.checkpoint_every_s, stop signals)."""
    checkpoints_written: int = _field(default=0)
    """Checkpoints written while the seed trained."""
    logging_seconds: float = _metric("time/logging_seconds", part=True, default=0.0)
    """Seconds handing epoch records to the tracking hooks."""
    setup_seconds: float = _metric("time/setup_seconds", part=True, default=0.0)
    """Seconds building the loader, model, optimizer and step before the first epoch."""
    model_save_seconds: float | None = _metric("time/model_save_seconds", part=True, default=None)
    """Seconds writing model.pt (set after it is written, so not in the file itself)."""
    # What was really in use
    world_size: int = _param("world_size", carried=True)
    """Processes that trained it (DDP: one per GPU)."""
    devices_used: int = _param("devices_used", carried=True)
    """Devices really used: 1 where DataParallel had one GPU, so no speed-up is claimed that was not."""
    device_type: str | None = _param("device_type", default=None)
    """"cuda" or "cpu"."""
    device_name: str | None = _param("device_name", carried=True, default=None)
    """The GPU's name, or the CPU's with its cores."""
    amp_dtype: str | None = _param("amp_dtype", carried=True, default=None)
    """What autocast computed in ("float16", "bfloat16"), "float32" without autocast."""
    autocast_used: bool | None = _param("autocast_used", default=None)
    """Whether the forward ran under autocast."""
    grad_scaler_used: bool | None = _param("grad_scaler_used", default=None)
    """Whether a GradScaler scaled the loss (PyTorch may disable a requested one)."""
    tf32_matmul: bool | None = _param("tf32_matmul", default=None)
    """TF32 for float32 matmuls (the variant's setting, process-wide)."""
    tf32_cudnn: bool | None = _param("tf32_cudnn", default=None)
    """TF32 for cuDNN convolutions."""
    autocast_placement: str | None = _param("autocast_placement", carried=True, default=None)
    """Where autocast was entered under train.dp_autocast_outside_forward (claim 4); else None."""
    replica_dtypes: str | None = _param("replica_dtypes", carried=True, default=None)
    """What each (DataParallel) replica's forward really computed in, e.g. "cuda:0=float16"."""
    cuda_graph_used: bool | None = _param("cuda_graph_used", carried=True, default=None)
    """Whether the steps ran from a captured CUDA graph."""
    cuda_graph_fallback: str | None = _param("cuda_graph_fallback", default=None)
    """Why capture failed and the steps ran eager; None when it did not fail."""
    compile: str | None = _param("compile", default=None)
    """train.compile's mode ("none": eager)."""
    extra: dict[str, Any] = field(default_factory=dict, metadata={"kind": "", "mlflow": ""})
    """Facts of names this type does not know (a new strategy's or precision's): logged as params."""

    @classmethod
    def from_dict(cls, flat: dict) -> Self:
        """From the flat dict the loop assembles and model files hold; unknown keys go to ``extra``."""
        known = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: v for k, v in flat.items() if k not in known}
        return cls(**{k: v for k, v in flat.items() if k in known}, extra=extra)

    def to_dict(self) -> dict:
        """The flat dict model files hold: every field, less the optional ones not measured (None),
        then ``extra``."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        optional = {f.name for f in fields(self) if f.default is None}
        return {**{k: v for k, v in values.items() if v is not None or k not in optional}, **self.extra}

    def metrics(self) -> dict[str, float]:
        """The seed run's metrics, by MLflow name: what was measured (neither None nor NaN)."""
        out = {}
        for f in _of_kind("metric"):
            value = getattr(self, f.name)
            if value is not None and value == value:  # NaN != NaN
                out[f.metadata["mlflow"]] = float(value) if isinstance(value, bool) else value
        return out

    def params(self) -> dict[str, Any]:
        """The seed run's params, by MLflow name: the facts, and ``extra``'s plain ones."""
        out = {f.metadata["mlflow"]: getattr(self, f.name) for f in _of_kind("param")}
        plain = {k: v for k, v in self.extra.items() if isinstance(v, (str, bool, int))}
        return {**{k: v for k, v in out.items() if v is not None}, **plain}

    def carried(self) -> dict[str, Any]:
        """What evaluate copies into the metrics file (None where not measured)."""
        return {name: getattr(self, name) for name in CARRIED}


def _of_kind(kind: str) -> list:
    return [f for f in fields(SeedResult) if f.metadata.get("kind") == kind]


def _flagged(flag: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(SeedResult) if f.metadata.get(flag))


CARRIED = _flagged("carried")
# Mean and std over seeds on the variant's run and in the comparison (each where every seed has it).
SUMMARISED = (*SCORES, *_flagged("summarised"))
TIME_PARTS = _flagged("part")  # a seed's seconds by part; the stage sums them (time/seeds_<part>)


def unusable(record: object) -> str:
    """Why an evaluate metrics file's content cannot be summarised ('' if it can): a list of seeds,
    each a dict whose accuracy and speed are numbers, as every other summarised figure it holds
    (hostile pass B7: a seed without test_accuracy was a traceback in compare, and findings took
    the other seed's figure for the mean, exit 0)."""
    seeds = record.get("seeds") if isinstance(record, dict) else None
    if not isinstance(seeds, list) or not seeds:
        return "no list of seeds"
    numbers: set[int] = set()
    for i, seed in enumerate(seeds):
        if not isinstance(seed, dict):
            return f"seed entry {i} is {seed!r}, not a record"
        number = seed.get("seed")  # pass H10: "zero", 1.5 or a repeated 0 counted as seeds of their own
        if isinstance(number, bool) or not isinstance(number, int) or number < 0 or number in numbers:
            return f"seed entry {i}'s seed is {number!r}: " + (
                "a repeat" if number in numbers else "not a seed"
            )
        numbers.add(number)
        for key in ("test_accuracy", "images_per_second", *SUMMARISED):
            value = seed.get(key)
            if value is None and key in ("test_accuracy", "images_per_second"):
                return f"seed entry {i} has no {key}"
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                return f"seed entry {i}'s {key} is {value!r}, not a number"
            top = 1 if key in SCORES else math.inf  # a fraction; else a count, time or energy
            if value is not None and not 0 <= value <= top:  # NaN too (pass F9: an accuracy of -3.0)
                return f"seed entry {i}'s {key} is {value!r}, not in [0, {top:g}]"
    return ""
