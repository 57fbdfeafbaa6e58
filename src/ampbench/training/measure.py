"""Measurements bench, evaluation and the loop share: predictions, accuracy, device sync, peak memory,
and an epoch's clock (seconds and joules)."""

from __future__ import annotations

import contextlib
import resource
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


class EpochClock:
    """An epoch's measured region: its training seconds and joules (`energy.Energy`), each
    synchronised, with the time and energy of saves taken out and a resumed epoch's first part
    (from its checkpoint) added. Joules are None where unmeasured, or unknown for a first part."""

    def __init__(self, device: torch.device, energy, seconds: float = 0.0, joules: float | None = 0.0):
        self.device, self.energy = device, energy
        self.before = (seconds, joules)  # a resumed epoch's first part
        self.paused = [0.0, 0.0]  # seconds and joules spent in saves
        sync(device)
        self.start = (time.perf_counter(), energy.joules())

    def read(self) -> tuple[float, float | None]:
        """(seconds, joules) of training so far, synchronised."""
        sync(self.device)
        seconds = self.before[0] + time.perf_counter() - self.start[0] - self.paused[0]
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
        self.paused[0] += time.perf_counter() - t0
        j1 = self.energy.joules()
        if j0 is not None and j1 is not None:
            self.paused[1] += j1 - j0
