"""`mlflow run`'s runs that nothing carries on: a SIGTERM to its group in the first instant of its
command, before Python had started it, killed `mlflow run` and the command with the run RUNNING
for good (hostile pass O, 2 tries in 6). The next `ampbench variant` under `mlflow run` ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampbench.tracking import launcher


@pytest.fixture
def store(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("study")


def _entry_run(client, experiment: str) -> str:
    return client.create_run(experiment, tags={launcher.ENTRY_TAG: "main"}).info.run_id


def test_a_run_no_process_carries_on_is_ended_killed(store, monkeypatch, caplog):
    uri, client, experiment = store
    monkeypatch.setattr(launcher, "_mlflow_run", lambda argv: False)  # other tests' `mlflow run`s
    dead, held, own = (_entry_run(client, experiment) for _ in range(3))
    plain = client.create_run(experiment).info.run_id  # a stage's run: not `mlflow run`'s
    holder = subprocess.Popen(["sleep", "60"], env={**os.environ, launcher.ENV: held})  # its command
    try:
        launcher.end_abandoned(client, own, uri)
    finally:
        holder.kill()
        holder.wait()
    status = {run: client.get_run(run).info.status for run in (dead, held, plain, own)}
    assert status == {dead: "KILLED", held: "RUNNING", plain: "RUNNING", own: "RUNNING"}
    assert f"ended `mlflow run`'s run {dead}" in caplog.text


def test_nothing_is_ended_while_another_mlflow_run_may_be_starting(store, tmp_path):
    """Its run is in no process's environment until its environment is built (pip, minutes)."""
    uri, client, experiment = store
    dead, own = _entry_run(client, experiment), _entry_run(client, experiment)
    script = tmp_path / "bin" / "mlflow"
    script.parent.mkdir()
    script.write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    other = subprocess.Popen([sys.executable, str(script), "run", "."])
    cmdline = Path(f"/proc/{other.pid}/cmdline")
    while str(script).encode() not in cmdline.read_bytes():  # forked, not yet exec'd: pytest's own
        time.sleep(0.01)
    try:
        launcher.end_abandoned(client, own, uri)
        launcher.end_abandoned(client, own, "http://127.0.0.1:9")  # runs of other hosts: not seen here
    finally:
        other.kill()
        other.wait()
    assert client.get_run(dead).info.status == "RUNNING"
    assert launcher._mlflow_run([b"python", b"-m", b"mlflow", b"run", b"."])  # noqa: SLF001
    assert not launcher._mlflow_run([b"python", b"-m", b"ampbench", b"variant"])  # noqa: SLF001
