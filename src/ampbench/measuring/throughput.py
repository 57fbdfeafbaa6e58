"""Training throughput of chosen variants, three ways: the measures of `ampbench bench`.

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

import torch

from ampbench.config import replace
from ampbench.measuring import pace
from ampbench.measuring.kit import epochs, seconds, train_flops_per_image, trainer, warm_steps
from ampbench.report import selfcheck
from ampbench.training import loader, measure, parallel, precision
from ampbench.training.study_cost import fmt_duration
from ampbench.variants import split_name

log = logging.getLogger(__name__)


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
        self.sec_per_step.append(seconds(fn, calls, device) / calls)
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
    pipe_step, facts = trainer(cfg, variant, dataset, strategy)
    pace.between("%s: building its second trainer", variant)
    ceil_step, ceil_facts = trainer(cfg, variant, dataset, strategy)
    batches = loader.make("device", dataset, batch, strategy, 0, 0)
    pace.between("%s: warming up", variant)
    # Warm-up, outside the windows: the real loop on the first epoch(s), then the bare step on
    # one fixed batch. Both trainers are ready (graphs captured) before the first window.
    warm = warm_steps(pipe_step, warmup)
    it = epochs(batches, 0)
    pipe = Measure("pipeline", variant, facts, seconds(lambda: pipe_step(*next(it)), warm, device))
    it.close()  # frees the rest of its epoch's augmented images
    pace.between("%s: warming up the bare step", variant)
    first_epoch = -(-warm // len(batches))  # windows start on a fresh epoch
    # A batch of an epoch no window trains on; cloned so the rest of that epoch can be freed.
    x, y = (t.clone() for t in next(batches.epoch(first_epoch + windows)))

    def fixed():
        ceil_step(x, y)

    ceil_warm = seconds(fixed, warm_steps(ceil_step, warmup), device)
    ceil = Measure("ceiling", variant, ceil_facts, ceil_warm)
    per_step = ceil_warm / max(1, warm_steps(ceil_step, warmup))  # warm-up's: an upper bound, roughly
    about = fmt_duration(max(1.0, windows * (len(batches) + steps) * per_step))
    log.info(
        "%s: warmed up; timing %d windows of one epoch (%d steps) and of %d steps: about %s",
        variant, windows, len(batches), steps, about,
    )  # fmt: skip
    for w in range(windows):
        epoch = batches.epoch(first_epoch + w)  # a full epoch, its augmentation included
        pipe.window(lambda e=epoch: pipe_step(*next(e)), len(batches), device)
        pace.between("%s: window %d of %d, pipeline timed", variant, w + 1, windows)
        ceil.window(fixed, steps, device)
        pace.between("%s: window %d of %d timed", variant, w + 1, windows)
    prof = kernel_profile(fixed, profile_steps, device) if profile_steps else None
    return pipe, ceil, prof, strategy


def measure_dataloader(cfg, variant, dataset, strategy, steps, warmup, windows, workers) -> Measure:
    """The tutorial's DataLoader feeding the step; each window runs within one epoch."""
    device, batch = strategy.device, cfg.train.batch_size
    log.info(
        "the DataLoader reference (%d workers, %s): warm-up, then %d windows of %d steps",
        workers,
        variant,
        windows,
        steps,
    )
    step, facts = trainer(cfg, variant, dataset, strategy)
    tl = loader.TorchLoader(dataset["train_images"], dataset["train_labels"], batch, 0, 1, device, 0, workers)
    warm = warm_steps(step, warmup)
    it = epochs(tl, 0)
    m = Measure(
        f"dataloader ({workers} workers)", variant, facts, seconds(lambda: step(*next(it)), warm, device)
    )
    it.close()  # its workers stop here, outside any window
    for w in range(windows):
        # Each epoch starts new worker processes: start them and wait for the first batch before
        # the clock starts, and stay within the epoch, so no window pays a start-up.
        epoch = tl.epoch(-(-warm // len(tl)) + w)
        batches = itertools.chain([next(epoch)], epoch)
        m.window(lambda b=batches: step(*next(b)), min(steps, len(tl)), device)
        epoch.close()
        pace.between("the DataLoader reference: window %d of %d timed", w + 1, windows)
    return m


def check_benchmarkable(variants: list[str]) -> None:
    """Only variants that train in this process can be benchmarked (not ddp: one process per rank)."""
    in_process = [name for name, s in parallel.STRATEGIES.items() if s.in_process]
    bad = [
        v
        for v in variants
        if split_name(v)[0] not in in_process or split_name(v)[1] not in precision.REGISTRY
    ]
    if bad:
        raise ValueError(
            f"--variants: {', '.join(bad)} not benchmarkable (in-process variants only: "
            f"{', '.join(p + '-*' for p in in_process)})"
        )


def run_modes(cfg, variants: list[str], modes: list[str], dataset: dict, **options) -> dict:
    """`run` once per train.compile mode, each mode measured whole, one after another; the rows of
    all in one result, each row naming its mode."""
    res: dict = {}
    for mode in modes:
        one = run(replace(cfg, train={"compile": mode}), variants, dataset, **options)
        rows = [{**r, "compile": mode} for r in one["rows"]]
        res = {**one, "rows": res.get("rows", []) + rows, "compile": res.get("compile", []) + [mode]}
    res["train_images"] = len(dataset["train_labels"])
    return res


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
