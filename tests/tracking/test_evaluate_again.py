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


@pytest.mark.slow  # train, evaluate and compare (twice) as subprocesses
def test_comparing_the_same_study_again_logs_nothing_twice(tmp_path: Path):
    """Final pass G: a second compare logged every compare metric (answer/*, speed/speedup_vs_...,
    test/p_value_vs_...) once more at step 0 in each variant run."""
    project = new_project(tmp_path / "proj")
    run_cli(project, "train", *VARIANT)
    run_cli(project, "evaluate", *VARIANT)
    ours = "select count(*) from metrics m join runs r on r.run_uuid = m.run_uuid where r.name != 'compare'"
    run_cli(project, "compare", "--variants", "single-fp32")
    with sqlite3.connect(project / "mlflow.db") as db:
        count = db.execute(ours).fetchone()[0]
        answer = db.execute("select count(*) from metrics where key like 'answer/%'").fetchone()[0]
    run_cli(project, "compare", "--variants", "single-fp32")
    with sqlite3.connect(project / "mlflow.db") as db:
        assert answer > 0  # the first compare logged its answer on the variant run
        assert db.execute(ours).fetchone()[0] == count, db.execute(TWICE).fetchall()


def test_the_confusion_image_of_many_classes_takes_seconds_not_minutes(tmp_path):
    """Hostile pass H: evaluate on 1000 classes ran over 5 minutes, silent, drawing a count in each
    of a million cells (100 classes: 6 s, 300: 45 s on a 2-core machine). Above
    LABELLED_CLASSES the image shows colours only; the counts are in confusion_matrix.json."""
    import time

    from ampbench.tracking.evaluate_runs import LABELLED_CLASSES, confusion_png

    n = 400
    cm = [[(i * 7 + j) % 5 for j in range(n)] for i in range(n)]
    started = time.monotonic()
    confusion_png(cm, [f"class {i}" for i in range(n)], "single-fp32: confusion matrix", tmp_path / "cm.png")
    assert time.monotonic() - started < 20 and (tmp_path / "cm.png").stat().st_size > 1000
    small = [[1, 2], [3, 4]]
    confusion_png(small, ["cat", "dog"], "two classes", tmp_path / "small.png")  # labelled, counted
    assert LABELLED_CLASSES >= 10  # CIFAR-10's image keeps its names and counts
