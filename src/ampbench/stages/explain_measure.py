"""The measures of `ampbench explain` (stages/explain.py): AMP's speed-up rung by rung, from the
tutorial's conditions to the project's defaults, and over batch sizes.

Each rung is a named set of existing ``train.*`` params applied on top of the previous rung (no
code path of its own), so any rung can also be trained as a whole study with ``--set``. For each
rung and precision this trains the real loop (the rung's loader, batch, cuDNN, graph and compile
settings) for ``windows`` windows of ``steps`` steps after a warm-up, and reads: images/s (median,
min–max), the share of wall time the device was busy and the host syncs per step (torch.profiler
over ``profile_steps`` steps), peak memory, TFLOP/s, and the energy per image from NVML's
total-energy counter where the GPU has one. Every speed-up is a ratio of medians of this run.
"""

from __future__ import annotations

import itertools
import statistics

import torch

from ampbench.config import replace
from ampbench.report import selfcheck
from ampbench.stages import bench_measure
from ampbench.training import loader, measure, parallel, precision

# (name, what changes, train.* overrides on top of the previous rung). R0 is tutorial/params.yaml's
# train section (tests/stages/test_explain.py keeps them equal); the last rung without compile is
# params.yaml's defaults.
RUNGS = (
    (
        "R0",
        "the tutorial's conditions: DataLoader with PIL transforms, 8 workers, batch 128, eager, "
        "cuDNN autotuning off",
        {
            "loader": "dataloader",
            "workers": 8,
            "batch_size": 128,
            "cuda_graph": False,
            "cudnn_benchmark": False,
            "compile": "none",
        },
    ),
    ("R1", "data and augmentation on the GPU", {"loader": "device"}),
    ("R2", "batch 512", {"batch_size": 512}),
    ("R3", "cuDNN autotuning", {"cudnn_benchmark": True}),
    ("R4", "the whole step replayed from a CUDA graph (the defaults)", {"cuda_graph": True}),
    ("R5", "torch.compile inside the graph", {"compile": "default"}),
)
DEFAULTS_RUNG = "R4"  # params.yaml's defaults (FINDINGS' "why" reads it from the JSON)
CPU_RUNGS = ("R0", "R1", "R2")  # cuDNN, CUDA graphs and inductor's GPU kernels mean nothing on a CPU
SYNC_EVENTS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aten::_local_scalar_dense",
)


def precisions(device: torch.device) -> list[str]:
    """True fp32 first (every speed-up's base); on CUDA also tf32, PyTorch's own default for
    convolutions on Ampere and newer, so AMP's gain shows against both (on a CPU it is fp32)."""
    cuda = device.type == "cuda"
    names = ["fp32"] + (["tf32"] if cuda else []) + ["autocast", "autocast_gradscaler"]
    bf16 = cuda and torch.cuda.is_bf16_supported()
    return names + (["autocast_bf16"] if bf16 else [])


def rung_configs(cfg, device: torch.device) -> list[tuple[str, str, object]]:
    """(name, what changes, config) per rung, cumulative; on a CPU the CPU rungs, batch / 8."""
    out, train = [], {}
    for name, what, overrides in RUNGS:
        train = {**train, **overrides}
        if device.type != "cuda":
            if name not in CPU_RUNGS:
                continue
            # an eighth of the GPU batch (128 -> 16, 512 -> 64): the same step, sized for a CPU
            out.append(
                (
                    name,
                    what,
                    replace(cfg, train={**train, "batch_size": train["batch_size"] // 8, "workers": 2}),
                )
            )
            continue
        out.append((name, what, replace(cfg, train=train)))
    return out


def _windows(
    step, batches, steps: int, windows: int, warmup: int, device, energy
) -> tuple[list, float | None]:
    """Seconds per step of each window, and the joules of the windows alone (None unmeasured):
    each window within one epoch, its first batch fetched before the clock starts (DataLoader
    workers start with each epoch); the warm-up's energy not counted."""
    first = 0
    for _ in range(warmup):  # warm-up: cuDNN search, graph capture, compile
        for b in itertools.islice(batches.epoch(first), steps):
            step(*b)
        first += 1
    out, joules = [], 0.0
    for w in range(windows):
        epoch = batches.epoch(first + w)
        todo = itertools.chain([next(epoch)], epoch)
        n = min(steps, len(batches))
        measure.sync(device)  # the warm-up's or last window's work done: not this window's energy
        j0 = energy.joules()
        out.append(bench_measure._seconds(lambda e=todo: step(*next(e)), n, device) / n)
        j1 = energy.joules()
        joules = None if joules is None or j0 is None or j1 is None else joules + j1 - j0
        epoch.close()
    return out, joules


def _profile(step, batches, steps: int, device) -> tuple[float, float]:
    """(share of wall time the device was busy, host syncs per step) over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    epoch = batches.epoch(10_000)
    todo = list(itertools.islice(epoch, steps))
    epoch.close()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    measure.sync(device)
    with profile(activities=activities) as prof:
        it = iter(todo)
        wall = bench_measure._seconds(lambda: step(*next(it)), len(todo), device)
    events = prof.key_averages()
    busy_us = (
        sum(e.self_device_time_total for e in events)
        if cuda
        else sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    )
    syncs = sum(e.count for e in events if e.key in SYNC_EVENTS)
    return min(1.0, busy_us / 1e6 / wall), syncs / len(todo)


def measure_cell(cfg, name: str, dataset: dict, strategy, energy, flops: float, opts: dict) -> dict:
    """One rung x precision: its windows, profile, memory and energy."""
    device, t = strategy.device, cfg.train
    step, facts = bench_measure._trainer(cfg, f"single-{name}", dataset, strategy)
    batches = loader.make(t.loader, dataset, t.batch_size, strategy, 0, t.workers)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    per_step, joules = _windows(
        step, batches, opts["steps"], opts["windows"], opts["warmup_epochs"], device, energy
    )
    busy, syncs = _profile(step, batches, opts["profile_steps"], device)
    ips = [t.batch_size / s for s in per_step]
    images = t.batch_size * min(opts["steps"], len(batches)) * opts["windows"]
    return {
        "precision": name,
        "amp_dtype": facts["amp_dtype"],
        "images_per_second": statistics.median(ips),
        "images_per_second_min": min(ips),
        "images_per_second_max": max(ips),
        "ms_per_step": t.batch_size / statistics.median(ips) * 1e3,
        "device_busy": busy,
        "host_syncs_per_step": syncs,
        "peak_memory_mb": measure.peak_memory_mb(device),
        "tflops": statistics.median(ips) * flops / 1e12,
        "joules_per_image": None if joules is None else joules / images,
        "noisy": selfcheck.of_series(ips),  # '' when the windows agree within 5%
    }


def crossover(cfg, dataset: dict, strategy, batches_to_try: list[int], opts: dict) -> dict:
    """Images/s of the defaults' bare step (one resident batch, graph-replayed on CUDA) per batch
    and precision; the smallest batch where autocast reaches 1.5x and 2x fp32."""
    device, rows = strategy.device, []
    for batch in batches_to_try:
        c = replace(cfg, train={"batch_size": batch})
        x = dataset["train_images"][:batch].to(device)
        y = dataset["train_labels"][:batch].to(device)
        row = {"batch": batch}
        for name in precisions(device):
            row[name] = _ceiling(c, name, dataset, strategy, x, y, opts["steps"])
        rows.append(row)

    def first(ratio: float) -> int | None:
        return next((r["batch"] for r in rows if r["autocast"] >= ratio * r["fp32"]), None)

    return {"rows": rows, "autocast_1_5x_from_batch": first(1.5), "autocast_2x_from_batch": first(2.0)}


def _ceiling(cfg, name: str, dataset: dict, strategy, x, y, steps: int) -> float:
    """Images/s of the bare step on one resident batch: the median of 3 windows after warm-up."""
    device = strategy.device
    step, _ = bench_measure._trainer(cfg, f"single-{name}", dataset, strategy)

    def once() -> None:
        step(x, y)

    bench_measure._seconds(once, bench_measure._warm_steps(step, 3), device)
    secs = [bench_measure._seconds(once, steps, device) / steps for _ in range(3)]
    return len(y) / statistics.median(secs)


def setup_device():
    strategy = parallel.make("single")
    strategy.setup()
    precision.disable_tf32()
    return strategy
