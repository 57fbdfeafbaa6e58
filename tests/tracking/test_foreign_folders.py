"""Folders a `sudo make run` left root-owned inside the user's project: checkpoints/, a seed folder
of models/<variant>, an MLflow run's own artifact folder. Each stops its stage in one line naming
the path and the fix (`sudo chown -R ...`), before the work, instead of a traceback after it
(issue #36). The stages run as the user nobody (``test_store_faults.as_nobody``, which skips,
saying why, where that cannot be done); a last-resort mapping turns any write refused by the file
system that no check caught into one line too.
"""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest
import test_store_faults
from test_store_faults import STAGES, as_nobody, assert_one_line, run_stage

from ampbench import cli
from ampbench.tracking import store
from conftest import SINGLE, mlflow_client, run_cli, runs

shared_project = test_store_faults.shared_project  # a project the user nobody can reach


def _chown_root(path: Path) -> None:
    for p in (path, *path.rglob("*")):
        os.chown(p, 0, 0, follow_symlinks=False)


@pytest.mark.slow  # stages as subprocesses
def test_checkpoints_of_root_stops_train_before_the_lock(shared_project):
    """F2: the variant's lock folder could not be made: a PermissionError traceback."""
    prefix = as_nobody(shared_project)
    (shared_project / "checkpoints").mkdir()
    _chown_root(shared_project / "checkpoints")
    proc, seconds = run_stage(shared_project, "train", prefix)
    line = "checkpoints/single-fp32/ cannot hold the work in progress (checkpoints) (Permission denied)"
    assert_one_line(proc, seconds, line)
    assert runs(shared_project) == []


@pytest.mark.slow
def test_a_root_owned_seed_folder_in_models_stops_train_before_training(shared_project):
    """F3: models/ is the user's, models/single-fp32/seed-0/model.pt root's: the publish's rename
    failed after the whole training (Directory not empty) and left models/.single-fp32.publishing."""
    seed = shared_project / "models" / "single-fp32" / "seed-0"
    seed.mkdir(parents=True)
    (seed / "model.pt").write_bytes(b"a sudo run's model")
    prefix = as_nobody(shared_project)
    _chown_root(seed)
    proc, seconds = run_stage(shared_project, "train", prefix)
    out = Path("models/single-fp32")
    assert_one_line(
        proc,
        seconds,
        f"{out} cannot be replaced by this stage's models: {out}/seed-0 belongs to root",
        f"`sudo chown -R $USER {out}`",
        f"`sudo rm -r {out}`",
    )
    assert runs(shared_project) == []  # before any run, so before any training
    assert not (shared_project / "models" / ".single-fp32.publishing").exists()


@pytest.mark.slow
def test_a_run_folder_left_by_sudo_stops_evaluate_before_scoring(shared_project):
    """F4: the seed run trained and evaluated by `sudo make run`, evaluated again by its user:
    log_artifact's PermissionError was a 43-line traceback after scoring."""
    run_cli(shared_project, *SINGLE)
    run_cli(shared_project, *STAGES["evaluate"])  # as root: its files in the run's folder
    client = mlflow_client(shared_project)
    (seed_run,) = runs(shared_project, kind="seed")
    logged = {k: len(client.get_metric_history(seed_run.info.run_id, k)) for k in seed_run.data.metrics}
    prefix = as_nobody(shared_project)
    run_folder = shared_project / "mlruns" / seed_run.info.run_id
    assert run_folder.is_dir(), list((shared_project / "mlruns").iterdir())
    _chown_root(run_folder)
    proc, seconds = run_stage(shared_project, "evaluate", prefix)
    assert_one_line(
        proc,
        seconds,
        f"MLflow run {seed_run.info.run_id}'s artifacts",
        f"{run_folder}/artifacts/evaluation (belongs to root, not to nobody; Permission denied)",
        f"`sudo chown -R nobody {run_folder}`",
    )
    again = {k: len(client.get_metric_history(seed_run.info.run_id, k)) for k in seed_run.data.metrics}
    assert again == logged  # refused before scoring: nothing logged twice


def test_a_file_in_place_of_a_runs_artifact_folder_is_one_line(tmp_path):
    """The same check as root can meet it: a file where the run's evaluation/ folder goes."""
    artifacts = tmp_path / "mlruns" / "abc" / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "evaluation").write_text("not a folder")
    with pytest.raises(store.TrackingError) as err:
        store.check_run_artifacts(artifacts.as_uri(), "abc", "sqlite:///x.db", "evaluation")
    assert f"{artifacts / 'evaluation'} is a file" in str(err.value)
    assert f"{tmp_path / 'mlruns' / 'abc'}`" in str(err.value) and "\n" not in str(err.value)
    store.check_run_artifacts((tmp_path / "mlruns" / "new").as_uri(), "new", "sqlite:///x.db", "evaluation")


REFUSED = {"EACCES": errno.EACCES, "EPERM": errno.EPERM, "EROFS": errno.EROFS, "ENOTDIR": errno.ENOTDIR}


@pytest.mark.parametrize("code", [*REFUSED.values(), errno.EISDIR], ids=[*REFUSED, "EISDIR"])
def test_a_refused_write_no_check_caught_is_one_line(project, monkeypatch, caplog, code):
    """The last resort: any command ending in such an OSError exits 1 with one line naming the path."""
    path = str(project / "somewhere" / "file")

    def refused(cfg, args, argv):
        raise OSError(code, os.strerror(code), path)

    monkeypatch.chdir(project)
    monkeypatch.delenv("AMPBENCH_DEBUG", raising=False)
    monkeypatch.setattr(cli, "command_module", lambda name: types.SimpleNamespace(main=refused))
    assert cli.main(["compare"]) == cli.EXIT_ERROR  # returned: no traceback
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    if code == errno.EISDIR:  # a folder in a file's place: neither ownership nor permissions
        assert errors[0] == f"{path}: is a folder where a file goes: move it aside or remove it, then re-run"
    elif code == errno.ENOTDIR:
        assert errors[0].startswith(f"{path}: Not a directory (a file stands where a folder"), errors
    else:
        assert errors[0].startswith(f"{path}: {os.strerror(code)}: make it writable by this user"), errors
