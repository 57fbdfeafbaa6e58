"""Measurements bench, evaluation and the loop share: predictions, accuracy, device sync, peak memory."""

from __future__ import annotations

import resource

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
