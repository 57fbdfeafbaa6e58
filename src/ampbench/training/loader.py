"""Training batches: device-resident uint8 data augmented on the device, or a torch DataLoader.

``DeviceLoader`` (the default) keeps the prepared uint8 dataset on the training device and, once
per epoch, shuffles it and applies a per-image random crop (zero padding 4) and horizontal flip
in a few batched ops: no worker processes, no per-batch host work. ``TorchLoader`` is the
tutorial's pipeline (DataLoader workers, PIL-based torchvision transforms) for comparison.

Both are deterministic in (seed, epoch), cut every global batch into contiguous per-rank slices
(so DDP with B/W per rank sees exactly the samples one process sees with B), drop the last
partial batch (static shapes), and can start mid-epoch for resume.
"""

from __future__ import annotations

import torch

from ampbench.cli_options import variant_fix
from ampbench.config import ConfigError


def epoch_generator(seed: int, epoch: int, device: torch.device | None = None) -> torch.Generator:
    """The epoch's random numbers, on ``device`` (the CPU by default)."""
    return torch.Generator(device=device or "cpu").manual_seed(seed * 100_003 + epoch)


def draw_crop_flip(n: int, gen: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Per-image (dy, dx, flip) for n images, as an (n, 3) int64 tensor on the generator's device."""
    shifts = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen, device=gen.device)
    flips = (torch.rand(n, generator=gen, device=gen.device) < 0.5).long()[:, None]
    return torch.cat([shifts, flips], 1)


def random_crop_flip(images: torch.Tensor, aug: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Crop each zero-padded image at (dy, dx) and mirror it where flip is set, batched."""
    n, _, h, w = images.shape
    aug = aug.to(images.device)
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    rows = aug[:, :1] + torch.arange(h, device=images.device)  # (n, h)
    cols = aug[:, 1:2] + torch.arange(w, device=images.device)  # (n, w)
    cols = torch.where(aug[:, 2:3].bool(), cols.flip(1), cols)
    idx = torch.arange(n, device=images.device)[:, None, None]
    # Advanced indexing puts the indexed dims first: (n, h, w, c) -> back to (n, c, h, w).
    out = padded[idx, :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


class DeviceLoader:
    """Yields (uint8 images, int64 labels) of this rank's slice of each global batch."""

    def __init__(self, images, labels, global_batch, rank, world_size, device, seed, chunk=8192):
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.global_batch, self.rank, self.world = global_batch, rank, world_size
        self.local = global_batch // world_size
        self.seed, self.chunk = seed, chunk

    def __len__(self) -> int:
        return len(self.labels) // self.global_batch

    def epoch(self, epoch: int, start_step: int = 0):
        # The shuffle and the draws are made on the device: drawn on the host and copied over,
        # they cost 6-50 ms of host work per epoch (page faults, synchronising copies) while the GPU
        # waited, which made an H100's AMP epochs vary by up to 30% (docs/BENCHMARKS.md).
        device = self.images.device
        gen = epoch_generator(self.seed, epoch, device)
        order = torch.randperm(len(self.labels), generator=gen, device=device)
        order = order[: len(self) * self.global_batch]
        # Draw the augmentation for the whole global order, then take this rank's part, so each
        # image gets the same crop and flip whatever the world size (DDP == one process).
        aug = draw_crop_flip(len(order), gen)
        rows = torch.arange(len(order), device=device).view(len(self), self.world, self.local)
        part = rows[:, self.rank].reshape(-1)
        mine, aug = order[part], aug[part]
        # Augment in chunks so peak memory stays bounded on large datasets.
        chunks = zip(mine.split(self.chunk), aug.split(self.chunk))
        images = torch.cat([random_crop_flip(self.images[i], a) for i, a in chunks])
        labels = self.labels[mine]
        for step in range(start_step, len(self)):
            s = slice(step * self.local, (step + 1) * self.local)
            yield images[s], labels[s]


class _PilDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels, transform):
        self.images, self.labels, self.transform = (
            images.permute(0, 2, 3, 1).contiguous().numpy(),
            labels,
            transform,
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return self.transform(Image.fromarray(self.images[i])), self.labels[i]


class TorchLoader(DeviceLoader):
    """The tutorial's input pipeline: DataLoader workers with PIL transforms."""

    def __init__(self, images, labels, global_batch, rank, world_size, device, seed, workers=8):
        import torchvision.transforms.v2 as T  # only this reference pipeline needs torchvision

        self.device = device
        transform = T.Compose(
            [T.RandomCrop(images.shape[-1], padding=4), T.RandomHorizontalFlip(), T.PILToTensor()]
        )
        self.dataset = _PilDataset(images, labels, transform)
        self.labels = labels
        self.global_batch, self.rank, self.world = global_batch, rank, world_size
        self.local = global_batch // world_size
        self.seed, self.workers = seed, workers

    def epoch(self, epoch: int, start_step: int = 0):
        gen = epoch_generator(self.seed, epoch)
        order = torch.randperm(len(self.labels), generator=gen)[: len(self) * self.global_batch]
        mine = order.view(len(self), self.world, self.local)[:, self.rank, :]
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=mine[start_step:].tolist(),
            num_workers=self.workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=False,
        )
        for images, labels in loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


# The one-cycle schedule's fewest steps (build.setup refuses fewer too, as a last guard).
ONE_CYCLE_MIN_STEPS = 4


def check_batch(global_batch: int, data: dict, epochs: int | None = None) -> None:
    """A batch larger than the train set would give epochs of zero steps; with ``epochs``, a
    schedule too short for one-cycle is refused here too, before any run is created."""
    n = len(data["train_labels"])
    if global_batch > n:
        raise ConfigError(
            f"train.batch_size={global_batch} is larger than the train set ({n} images); "
            "lower train.batch_size or raise data.train_per_class"
            + variant_fix("train.batch_size", "data.train_per_class")
        )
    steps = (epochs or 0) * (n // global_batch)
    if epochs is not None and steps < ONE_CYCLE_MIN_STEPS:
        raise ConfigError(
            f"only {steps} training steps (train.epochs x train set / train.batch_size): the one-cycle "
            f"schedule needs at least {ONE_CYCLE_MIN_STEPS}; raise train.epochs or lower train.batch_size"
            + variant_fix("train.epochs", "train.batch_size")
        )


def make(kind: str, data: dict, global_batch: int, strategy, seed: int, workers: int):
    """The loader named by ``train.loader`` for this rank."""
    check_batch(global_batch, data)
    images, labels = data["train_images"], data["train_labels"]
    args = (images, labels, global_batch, strategy.rank, strategy.world_size, strategy.device, seed)
    return DeviceLoader(*args) if kind == "device" else TorchLoader(*args, workers=workers)
