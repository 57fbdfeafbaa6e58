"""models/ and checkpoints/ that cannot take files stop the train stage before it trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampbench.checkpoints import files, work
from conftest import run_cli, runs


def test_a_file_in_a_folders_place_is_named(tmp_path):
    (tmp_path / "models").write_text("not a folder")
    with pytest.raises(files.CheckpointError) as err:
        work.check_writable(tmp_path / "checkpoints" / "single-fp32", tmp_path / "models" / "single-fp32")
    message = str(err.value)
    models = tmp_path / "models"
    assert f"{models}/ cannot hold the trained models ({models} is a file)" in message
    assert "then re-run" in message and "\n" not in message


def test_writable_folders_pass_and_create_nothing(tmp_path):
    """A refused stage must leave no models/ behind (other faults' tests check that), so the probe
    goes into the nearest folder that exists and is removed."""
    work.check_writable(tmp_path / "checkpoints" / "v", tmp_path / "models" / "v")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "models").mkdir()
    work.check_writable(tmp_path / "checkpoints" / "v", tmp_path / "models" / "v")
    assert [p.name for p in tmp_path.iterdir()] == ["models"] and not list((tmp_path / "models").iterdir())


@pytest.mark.slow  # a train stage as a subprocess
def test_the_train_stage_refuses_before_creating_a_run(project: Path):
    (project / "models").write_text("not a folder")
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "models/ cannot hold the trained models" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert runs(project) == []  # refused before MLflow was touched
