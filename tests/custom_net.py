"""A user's own model factory, as `model.name: custom_net:make_model` names it (tests only).

The contract (training/factory.py): called with the class count, returns an nn.Module mapping
normalised float images (N, 3, H, W) to logits (N, num_classes); nothing about precision.
"""

from __future__ import annotations

from torch import nn


def make_model(num_classes: int) -> nn.Module:
    """A small convnet of any input size (adaptive pooling)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )


def wrong_class_count(num_classes: int) -> nn.Module:
    """Ignores the class count it is given: the factory's check must say so."""
    return make_model(num_classes + 3)


def not_a_module(num_classes: int) -> str:
    return f"{num_classes} classes"


def fixed_size(num_classes: int) -> nn.Module:
    """Takes 32x32 images only (a flatten into a fixed Linear)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))


def forward_fails(num_classes: int) -> nn.Module:
    """A model whose forward has a bug of the user's own (not a RuntimeError)."""

    class Broken(nn.Module):
        def forward(self, images):
            raise TypeError("forward() got an unexpected keyword")

    return Broken()


def forward_runtime_error(num_classes: int) -> nn.Module:
    """A forward that raises a RuntimeError of its own, nothing to do with the image size."""

    class Broken(nn.Module):
        def forward(self, images):
            raise RuntimeError("the feature store is offline")

    return Broken()


def fails_at_real_batch(num_classes: int, error: type[Exception] = RuntimeError) -> nn.Module:
    """Passes the factory's 2-image dry forward, then fails on the first real batch."""

    class Late(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(num_classes)

        def forward(self, images):
            if images.shape[0] > 2:
                raise error("only fails at a real batch")
            return self.net(images)

    return Late()


def value_error_at_real_batch(num_classes: int) -> nn.Module:
    """As fails_at_real_batch, with a ValueError (an error ampbench also raises for its own faults)."""
    return fails_at_real_batch(num_classes, ValueError)


def aux_heads_when_training(num_classes: int) -> nn.Module:
    """Logits when evaluating, (logits, auxiliary logits) when training: torchvision's googlenet and
    inception_v3 with their aux_logits on."""

    class WithAux(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(num_classes)

        def forward(self, images):
            logits = self.net(images)
            return (logits, logits) if self.training else logits

    return WithAux()
