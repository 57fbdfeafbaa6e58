"""MLflow recording for rank 0: runs, params, per-epoch metrics, artifacts. DVC orchestrates;
this module only records.

The store is ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo root>/mlflow.db`` (with
artifacts in ``<repo root>/mlruns``), also when DVC runs a stage in a temporary folder. Under
``mlflow run`` the runs this creates are children of the run MLflow started for the entry point.
Everything goes through ``MlflowClient`` with explicit run ids: no hidden active-run state.
"""

from __future__ import annotations

import fcntl
import logging
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAX_PARAM = 6000  # MLflow's limit on a param value's length


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message says which and how to fix it."""


def repo_root() -> Path:
    """DVC_ROOT when DVC runs us (also for `dvc exp run --temp`), else the folder holding dvc.yaml."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists():
            return folder
    return here


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite URI (relative to the working folder, as SQLAlchemy reads it)."""
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    return Path(database) if database and database != ":memory:" else None


@contextmanager
def store_lock(uri: str):
    """Exclusive flock on `<db>.lock` beside a sqlite store; no-op for any other store.

    Two processes opening a new store both run MLflow's schema migration (and both create the
    experiment): `duplicate column`, `_alembic_tmp_* already exists`, a store broken for good.
    """
    db = _sqlite_file(uri)
    if db is None:
        yield
        return
    lock = db.with_name(db.name + ".lock")
    try:
        handle = open(lock, "a")  # noqa: SIM115 (closed by the `with handle` below)
    except OSError as err:
        raise TrackingError(
            f"cannot create lock file {lock} for MLflow store {uri}: {err.strerror}; make its folder "
            "exist and writable, or fix MLFLOW_TRACKING_URI"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, also if we are killed
        yield


def ensure_store(uri: str):
    """An MlflowClient for `uri`, whose schema was created/migrated by one process at a time."""
    from mlflow.tracking import MlflowClient  # deferred: workers never pay the import

    with store_lock(uri):
        return MlflowClient(uri)  # a sqlite store creates and migrates its tables right here


@contextmanager
def _short_http_timeouts(seconds: float):
    """A dead server otherwise blocks one call for minutes (5 retries x 120 s)."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(int(seconds)))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    """Creates, resumes, fills and ends MLflow runs. Use on rank 0 only."""

    def __init__(self, experiment: str, preflight_timeout_s: float = 5.0) -> None:
        self.uri = tracking_uri()
        self.client = ensure_store(self.uri)
        self.experiment = experiment
        self.timeout = preflight_timeout_s
        self.parent_run_id = os.environ.get("MLFLOW_RUN_ID")  # set by `mlflow run`
        self._experiment_id = None

    def preflight(self) -> None:
        """Fail fast, before any training, if the store cannot be reached."""
        try:
            with _short_http_timeouts(self.timeout), store_lock(self.uri):  # one creates the experiment
                self.experiment_id()
        except Exception as err:
            raise TrackingError(
                f"MLflow tracking store {self.uri} is not usable ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:300] if str(err) else ''}). Start the server, fix or "
                "unset MLFLOW_TRACKING_URI (default: sqlite mlflow.db at the repo root)"
            ) from None

    def experiment_id(self) -> str:
        if self._experiment_id:
            return self._experiment_id
        if self.parent_run_id and os.environ.get("MLFLOW_EXPERIMENT_ID"):
            self._experiment_id = os.environ["MLFLOW_EXPERIMENT_ID"]
            return self._experiment_id
        found = self.client.get_experiment_by_name(self.experiment)
        if found is None:
            location = None
            if self.uri.startswith("sqlite:") and "MLFLOW_TRACKING_URI" not in os.environ:
                location = (repo_root() / "mlruns").as_uri()  # absolute, never a temp folder
            self._experiment_id = self.client.create_experiment(self.experiment, location)
        else:
            self._experiment_id = found.experiment_id
        return self._experiment_id

    def start(self, name: str, tags: dict[str, str], params: dict[str, object]) -> str:
        tags = {k: str(v) for k, v in tags.items()}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(self.experiment_id(), run_name=name, tags=tags)
        self.log_params(run.info.run_id, params)
        return run.info.run_id

    def resume(self, run_id: str) -> None:
        self.client.update_run(run_id, status="RUNNING")

    def log_params(self, run_id: str, params: dict[str, object]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        self.client.log_batch(run_id, metrics=items)

    def set_tags(self, run_id: str, tags: dict[str, object]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_artifact(self, run_id: str, path: Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)

    def mark_failed_if_running(self, run_ids: list[str]) -> None:
        """After a crashed worker: end runs still RUNNING as FAILED (never leave them dangling)."""
        for run_id in run_ids:
            try:
                if self.client.get_run(run_id).info.status == "RUNNING":
                    self.end(run_id, "FAILED")
            except Exception as err:  # the store itself may be what failed
                log.warning("could not mark run %s FAILED: %s", run_id, err)


class EpochHooks:
    """Forwards the training core's per-epoch metrics to one MLflow run."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker, self.run_id = tracker, run_id

    def on_epoch(self, epoch: int, metrics: dict) -> None:
        self.tracker.log_metrics(self.run_id, metrics, step=epoch)
