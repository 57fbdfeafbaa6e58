"""Which store a stage records into, wherever DVC runs it."""

from __future__ import annotations

import os

from ampbench.tracking import locations, store


def test_a_relative_sqlite_store_is_the_project_roots_even_in_a_temporary_copy(tmp_path, monkeypatch):
    """Hostile pass P: `MLFLOW_TRACKING_URI=sqlite:///mlflow.db dvc exp run --temp` recorded every
    run into the temporary copy's mlflow.db, which DVC then deleted (exit 0). DVC sets DVC_ROOT to
    the project for the stages it runs in a copy."""
    root, copy = tmp_path / "project", tmp_path / "tmp-copy"
    root.mkdir()
    copy.mkdir()
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db?timeout=30")
    assert store.tracking_uri() == f"sqlite:///{root}/mlflow.db?timeout=30"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///stores/m.db")
    assert store.tracking_uri() == f"sqlite:///{root}/stores/m.db"
    for kept in (f"sqlite:///{tmp_path}/abs.db", "http://127.0.0.1:5000", "sqlite:///:memory:"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", kept)
        assert store.tracking_uri() == kept
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert store.tracking_uri() == f"sqlite:///{root}/mlflow.db"


def test_under_mlflow_run_a_relative_sqlite_store_is_the_folder_mlflow_run_started_in(tmp_path, monkeypatch):
    """Hostile pass R: `cd /tmp/x; MLFLOW_TRACKING_URI=sqlite:///rel.db mlflow run /path/to/project`:
    MLflow made its run in /tmp/x/rel.db, the stages looked in the project's rel.db and refused its
    MLFLOW_RUN_ID as left over."""
    root, started = tmp_path / "project", tmp_path / "x"
    root.mkdir()
    started.mkdir()
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel.db")
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    monkeypatch.chdir(started)  # this process stands for `mlflow run`, which set MLFLOW_RUN_ID
    monkeypatch.setattr(locations, "setter_of", lambda variable: os.getpid())
    assert store.tracking_uri() == f"sqlite:///{started}/rel.db"
    locations.pin_tracking_uri()  # as every command does when it starts
    # hostile pass U: read again after `mlflow run` was killed (its folder gone from /proc), the
    # path was the project's: its run left RUNNING, an empty store made in the project
    monkeypatch.setattr(locations, "setter_of", lambda variable: None)
    assert store.tracking_uri() == f"sqlite:///{started}/rel.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel.db")  # none found: the project's
    assert store.tracking_uri() == f"sqlite:///{root}/rel.db"


def test_a_left_over_mlflow_run_id_is_refused_before_any_run_is_touched(tmp_path, monkeypatch):
    """Hostile pass P: with MLFLOW_RUN_ID exported in the shell, a bogus id left a new variant run
    RUNNING at every try (and blamed the store); the id of the study's `compare` run got that run
    renamed "single-autocast (mlflow run)". Only `mlflow run`'s own RUNNING run is taken."""
    import pytest

    from ampbench.tracking.tracker import Tracker, TrackingError
    from conftest import empty_store

    empty_store(tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    tracker = Tracker("study")
    tracker.preflight()
    compare = tracker.start("compare", {})
    entry = tracker.start("x", {"mlflow.project.entryPoint": "main"})
    ended = tracker.start("y", {"mlflow.project.entryPoint": "main"})
    tracker.client.set_terminated(ended, "FINISHED")
    for run_id, said in (
        ("0123456789abcdef0123456789abcdef", "names no run of"),
        (compare, "names run 'compare', which no `mlflow run` started"),
        (ended, "names an ended (FINISHED) `mlflow run`"),
    ):
        monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
        with pytest.raises(TrackingError) as err:
            Tracker("study").preflight()
        assert said in str(err.value) and "`unset MLFLOW_RUN_ID`" in str(err.value)
    assert tracker.client.get_run(compare).info.run_name == "compare"
    assert len(tracker.client.search_runs([tracker.experiment_id()])) == 3  # none started
    monkeypatch.setenv("MLFLOW_RUN_ID", entry)
    Tracker("study").preflight()  # `mlflow run`'s own, in progress


def test_an_in_memory_store_or_a_database_named_as_a_path_is_refused_before_any_run(tmp_path, monkeypatch):
    """Hostile pass X2: `MLFLOW_TRACKING_URI=sqlite://` trained and published (exit 0), every run
    lost, its warning promising the epochs "kept in the checkpoint" the publish then removed;
    `MLFLOW_TRACKING_URI=mlflow.db` was "a folder store", and the next advice was to remove it."""
    import pytest

    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(tmp_path)
    for memory in (
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite+pysqlite://",
        "sqlite://?timeout=5",
        "sqlite:///",
        "sqlite:///?timeout=5",
    ):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", memory)
        with pytest.raises(store.TrackingError, match="keeps its runs in memory only, lost as the command"):
            Tracker("cifar10-amp")
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    Tracker("cifar10-amp").preflight()  # a real store there
    for named in ("mlflow.db", str(db), f"file://{db}", f"file:{db}", "file:mlflow.db"):  # pass Z: file:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", named)
        fix = f"names the sqlite database {db} as a path, which MLflow takes for a folder store: set "
        with pytest.raises(store.TrackingError, match=f"{fix}MLFLOW_TRACKING_URI=sqlite:///{db}$"):
            Tracker("cifar10-amp")
    assert locations.unusable("mlruns") == locations.unusable(f"sqlite:///{db}") == ""
    # slashes missing (pass I: a 62-line SQLAlchemy traceback from every stage)
    for typed, meant in (("sqlite:mlflow.db", "sqlite:///mlflow.db"), (f"sqlite:{db}", f"sqlite:///{db}")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", typed)
        with pytest.raises(store.TrackingError, match=f"SQLAlchemy can read: write {meant} \\(three slashes"):
            Tracker("cifar10-amp")
