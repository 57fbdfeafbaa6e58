"""`mlflow run`'s own run, which MLflow names in MLFLOW_RUN_ID for its entry point's command.

A value left in a shell (exported to debug, or copied from another run) names another run or none:
the stages renamed that run and tagged it as a variant's, or started variant runs left RUNNING for
good (hostile pass P). So MLFLOW_RUN_ID is taken as `mlflow run`'s only where it is: a live,
RUNNING run of this store that MLflow Projects tagged with its entry point.
"""

from __future__ import annotations

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
