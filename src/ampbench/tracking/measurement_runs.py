"""The MLflow runs of the measuring commands (`ampbench bench`, `ampbench explain`): one run per
measurement in ``<tracking.experiment>-<kind>``, apart from the study's experiment, whose runs table
stays one row per variant.

The files are written before the store is touched (the results never depend on it), then rewritten
to name the run and logged as its artifacts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def check_store(cfg, kind: str, out: Path) -> None:
    """Before a measurement: one warning line at once where the store already fails (the
    measurement still runs and its files are written; ``record`` then says it again and the
    command exits 1), not only after minutes of measuring."""
    from ampbench.tracking import store
    from ampbench.tracking.tracker import Tracker

    t = cfg.tracking
    try:
        Tracker(f"{t.experiment}-{kind}", t.preflight_timeout_s, t.request_timeout_s).preflight()
    except Exception as err:  # noqa: BLE001 - any fault: said, and the measurement goes on
        log.warning(
            "%s will not be recorded in MLflow: %s. Measuring anyway: the results will be in %s.json and .md",
            kind,
            store.store_fault(err) or err,
            out,
        )


def record(
    cfg,
    kind: str,
    res: dict,
    out: Path,
    params: dict,
    metrics: dict,
    write: Callable[[dict, Path], None],
    suffixes: tuple[str, ...],
) -> str | None:
    """Writes the files (`write`: ``out`` + each of `suffixes`) first, then one run of `kind`:
    `params`, `metrics`, and the files, rewritten to name the run. Returns the run id, or None with
    one error line if any of it failed: the run, if started, is ended FAILED and the files are
    rewritten without its id, so they never name a run that does not hold them."""
    from ampbench.tracking.tracker import KIND_TAG, Tracker

    out.parent.mkdir(parents=True, exist_ok=True)
    write(res, out)  # first: the results never depend on the tracking store
    t, tracker, run_id = cfg.tracking, None, None
    try:
        tracker = Tracker(f"{t.experiment}-{kind}", t.preflight_timeout_s, t.request_timeout_s)
        tracker.preflight()
        run_id = tracker.start(kind, {KIND_TAG: kind}, params)
        tracker.log_metrics(run_id, metrics)
        write({**res, "run_id": run_id}, out)
        for suffix in suffixes:
            tracker.log_artifact(run_id, out.with_suffix(suffix))
        tracker.end(run_id, "FINISHED")
        return run_id
    except Exception as err:  # the store failed: the measurement must not be lost with it
        from ampbench.tracking import store

        log.error(
            "%s not recorded in MLflow: %s. The results are in %s.json and .md",
            kind,
            store.store_fault(err) or err,
            out,
        )
        if run_id and tracker is not None:
            tracker.end_quietly(run_id, "FAILED")
            write(res, out)
        return None


def bench_figures(res: dict) -> tuple[dict, dict]:
    """(params, metrics) of a bench: its settings, and every measure's medians."""
    keys = ("hardware", "torch", "tf32", "batch", "steps", "warmup", "windows", "cudnn_benchmark")
    params = {k: res[k] for k in (*keys, "train_images")}
    metrics = {}
    for r in res["rows"]:
        mode = r.get("compile", "none")
        key = f"bench/{r['measure'].split(' ')[0]}/{r['variant']}" + (
            "" if mode == "none" else f"/compile-{mode}"
        )
        metrics.update(
            {
                f"{key}/images_per_second": r["images_per_second"],
                f"{key}/fraction_of_ceiling": r["fraction_of_ceiling"],
                f"{key}/ms_per_step": r["ms_per_step"],
            }
        )
    return params, metrics


def explain_figures(res: dict) -> tuple[dict, dict]:
    """(params, metrics) of an explain: the machine, and every cell's images/s and speed-up."""
    params = {"hardware": res["hardware"], "device_type": res["device_type"]}
    metrics = {}
    for r in res["rungs"]:
        for c in r["cells"]:
            key = f"explain/{r['rung']}/{c['precision']}"
            metrics[f"{key}/images_per_second"] = c["images_per_second"]
            metrics[f"{key}/speedup_vs_fp32"] = c["speedup_vs_fp32"]
    return params, metrics


def where(cfg, kind: str, run_id: str | None, out: Path, also: str) -> str:
    """A measurement's last line: where its report went (files, and the MLflow run when recorded;
    hostile pass R: bench said neither)."""
    from ampbench.tracking.store import tracking_uri, ui_command

    files = f"The report: {out.with_suffix('.md')} (also {also})"
    if not run_id:
        return f"{files}; not in MLflow (see the error above)."
    ui = ui_command(tracking_uri())
    start = f"; start the UI first: {ui}" if ui else ""
    return f"{files}; MLflow run {run_id} in experiment {cfg.tracking.experiment}-{kind}{start}"
