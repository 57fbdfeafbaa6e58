"""Does the model fit? Checked before a train stage creates any MLflow run.

The configuration's own rule (``config.rules``) refuses only models no machine could hold (over
1 TiB, counting 16 bytes a parameter). This check uses what a train stage was measured to need,
per training process, and compares it with what this machine has free: the GPU's free memory, or
the host's available memory shared by the processes training on it. A model that cannot fit is
then one line, not runs left behind and an allocator traceback (or the kernel's OOM killer)
minutes later.

Measured (2-core CPU machine, 2026-12-06, peak resident memory of a train stage, fp32, 2 epochs,
checkpoints every second, model exported to MLflow), at fc_dim 4096 / 8000 / 16000 (23 M / 75 M /
275 M parameters): single 1.31 / 2.28 / 6.13 GB, each of ddp's 2 processes 1.41 / 2.58 / 7.20 GB.
That is 19.7 (single) and 23.6 (ddp) bytes a parameter (weights, gradients, momentum, DDP's
buckets, the optimizer's temporaries, checkpoint copies) plus 0.87 GB a process (torch, MLflow,
data, activations). The same ddp stage at 75 M parameters peaked at 3.01 GB in a CI run (about
26 bytes a parameter): the peak varies by run. The check counts 32 bytes a parameter plus 1 GiB
a process: 3.46 GB there, above every measurement, so a model it lets through is not killed
half-way; tests/training/test_memory_check.py measures it again on every CI run.

On a GPU (H100 80GB, 2026-12-06, the GPU's used memory as nvidia-smi reports it, peak over a
2-epoch train stage (seed 0, tracking.log_model=none), else the defaults: data on the device,
cuDNN autotuning, the step as a replayed CUDA graph) at fc_dim 8000 / 16000: single (fp32,
autocast, autocast + scaler alike within 0.6 GB) 4.8 / 7.3-7.9 GB, ddp-autocast's worker 5.6 /
9.8 GB: 13 (single) and 22 (ddp) bytes a parameter plus about 4 GB a process (CUDA's context,
the data set, cuDNN's and the graph's workspaces). There the check counts 32 bytes a parameter
plus 4 GiB: 12.5 GiB for ddp's 9.6 GiB at 275 M parameters, 6.2 GiB for single's 4.7 GiB at 75
M.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ampbench.config import Config, ConfigError
from ampbench.config.rules import alexnet_parameters

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
CGROUP_FILES = (
    ("memory.max", "memory.current"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
)
BYTES_PER_PARAMETER = 32  # measured: 19.7 single, 23.6-26 ddp (module docstring)
PROCESS_BYTES = 2**30  # measured: 0.87 GB a process at any model size
# Measured (2-core CPU, 2026-12-06, fp32 step of the study's AlexNet on 32x32 images, peak resident
# memory): 1.15 / 1.64 / 2.92 GB at batch 128 / 1024 / 4096, 0.45 MB an image; counted 0.6 MB, so
# a batch of tens of thousands is refused in one line, not killed by the kernel mid-step.
ACTIVATION_BYTES = 600_000
ADDRESS_MARGIN = 3 * 2**28  # 0.75 GiB: see check_address_space
# bench's DataLoader rung starts worker processes and threads: "can't start new thread" at 0.8 GiB
# left (ulimit -v 4500000), none at 1.3 (5000000)
BENCH_ADDRESS_MARGIN = 2**30
GPU_PROCESS_BYTES = 4 * 2**30  # measured: about 4 GB of a GPU a process (module docstring)


def needed_bytes(params: int, device_type: str = "cpu") -> int:
    """Memory one training process needs for a model of `params` parameters on a device of
    `device_type` (measured rule)."""
    return params * BYTES_PER_PARAMETER + (GPU_PROCESS_BYTES if device_type == "cuda" else PROCESS_BYTES)


def available_bytes(device: torch.device, processes: int = 1) -> int | None:
    """Free memory for one training process on `device`: the GPU's free memory, or the host's
    MemAvailable split over `processes` (DDP workers sharing the host); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    free = [b for b in (_meminfo("MemAvailable"), cgroup_free()) if b is not None]
    return min(free) // max(1, processes) if free else None


def _meminfo(key: str, path: Path | None = None) -> int | None:
    """A `key:  N kB` line of /proc/meminfo (or /proc/self/status) in bytes, or None."""
    try:
        for line in (path or MEMINFO).read_text(encoding="utf-8").splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_free() -> int | None:
    """What this process's memory cgroup (a container's limit: cgroup v2, else v1) still allows,
    or None without a limit: MemAvailable counts the host's memory, not the container's."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = CGROUP / limit_file
            text = limit.read_text(encoding="utf-8").strip()
            if text == "max" or int(text) >= 2**60:  # no limit (v1 writes a huge number)
                return None
            return max(0, int(text) - int((CGROUP / usage_file).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return None


def address_space_left() -> int | None:
    """What this process's address-space limit (`ulimit -v`) still allows, or None without one."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    used = _meminfo("VmSize", Path("/proc/self/status"))
    return None if soft == resource.RLIM_INFINITY or used is None else max(0, soft - used)


def check_fits(cfg: Config, device: torch.device, num_classes: int, processes: int = 1) -> None:
    """ConfigError naming the setting when the study's AlexNet cannot fit this device's memory."""
    m = cfg.model
    if m.name != "alexnet":  # other models are counted when built
        return
    params = alexnet_parameters(m.fc_dim, m.batch_norm, num_classes)
    need, free = needed_bytes(params, device.type), available_bytes(device, processes)
    if device.type != "cuda":
        check_address_space(cfg, params)
    if free is None or need + batch_bytes(cfg, processes) <= free:
        return
    where = f"this GPU ({device}) has" if device.type == "cuda" else "this machine has"
    if (
        device.type != "cuda"
        and (limited := cgroup_free()) is not None
        and limited // max(1, processes) == free
    ):
        where = "this container's memory limit (cgroup) leaves"
    share = f" for each of its {processes} processes" if processes > 1 and device.type != "cuda" else ""
    if need <= free:  # the model fits; its batch's activations do not
        raise ConfigError(
            f"train.batch_size: {cfg.train.batch_size} images a step need about "
            f"{batch_bytes(cfg, processes) / 2**30:,.1f} GiB of activations a process beside the "
            f"model's {need / 2**30:,.1f} GiB, but {where} {free / 2**30:,.1f} GiB free{share}: lower "
            f"train.batch_size (the study's 512 needs {512 * ACTIVATION_BYTES / 2**30:.1f} GiB)"
        )
    raise ConfigError(
        f"model.fc_dim: {m.fc_dim} makes a model of {params:,} parameters; training it needs at least "
        f"{need / 2**30:,.1f} GiB a process ({BYTES_PER_PARAMETER} bytes a parameter plus "
        f"{(need - params * BYTES_PER_PARAMETER) // 2**30} GiB, as measured) but {where} "
        f"{free / 2**30:,.1f} GiB free{share}: choose a smaller model.fc_dim (the study's 4096 needs "
        f"{needed_bytes(alexnet_parameters(4096, True, 10), device.type) / 2**30:.1f} GiB)"
    )


def check_address_space(cfg: Config, params: int | None = None, margin: int = 0) -> None:
    """Under `ulimit -v` the allocator fails long before the host's memory runs out (hostile
    re-run: a 52-line traceback, runs left FAILED). What this process has mapped (torch and
    MLflow imported: ~3.5 GB of address space) is spent already; the model's bytes, the batch's
    and ``ADDRESS_MARGIN`` (what torch and the libraries it loads as it goes map: a tiny model
    failed with 0.6 GiB left, ran with 1.1) count against what the limit leaves."""
    left = address_space_left()
    if params is None:  # the study's AlexNet counted; another model by the margin only
        m = cfg.model
        params = alexnet_parameters(m.fc_dim, m.batch_norm) if m.name == "alexnet" else 0
    margin = margin or ADDRESS_MARGIN  # more for a command that starts loader workers (bench)
    need = params * BYTES_PER_PARAMETER + batch_bytes(cfg) + margin
    if left is None or need <= left:
        return
    raise ConfigError(
        f"model.fc_dim {cfg.model.fc_dim} and train.batch_size {cfg.train.batch_size} need about "
        f"{need / 2**30:,.2f} GiB more memory (with {margin / 2**30:.2f} GiB for what torch "
        f"loads as it goes), but this process's address-space limit (ulimit -v) leaves "
        f"{left / 2**30:,.2f} GiB: raise the limit (ulimit -v unlimited), or choose a smaller "
        "model.fc_dim or train.batch_size"
    )


def batch_bytes(cfg: Config, processes: int = 1) -> int:
    """The activations one training process keeps for its share of a batch (measured rule)."""
    images = max(1, cfg.train.batch_size // max(1, processes))
    return int(images * ACTIVATION_BYTES * (cfg.data.image_size / 32) ** 2)


def local_processes() -> int:
    """Training processes on this host: torchrun's LOCAL_WORLD_SIZE, else 1."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
