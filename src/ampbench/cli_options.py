"""The options of the commands that have many (`ampbench variant`, `bench`, `findings`,
`explain`); cli.py builds the parser and names every command. No torch here."""

from __future__ import annotations

import argparse


def add_variant(v: argparse.ArgumentParser) -> None:
    """`ampbench variant` (the MLproject entry point): an empty value keeps params.yaml's."""
    for flag, key, example in (
        ("--epochs", "train.epochs", ""),
        ("--batch-size", "train.batch_size (global)", ""),
        ("--seeds", "train.seeds", ", e.g. 0,1"),
        ("--data-url", "data.url", ", e.g. a local archive"),
        ("--per-class", "data.train_per_class", ": a balanced subset for a quick run, e.g. 100"),
        ("--fc-dim", "model.fc_dim", ", e.g. 256 for a quick run"),
        ("--model", "model.name", ", e.g. torchvision:resnet18 or mypkg.nets:make_model"),
    ):
        v.add_argument(flag, default="", help=f"override {key}{example} (empty: params.yaml)")


def add_bench(b: argparse.ArgumentParser) -> None:
    b.add_argument("--variants", default="single-fp32,single-autocast,single-autocast_gradscaler")
    b.add_argument("--batch-size", type=int, default=0, help="default: train.batch_size")
    b.add_argument("--compile", default="", help="train.compile modes side by side, e.g. none,default")
    b.add_argument(
        "--steps",
        type=at_least_one,
        default=50,
        help="timed steps per ceiling and dataloader window (pipeline: one epoch)",
    )
    b.add_argument(
        "--windows",
        type=at_least_one,
        default=5,
        help="timed windows per measure, reported as median and min-max",
    )
    b.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps")
    b.add_argument("--workers", type=int, default=8, help="DataLoader workers for the reference")
    b.add_argument("--max-images", type=int, default=0, help="use the first N train images; 0: all")
    b.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also profile STEPS ceiling steps per variant with torch.profiler and list "
        "the time per GPU kernel (CPU: per operator); 0: off",
    )
    b.add_argument("--out", default="reports/bench", help="output prefix for .md and .json")


def add_findings(f: argparse.ArgumentParser) -> None:
    f.add_argument("--study", default="reports", help="the project's reports folder (default: %(default)s)")
    f.add_argument(
        "--tutorial",
        default="tutorial/reports",
        help="the tutorial-conditions reports folder (make tutorial; default: %(default)s)",
    )
    f.add_argument("--bench", default="", help="ampbench bench's JSON, e.g. reports/bench.json (optional)")
    f.add_argument(
        "--explain", default="", help="ampbench explain's JSON, e.g. reports/explain.json (optional): the why"
    )
    f.add_argument(
        "--out",
        default="docs/FINDINGS.md",
        help="the English edition; the Chinese one goes beside it (FINDINGS.zh.md); default: %(default)s",
    )
    f.add_argument(
        "--readme",
        default="README.md",
        help="README whose findings block is refreshed "
        "(between <!-- findings:start/end --> markers, if any); empty: none",
    )


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_explain(e: argparse.ArgumentParser) -> None:
    e.add_argument("--steps", type=at_least_one, default=0, help="steps per window (default: 40 GPU, 3 CPU)")
    e.add_argument("--windows", type=at_least_one, default=0, help="timed windows (default: 5 GPU, 2 CPU)")
    e.add_argument(
        "--profile-steps", type=at_least_one, default=0, help="profiled steps (default: 10 GPU, 2 CPU)"
    )
    e.add_argument(
        "--max-images", type=int, default=-1, help="use the first N train images (default: all GPU, 320 CPU)"
    )
    e.add_argument("--no-crossover", action="store_true", help="skip the batch crossover")
    e.add_argument("--rungs", default="", help=argparse.SUPPRESS)  # a part, measured in its own process
    e.add_argument("--out", default="reports/explain", help="output prefix for .json, .md, .png")
