"""AlexNet for 32x32 CIFAR images, with autocast entered inside ``forward``.

Autocast state is thread-local and ``nn.DataParallel`` re-enters it in its replica threads with
only ``enabled=``, not the dtype, so an outer bf16 autocast would make replicas run fp16. Entering
autocast in the model's own forward gives every replica (and every DDP process) the same dtype.

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
        # Set by the precision strategy; plain attributes so DataParallel replicas copy them.
        self.amp_enabled = False
        self.amp_dtype = torch.bfloat16

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() - self.mean) * self.inv_std
        if not self.amp_enabled:
            # No autocast entered, not even a disabled one: that would switch off a caller's
            # (claim4.py enters one around the model). Nothing in training enters one otherwise.
            return self.classifier(self.features(x)).float()
        with torch.autocast(x.device.type, dtype=self.amp_dtype):
            return self.classifier(self.features(x)).float()


class DtypeProbe:
    """Records the dtype the first convolution produced in training, per device (every run: the
    `replica_dtypes` fact; the claim-4 demonstration, claim4.py, is where it tells most).

    A forward hook on the AlexNet's first Conv2d; DataParallel's replicas share the hook (replicate
    copies the module's hook dict), so each GPU's replica reports its own output dtype. Only the
    first training forward per device is kept (one dict lookup per call after that); evaluation
    (eval mode) is not recorded. Under a CUDA graph the hook runs at capture, which is the step.
    """

    def __init__(self, model: AlexNet) -> None:
        self.seen: dict[str, str] = {}
        conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
        self.handle = conv.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs, output: torch.Tensor) -> None:
        if module.training and str(output.device) not in self.seen:
            self.seen[str(output.device)] = str(output.dtype).removeprefix("torch.")

    def fact(self) -> str:
        """`cuda:0=float16,cuda:1=float16` (sorted by device); empty before any training step."""
        return ",".join(f"{device}={dtype}" for device, dtype in sorted(self.seen.items()))
