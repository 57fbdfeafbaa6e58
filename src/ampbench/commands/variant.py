"""`ampbench variant`, the MLproject entry point: everything one variant needs, in one command.

    ampbench variant --parallel dp --precision autocast --epochs 2 --seeds 0,1

Prepares the data if it is missing or was made from other data settings, then trains and
evaluates the variant, each as the `ampbench` command it is (same options, same overrides), and
ends on its answer: the variant run gets the description, tags and `answer/*` metrics that
`compare` gives a study's variant runs (its speed-up against a single-fp32 trained with the same
settings, where reports/metrics/ has one), and the last lines are that answer, the link to its run
and the command that starts the UI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import sys

from ampbench.cli_options import QUICK_RUN, VARIANT_OPTIONS, add_variant_choice, yes_no
from ampbench.config import Config
from ampbench.paths import DATA_FILE, MODELS_DIR, REPORTS_DIR, dvc_recorded
from ampbench.stages.download import prepared_mismatch
from ampbench.stages.stop import came_late, launcher_command
from ampbench.variants import variant_name

log = logging.getLogger(__name__)


def add_arguments(v: argparse.ArgumentParser) -> None:
    """The variant, the quick run, and overrides of params.yaml (MLproject's parameters; an
    empty value keeps params.yaml's)."""
    add_variant_choice(v)
    for flag, key, example in VARIANT_OPTIONS:
        underscored = "--" + flag[2:].replace("-", "_")  # how `mlflow run` passes -P batch_size=...
        flags = (flag, underscored) if underscored != flag else (flag,)
        v.add_argument(*flags, default="", help=f"override {key}{example} (empty: params.yaml)")
    v.add_argument(
        "--quick",
        type=yes_no,
        default=False,
        metavar="yes|no",
        help="a quick run of a minute or two on a CPU (" + ", ".join(QUICK_RUN) + "); the options "
        "above and --set override its settings",
    )
    if os.environ.get("MLFLOW_RUN_ID"):
        v.error = _in_mlflow_run_words(v)  # type: ignore[method-assign]


def _in_mlflow_run_words(parser: argparse.ArgumentParser):
    """Under `mlflow run`, a wrong parameter is one line in its -P words, not `ampbench variant`'s
    usage (hostile passes P, R: nine lines of --options that the user never typed)."""
    names = ["parallel", "precision", "quick", *(f[2:].replace("-", "_") for f, _, _ in VARIANT_OPTIONS)]

    def error(message: str):
        if message.startswith("unrecognized arguments"):  # MLflow passes `-P name=value` on as `--name value`
            message = re.sub(r"--([\w-]+) (\S+)", r"-P \1=\2", message)
            message += f" (the parameters: {', '.join(names)})"
        said = re.sub(r"--([\w-]+)", lambda m: "-P " + m[1].replace("-", "_"), message)
        parser.exit(2, f"mlflow run: {said}\n")

    return error


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench import cli, timing

    # One variant, not the study: the train stage's estimate then leaves out the other variants
    # (an environment variable, so that DDP workers see it too).
    os.environ["AMPBENCH_SCOPE"] = "variant"
    _name_the_entry_run(variant_name(args.parallel, args.precision))
    if "AMPBENCH_RESUME_COMMAND" not in os.environ:
        # a stop says: run the same `mlflow run`, or this command (hostile pass G: the train
        # stage's own command, which would not evaluate)
        os.environ["AMPBENCH_RESUME_COMMAND"] = launcher_command() or shlex.join(["ampbench", *argv])
    base = ["--params", args.params, *sum((["--set", o] for o in cli.all_overrides(args)), [])]
    _say_what_is_replaced(variant_name(args.parallel, args.precision), cfg)
    if not DATA_FILE.exists() or prepared_mismatch(cfg):
        code = cli.main(["download", *base])
        if code:
            return code
        timing.command_starts()
    v = ["--parallel", args.parallel, "--precision", args.precision]
    code = cli.main(["train", *v, *base])
    evaluate = shlex.join(["ampbench", "evaluate", *v, *base])
    if not code and (late := came_late()):  # hostile pass O: evaluated, answered, then died of it
        log.warning("stopped before the evaluation; to evaluate the trained seeds: %s", evaluate)
        code = 128 + late
    if not code:
        timing.command_starts()  # evaluate's start-up is not the training before it
        # what is left is the evaluation: a stop names the command that does it (hostile pass H:
        # "To resume: ampbench variant ...", which trained every seed again)
        os.environ["AMPBENCH_RESUME_COMMAND"] = evaluate
        code = cli.main(["evaluate", *v, *base])
    if code > 128:  # stopped by a signal: 128 + its number
        _end_the_entry_run("KILLED")  # `mlflow run` itself may be gone (what stopped the stage)
    if not code:
        _publish_answer(cfg, variant_name(args.parallel, args.precision), args.quick)
    return code


def _say_what_is_replaced(variant: str, cfg: Config) -> None:
    """The study's DVC outputs this run replaces, and how they come back (hostile pass Z: a quick
    `mlflow run` after `dvc repro` replaced the study's models and data without a word)."""
    outputs = dvc_recorded()
    models = f"models/{variant}"
    replaced = [models] if models in outputs and (MODELS_DIR / variant).is_dir() else []
    if DATA_FILE.exists() and "data/prepared" in outputs and prepared_mismatch(cfg):
        replaced.append("data/prepared")
    if replaced:
        log.warning(
            "this run replaces the pipeline's %s (`dvc repro`'s, in DVC's cache): `dvc checkout --force %s` "
            "puts them back, and `dvc repro` the reports made from them",
            " and ".join(replaced),
            " ".join(replaced),
        )


def _answer_row(variant: str) -> dict:
    """The variant's comparison row from the evaluate stages' metrics files: against single-fp32
    where one was trained with the same settings, else without a speed-up."""
    from ampbench.report import compare, mixed

    records = {variant: json.loads((REPORTS_DIR / "metrics" / f"{variant}.json").read_text(encoding="utf-8"))}
    base = REPORTS_DIR / "metrics" / f"{compare.BASELINE}.json"
    if variant != compare.BASELINE and base.exists():
        both = {**records, compare.BASELINE: json.loads(base.read_text(encoding="utf-8"))}
        records = both if not mixed.differences(both) else records
    return next(r for r in compare.summarize(records) if r["variant"] == variant)


def _publish_answer(cfg: Config, variant: str, quick: bool) -> None:
    """The answer on the variant's run (and on `mlflow run`'s own, where that is another run),
    then in the last lines: the answer, the run's link, and how to start the UI."""
    from ampbench.tracking import store, view
    from ampbench.tracking.tracker import Tracker

    row, tracker = _answer_row(variant), Tracker.from_config(cfg)
    launcher = tracker.launcher_run_id
    for run_id in row["variant_run_ids"]:
        view.publish_row(tracker, run_id, row)
    if launcher and launcher not in row["variant_run_ids"]:  # its note points at the seeds' run
        pointer = tracker.client.get_run(launcher).data.tags.get(view.NOTE_TAG, "")
        view.publish_row(tracker, launcher, row, note=pointer)
    said = " (a quick run: it shows the path, its figures mean nothing)" if quick else ""
    print(f"{variant}: {view.summary_line(row)}{said}")
    link = view.run_link(store.ui_base(tracker.uri), tracker.experiment_id(), row["variant_run_ids"][0])
    print(f"Its run: {link}")
    if command := store.ui_command(tracker.uri):
        print(f"Start the UI first (it serves that address): {command}")


def _name_the_entry_run(variant: str) -> None:
    """Under `mlflow run`, name the entry point's run after its variant at once: the train stage
    names it too, but a run that fails before (no data, a bad store) would keep MLflow's random
    name. A store that cannot be reached is left to the stages, which say so in one line."""
    from ampbench.tracking import launcher, store

    def name_it(client, run_id: str) -> None:
        client.set_tag(run_id, "mlflow.runName", f"{variant} (mlflow run)")
        launcher.end_abandoned(client, run_id, store.tracking_uri())  # an earlier one's, stopped at once

    _on_the_entry_run(name_it)


def stopped_outside_its_stages() -> str | None:
    """A stop outside the stages it runs (its own start-up, before ``main``): `mlflow run`'s run
    ends KILLED, not RUNNING for good under MLflow's random name (hostile pass K: a SIGTERM to its
    group 0.3-1.5 s in); the command that resumes it, where one started this one."""
    try:
        _end_the_entry_run("KILLED")
    except Exception:  # noqa: BLE001 - the stop broke MLflow's import half-way: a fresh interpreter ends it
        _end_elsewhere("KILLED")
    return launcher_command()


def _end_elsewhere(status: str) -> None:
    """`mlflow run`'s run ended with ``status`` by a fresh interpreter, with its own MLflow."""
    import subprocess

    from ampbench.tracking import store

    end = "import sys, mlflow; mlflow.MlflowClient(sys.argv[1]).set_terminated(*sys.argv[2:])"
    with contextlib.suppress(Exception):
        run = [sys.executable, "-c", end, store.tracking_uri(), os.environ["MLFLOW_RUN_ID"], status]
        subprocess.run(run, capture_output=True, timeout=60, check=False)


def _end_the_entry_run(status: str) -> None:
    """Under `mlflow run`, end its run with ``status``: MLflow ends it when its command exits, but
    a killed `mlflow run` (what stops the stage) would leave it RUNNING for good."""
    from ampbench import interrupts

    with interrupts.held():  # hostile pass Y: a Ctrl-C pressed again cut this short, the run RUNNING
        _on_the_entry_run(lambda client, run_id: client.set_terminated(run_id, status))


def _on_the_entry_run(change) -> None:
    """``change(client, run_id)`` on `mlflow run`'s own run, if any; a store that cannot be
    reached is left to the stages, which say so in one line."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    from mlflow.tracking import MlflowClient

    from ampbench.tracking import launcher, store

    with contextlib.suppress(Exception), store.http_limits(5, retries=0):
        # the store as the stages read it: MLflow's own reading of a relative sqlite path is from
        # this folder, not `mlflow run`'s (hostile pass T: its run left unnamed, or RUNNING)
        client = MlflowClient(store.tracking_uri())
        if not launcher.problem(client, run_id):  # a left-over id names another run: the stage says so
            change(client, run_id)
