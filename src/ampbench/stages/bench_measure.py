"""The measures of `ampbench bench` (stages/bench.py): training throughput of one variant, three ways.

For each variant (``single`` or ``dp``) at one batch size, in one process:
- **pipeline**: the real training loop (device-resident data and augmentation, the same step the
  ``train`` stage runs); a window is one full epoch, each window a new epoch;
- **ceiling**: the bare training step replayed from a CUDA graph on one fixed, resident batch
  (on CPU: the eager step on a fixed batch), the most this model and batch can do here; a window
  is ``--steps`` steps;
- **dataloader** (once, in the last variant's precision): the tutorial's input pipeline, a torch
  DataLoader with PIL-based torchvision transforms and ``--workers`` workers, feeding that step;
  a window is ``--steps`` steps within one epoch (at most the epoch).

Each measure is timed in ``--windows`` windows and reported as the median (min–max and every
window in the JSON): one window on a shared GPU can be hit by someone else's work. A variant's
two trainers are set up and warmed up first, then pipeline and ceiling windows alternate, so a
slow spell hits both; ratios are medians of the same run. Clocks are read only after
``measure.sync``; warm-up steps (graph capture, cuDNN autotuning) and worker start-up stay out of
the windows and are reported separately. TF32 is off, as in training. With ``--profile N`` it also
times each kernel (CPU: operator) of N ceiling steps per variant, from torch.profiler.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from ampbench.report import selfcheck
from ampbench.training import build, loader, measure, parallel, precision

log = logging.getLogger(__name__)


def train_flops_per_image(cfg, num_classes: int) -> float:
    """Model FLOPs of one forward + backward, per image (counted, not assumed)."""
    model = build.build_model(cfg, num_classes, torch.device("cpu"))
    size = cfg.data.image_size
    x = torch.randint(0, 255, (2, 3, size, size), dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def _clock(device) -> float:
    """perf_counter after the device has finished all queued work (so the reading means it)."""
    measure.sync(device)
    return time.perf_counter()


def _seconds(fn, calls: int, device) -> float:
    """Wall seconds of `calls` calls of fn, device work included."""
    t0 = _clock(device)
    for _ in range(calls):
        fn()
    return _clock(device) - t0


def _epochs(batches, first: int):
    """Batches of epochs first, first + 1, ... without end (each epoch reshuffles and re-augments)."""
    return (b for e in itertools.count(first) for b in batches.epoch(e))


def _warm_steps(step, warmup: int) -> int:
    # With a CUDA graph, at least its eager warm-up steps plus the capture stay out of every
    # window. With train.cudnn_benchmark those eager steps also run cuDNN's algorithm search for
    # the one batch shape there is (the loaders drop the last partial batch), so no capture
    # records a search and no window pays for one.
    return max(warmup, step.warmup_steps + 1) if step.use_graph else warmup


def _trainer(cfg, variant: str, dataset: dict, strategy):
    prec = precision.REGISTRY[variant.split("-", 1)[1]]
    torch.manual_seed(0)
    trainer = build.setup(cfg, prec, strategy, len(dataset["classes"]), 10**6)
    return build.make_step(trainer, cfg, strategy), trainer.facts


class Measure:
    """One measure's windows: seconds per step of each, and the peak memory seen while timing."""

    def __init__(self, name: str, variant: str, facts: dict, warmup_seconds: float):
        self.name, self.variant, self.facts, self.warm = name, variant, facts, warmup_seconds
        self.sec_per_step: list[float] = []
        self.peak_mb = 0.0

    def window(self, fn, calls: int, device) -> None:
        """Time one window of `calls` calls of fn, each one training step."""
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.sec_per_step.append(_seconds(fn, calls, device) / calls)
        self.peak_mb = max(self.peak_mb, measure.peak_memory_mb(device))

    def row(self, batch: int, flops: float) -> dict:
        ips = [batch / s for s in self.sec_per_step]
        med = statistics.median(ips)
        return {
            "measure": self.name,
            "variant": self.variant,
            "batch": batch,
            "images_per_second": med,
            "ms_per_step": batch / med * 1e3,
            "images_per_second_min": min(ips),
            "images_per_second_max": max(ips),
            "windows": ips,
            "warmup_seconds": self.warm,
            "tflops": med * flops / 1e12,
            "peak_memory_mb": self.peak_mb,
            "amp_dtype": self.facts["amp_dtype"],
            "cuda_graph": self.facts["cuda_graph_used"],
            "noisy": selfcheck.of_series(ips),  # '' when the windows agree within 5%
        }


def kernel_profile(fn, steps: int, device) -> dict:
    """Time per step by kernel (CUDA, via CUPTI) or by operator (CPU), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    measure.sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        measure.sync(device)
    kernels = []
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            kernels.append({"kernel": e.key, "us_per_step": us / steps, "calls_per_step": e.count / steps})
    kernels.sort(key=lambda k: -k["us_per_step"])
    return {
        "steps": steps,
        "busy_ms_per_step": sum(k["us_per_step"] for k in kernels) / 1e3,
        "kernels": kernels,
    }


def measure_variant(cfg, variant, dataset, steps, warmup, windows, profile_steps):
    """Pipeline and ceiling of one variant, their windows interleaved so a slow spell hits both."""
    strategy = parallel.make(variant.split("-", 1)[0])
    device = strategy.setup()
    precision.disable_tf32()
    batch = cfg.train.batch_size
    pipe_step, facts = _trainer(cfg, variant, dataset, strategy)
    ceil_step, ceil_facts = _trainer(cfg, variant, dataset, strategy)
    batches = loader.make("device", dataset, batch, strategy, 0, 0)
    # Warm-up, outside the windows: the real loop on the first epoch(s), then the bare step on
    # one fixed batch. Both trainers are ready (graphs captured) before the first window.
    warm = _warm_steps(pipe_step, warmup)
    it = _epochs(batches, 0)
    pipe = Measure("pipeline", variant, facts, _seconds(lambda: pipe_step(*next(it)), warm, device))
    it.close()  # frees the rest of its epoch's augmented images
    first_epoch = -(-warm // len(batches))  # windows start on a fresh epoch
    # A batch of an epoch no window trains on; cloned so the rest of that epoch can be freed.
    x, y = (t.clone() for t in next(batches.epoch(first_epoch + windows)))

    def fixed():
        ceil_step(x, y)

    ceil_warm = _seconds(fixed, _warm_steps(ceil_step, warmup), device)
    ceil = Measure("ceiling", variant, ceil_facts, ceil_warm)
    for w in range(windows):
        epoch = batches.epoch(first_epoch + w)  # a full epoch, its augmentation included
        pipe.window(lambda e=epoch: pipe_step(*next(e)), len(batches), device)
        ceil.window(fixed, steps, device)
    prof = kernel_profile(fixed, profile_steps, device) if profile_steps else None
    return pipe, ceil, prof, strategy


def measure_dataloader(cfg, variant, dataset, strategy, steps, warmup, windows, workers) -> Measure:
    """The tutorial's DataLoader feeding the step; each window runs within one epoch."""
    device, batch = strategy.device, cfg.train.batch_size
    step, facts = _trainer(cfg, variant, dataset, strategy)
    tl = loader.TorchLoader(dataset["train_images"], dataset["train_labels"], batch, 0, 1, device, 0, workers)
    warm = _warm_steps(step, warmup)
    it = _epochs(tl, 0)
    m = Measure(
        f"dataloader ({workers} workers)", variant, facts, _seconds(lambda: step(*next(it)), warm, device)
    )
    it.close()  # its workers stop here, outside any window
    for w in range(windows):
        # Each epoch starts new worker processes: start them and wait for the first batch before
        # the clock starts, and stay within the epoch, so no window pays a start-up.
        epoch = tl.epoch(-(-warm // len(tl)) + w)
        batches = itertools.chain([next(epoch)], epoch)
        m.window(lambda b=batches: step(*next(b)), min(steps, len(tl)), device)
        epoch.close()
    return m


def run(
    cfg,
    variants: list[str],
    dataset: dict,
    steps: int,
    warmup: int,
    workers: int,
    profile_steps: int = 0,
    windows: int = 5,
) -> dict:
    if windows < 1 or steps < 1:
        raise ValueError(f"--windows and --steps must be at least 1 (got {windows} and {steps})")
    batch = cfg.train.batch_size
    flops = train_flops_per_image(cfg, len(dataset["classes"]))
    rows, profiles = [], {}
    for variant in variants:
        pipe, ceil, prof, strategy = measure_variant(
            cfg, variant, dataset, steps, warmup, windows, profile_steps
        )
        rows += [pipe.row(batch, flops), ceil.row(batch, flops)]
        if prof:
            profiles[variant] = {**prof, "ms_per_step": rows[-1]["ms_per_step"]}
        log.info(
            "%s: pipeline %.0f img/s, ceiling %.0f img/s (medians of %d windows)",
            variant,
            rows[-2]["images_per_second"],
            rows[-1]["images_per_second"],
            windows,
        )
    dl = measure_dataloader(cfg, variants[-1], dataset, strategy, steps, warmup, windows, workers)
    rows.append(dl.row(batch, flops))
    # Every ratio is one of medians from this run.
    ceilings = {r["variant"]: r["images_per_second"] for r in rows if r["measure"] == "ceiling"}
    for r in rows:
        r["fraction_of_ceiling"] = r["images_per_second"] / ceilings[r["variant"]]
    steps_per_epoch = len(dataset["train_labels"]) // batch
    return {
        "hardware": strategy.facts()["device_name"],
        "torch": torch.__version__,
        "tf32": False,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "windows": windows,
        "pipeline_steps": steps_per_epoch,
        "dataloader_steps": min(steps, steps_per_epoch),
        "cudnn_benchmark": cfg.train.cudnn_benchmark,
        "gflop_per_image": flops / 1e9,
        "rows": rows,
        "profiles": profiles,
    }
