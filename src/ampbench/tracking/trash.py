"""Runs in the store's trash (deleted in the UI, `mlflow runs delete`) that a stage would go on with.

A run deleted while its stage was stopped cannot take a record ("must be in the 'active' state"):
the resume failed with the store blamed, on every re-run (hostile pass H). A stage that would
continue such a run says so in one line: restore it, or start the variant afresh.
"""

from __future__ import annotations

from ampbench.tracking.store import TrackingError


def deleted(tracker, run_id: str) -> bool:
    """Whether the store holds the run in its trash."""
    from mlflow.exceptions import MlflowException

    try:
        return tracker.client.get_run(run_id).info.lifecycle_stage == "deleted"
    except MlflowException:
        return False


def restore_command(tracker, run_id: str) -> str:
    return f"`MLFLOW_TRACKING_URI={tracker.uri} mlflow runs restore --run-id {run_id}`"


def refuse_deleted(tracker, run_id: str, whose: str, variant: str, again: str | None = None) -> None:
    """Raise TrackingError where ``run_id`` (``whose``: "seed 0's", "the variant's") is deleted;
    ``again``: the stage's own command with --fresh (else one built from the variant)."""
    if tracker.status(run_id) is None and deleted(tracker, run_id):
        parallel_name, _, precision_name = variant.partition("-")
        fresh = (
            f"`{again or f'ampbench train --parallel {parallel_name} --precision {precision_name} --fresh'}`"
        )
        raise TrackingError(
            f"{variant}: {whose} MLflow run {run_id} is deleted in store {tracker.uri} (in its trash), "
            f"so this stage cannot go on with it: restore it ({restore_command(tracker, run_id)}) and "
            f"re-run, or train {variant} afresh ({fresh}; its kept work is discarded)"
        )
