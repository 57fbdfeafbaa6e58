"""The tracking store's faults: an unreachable server fails the stage fast, before training; two
first runs at once create a new sqlite store once.
"""

from __future__ import annotations

import time

import pytest

from conftest import SINGLE, free_port, new_project, run_cli, runs, stage_log, venv_env, wait_exit


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_unreachable_tracking_server_fails_fast_before_training(project):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli(project, *SINGLE, env=venv_env(MLFLOW_TRACKING_URI=uri), check=False, timeout=120)
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 1
    assert f"MLflow tracking server {uri} is not answering" in proc.stderr
    assert "MLFLOW_TRACKING_URI" in proc.stderr
    assert not (project / "models").exists() and not (project / "checkpoints").exists()


@pytest.mark.slow
def test_two_first_runs_at_once_create_the_store_once(tmp_path, procs):
    """`dvc queue start -j 2` or two terminals: both first runs migrating a new sqlite store raced."""
    project = new_project(tmp_path / "p")
    started = [
        procs.start(project, "train", "--parallel", "single", "--precision", p, name=p)
        for p in ("fp32", "autocast")
    ]
    for proc, name in zip(started, ("fp32", "autocast")):
        assert wait_exit(proc, 240, project / f"{name}.log") == 0, stage_log(project, name)
    finished = [r for r in runs(project) if r.info.status == "FINISHED"]
    assert sorted(r.info.run_name for r in finished) == [
        "single-autocast",
        "single-autocast/seed-0",
        "single-fp32",
        "single-fp32/seed-0",
    ]
    run_cli(project, *SINGLE, "--set", "train.seeds=[1]")  # the store stays usable
    assert len(runs(project, kind="seed")) == 3
