"""The default store moves with its project.

The study's experiment keeps its files in ``<repo root>/mlruns``, written into ``mlflow.db`` as an
absolute location when the experiment is created (tracking/tracker.py: never a temporary folder
of DVC's). Moved or copied to another folder, the project would go on writing every new run's
files to the old folder (made again if it is gone, or another copy's), and the UI would look for
the old runs' files there. So before a stage's first run, locations of the form
``file://<another folder>/mlruns[/...]`` in the project's own store are rewritten to this
project's ``mlruns``: experiments, runs, logged models and model versions, in one transaction,
with one line saying so. The files themselves moved with the folder.

Only the default store (``sqlite`` at the repo root, ``MLFLOW_TRACKING_URI`` unset) is touched,
and only locations the project itself made: a server's or another tool's are not ours to move.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

# (table, column) holding artifact locations in MLflow's SQL schema; absent ones are skipped
COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
)


def old_roots(locations: list[str], mlruns: Path) -> set[str]:
    """The ``file://.../mlruns`` prefixes among experiments' `locations` that are not `mlruns`."""
    here = mlruns.as_uri()
    found = set()
    for location in locations:
        parsed = urlparse(location or "")
        if parsed.scheme == "file" and location != here and Path(unquote(parsed.path)).name == "mlruns":
            found.add(location)
    return found


def follow_move(db: Path, root: Path) -> list[str]:
    """Point the store ``db`` at ``root``'s mlruns where it points at another folder's; the old
    prefixes rewritten (none where the project did not move)."""
    mlruns = root / "mlruns"
    with sqlite3.connect(db, timeout=60) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "experiments" not in tables:
            return []
        locations = [loc for (loc,) in conn.execute("SELECT artifact_location FROM experiments")]
        olds = old_roots(locations, mlruns)
        new = mlruns.as_uri()
        for old in sorted(olds):
            for table, column in COLUMNS:
                if table in tables:
                    conn.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - names are ours
                        f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                        (new, len(old) + 1, old, len(old) + 1, old + "/"),
                    )
    for old in sorted(olds):
        was = unquote(urlparse(old).path)
        log.info(
            "mlflow.db: the project moved (or was copied); its runs' files, recorded in %s, are now in %s",
            was,
            mlruns,
        )
    return sorted(olds)
