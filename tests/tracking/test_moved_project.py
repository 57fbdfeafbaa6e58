"""A project folder moved (or copied) with its mlflow.db: the store's locations follow it, so new
runs' files land in the project's own mlruns/ and the UI finds the old runs' files (issue 36)."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

from ampbench.tracking import relocate
from ampbench.tracking.tracker import Tracker


def _study(folder: Path) -> str:
    """A project with the default store: an experiment made as the project makes it, one run
    with one file; the run's id."""
    folder.mkdir(parents=True)
    (folder / "dvc.yaml").write_text("stages: {}\n")
    client = mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.create_experiment("study", (folder / "mlruns").as_uri())
    run = client.create_run(experiment).info.run_id
    (folder / "note.txt").write_text("trained")
    client.log_artifact(run, str(folder / "note.txt"))
    return run


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_moved_project_keeps_its_runs_files_in_its_own_folder(tmp_path, monkeypatch, how, caplog):
    old, new = tmp_path / "old place", tmp_path / "new place"
    run = _study(old)
    shutil.move(old, new) if how == "moved" else shutil.copytree(old, new)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(new)
    tracker = Tracker("study")
    with caplog.at_level("INFO", logger=relocate.__name__):
        tracker.preflight()
    assert f"recorded in {old / 'mlruns'}, are now in {new / 'mlruns'}" in caplog.text
    experiment = tracker.client.get_experiment(tracker.experiment_id())
    assert experiment.artifact_location == (new / "mlruns").as_uri()
    # the old run's file is found where it is now, and a new run writes here, not in the old place
    local = tracker.client.download_artifacts(run, "note.txt", str(tmp_path))
    assert Path(local).read_text() == "trained"
    fresh = tracker.client.create_run(tracker.experiment_id()).info.run_id
    tracker.client.log_artifact(fresh, str(new / "note.txt"))
    assert (new / "mlruns" / fresh / "artifacts" / "note.txt").exists()
    assert not (old / "mlruns" / fresh).exists()


def test_a_project_in_place_is_left_as_it_is(tmp_path, monkeypatch, caplog):
    _study(tmp_path / "p")
    db = tmp_path / "p" / "mlflow.db"
    before = db.read_bytes()
    with caplog.at_level("INFO", logger=relocate.__name__):
        assert relocate.follow_move(db, tmp_path / "p") == []
    assert "moved" not in caplog.text and db.read_bytes() == before


def test_locations_that_are_not_the_projects_are_not_moved(tmp_path):
    mlruns = tmp_path / "p" / "mlruns"
    others = ["s3://bucket/mlruns", "/elsewhere/mlruns/0", "file:///shared/artifacts", mlruns.as_uri()]
    assert relocate.old_roots(others, mlruns) == set()
    assert relocate.old_roots(["file:///was/here/mlruns"], mlruns) == {"file:///was/here/mlruns"}
