"""AMP's speed-up rung by rung, from the tutorial's conditions to the project's defaults, and over
batch sizes: the measures of `ampbench explain`.

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
import json
import logging
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from ampbench.config import ConfigError, replace
from ampbench.measuring import kit, pace
from ampbench.report import selfcheck
from ampbench.training import loader, measure

log = logging.getLogger(__name__)

# (name, what changes, train.* overrides on top of the previous rung). R0 is tutorial/params.yaml's
# train section (tests/commands/test_explain.py keeps them equal); the last rung without compile is
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
# What the CPU rungs really run (the report's words must match its batch column and this machine)
CPU_WHAT = {
    "R0": "the tutorial's conditions sized for a CPU: DataLoader with PIL transforms, {workers} workers, "
    "batch {batch_size} (the GPU's 128 / 8), eager",
    "R1": "data and augmentation as tensors on the device (this CPU), no loader workers",
    "R2": "batch {batch_size} (the GPU rung's 512 / 8)",
}
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
            cpu = {**train, "batch_size": train["batch_size"] // 8, "workers": 2}
            out.append((name, CPU_WHAT[name].format(**cpu), replace(cfg, train=cpu)))
            continue
        out.append((name, what, replace(cfg, train=train)))
    return out


def _windows(
    step, batches, steps: int, windows: int, warmup: int, device, energy, what: str
) -> tuple[list, float | None]:
    """Seconds per step of each window, and the joules of the windows alone (None unmeasured):
    each window within one epoch, its first batch fetched before the clock starts (DataLoader
    workers start with each epoch); the warm-up's energy not counted."""
    first = 0
    for _ in range(warmup):  # warm-up: cuDNN search, graph capture, compile
        for b in itertools.islice(batches.epoch(first), steps):
            step(*b)
        first += 1
        pace.between("%s: warm-up epoch %d of %d done", what, first, warmup)
    out, joules = [], 0.0
    for w in range(windows):
        epoch = batches.epoch(first + w)
        todo = itertools.chain([next(epoch)], epoch)
        n = min(steps, len(batches))
        measure.sync(device)  # the warm-up's or last window's work done: not this window's energy
        j0 = energy.joules()
        out.append(kit.seconds(lambda e=todo: step(*next(e)), n, device) / n)
        j1 = energy.joules()
        joules = None if joules is None or j0 is None or j1 is None else joules + j1 - j0
        epoch.close()
        pace.between("%s: window %d of %d timed", what, w + 1, windows)
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
        wall = kit.seconds(lambda: step(*next(it)), len(todo), device)
    events = prof.key_averages()
    busy_us = (
        sum(e.self_device_time_total for e in events)
        if cuda
        else sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    )
    syncs = sum(e.count for e in events if e.key in SYNC_EVENTS)
    return min(1.0, busy_us / 1e6 / wall), syncs / len(todo)


def measure_cell(
    cfg, name: str, dataset: dict, strategy, energy, flops: float, opts: dict, rung: str = ""
) -> dict:
    """One rung x precision (`name`): its windows, profile, memory and energy."""
    device, t = strategy.device, cfg.train
    step, facts = kit.trainer(cfg, f"single-{name}", dataset, strategy)
    batches = loader.make(t.loader, dataset, t.batch_size, strategy, 0, t.workers)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    what = f"{rung} {name}"  # as its line says it: "R4 autocast"
    per_step, joules = _windows(
        step, batches, opts["steps"], opts["windows"], opts["warmup_epochs"], device, energy, what
    )
    pace.between("%s: profiling %d steps", what, opts["profile_steps"])
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


def measure_ladder(cfg, dataset: dict, strategy, opts: dict, only: list[str], cli_args: list[str], out: Path):
    """(every rung measured, whether the energy counter was there): the rungs named in `only`, or
    all. On a GPU, measuring all, the rungs without cuDNN autotuning run in a process of their own
    (`measured_apart`): cuDNN keeps the plan it chose for a shape without autotuning and reuses it
    once autotuning is on (measured: R3 at R2's fp32 speed)."""
    from ampbench.training.energy import Energy

    todo = rung_configs(cfg, strategy.device)
    if only:  # a part of another explain: these rungs only
        todo = [r for r in todo if r[0] in only]
    apart = []
    if strategy.device.type == "cuda" and not only:
        off = [name for name, _, c in todo if not c.train.cudnn_benchmark]
        apart = measured_apart(cli_args, opts, off, out)
        todo = [r for r in todo if r[0] not in off]
    energy = Energy(strategy.device)
    measured = [measure_rung(name, what, c, dataset, strategy, energy, opts) for name, what, c in todo]
    return apart + measured, energy.available


def measure_rung(name: str, what: str, cfg, dataset: dict, strategy, energy, opts: dict) -> dict:
    """One rung, every precision; speed-ups as ratios of this rung's medians."""
    flops = kit.train_flops_per_image(cfg, len(dataset["classes"]))
    cells = []
    for p in precisions(strategy.device):  # a line after each: a CPU cell takes a quarter minute
        cells.append(measure_cell(cfg, p, dataset, strategy, energy, flops, opts, rung=name))
        log.info(
            "%s %s: %s img/s (median of %d windows)",
            name,
            p,
            f"{cells[-1]['images_per_second']:,.0f}",
            opts["windows"],
        )
    tf32 = next((c for c in cells if c["precision"] == "tf32"), None)
    for c in cells:
        c["speedup_vs_fp32"] = c["images_per_second"] / cells[0]["images_per_second"]
        if tf32:  # AMP's gain against what PyTorch runs by default on Ampere and newer
            c["speedup_vs_tf32"] = c["images_per_second"] / tf32["images_per_second"]
    summary = ", ".join(
        f"{c['precision']} {c['images_per_second']:,.0f} img/s {c['speedup_vs_fp32']:.2f}x "
        f"busy {c['device_busy']:.0%} syncs {c['host_syncs_per_step']:.1f}"
        for c in cells
    )
    log.info("%s (%s): %s", name, what, summary)
    return {"rung": name, "change": what, "batch": cfg.train.batch_size, "cells": cells}


def check_data(todo: list, dataset: dict, crossover: list[int]) -> list[int]:
    """Before any measuring: every rung's batch fits the train set (else a ConfigError naming the
    rung), and the crossover's batches that do (a larger one would time the whole, smaller set)."""
    n = len(dataset["train_labels"])
    for name, _, c in todo:
        if c.train.batch_size > n:
            raise ConfigError(
                f"explain's rung {name} trains batches of {c.train.batch_size} images, more than the "
                f"{n:,} train images here (the data set, cut by data.train_per_class or --max-images); "
                f"give it at least {c.train.batch_size}: a larger data set (data.url), or a higher "
                "data.train_per_class or --max-images"
            )
    fits = [b for b in crossover if b <= n]
    if len(fits) < len(crossover):
        log.info(
            "crossover: batches %s skipped: the train set here holds %s images",
            crossover[len(fits) :],
            f"{n:,}",
        )
    return fits


def measured_apart(cli_args: list[str], opts: dict, names: list[str], out: Path) -> list[dict]:
    """`names` measured by `ampbench explain --rungs ...` in a fresh process; `cli_args`: this
    explain's --params and --set options."""
    if not names:
        return []
    part = out.with_name(out.name + "-part")
    command = [sys.executable, "-m", "ampbench", "explain", *cli_args]
    for flag, key in (("--steps", "steps"), ("--windows", "windows"), ("--profile-steps", "profile_steps")):
        command += [flag, str(opts[key])]
    command += ["--max-images", str(opts["max_images"]), "--rungs", ",".join(names), "--out", str(part)]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"measuring {', '.join(names)} apart failed: {shlex.join(command)}")
    rungs = json.loads(part.with_suffix(".json").read_text(encoding="utf-8"))["rungs"]
    part.with_suffix(".json").unlink()
    return rungs
