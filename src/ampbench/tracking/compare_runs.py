"""The MLflow side of the compare stage: each variant's run gets its row's numbers (speed-up,
accuracy delta, p-value: its row in the UI); a ``compare`` run holds the table and chart only, so
it adds no charts beside the training runs'; the answer is published (tracking/view.py)."""

from __future__ import annotations

from pathlib import Path

from ampbench.tracking.tracker import KIND_TAG, Tracker

ROW_METRICS = ("speedup", "accuracy_delta", "p_value")


def log_comparison(tracker: Tracker, rows: list[dict], variants: list[str], files: list[Path], notice: str):
    """The comparison's numbers on each variant's run, then the ``compare`` run with `files`."""
    for r in rows:
        numbers = {k: r[k] for k in ROW_METRICS if isinstance(r[k], float) and r[k] == r[k]}  # not NaN
        for run_id in r["variant_run_ids"]:
            tracker.log_changed(run_id, numbers)
    run_id = tracker.start("compare", {KIND_TAG: "compare"}, {"variants": ",".join(variants)})
    try:
        for path in files:
            tracker.log_artifact(run_id, path)
        tracker.publish_answer(rows, run_id, notice)
    except BaseException as err:  # never RUNNING for good (hostile pass G: a SIGTERM in here)
        tracker.end_quietly(run_id, "FAILED" if isinstance(err, Exception) else "KILLED")
        raise
    tracker.end(run_id, "FINISHED")
