"""An evaluate run again (DVC re-runs the one evaluate stage when any variant is retrained) logs
nothing more for models it scored already (hostile re-run: every metric of every variant not
retrained was logged once more per evaluate; the seed run's test/accuracy three times)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import new_project, run_cli

VARIANT = ("--parallel", "single", "--precision", "fp32")
TWICE = (
    "select r.name, m.key, m.step, count(*) from metrics m join runs r on r.run_uuid = m.run_uuid "
    "group by m.run_uuid, m.key, m.step having count(*) > 1"
)


@pytest.mark.slow  # train and evaluate (twice) as subprocesses
def test_evaluating_an_unchanged_model_again_logs_nothing_twice(tmp_path: Path):
    project = new_project(tmp_path / "proj")
    run_cli(project, "train", *VARIANT)
    run_cli(project, "evaluate", *VARIANT)
    with sqlite3.connect(project / "mlflow.db") as db:
        first = sorted(db.execute(TWICE).fetchall())
        count = db.execute("select count(*) from metrics").fetchone()[0]
    run_cli(project, "evaluate", *VARIANT)
    with sqlite3.connect(project / "mlflow.db") as db:
        assert sorted(db.execute(TWICE).fetchall()) == first  # the seed run's documented pair only
        assert db.execute("select count(*) from metrics").fetchone()[0] == count
    assert all(key == "test/accuracy" and name.endswith("/seed-0") for name, key, _, _ in first), first
