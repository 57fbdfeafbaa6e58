"""`mlflow run`'s own run, which MLflow names in MLFLOW_RUN_ID for its entry point's command.

A value left in a shell (exported to debug, or copied from another run) names another run or none:
the stages renamed that run and tagged it as a variant's, or started variant runs left RUNNING for
good (hostile pass P). So MLFLOW_RUN_ID is taken as `mlflow run`'s only where it is: a live,
RUNNING run of this store that MLflow Projects tagged with its entry point.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "MLFLOW_RUN_ID"
ENTRY_TAG = "mlflow.project.entryPoint"  # what `mlflow run` tags the run it starts with


def problem(client, run_id: str) -> str:
    """Why ``run_id`` is not an `mlflow run` in progress in ``client``'s store; "" where it is."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return "names no run of"
    if run.info.lifecycle_stage != "active":
        return "names a deleted run of"
    if ENTRY_TAG not in run.data.tags:
        return f"names run {run.info.run_name!r}, which no `mlflow run` started, in"
    if run.info.status != "RUNNING":
        return f"names an ended ({run.info.status}) `mlflow run` of"
    return ""


def refusal(run_id: str, why: str, uri: str) -> str:
    return (
        f"{ENV}={run_id} in the environment {why} store {uri}: `mlflow run` sets it for the run it "
        f"starts, and this one is left over (an export in this shell?); `unset {ENV}`, then run the "
        "command again"
    )


def end_abandoned(client, run_id: str, uri: str) -> None:
    """End KILLED the runs of ``run_id``'s experiment that an `mlflow run` started and nothing
    carries on: a stop to `mlflow run`'s group in the first instant of its command, before Python
    had started it, killed both with the run RUNNING for good (hostile pass O; nothing of this
    project had run yet). Only where a local store holds every such run (SQLite), no other `mlflow
    run` of this user runs here (one may be building its environment) and no process holds the run's
    id in its environment (its command, running)."""
    if not uri.startswith("sqlite:"):
        return
    holders = _live_run_ids()
    if holders is None:
        return
    experiment = client.get_run(run_id).info.experiment_id
    found = client.search_runs([experiment], "attributes.status = 'RUNNING'", max_results=100)
    for run in found:
        if run.info.run_id in holders or run.info.run_id == run_id or ENTRY_TAG not in run.data.tags:
            continue
        client.set_terminated(run.info.run_id, "KILLED")
        log.warning(
            "ended `mlflow run`'s run %s (%s) KILLED: it was stopped before its command started",
            run.info.run_id,
            run.info.run_name,
        )


def _live_run_ids() -> set[str] | None:
    """The MLFLOW_RUN_ID of every process of this user on this host; None where another `mlflow
    run` (not one that started this process) runs, as its run may be in no environment yet."""
    from ampbench.processes import is_ancestor

    held = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone
            continue
        if _mlflow_run(argv) and not is_ancestor(int(entry.name)):
            return None
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        key = ENV.encode() + b"="
        held.update(item[len(key) :].decode() for item in environ if item.startswith(key))
    return held


def _mlflow_run(argv: list[bytes]) -> bool:
    """Whether a command line is `mlflow run ...` (its script) or `python -m mlflow run ...`."""
    words = argv[:4]
    return any(w.endswith(b"mlflow") and b"run" in words[j + 1 : j + 2] for j, w in enumerate(words))
