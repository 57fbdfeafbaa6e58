"""MLflow recording for rank 0: runs, params, per-epoch metrics, datasets, models. DVC
orchestrates; this module only records.

Everything goes through ``MlflowClient`` with explicit run ids: no hidden active-run state. Where
the store is and how it is opened: ``tracking.store``; metric names: ``tracking.metric_names``.

How a study looks in the MLflow UI (one experiment, ``tracking.experiment``):

- one **variant run** per variant, named ``<parallel>-<precision>`` and tagged
  ``ampbench.kind=variant``: it carries the mean and std over seeds (logged by evaluate and
  compare), so the runs table and the charts show nine rows, one per variant;
- one **seed run** per seed, named ``<variant>/seed-<s>``, nested under its variant run: the
  whole config as params, per-epoch curves, the evaluation, the dataset inputs and the model;
- one ``compare`` run with the comparison table and chart as artifacts and no metrics, so it
  never adds charts of its own next to the training runs'.
"""

from __future__ import annotations

import logging
import os
import platform
import sqlite3
import subprocess
import time
from pathlib import Path

import torch

from ampbench.tracking import launcher, relocate, store, view
from ampbench.tracking.epoch_hooks import EpochHooks
from ampbench.tracking.metric_names import metric_name
from ampbench.tracking.store import TrackingError, repo_root, temporary_env, tracking_uri

# Re-exported: callers import the tracking names they need from here.
__all__ = [
    "KIND_TAG",
    "EpochHooks",
    "Tracker",
    "TrackingError",
    "environment_facts",
    "metric_name",
    "repo_root",
    "temporary_env",
    "tracking_uri",
]

log = logging.getLogger(__name__)

MAX_PARAM = 6000  # MLflow's limit on a param value's length
KIND_TAG = "ampbench.kind"  # variant | seed | compare
CONDITIONS_TAG = "ampbench.conditions"  # tracking.conditions: project | tutorial | demo


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_facts() -> dict[str, str]:
    return {
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda),
        "python_version": platform.python_version(),
        "git_commit": git_commit(repo_root()),
    }


class Tracker:
    """Creates, resumes, fills and ends MLflow runs. Use on rank 0 only.

    Every call is bounded (``request_timeout_s``, one retry) unless the user set MLflow's own
    ``MLFLOW_HTTP_REQUEST_*`` variables: a dead server costs seconds, not minutes of retries.
    """

    def __init__(self, experiment: str, preflight_timeout_s: float = 5.0, request_timeout_s: float = 10.0):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(request_timeout_s))))
        # MLflow prints "View run <name> at: <url>" and "View experiment at" as every run on a
        # server ends: 4 lines a variant (hostile pass WARN); compare prints the one link to browse
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri = tracking_uri()
        self.client = store.ensure_store(self.uri)
        self.experiment = experiment
        self.timeout = preflight_timeout_s
        self.launcher_run_id = os.environ.get(launcher.ENV)  # set by `mlflow run` (checked in preflight)
        self._experiment_id = None
        self._artifact_location = ""  # the experiment's, once experiment_id() found it

    @classmethod
    def from_config(cls, cfg) -> Tracker:
        t = cfg.tracking
        return cls(t.experiment, t.preflight_timeout_s, t.request_timeout_s)

    def preflight(self) -> None:
        """Fail fast, before any training, if the store cannot be reached or its artifact root
        cannot take the runs' files."""
        try:
            # under the lock: one process creates the experiment
            with store.http_limits(self.timeout, retries=0), store.store_lock(self.uri):
                self._follow_move()
                self.experiment_id()
                if self.launcher_run_id and (why := launcher.problem(self.client, self.launcher_run_id)):
                    raise TrackingError(launcher.refusal(self.launcher_run_id, why, self.uri))
        except TrackingError:  # already its one line (a deleted experiment)
            raise
        except Exception as err:
            raise store.store_fault(err, self.uri) or TrackingError(
                f"MLflow tracking store {self.uri} is not usable ({store.brief(err)}). Start the server, "
                "fix or unset MLFLOW_TRACKING_URI (default: sqlite mlflow.db at the repo root)"
            ) from None
        store.check_artifact_root(self._artifact_location, self.experiment, self.uri)

    def _follow_move(self) -> None:
        """The default store's locations follow a moved project (``tracking.relocate``)."""
        db = repo_root() / "mlflow.db"
        if self.uri != f"sqlite:///{db}" or "MLFLOW_TRACKING_URI" in os.environ or not db.is_file():
            return
        try:
            relocate.follow_move(db, repo_root())
        except sqlite3.Error as err:  # MLflow's own calls next say what is wrong with the store
            log.warning("mlflow.db: could not check where its runs' files are: %s", err)

    def experiment_id(self) -> str:
        """The study's experiment (``tracking.experiment``), also under `mlflow run`."""
        if self._experiment_id:
            return self._experiment_id
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None and found.lifecycle_stage == "deleted":  # hostile pass E: "failed (...)"
            raise store.TrackingError(
                f"MLflow experiment {self.experiment!r} of store {self.uri} is deleted (in its trash): "
                f"restore it (`MLFLOW_TRACKING_URI={self.uri} mlflow experiments restore --experiment-id "
                f"{found.experiment_id}`), or name another experiment (tracking.experiment in params.yaml)"
            )
        if found is None:
            location = None
            if self.uri.startswith("sqlite:") and "MLFLOW_TRACKING_URI" not in os.environ:
                location = (repo_root() / "mlruns").as_uri()  # absolute, never a temp folder
            self._experiment_id = self.client.create_experiment(self.experiment, location)
            found = self.client.get_experiment(self._experiment_id)
        else:
            self._experiment_id = found.experiment_id
        self._artifact_location = found.artifact_location
        try:
            view.ensure_shared_view(self.client, found)  # what the printed link opens
        except Exception as err:  # a view is no reason to stop a study
            log.warning(
                "could not store the UI's answer view on experiment %s: %s", self.experiment, store.brief(err)
            )
        return self._experiment_id

    def link(self) -> str:
        return store.runs_link(self.uri, self.experiment_id())

    def start(self, name: str, tags: dict, params: dict | None = None, parent: str | None = None) -> str:
        tags = {k: str(v) for k, v in tags.items()}
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id(), run_name=name, tags=tags)
        self.log_params(run.info.run_id, params or {})
        return run.info.run_id

    def status(self, run_id: str) -> str | None:
        """The run's status, or None if this store has no such (live) run."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        return run.info.status if run.info.lifecycle_stage == "active" else None

    def variant_run(self, variant: str, tags: dict, params: dict) -> str:
        """Start the run a variant's seeds nest under (one row per variant in the UI).

        Under `mlflow run` the entry point's run is this run when MLflow put it in the study's
        experiment (``--experiment-name <tracking.experiment>``); otherwise a variant run is
        started in the study's experiment and the entry point's run points at it.
        """
        launcher = self.launcher_run_id
        name = f"{variant} (mlflow run)" if launcher else variant
        tags = {KIND_TAG: "variant", "variant": variant, **tags}
        if launcher and os.environ.get("MLFLOW_EXPERIMENT_ID") == self.experiment_id():
            self.set_tags(launcher, {"mlflow.runName": name, **tags})
            return launcher
        run_id = self.start(
            name, {**tags, **({"ampbench.launcher_run_id": launcher} if launcher else {})}, params
        )
        if launcher:
            note = (
                f"The seeds of this `mlflow run` are recorded in experiment `{self.experiment}` "
                f"(run `{name}`, id {run_id}), beside the study: {self.link()}"
            )
            self.set_tags(
                launcher,
                {
                    "mlflow.runName": name,
                    **tags,
                    "ampbench.variant_run_id": run_id,
                    "ampbench.experiment": self.experiment,
                    "mlflow.note.content": note,
                },
            )
        return run_id

    def publish_answer(self, rows: list[dict], compare_run_id: str, notice: str = "") -> None:
        """The comparison's answer where the printed link shows it (``tracking.view``)."""
        view.publish(self, rows, compare_run_id, notice)

    def logged_steps(self, run_id: str, key: str) -> set[int]:
        """The steps at which the run holds metric ``key`` (a flat key, as ``log_metrics`` takes)."""
        return {m.step for m in self.client.get_metric_history(run_id, metric_name(key))}

    def resume(self, run_id: str) -> None:
        self.client.update_run(run_id, status="RUNNING")

    def log_params(self, run_id: str, params: dict[str, object]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_changed(self, run_id: str, metrics: dict[str, float]) -> None:
        """Step-0 summary metrics (compare's), only those whose value differs from the run's latest:
        a re-run of compare logs nothing twice (final pass G: every compare metric, again, at step 0)."""
        latest = self.client.get_run(run_id).data.metrics
        changed = {k: v for k, v in metrics.items() if latest.get(metric_name(k)) != float(v)}
        if changed:
            self.log_metrics(run_id, changed)

    def log_metrics(
        self, run_id: str, metrics: dict[str, float], step: int | None = None, model_id: str | None = None
    ) -> None:
        """Log flat keys under their sectioned MLflow names (``metric_name``); ``model_id`` links
        them to a logged model too (its row in the Models tab)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(metric_name(k), float(v), now, step or 0, model_id=model_id) for k, v in metrics.items()
        ]
        for i in range(0, len(items), 1000):  # MLflow's batch limit
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def log_dataset(self, run_id: str, name: str, digest: str, source: str, context: str) -> None:
        """Fill the run's Dataset column: which prepared data (by digest) from which source."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        remote = source.startswith(("http://", "https://"))
        dataset = Dataset(
            name=name,
            digest=digest[:36],
            source_type="http" if remote else "local",
            source=json.dumps({"url": source} if remote else {"uri": source}),
        )
        tag = InputTag("mlflow.data.context", context)
        for attempt in (1, 2):
            try:
                self.client.log_inputs(run_id, datasets=[DatasetInput(dataset, [tag])])
                return
            except Exception as err:
                # Two stages registering the same dataset at once race on its unique row in the
                # store (sqlite: UNIQUE constraint failed); the second try finds the row.
                if attempt == 2:
                    log.warning("could not record dataset %s on run %s: %s", name, run_id, store.brief(err))

    def set_tags(self, run_id: str, tags: dict[str, object]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_artifact(self, run_id: str, path: Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)

    def end_quietly(self, run_id: str, status: str) -> None:
        """End a run on a path that must not fail because the store did (stop, crash)."""
        try:
            self.end(run_id, status)
        except Exception as err:
            log.warning("could not mark MLflow run %s %s in %s: %s", run_id, status, self.uri, err)

    def mark_failed_if_running(self, run_ids: list[str]) -> None:
        """After a crashed worker: end runs still RUNNING as FAILED (never leave them dangling)."""
        for run_id in run_ids:
            try:
                if self.client.get_run(run_id).info.status == "RUNNING":
                    self.end(run_id, "FAILED")
            except Exception as err:  # the store itself may be what failed
                log.warning("could not mark run %s FAILED: %s", run_id, err)
