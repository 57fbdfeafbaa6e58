"""Where a study's MLflow store is (``tracking_uri``, ``repo_root``) and where a person opens it
(``runs_link``, ``ui_command``); how the store is opened and its faults: ``tracking.store``."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ampbench.processes import setter_of

UI_DEFAULT = "http://127.0.0.1:5000"  # `mlflow ui` as the README starts it


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
    """MLFLOW_TRACKING_URI, else the project's mlflow.db. A relative sqlite path is the project
    root's: a stage of `dvc exp run --temp` or of the queue runs in a temporary copy, and a store
    there went with it (hostile pass P: exit 0, every run lost). Under `mlflow run` it is the
    folder `mlflow run` was started in, where MLflow records its own run (hostile pass R)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return f"sqlite:///{repo_root() / 'mlflow.db'}"
    database = sqlite_file(uri)
    if database is None or database.is_absolute():
        return uri
    from sqlalchemy.engine import make_url

    return make_url(uri).set(database=str(relative_to() / database)).render_as_string(hide_password=False)


def pin_tracking_uri() -> None:
    """MLFLOW_TRACKING_URI with a relative sqlite path made absolute, once, as the command starts:
    read later, after `mlflow run` was killed, its folder was gone from /proc and the path was read
    from the project instead (hostile pass U: its run left RUNNING, an empty store made there)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    relative = uri.startswith("sqlite:///") and not uri.startswith("sqlite:////")  # no SQLAlchemy else
    if relative and (pinned := tracking_uri()) != uri:
        os.environ["MLFLOW_TRACKING_URI"] = pinned


def relative_to() -> Path:
    """The folder a relative sqlite path is read from: `mlflow run`'s (the process that set
    MLFLOW_RUN_ID for its entry point's command), else the project root."""
    launcher = setter_of("MLFLOW_RUN_ID") if os.environ.get("MLFLOW_RUN_ID") else None
    try:
        return Path(os.readlink(f"/proc/{launcher}/cwd")) if launcher else repo_root()
    except OSError:  # gone, or not ours to read
        return repo_root()


def where_the_runs_are() -> str:
    """The fix when this store lacks runs a file names: under MLFLOW_TRACKING_URI, the store that
    has them; without it the repo's mlflow.db was replaced or emptied (hostile pass P: "unset it for
    the repo's mlflow.db", said with it unset)."""
    if "MLFLOW_TRACKING_URI" in os.environ:
        return "point MLFLOW_TRACKING_URI at the store that holds them (unset it for the repo's mlflow.db)"
    return "this is the repo's mlflow.db, replaced or emptied since: put back the one that holds them"


def ui_base(uri: str) -> str:
    """Where a person opens the UI for this store: the server itself, or `mlflow ui`'s default."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_DEFAULT


def ui_command(uri: str) -> str:
    """The command that serves a sqlite store's UI at the link's address; "" for a server's URI."""
    if not uri.startswith("sqlite:"):
        return ""  # a tracking server: the link opens it
    mlflow = Path(sys.executable).absolute().with_name("mlflow")  # this venv's, absolute: any folder
    program = shlex.quote(str(mlflow)) if mlflow.exists() else "mlflow"
    return f"{program} ui --backend-store-uri {shlex.quote(uri)}"


def runs_link(uri: str, experiment_id: str) -> str:
    """A link that opens the study's answer: the nine variant runs as a table of their results.

    The UI decides its landing page by a per-browser workflow type (default: GenAI); the query
    inside the hash selects the training view and the UI remembers it. ``viewStateShareKey``
    opens the shared view that ``tracking.view`` stores on the experiment (columns, filter, sort,
    charts).
    """
    from ampbench.tracking.view import SHARE_KEY

    query = f"workflowType=machine_learning&compareRunsMode=TABLE&viewStateShareKey={SHARE_KEY}"
    return f"{ui_base(uri)}/#/experiments/{experiment_id}/runs?{query}"


def unusable(uri: str) -> str:
    """One line for a tracking URI MLflow takes that cannot keep a study, else "" (hostile pass X2):
    an in-memory sqlite store (exit 0, every run lost as the command ended, its models naming runs
    that exist nowhere); a sqlite database named as a plain path, which MLflow reads as a folder
    store (whose advice then was to remove the database)."""
    if _is_sqlite(uri) and _url(uri) is None:  # sqlite:mlflow.db (pass I: a 62-line traceback)
        scheme, _, rest = uri.partition(":")
        return (
            f"MLFLOW_TRACKING_URI={uri} is not a sqlite URI SQLAlchemy can read: write "
            f"{scheme}:///{rest} (three slashes "
            "before a relative path, four before an absolute one)"
        )
    if _is_sqlite(uri) and _in_memory(uri):  # sqlite+pysqlite:// too (pass G)
        return (
            f"MLflow store {uri} keeps its runs in memory only, lost as the command ends: set "
            "MLFLOW_TRACKING_URI to sqlite:///<path>.db, or unset it (the repo's mlflow.db)"
        )
    # a plain path, file:///abs, file:/abs or file:rel (hostile pass Z: the single-slash forms)
    path = uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:")
    path = "" if ":" in path else path
    try:
        with open(path or os.devnull, "rb") as f:
            sqlite = path and f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return ""
    if not sqlite:
        return ""
    database = Path(path).resolve()
    return (
        f"MLFLOW_TRACKING_URI={uri} names the sqlite database {database} as a path, which MLflow "
        f"takes for a folder store: set MLFLOW_TRACKING_URI=sqlite:///{database}"
    )


def _in_memory(uri: str) -> bool:
    """SQLAlchemy's reading: no database name (`sqlite://`, `sqlite:///`; pass F) or :memory:."""
    return sqlite_file(uri) is None


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite URI (relative to the working folder, as SQLAlchemy reads it);
    None for another store, an in-memory one, or one SQLAlchemy cannot read (``unusable`` says so)."""
    url = _url(uri) if _is_sqlite(uri) else None
    database = url.database if url is not None else None
    return Path(database) if database and database != ":memory:" else None


def _is_sqlite(uri: str) -> bool:
    return uri.split(":")[0].split("+")[0] == "sqlite"  # sqlite: or sqlite+<driver>:


def _url(uri: str):
    """SQLAlchemy's reading of a URI, or None where it cannot read it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(uri)
    except (ArgumentError, ValueError):
        return None
