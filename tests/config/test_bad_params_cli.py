"""Bad configuration through the CLI: every bad setting reported in one message, unknown variant
names, batch sizes that do not fit; each refused before anything runs (no store, no files).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DDP, SINGLE, run_cli, venv_env, write_params


def _no_side_effects(project: Path) -> None:
    assert not (project / "mlflow.db").exists() and not (project / "mlruns").exists()
    assert not (project / "models").exists() and not (project / "checkpoints").exists()


@pytest.mark.no_store
@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_bad_params_are_all_reported_in_one_message_before_anything_runs(project):
    write_params(
        project, data={"url": 42}, train={"epochs": -1, "batch_size": 0, "bogus": 1}, nosuch={"key": 1}
    )
    proc = run_cli(project, *SINGLE, "--set", "train.lr=fast", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("invalid configuration") == 1
    message = proc.stderr.split("invalid configuration", 1)[1]
    for key in ("data.url", "train.epochs", "train.batch_size", "train.bogus", "nosuch", "train.lr"):
        assert key in message, f"{key} not reported:\n{proc.stderr}"
    _no_side_effects(project)


@pytest.mark.no_store
@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
@pytest.mark.parametrize("args", [("--precision", "fp8"), ("--parallel", "tpu")])
def test_unknown_variant_names_are_usage_errors(project, args):
    proc = run_cli(project, "train", *args, check=False)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    _no_side_effects(project)


@pytest.mark.no_store
@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_batch_not_divisible_by_ddp_world_size(project):
    proc = run_cli(project, *DDP, "--set", "train.batch_size=21", env=venv_env(), check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "train.batch_size=21 does not divide by" in out and "multiple of 2" in out, out
    _no_side_effects(project)


@pytest.mark.no_store
@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_batch_larger_than_the_dataset(project):
    proc = run_cli(project, *SINGLE, "--set", "train.batch_size=100", check=False)
    assert proc.returncode == 2  # a configuration error, as every other (hostile re-run: exit 1)
    assert "train.batch_size=100 is larger than the train set (60 images)" in proc.stderr
    _no_side_effects(project)
