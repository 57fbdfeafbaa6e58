"""AlexNet for 32x32 CIFAR images (``model.name: alexnet``, the study's network), and the probe
that records the dtype each replica ran.

The model knows nothing of precision: autocast is entered by the precision's own wrapper module
(``precision.AutocastForward``), placed inside the parallel strategy's wrapper. Build it through
``training/factory.py``, the one model factory every command uses.

The model takes uint8 images (N, 3, 32, 32) and normalises them itself, so the device-resident
loader, the DataLoader path and evaluation all feed the same thing.
"""

from __future__ import annotations

import torch
from torch import nn

from ampbench.config import ModelConfig

# Per-channel mean / std of CIFAR-10's train split, in [0, 1] units.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _conv(c_in: int, c_out: int, batch_norm: bool, stride: int = 1) -> list[nn.Module]:
    norm = nn.BatchNorm2d(c_out) if batch_norm else nn.Identity()
    return [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=not batch_norm), norm, nn.ReLU(inplace=True)]


class AlexNet(nn.Module):
    """Conv 64-192-384-256-256 (3x3, first stride 2), FC 1024-fc_dim-fc_dim-10: 23.3 M params."""

    mean: torch.Tensor  # buffers (register_buffer below), declared for the type checker
    inv_std: torch.Tensor

    def __init__(self, cfg: ModelConfig, num_classes: int = 10) -> None:
        super().__init__()
        bn = cfg.batch_norm
        self.features = nn.Sequential(
            *_conv(3, 64, bn, stride=2),
            nn.MaxPool2d(2),
            *_conv(64, 192, bn),
            nn.MaxPool2d(2),
            *_conv(192, 384, bn),
            *_conv(384, 256, bn),
            *_conv(256, 256, bn),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(cfg.dropout),
            nn.Linear(256 * 2 * 2, cfg.fc_dim),
            nn.ReLU(inplace=True),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.fc_dim, cfg.fc_dim),
            nn.ReLU(inplace=True),
            nn.Linear(cfg.fc_dim, num_classes),
        )
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("inv_std", 1 / (torch.tensor(STD).view(1, 3, 1, 1) * 255), False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() - self.mean) * self.inv_std
        return self.classifier(self.features(x))


class DtypeProbe:
    """Records the dtype the first convolution produced in training, per device (every run: the
    `replica_dtypes` fact; the claim-4 demonstration, dp_autocast_outside.py, is where it tells most).

    A forward hook on the model's first Conv2d (or, without one, its first Linear): any model.
    DataParallel's replicas share the hook (replicate copies the module's hook dict), so each GPU's
    replica reports its own output dtype. Only the first training forward per device is kept (one
    dict lookup per call after that); evaluation (eval mode) is not recorded. Under a CUDA graph
    the hook runs at capture, which is the step. A model with neither layer records nothing.
    """

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[str, str] = {}
        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        first = next((m for m in layers if isinstance(m, nn.Conv2d)), layers[0] if layers else None)
        self.handle = first.register_forward_hook(self._hook) if first is not None else None

    def _hook(self, module: nn.Module, inputs, output: torch.Tensor) -> None:
        if module.training and str(output.device) not in self.seen:
            self.seen[str(output.device)] = str(output.dtype).removeprefix("torch.")

    def fact(self) -> str:
        """`cuda:0=float16,cuda:1=float16` (sorted by device); empty before any training step."""
        return ",".join(f"{device}={dtype}" for device, dtype in sorted(self.seen.items()))
