"""Measurements bench, evaluation and the loop share: predictions, accuracy, device sync, peak memory,
a clean slate between seeds, the timed region and an epoch's clock (seconds and joules)."""

from __future__ import annotations

import contextlib
import gc
import math
import resource
import statistics
import threading
import time

import torch
from torch import nn


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, flip: bool, batch: int = 2048) -> torch.Tensor:
    """Predicted classes (eval mode) for uint8 images on the model's device.

    With ``flip``, the logits of each image and its mirror image are averaged (test-time
    augmentation: the model was trained on flipped images too).
    """
    was_training = model.training
    model.eval()
    preds = []
    for x in images.split(batch):
        logits = model(x)
        if flip:
            logits = logits + model(x.flip(3))
        preds.append(logits.argmax(1))
    model.train(was_training)
    return torch.cat(preds)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, flip: bool) -> float:
    return (predict(model, images, flip) == labels).sum().item() / max(1, len(labels))


def sync(device: torch.device | None) -> None:
    """Wait for the device (CUDA) so that a clock read after it measures finished work."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory on CUDA; peak resident memory of this process on CPU."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def clean_slate(device: torch.device | None) -> None:
    """Before a seed: what earlier seeds left (their CUDA graph's pool, model, optimizer: reference
    cycles wait for the cyclic collector; cuBLAS's workspaces) is freed, the allocator's cache
    returned, the peak statistics reset. A seed's memory then reads the same whatever ran before
    it in the process."""
    gc.collect()
    # What survives is the process's for good (modules, data, the stage): frozen, it is no longer
    # scanned, so the next seed's collection looks at that seed's objects alone (a full one took
    # ~0.7 s a seed on the H200 host with torch, MLflow and scikit-learn loaded).
    gc.freeze()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        # cuBLAS workspaces (one per stream that ran a matmul) live as long as the process and
        # count as allocated: freed here, each seed allocates its own as the first seed did.
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


class PeakMemory:
    """A seed's peak memory, its warm-up epoch apart.

    The first epoch a process trains holds one-off work: cuDNN autotuning's trial workspaces (the
    first seed of a process only: the choice is cached), the CUDA graph's capture, compilation.
    ``peak_memory_mb`` is the peak *allocated* after it (what training and evaluation need, the
    graph's pool included), ``peak_reserved_mb`` what the process held from the allocator then,
    ``warmup_peak_memory_mb`` the warm-up epoch's peak allocated. On a CPU: the process's peak
    resident memory (never reset), alone.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self.warmup_mb = device, math.nan
        self.cuda = device is not None and device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def warmup_done(self) -> None:
        """The warm-up epoch ended (called once, before the next epoch's clock starts)."""
        if self.cuda and math.isnan(self.warmup_mb):
            self.warmup_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            torch.cuda.reset_peak_memory_stats(self.device)

    def facts(self) -> dict:
        if not self.cuda:
            return {"peak_memory_mb": peak_memory_mb(self.device)}
        out = {
            "peak_memory_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
        }
        if not math.isnan(self.warmup_mb):
            out["warmup_peak_memory_mb"] = self.warmup_mb
        return out


# Set while an epoch's clock runs (EpochClock: between its start and a read, saves out): a test
# hook, nothing of the tool's own may run then.
TIMED = threading.Event()
# How long a timed epoch waits for a metrics send in flight before it starts anyway (a slow
# store): that epoch is then counted as disturbed.
HOLD_TIMEOUT_S = 5.0


@contextlib.contextmanager
def timed_region(hooks):
    """Around an epoch's clock: its steps alone in the process, the metrics sender
    (``hooks.hold``) held back and the cyclic garbage collector off (a full collection of torch's
    and MLflow's objects takes tens of ms). Yields whether the region is undisturbed: False when
    a send in flight outlasted ``HOLD_TIMEOUT_S``."""
    hold, release = getattr(hooks, "hold", None), getattr(hooks, "release", None)
    quiet = hold(HOLD_TIMEOUT_S) if hold else True
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield quiet
    finally:
        TIMED.clear()
        if collecting:
            gc.enable()
        if release:
            release()


def spread(values: list[float]) -> float:
    """Coefficient of variation (std / mean) of a series; nan with fewer than two values."""
    if len(values) < 2 or not statistics.fmean(values):
        return math.nan
    return statistics.stdev(values) / statistics.fmean(values)


class EpochClock:
    """An epoch's measured region: its training seconds and joules (`energy.Energy`), each
    synchronised, with the time and energy of saves taken out and a resumed epoch's first part
    (from its checkpoint) added. Joules are None where unmeasured, or unknown for a first part."""

    def __init__(self, device: torch.device, energy, seconds: float = 0.0, joules: float | None = 0.0):
        self.device, self.energy = device, energy
        self.before = (seconds, joules)  # a resumed epoch's first part
        self.paused = [0.0, 0.0]  # seconds and joules spent in saves
        sync(device)
        j0 = energy.joules()  # NVML is read outside the timed seconds
        self.start = (time.perf_counter(), j0)
        TIMED.set()

    def read(self) -> tuple[float, float | None]:
        """(seconds, joules) of training so far, synchronised."""
        sync(self.device)
        seconds = self.before[0] + time.perf_counter() - self.start[0] - self.paused[0]
        TIMED.clear()
        now, first, j0 = self.energy.joules(), self.before[1], self.start[1]
        if now is None or first is None or j0 is None:
            return seconds, None
        return seconds, first + now - j0 - self.paused[1]

    @contextlib.contextmanager
    def pause(self):
        """Around a save: yields the (seconds, joules) so far; what the save takes is not counted."""
        so_far = self.read()
        t0, j0 = time.perf_counter(), self.energy.joules()
        yield so_far
        j1 = self.energy.joules()
        self.paused[0] += time.perf_counter() - t0
        TIMED.set()
        if j0 is not None and j1 is not None:
            self.paused[1] += j1 - j0
