"""Runs in the store's trash (deleted in the UI, `mlflow runs delete`) that a stage would go on with.

A run deleted while its stage was stopped cannot take a record ("must be in the 'active' state"):
the resume failed with the store blamed, on every re-run (hostile pass H). A stage that would
continue such a run says so in one line: restore it, or start the variant afresh.
"""

from __future__ import annotations

from ampbench.tracking.store import TrackingError, where_the_runs_are


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
    """Raise TrackingError where ``run_id`` (``whose``: "seed 0's", "the variant's") is deleted, or
    not in this store at all (hostile pass T: a checkpoint of a stage stopped under another
    MLFLOW_TRACKING_URI gave "failed (... Run with id=... not found); check the store");
    ``again``: the stage's own command with --fresh (else one built from the variant)."""
    if tracker.status(run_id) is not None:
        return
    parallel_name, _, precision_name = variant.partition("-")
    fresh = f"`{again or f'ampbench train --parallel {parallel_name} --precision {precision_name} --fresh'}`"
    afresh = f"train {variant} afresh ({fresh}; its kept work is discarded)"
    if deleted(tracker, run_id):
        raise TrackingError(
            f"{variant}: {whose} MLflow run {run_id} is deleted in store {tracker.uri} (in its trash), "
            f"so this stage cannot go on with it: restore it ({restore_command(tracker, run_id)}) and "
            f"re-run, or {afresh}"
        )
    if absent(tracker, run_id):  # not a store that does not answer: its outage is said where it is met
        raise TrackingError(
            f"{variant}: {whose} MLflow run {run_id}, which its kept work continues, is not in store "
            f"{tracker.uri}: {where_the_runs_are()}, and re-run; or {afresh}"
        )


# what a store answers for a run id it has no run of (a server: RESOURCE_DOES_NOT_EXIST; sqlite: either)
NO_SUCH_RUN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def absent(tracker, run_id: str) -> bool:
    """Whether the store answers that it has no run ``run_id`` (not: it does not answer)."""
    from mlflow.exceptions import MlflowException

    try:
        tracker.client.get_run(run_id)
    except MlflowException as err:
        return err.error_code in NO_SUCH_RUN
    except Exception:  # noqa: BLE001 - a store that does not answer: not this question's
        return False
    return False


def in_trash(tracker, run_ids, what: str, otherwise: str) -> str:
    """One line where one of ``run_ids`` (None skipped) is in the store's trash, else "" (hostile
    pass T: evaluate with a variant run deleted said "MLflow store ... failed (... must be in the
    'active' state ...); check the store", and compare then sent the user back to evaluate)."""
    gone = next((run_id for run_id in run_ids if run_id and deleted(tracker, run_id)), None)
    if gone is None:
        return ""
    return (
        f"{what} MLflow run {gone}, deleted in store {tracker.uri} (in its trash): restore it "
        f"({restore_command(tracker, gone)}) and re-run, or {otherwise}"
    )
