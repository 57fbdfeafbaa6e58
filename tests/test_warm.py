"""Warm starts (ampbench.warm, ampbench.warm_server): stages forked from a server that imported
torch, MLflow and scikit-learn once behave as the same stages run as plain processes: output,
exit codes, environment and working folder, signals, kill -9, and the train stage's helper
processes (checkpoint writer, system-metrics sampler). Each test has its own socket folder and
stops its server; everything else in the suite runs with AMPBENCH_WARM=0 (conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from ampbench import warm
from conftest import alive, load_pt, long_project, run_cli, runs, venv_env, wait_for_checkpoint

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="warm starts are Linux-only (fork, /proc)")


@pytest.fixture
def warm_dir(tmp_path: Path):
    folder = tmp_path / "warm"
    yield folder
    for log in folder.glob("ampbench-warm-*/*.log"):  # stop the servers this test started
        for pid in re.findall(r"warm server (\d+): ready", log.read_text()):
            if alive(int(pid)):
                os.kill(int(pid), signal.SIGTERM)


def warm_env(folder: Path, **extra: str) -> dict:
    return venv_env(AMPBENCH_WARM="1", AMPBENCH_WARM_DIR=str(folder), **extra)


def server_log(folder: Path, timeout: float = 120) -> Path:
    """The server's log, once it says it is ready (its imports take seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in folder.glob("ampbench-warm-*/*.log"):
            if "ready at" in log.read_text():
                return log
        time.sleep(0.2)
    pytest.fail(f"no warm server became ready in {folder}")


def child_pid(log: Path, command: str, nth: int = 1, timeout: float = 60) -> int:
    """The pid of the server's `nth` child that runs `ampbench <command>...`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(rf"pid (\d+) runs `ampbench {re.escape(command)}", log.read_text())
        if len(found) >= nth:
            return int(found[nth - 1])
        time.sleep(0.1)
    pytest.fail(f"the server ran no {nth}. `ampbench {command}`:\n{log.read_text()}")


def test_the_socket_is_per_code_version_and_off_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPBENCH_WARM_DIR", str(tmp_path))
    before = warm.socket_path()
    assert before.parent.stat().st_mode & 0o777 == 0o700  # other users cannot reach it
    source = warm.PACKAGE / "timing.py"
    st = source.stat()
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert warm.socket_path() != before  # edited code never runs in an old server
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert warm.socket_path() == before
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    assert not warm.enabled()


@pytest.mark.slow  # a server's imports and tiny trainings: ~40 s on 2 cores
def test_stages_in_warm_children_behave_as_plain_processes(tmp_path, warm_dir):
    project = long_project(tmp_path / "p", epochs=3)  # trains for seconds: the sampler samples
    store = tmp_path / "store"  # named by the client's environment only
    store.mkdir()
    env = warm_env(warm_dir, MLFLOW_TRACKING_URI=f"sqlite:///{store / 'mlflow.db'}")
    # No server yet: the stage runs here (same error, same exit code) and starts one.
    cold = run_cli(project, "compare", "--variants", "nope", env=env, check=False)
    assert cold.returncode == 2 and "--variants: unknown nope" in cold.stderr
    log = server_log(warm_dir)
    warmed = run_cli(project, "compare", "--variants", "nope", env=env, check=False)
    assert warmed.returncode == 2 and "--variants: unknown nope" in warmed.stderr  # its stderr came back
    child_pid(log, "compare --variants nope")

    # A train and evaluate stage: the client's folder and environment (the store), the helper
    # processes forked too, and a start-up without the imports.
    run_cli(project, "train", "--set", "tracking.system_metrics=always", env=env)
    run_cli(project, "evaluate", env=env)
    text = log.read_text()
    for command in ("train", "checkpoint-writer", "system-metrics", "evaluate"):
        assert f"runs `ampbench {command}" in text and str(project) in text
    assert (project / "models" / "single-fp32" / "seed-0" / "model.pt").exists()
    assert (project / "reports" / "metrics" / "single-fp32.json").exists()
    (variant,) = runs(store, kind="variant")
    assert variant.info.status == "FINISHED"
    assert variant.data.metrics["time/startup_seconds"] < 1.0  # a cold start imports for ~2 s here
    assert any(k.startswith("system/") for k in variant.data.metrics)  # the sampler process logged
    (seed,) = runs(store, kind="seed")
    assert seed.info.status == "FINISHED"
    assert json.loads((project / "reports" / "metrics" / "single-fp32.json").read_text())["test_accuracy"] > 0


@pytest.mark.slow  # a server's imports and a killed training: ~40 s on 2 cores
def test_signals_reach_the_warm_child_and_a_killed_client_takes_it_along(tmp_path, warm_dir, procs):
    env = warm_env(warm_dir)
    proj = long_project(tmp_path / "p", epochs=40)
    run_cli(proj, "compare", "--variants", "nope", env=env, check=False)  # starts the server
    log = server_log(warm_dir)

    # SIGTERM to the client: the child stops at a step boundary, saves, exits 143, as a plain stage.
    client = procs.start(proj, "train", env=env)
    ckpt = proj / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt"
    wait_for_checkpoint(client, ckpt, proj / "train.log")
    stage = child_pid(log, "train")
    client.send_signal(signal.SIGTERM)
    assert client.wait(60) == 143, (proj / "train.log").read_text()
    assert not alive(stage)
    assert "SIGTERM received" in (proj / "train.log").read_text()

    # kill -9 of the client: its stage goes at once; the last epoch's checkpoint stays readable.
    client = procs.start(proj, "train", env=env, name="train2")
    done = load_pt(ckpt)["epoch"]
    wait_for_checkpoint(client, ckpt, proj / "train2.log", min_epoch=done + 1)
    stage = child_pid(log, "train", nth=2)
    client.kill()
    client.wait(10)
    deadline = time.monotonic() + 10
    while alive(stage) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(stage)
    assert load_pt(ckpt)["epoch"] >= done + 1

    # SIGTERM to the server: its stages stop as if each got the SIGTERM, and their clients hear it.
    client = procs.start(proj, "train", env=env, name="train3")
    done = load_pt(ckpt)["epoch"]
    wait_for_checkpoint(client, ckpt, proj / "train3.log", min_epoch=done + 1)
    (server,) = re.findall(r"warm server (\d+): ready", log.read_text())
    os.kill(int(server), signal.SIGTERM)
    assert client.wait(60) == 143, (proj / "train3.log").read_text()
    assert "SIGTERM received" in (proj / "train3.log").read_text()


@pytest.mark.slow  # a server's imports: ~10 s on 2 cores
def test_an_idle_server_exits_and_removes_its_socket(project, warm_dir):
    env = warm_env(warm_dir, AMPBENCH_WARM_IDLE_S="1")
    run_cli(project, "compare", "--variants", "nope", env=env, check=False)
    log = server_log(warm_dir)
    deadline = time.monotonic() + 30
    while "exiting" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "idle for" in log.read_text()
    while list(warm_dir.glob("ampbench-warm-*/*.sock")) and time.monotonic() < deadline + 10:
        time.sleep(0.1)  # it removes the socket as it exits
    assert not list(warm_dir.glob("ampbench-warm-*/*.sock"))
    # The next stage finds no server: it runs here (and starts another).
    again = run_cli(project, "compare", "--variants", "nope", env=env, check=False)
    assert again.returncode == 2 and "--variants: unknown nope" in again.stderr


@pytest.mark.slow  # a server's imports: ~15 s on 2 cores
def test_kill_9_of_a_warm_trainer_does_not_stop_its_forked_writer(tmp_path, project, warm_dir):
    """As test_checkpoint_writer's test of the same name, with the writer forked by the server."""
    env = warm_env(warm_dir)
    run_cli(project, "compare", "--variants", "nope", env=env, check=False)  # starts the server
    log = server_log(warm_dir)
    ck = tmp_path / "ck.pt"
    script = textwrap.dedent(f"""
        import os, signal, torch
        from pathlib import Path
        from ampbench.checkpoint_writer import CheckpointWriter
        w = CheckpointWriter()
        w.save({{"w": torch.ones(3000, 3000), "epoch": 5}}, Path({str(ck)!r}), wait=True)
        w.save({{"w": torch.full((3000, 3000), 2.0), "epoch": 6}}, Path({str(ck)!r}))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    # RANK: a DDP rank 0's writer, whose client must not take its trainer's death for torchrun's.
    proc = subprocess.Popen([sys.executable, "-c", script], env={**env, "RANK": "0"})
    assert proc.wait(120) == -signal.SIGKILL
    writer = child_pid(log, "checkpoint-writer")
    deadline = time.monotonic() + 60
    while alive(writer) and time.monotonic() < deadline:  # it finishes the write, then exits
        time.sleep(0.1)
    saved = torch.load(ck, weights_only=True)
    assert saved["epoch"] == 6 and torch.equal(saved["w"], torch.full((3000, 3000), 2.0))
