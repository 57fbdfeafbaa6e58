"""Does the model fit? Checked before a train stage creates any MLflow run.

The configuration's own rule (``config.rules``) refuses only models no machine could hold (over
1 TiB). This check compares the same count, weights, gradients, momentum and one copy at 4 bytes
a parameter (activations come on top), with what this machine has free: the GPU's free memory, or
the host's available memory shared by the processes training on it. A model that cannot fit is
then one line, not runs left behind and an allocator traceback minutes later.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ampbench.config import Config, ConfigError
from ampbench.config.rules import BYTES_PER_PARAMETER, alexnet_parameters

MEMINFO = Path("/proc/meminfo")


def available_bytes(device: torch.device, processes: int = 1) -> int | None:
    """Free memory for one training process on `device`: the GPU's free memory, or the host's
    MemAvailable split over `processes` (DDP workers sharing the host); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // max(1, processes)
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(cfg: Config, device: torch.device, num_classes: int, processes: int = 1) -> None:
    """ConfigError naming the setting when the study's AlexNet cannot fit this device's memory."""
    m = cfg.model
    if m.name != "alexnet":  # other models are counted when built
        return
    params = alexnet_parameters(m.fc_dim, m.batch_norm, num_classes)
    need, free = params * BYTES_PER_PARAMETER, available_bytes(device, processes)
    if free is None or need <= free:
        return
    where = f"this GPU ({device}) has" if device.type == "cuda" else "this machine has"
    share = f" for each of its {processes} processes" if processes > 1 and device.type != "cuda" else ""
    raise ConfigError(
        f"model.fc_dim: {m.fc_dim} makes a model of {params:,} parameters; training it needs at least "
        f"{need / 2**30:,.1f} GiB (weights, gradients, momentum and a copy, 4 bytes each) but {where} "
        f"{free / 2**30:,.1f} GiB free{share}: choose a smaller model.fc_dim (the study's 4096 needs "
        "0.35 GiB)"
    )


def local_processes() -> int:
    """Training processes on this host: torchrun's LOCAL_WORLD_SIZE, else 1."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
