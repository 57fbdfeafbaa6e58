"""`ampbench variant`, the MLproject entry point: everything one variant needs, in one command.

    ampbench variant --parallel dp --precision autocast --epochs 2 --seeds 0,1

Prepares the data if it is missing or was made from other data settings, then trains and
evaluates the variant, each as the `ampbench` command it is (same options, same overrides).
"""

from __future__ import annotations

import argparse
import contextlib
import os

from ampbench.cli_options import add_variant_choice
from ampbench.config import Config
from ampbench.paths import DATA_FILE
from ampbench.stages.download import prepared_mismatch
from ampbench.variants import variant_name


def add_arguments(v: argparse.ArgumentParser) -> None:
    """The variant, and overrides of params.yaml (MLproject's parameters; empty: params.yaml's)."""
    add_variant_choice(v)
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


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench import cli, timing

    # One variant, not the study: the train stage's estimate then leaves out the other variants
    # (an environment variable, so that DDP workers see it too).
    os.environ["AMPBENCH_SCOPE"] = "variant"
    _name_the_entry_run(variant_name(args.parallel, args.precision))
    base = ["--params", args.params, *sum((["--set", o] for o in cli.all_overrides(args)), [])]
    if not DATA_FILE.exists() or prepared_mismatch(cfg):
        code = cli.main(["download", *base])
        if code:
            return code
        timing.command_starts()
    v = ["--parallel", args.parallel, "--precision", args.precision]
    code = cli.main(["train", *v, *base])
    if not code:
        timing.command_starts()  # evaluate's start-up is not the training before it
        code = cli.main(["evaluate", *v, *base])
    if not code:
        from ampbench.tracking.tracker import Tracker

        print(f"Browse the runs: {Tracker.from_config(cfg).link()}")
    return code


def _name_the_entry_run(variant: str) -> None:
    """Under `mlflow run`, name the entry point's run after its variant at once: the train stage
    names it too, but a run that fails before (no data, a bad store) would keep MLflow's random
    name. A store that cannot be reached is left to the stages, which say so in one line."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    from mlflow.tracking import MlflowClient

    from ampbench.tracking import store

    with contextlib.suppress(Exception), store.http_limits(5, retries=0):
        MlflowClient().set_tag(run_id, "mlflow.runName", f"{variant} (mlflow run)")
