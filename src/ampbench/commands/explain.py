"""`ampbench explain`: why AMP pays or not on this machine, rung by rung (measuring/rungs.py).

    ampbench explain                 # reports/explain.{json,md,png}; MLflow <experiment>-explain

On a GPU: every rung from the tutorial's conditions (R0) to the defaults (R4) and compile (R5),
each precision, then the batch crossover. On a CPU: R0–R2 at an eighth of the batch, in a minute,
and the report says plainly that CPU figures say nothing about any GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from ampbench import outputs
from ampbench.cli_options import at_least_one, at_least_zero
from ampbench.config import Config

log = logging.getLogger(__name__)
HELP = "AMP's speed-up rung by rung and over batch sizes"
DESCRIPTION = (  # `ampbench explain --help`
    "Why AMP pays or not on this machine: each precision's speed-up over fp32, rung by rung from the "
    "tutorial's conditions (DataLoader, batch 128, eager) to this project's defaults (data on the GPU, "
    "batch 512, cuDNN autotuning, a CUDA graph) and torch.compile, then over batch sizes. Writes "
    "reports/explain.md, .json and .png and an MLflow run in <tracking.experiment>-explain. On a CPU: "
    "the first three rungs at an eighth of the batch, in minutes; CPU figures say nothing about any "
    "GPU. Needs data/prepared (`ampbench download`)."
)


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("--steps", type=at_least_one, default=0, help="steps per window (default: 40 GPU, 3 CPU)")
    e.add_argument("--windows", type=at_least_one, default=0, help="timed windows (default: 5 GPU, 2 CPU)")
    e.add_argument(
        "--profile-steps", type=at_least_one, default=0, help="profiled steps (default: 10 GPU, 2 CPU)"
    )
    e.add_argument(
        "--max-images",
        type=at_least_zero,
        default=None,
        help="use the first N train images; 0: all (default: all GPU, 320 CPU)",
    )
    e.add_argument("--no-crossover", action="store_true", help="skip the batch crossover")
    e.add_argument("--rungs", default="", help=argparse.SUPPRESS)  # a part, measured in its own process
    e.add_argument("--out", default="reports/explain", help="output prefix for .json, .md, .png")


def options(args, cuda: bool) -> dict:
    """The measuring options: those given, else the GPU's or the CPU's defaults."""
    pick = {"steps": (40, 3), "windows": (5, 2), "profile_steps": (10, 2)}
    opts = {k: getattr(args, k) or (gpu if cuda else cpu) for k, (gpu, cpu) in pick.items()}
    opts["warmup_epochs"] = 1
    opts["max_images"] = args.max_images if args.max_images is not None else (0 if cuda else 320)
    return opts


STARTING = "loading torch and the data set, opening the MLflow store"


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.measuring import pace
    from ampbench.stages.starting import StartingLine

    with StartingLine("explain", doing=STARTING), pace.watching():
        return _explain(cfg, args)


def _explain(cfg: Config, args) -> int:
    # torch.profiler's Kineto prints "profiler_start/stop" per profile and, on a CPU, "ERROR ...
    # gpuGetDeviceCount failed": noise, not findings (level 6 silences both; the user's value wins)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from ampbench.config.rules import CIFAR_CLASSES
    from ampbench.measuring import crossover, kit, rungs
    from ampbench.report import explain_markdown as report
    from ampbench.tracking import measurement_runs
    from ampbench.training import memory_check

    strategy = kit.single_device()
    cuda = strategy.device.type == "cuda"
    memory_check.check_fits(cfg, strategy.device, CIFAR_CLASSES)
    outputs.report_prefix(args.out, "explain report")  # before the measurement
    opts = options(args, cuda)
    dataset = kit.dataset(opts["max_images"])
    out, only = Path(args.out), [r for r in args.rungs.split(",") if r]
    batches = plan(cfg, args, strategy, dataset, only)  # checked and said before any measuring
    cli_args = ["--params", args.params, *[x for o in args.overrides for x in ("--set", o)]]
    measured, energy_counter = rungs.measure_ladder(cfg, dataset, strategy, opts, only, cli_args, out)
    if only:  # a part of another explain (rungs.measured_apart): these rungs only, into its JSON
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps({"rungs": measured}) + "\n", encoding="utf-8")
        return 0
    res = {
        "hardware": strategy.facts()["device_name"],
        "device_type": strategy.device.type,
        "note": "" if cuda else report.CPU_NOTE,
        "tf32": False,
        "options": opts,
        "energy_counter": energy_counter,
        "defaults_rung": rungs.DEFAULTS_RUNG,
        "rungs": measured,
    }
    if batches:
        res["crossover"] = crossover.measure(cfg, dataset, strategy, batches, opts)
    params, metrics = measurement_runs.explain_figures(res)
    suffixes = (".json", ".md", ".png")
    res["run_id"] = measurement_runs.record(cfg, "explain", res, out, params, metrics, report.write, suffixes)
    print(report.to_markdown(res))
    print(measurement_runs.where(cfg, "explain", res["run_id"], out, ".json, .png"))
    return 0 if res["run_id"] else 1


def plan(cfg: Config, args, strategy, dataset: dict, only: list[str]) -> list[int]:
    """The crossover's batches (those the data set holds); a rung's batch larger than the data set
    refused, then the MLflow store checked (its import takes seconds on a loaded CPU: a refusal of
    the data comes first); the plan said in one line, so a CPU's long first rung is not a silent wait."""
    from ampbench.measuring import rungs
    from ampbench.tracking import measurement_runs

    cuda = strategy.device.type == "cuda"
    ladder = [r for r in rungs.rung_configs(cfg, strategy.device) if not only or r[0] in only]
    batches = [32, 64, 128, 256, 512, 1024, 2048, 4096] if cuda else [8, 16, 32]
    batches = rungs.check_data(ladder, dataset, [] if only or args.no_crossover else batches)
    if not only:  # a part of another explain records nothing, says nothing of the whole
        measurement_runs.check_store(cfg, "explain", Path(args.out))
        opts = options(args, cuda)
        log.info(
            "explain on %s: rungs %s-%s x %s, each %d windows of %d steps after a warm-up epoch%s; "
            "a line as each is measured",
            strategy.facts()["device_name"],
            ladder[0][0],
            ladder[-1][0],
            ", ".join(rungs.precisions(strategy.device)),
            opts["windows"],
            opts["steps"],
            f", then the batch crossover over {', '.join(map(str, batches))}" if batches else "",
        )
    return batches
