"""`ampbench bench`: training throughput of chosen variants, outside the DVC study, and its report.

    ampbench bench --variants single-fp32,single-autocast,single-autocast_gradscaler --batch-size 512

Measures each variant's pipeline (the real training loop), its ceiling (the bare step on one
resident batch) and the tutorial's DataLoader feeding the same step (measuring/throughput.py says
how), each as the median of ``--windows`` timed windows. Writes ``<out>.md`` and ``<out>.json``
first, then records them in MLflow (experiment ``<tracking.experiment>-bench``); with
``--profile N`` the report also lists the time per kernel (CPU: per operator) of the ceiling step.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ampbench import outputs
from ampbench.cli_options import at_least_one, at_least_zero
from ampbench.config import COMPILE_MODES, Config, ConfigError, replace

log = logging.getLogger(__name__)
HELP = "measure training throughput (MLflow: <experiment>-bench; not in DVC)"
CPU_BATCH = 64  # the GPU's 512 / 8, as explain's CPU rungs


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument(
        "--variants",
        default="single-fp32,single-autocast,single-autocast_gradscaler",
        help="comma-separated <parallel>-<precision> names to measure (default: %(default)s)",
    )
    b.add_argument("--batch-size", type=at_least_zero, default=0, help="0 (default): train.batch_size")
    b.add_argument("--compile", default="", help="train.compile modes side by side, e.g. none,default")
    b.add_argument(
        "--steps",
        type=at_least_one,
        default=None,
        help="timed steps per ceiling and dataloader window (pipeline: one epoch); default: 50 GPU, 4 CPU",
    )
    b.add_argument(
        "--windows",
        type=at_least_one,
        default=None,
        help="timed windows per measure, reported as median and min-max; default: 5 GPU, 3 CPU",
    )
    b.add_argument(
        "--warmup", type=at_least_zero, default=None, help="untimed warm-up steps; default: 10 GPU, 2 CPU"
    )
    b.add_argument(
        "--workers",
        type=at_least_zero,
        default=None,
        help="DataLoader workers for the reference; default: 8 (the tutorial's), at most the CPUs here",
    )
    b.add_argument(
        "--max-images",
        type=at_least_zero,
        default=None,
        help="use the first N train images; 0: all; default: all GPU, 4 batches CPU (one short epoch)",
    )
    b.add_argument(
        "--profile",
        type=at_least_zero,
        default=0,
        metavar="STEPS",
        help="also profile STEPS ceiling steps per variant with torch.profiler and list "
        "the time per GPU kernel (CPU: per operator); 0: off",
    )
    b.add_argument("--out", default="reports/bench", help="output prefix for .md and .json")


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.measuring import pace
    from ampbench.stages.starting import StartingLine

    with StartingLine("bench", doing=STARTING), pace.watching():
        return _bench(cfg, args)


def _bench(cfg: Config, args) -> int:
    from ampbench.config.rules import CIFAR_CLASSES
    from ampbench.measuring import kit, throughput
    from ampbench.report import bench_markdown
    from ampbench.tracking import measurement_runs
    from ampbench.training import loader, memory_check

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    modes = compile_modes(args.compile, cfg)
    throughput.check_benchmarkable(variants)
    cpu_defaults(args, cfg)
    if args.batch_size:
        cfg = replace(cfg, train={"batch_size": args.batch_size})
    if 0 < args.max_images < cfg.train.batch_size:  # named as given (pass H: blamed on train.batch_size)
        raise ConfigError(
            f"--max-images {args.max_images} is fewer images than one batch of {cfg.train.batch_size} "
            "(--batch-size, else train.batch_size, at most 64 on a CPU); give --max-images at least "
            f"{cfg.train.batch_size}, or 0 for every train image"
        )
    memory_check.check_address_space(cfg, margin=memory_check.BENCH_ADDRESS_MARGIN)
    strategy = kit.single_device()
    memory_check.check_fits(cfg, strategy.device, CIFAR_CLASSES)
    outputs.report_prefix(args.out, "bench report")  # before the measurement
    dataset = kit.dataset(args.max_images)
    loader.check_batch(cfg.train.batch_size, dataset)  # before MLflow's import, seconds on a loaded CPU
    measurement_runs.check_store(cfg, "bench", Path(args.out))
    workers = min(8, len(os.sched_getaffinity(0))) if args.workers is None else args.workers
    log.info(
        "bench on %s: %s at batch %d%s, each warmed up, then %d timed windows; then the DataLoader "
        "reference; a line as each is measured",
        strategy.facts()["device_name"],
        ", ".join(variants),
        cfg.train.batch_size,
        f", compile {', '.join(modes)}" if modes != ["none"] else "",
        args.windows,
    )
    res = throughput.run_modes(
        cfg,
        variants,
        modes,
        dataset,
        steps=args.steps,
        warmup=args.warmup,
        workers=workers,
        profile_steps=args.profile,
        windows=args.windows,
    )
    out = Path(args.out)
    params, metrics = measurement_runs.bench_figures(res)
    write, suffixes = bench_markdown.write, (".json", ".md")
    res["run_id"] = measurement_runs.record(cfg, "bench", res, out, params, metrics, write, suffixes)
    print(bench_markdown.to_markdown(res))
    print(measurement_runs.where(cfg, "bench", res["run_id"], out, ".json"))
    return 0 if res["run_id"] else 1  # measured, but not recorded: a failure, said in one line above


STARTING = "loading torch and the data set, opening the MLflow store"


def cpu_defaults(args, cfg: Config) -> None:
    """The options not given: the GPU's, or on a CPU ones that keep each timed window to seconds
    (hostile re-run: the GPU's 50 steps and full epochs at batch 512 left a CPU silent for minutes
    a window; no line is printed inside a window). CPU figures say nothing about any GPU."""
    import torch

    cpu = not torch.cuda.is_available()
    args.steps = args.steps or (4 if cpu else 50)
    args.windows = args.windows or (3 if cpu else 5)
    args.warmup = (2 if cpu else 10) if args.warmup is None else args.warmup
    if cpu and not args.batch_size:
        args.batch_size = min(cfg.train.batch_size, CPU_BATCH)
    if args.max_images is None:
        args.max_images = 4 * (args.batch_size or cfg.train.batch_size) if cpu else 0


def compile_modes(text: str, cfg: Config) -> list[str]:
    """--compile's modes (empty: train.compile's), each one of COMPILE_MODES."""
    modes = [m.strip() for m in text.split(",") if m.strip()] or [cfg.train.compile]
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise ValueError(f"--compile: {', '.join(bad)} not one of {', '.join(COMPILE_MODES)}")
    return modes
