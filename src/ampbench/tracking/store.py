"""Where the MLflow store is and how to open it safely; no runs here (that is ``tracking``).

The store is ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo root>/mlflow.db`` (with
artifacts in ``<repo root>/mlruns``), also when DVC runs a stage in a temporary folder. A new
sqlite store is created and migrated by one process at a time (``store_lock``), and MLflow's HTTP
calls can be bounded for a block (``http_limits``) so that a dead server costs seconds.
``store_fault`` turns whatever MLflow, SQLAlchemy or requests raised for a broken store (server
gone, database corrupt, locked or full) into one ``TrackingError`` line: what, which store, the fix
(the wording: ``tracking.faults``). What MLflow reports late or badly is checked first:
``check_sqlite_store`` (the store's files writable, not a folder) when the store is opened,
``check_artifact_root`` (the experiment's artifact folder takes files) in the stages' preflight,
``check_run_artifacts`` (an existing run's artifact folder) before a stage logs into that run.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

from ampbench.chains import chain, warning_as_error
from ampbench.paths import unwritable
from ampbench.tracking import faults

# Re-exported ("as"): where the store is, and where a person opens it, are read through here too.
from ampbench.tracking.locations import UI_DEFAULT as UI_DEFAULT
from ampbench.tracking.locations import repo_root as repo_root
from ampbench.tracking.locations import runs_link as runs_link
from ampbench.tracking.locations import sqlite_file, tracking_uri, unusable
from ampbench.tracking.locations import ui_base as ui_base
from ampbench.tracking.locations import ui_command as ui_command
from ampbench.tracking.locations import where_the_runs_are as where_the_runs_are

# Opening or creating a store holds `store_lock` for about a second (a new store's migration: a
# few); a holder that keeps it far longer is stopped or hung, and waiting on it would hang us too.
STORE_LOCK_TIMEOUT_S = 30.0
STORE_LOCK_SAY_AFTER_S = 3.0  # then one line: the wait is not silent for its 30 s


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message says which and how to fix it."""


@contextmanager
def store_lock(uri: str, timeout_s: float = STORE_LOCK_TIMEOUT_S):
    """Exclusive flock on `<db>.lock` beside a sqlite store; no-op for any other store.

    Two processes opening a new store both run MLflow's schema migration (and both create the
    experiment): `duplicate column`, `_alembic_tmp_* already exists`, a store broken for good.
    A lock still held after `timeout_s` raises TrackingError naming its holder.
    """
    db = sqlite_file(uri)
    if db is None:
        yield
        return
    lock = db.with_name(db.name + ".lock")
    try:
        handle = open(lock, "a", encoding="utf-8")  # noqa: SIM115 (closed by the `with handle` below)
    except OSError as err:
        raise TrackingError(
            f"cannot create lock file {lock} for MLflow store {uri}: {err.strerror}; make its folder "
            "exist and writable, or fix MLFLOW_TRACKING_URI"
        ) from None
    with handle:
        start = time.monotonic()
        said = False
        while True:  # released when the file closes, also if its holder is killed
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if not said and waited > min(STORE_LOCK_SAY_AFTER_S, timeout_s / 2):
                    said = True
                    holder = faults.lock_holders(lock) or "another process"
                    logging.getLogger(__name__).info(
                        "waiting for %s, held by %s (as a rule a stage opening the store); at most %g s",
                        lock, holder, timeout_s,
                    )  # fmt: skip
                if waited > timeout_s:
                    holder = faults.lock_holders(lock) or "another process"
                    raise TrackingError(
                        f"MLflow store {uri} is busy: {lock} has been locked for over {timeout_s:g} s by "
                        f"{holder} (a stage opening the store); if that process is stopped (Ctrl-Z) or "
                        "hung, end it, then re-run the same command"
                    ) from None
                time.sleep(0.1)
        yield


def ensure_store(uri: str):
    """An MlflowClient for `uri`, whose schema was created/migrated by one process at a time.

    A store that cannot be opened (corrupt, locked, full) raises `store_fault`'s TrackingError;
    one that cannot be written, or a folder in its place, `check_sqlite_store`'s.
    """
    from mlflow.tracking import MlflowClient  # deferred: workers never pay the import

    if line := unusable(uri):  # before MLflow opens it
        raise TrackingError(line)
    check_sqlite_store(uri)
    with store_lock(uri):
        try:
            return MlflowClient(uri)  # a sqlite store creates and migrates its tables right here
        except Exception as err:
            fault = store_fault(err, uri)
            if fault is None:
                raise
            raise fault from err


# What sqlite writes beside a database: its journals (a rollback journal, or WAL and shared memory)
# and store_lock's lock file. One left by another user is as unwritable as the database itself.
_COMPANIONS = ("", ".lock", "-journal", "-wal", "-shm")


def check_sqlite_store(uri: str) -> None:
    """A sqlite store's file is a file this user can write, in a folder that takes new files, or a
    one-line TrackingError now: MLflow itself retries a folder in the file's place for 105 s, and
    logs two tracebacks for a read-only database once the first run is written."""
    db = sqlite_file(uri)
    if db is None:
        return
    if db.is_dir():
        raise TrackingError(faults.store_is_folder(uri, db))
    above = next((p for p in db.parents if p.exists()), None)  # pass I: sqlite:////etc/passwd/x.db
    if above is not None and not above.is_dir():
        raise TrackingError(
            f"MLflow store {uri} cannot be made: {above} is a file, not a folder, so no database can "
            "be created under it: point MLFLOW_TRACKING_URI at a path in a folder "
            "(sqlite:///<folder>/mlflow.db); then re-run the same command"
        )
    if db.parent.is_dir() and (reason := unwritable(db.parent)):  # a missing folder: store_lock says so
        raise TrackingError(faults.store_folder_unwritable(uri, db.parent, reason))
    refused = []
    for path in (db.with_name(db.name + suffix) for suffix in _COMPANIONS):
        try:
            os.close(os.open(path, os.O_RDWR))  # opened for writing, not written
        except FileNotFoundError:
            continue
        except OSError as err:
            refused.append((path, err))
    if refused:
        raise TrackingError(faults.store_files_unwritable(uri, refused))


def _local_folder(location: str) -> Path | None:
    """The local folder of an artifact location (a path or file: URI); None for a remote one
    (s3:, mlflow-artifacts: a server's proxy, ...: that side checks)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(location)
    if not location or parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path) if parsed.scheme else location)


def check_artifact_root(location: str, experiment: str, uri: str) -> None:
    """The experiment's artifact root (a local folder; a remote one is not checked) can take files,
    or a one-line TrackingError now, before any training: evaluate and compare log their files
    there, and MLflow's own error would be a traceback after the work."""
    root = _local_folder(location)
    if root is None:
        return
    for folder in (root, root / "models"):  # models/: where MLflow keeps logged models' files
        if folder is root or folder.is_dir():
            reason = unwritable(folder)
            if reason:
                raise TrackingError(faults.artifact_root_unwritable(folder, experiment, uri, reason))


def check_run_artifacts(artifact_uri: str, run_id: str, uri: str, subfolder: str) -> None:
    """An existing run's artifact folder (``<root>/<run id>/artifacts``) and its ``subfolder`` take
    this stage's files, and the files there it would replace are writable: or a one-line
    TrackingError now, before the work. The experiment's root may be the user's while a `sudo`
    run left this run's folder root-owned (evaluate logs into the run that trained the model)."""
    root = _local_folder(artifact_uri)
    if root is None:
        return
    run_folder = root.parent if root.name == "artifacts" and root.parent.name == run_id else root
    target = root / subfolder
    reason = unwritable(target)
    if not reason and target.is_dir():
        for path in target.iterdir():
            try:
                os.close(os.open(path, os.O_WRONLY))  # opened for writing, not written
            except IsADirectoryError:
                continue
            except OSError as err:
                target, reason = path, err.strerror or type(err).__name__
                break
    if reason:
        raise TrackingError(faults.run_artifacts_unwritable(target, run_folder, run_id, uri, reason))


@contextmanager
def temporary_env(**values: str):
    """Set environment variables for the duration of a block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def http_limits(seconds: float, retries: int):
    """Bound MLflow's HTTP calls (default: 5 retries x 120 s, minutes on a dead server)."""
    return temporary_env(
        MLFLOW_HTTP_REQUEST_MAX_RETRIES=str(retries), MLFLOW_HTTP_REQUEST_TIMEOUT=str(max(1, int(seconds)))
    )


def brief(err: BaseException) -> str:
    """What went wrong, in a few words: a store fault's reason, else `Type: first line`."""
    found = faults.classify(err)
    if found:
        return found[1]
    text = str(err).splitlines()[0][:300] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def store_fault(err: BaseException, uri: str | None = None) -> TrackingError | None:
    """One line for a store fault in err's chain (what failed, which store, the fix), or None."""
    uri = uri or tracking_uri()
    text = warning_as_error(err) or _missing_driver(err, uri) or faults.describe(err, uri, sqlite_file(uri))
    return TrackingError(text) if text else None


def _missing_driver(err: BaseException, uri: str) -> str | None:
    """A database store whose Python driver is not installed (final pass L: postgresql:// and
    mysql:// gave a 66-line traceback ending "No module named 'psycopg'")."""
    scheme = uri.partition("://")[0].partition("+")[0]
    gone = next((e for e in chain(err) if isinstance(e, ModuleNotFoundError)), None)
    if gone is None or "://" not in uri or scheme in ("sqlite", "http", "https", "file", "databricks"):
        return None
    return (
        f"MLflow store {uri} needs the database driver {gone.name!r}, which is not installed here: "
        "install it in this environment (PostgreSQL: psycopg or psycopg2-binary, MySQL: mysqlclient), or set "
        "MLFLOW_TRACKING_URI to sqlite:///<path>.db or a tracking server's http(s)://<host>:<port>"
    )
