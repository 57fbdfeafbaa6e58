"""Nothing lost on the paths next to the tested ones (issue: resume everywhere, one run per seed,
a store that survives): `dvc exp run` (what `make run DATA=...` runs), several seeds with one
killed, a kill before the first checkpoint, and a tracking server that dies mid-training.

Like tests/stages/test_train_stops.py, these run the real commands as subprocesses in throwaway
projects and read back the real checkpoint folders and MLflow runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (
    REPO,
    VENV_BIN,
    MlflowServer,
    empty_store,
    image_folder_archive,
    load_pt,
    long_project,
    mlflow_client,
    runs,
    venv_env,
    wait_for_checkpoint,
    write_params,
)

SINGLE = ("train", "--parallel", "single", "--precision", "fp32")
WORK = Path("checkpoints/single-fp32")  # in-progress seeds: no DVC output, so nothing deletes it
MODELS = Path("models/single-fp32")


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"exit {proc.returncode} before {path} appeared:\n{log.read_text()}")
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def _git_dvc_project(proj: Path) -> None:
    """A committed git + DVC project: `dvc exp run` needs a commit to start from."""
    shutil.copytree(
        REPO / "src" / "ampbench", proj / "src" / "ampbench", ignore=shutil.ignore_patterns("__pycache__")
    )  # the stages' deps
    (proj / ".gitignore").write_text(
        "/data/prepared/\n/models/\n/checkpoints/\n/mlflow.db\n/mlruns/\n*.log\n"
    )
    git = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for cmd in (
        ["git", "init", "-q"],
        [str(VENV_BIN / "dvc"), "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "project"],
    ):
        subprocess.run(cmd, cwd=proj, env=venv_env(**git), check=True, timeout=120, capture_output=True)


@pytest.mark.slow
def test_dvc_exp_run_resumes_a_killed_stage_in_the_same_run(tmp_path, procs):
    """`dvc exp run` checks declared outputs out with force before it runs, deleting a half-trained
    models/ folder: the checkpoint lives in checkpoints/, which is no output, and survives."""
    proj = long_project(tmp_path / "proj", epochs=4)
    # DVC deletes outputs it has no hash for, data/prepared too: let the download stage make it.
    archive = image_folder_archive(tmp_path, per_class=24)
    write_params(proj, data={"url": str(archive)}, train={"epochs": 4})
    shutil.rmtree(proj / "data")
    _git_dvc_project(proj)
    exp_run = [str(VENV_BIN / "dvc"), "exp", "run", "train@single-fp32"]
    proc = procs.start(proj, cmd=exp_run, name="dvc")
    saved = wait_for_checkpoint(proc, proj / WORK / "seed-0" / "checkpoint.pt", proj / "dvc.log", min_epoch=1)
    os.killpg(proc.pid, signal.SIGKILL)  # dvc and the training it started
    proc.wait(30)

    again = subprocess.run(exp_run, cwd=proj, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming seed 0 at epoch" in again.stdout + again.stderr
    final = load_pt(proj / MODELS / "seed-0" / "model.pt")
    assert final["run_id"] == saved["run_id"]
    seed_runs = [(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")]
    assert seed_runs == [(saved["run_id"], "FINISHED")]
    assert not (proj / WORK).exists()  # published: the work folder is gone


@pytest.mark.slow
def test_finished_seed_is_not_retrained_after_a_later_seed_is_killed(tmp_path, procs):
    proj = long_project(tmp_path / "proj", epochs=3, seeds=[0, 1])
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, proj / WORK / "seed-1" / "checkpoint.pt", proj / "train.log", min_epoch=1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    seed0 = load_pt(proj / WORK / "seed-0" / "model.pt")

    done = subprocess.run(
        [str(VENV_BIN / "python"), "-m", "ampbench", *SINGLE],
        cwd=proj,
        env=venv_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "seed 0: already trained in this stage" in done.stderr
    seeds = {r.info.run_name: r for r in runs(proj, kind="seed")}
    assert sorted(seeds) == ["single-fp32/seed-0", "single-fp32/seed-1"]  # two runs for two seeds
    assert {r.info.status for r in seeds.values()} == {"FINISHED"}
    assert seeds["single-fp32/seed-0"].info.run_id == seed0["run_id"]
    assert load_pt(proj / MODELS / "seed-0" / "model.pt")["run_id"] == seed0["run_id"]


@pytest.mark.slow
def test_kill_before_the_first_checkpoint_reuses_the_run(tmp_path, procs):
    proj = long_project(tmp_path / "proj", per_class=60, epochs=2)  # 30 steps: seconds per epoch
    proc = procs.start(proj, *SINGLE)
    _wait_for(proj / WORK / "seed-0" / "run.json", proc, proj / "train.log")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert not (proj / WORK / "seed-0" / "checkpoint.pt").exists(), "killed too late for this test"
    (first,) = runs(proj, kind="seed")
    assert first.info.status == "RUNNING"

    done = subprocess.run(
        [str(VENV_BIN / "python"), "-m", "ampbench", *SINGLE],
        cwd=proj,
        env=venv_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    seed_runs = [(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")]
    assert seed_runs == [(first.info.run_id, "FINISHED")]
    assert load_pt(proj / MODELS / "seed-0" / "model.pt")["run_id"] == first.info.run_id


@pytest.mark.slow
def test_tracking_server_dying_mid_training_loses_no_epoch(tmp_path, procs):
    proj = long_project(tmp_path / "proj", epochs=4)
    server = MlflowServer(tmp_path).start()
    env = venv_env(MLFLOW_TRACKING_URI=server.uri)
    try:
        proc = procs.start(proj, *SINGLE, "--set", "tracking.request_timeout_s=2", env=env)
        saved = wait_for_checkpoint(proc, proj / WORK / "seed-0" / "checkpoint.pt", proj / "train.log")
        server.stop()
        killed_at = time.monotonic()
        code = proc.wait(240)
        # Bounded: no minutes of MLflow's default retries per call.
        assert time.monotonic() - killed_at < 120
        log = (proj / "train.log").read_text()
        assert code == 1, log
        assert saved["run_id"] in log and "re-run the same command" in log
        kept = load_pt(proj / WORK / "seed-0" / "model.pt")  # trained to the end, nothing lost
        assert len(kept["history"]) == 4 and kept["pending_metrics"]

        server.start()
        done = subprocess.run(
            [str(VENV_BIN / "python"), "-m", "ampbench", *SINGLE],
            cwd=proj,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        client = mlflow_client(tmp_path)  # the server's own sqlite store
        assert client.get_run(saved["run_id"]).info.status == "FINISHED"
        steps = sorted({m.step for m in client.get_metric_history(saved["run_id"], "train/loss")})
        assert steps == [1, 2, 3, 4]  # every epoch reached the store
        assert load_pt(proj / MODELS / "seed-0" / "model.pt")["run_id"] == saved["run_id"]
    finally:
        server.stop()


def test_dataset_input_race_is_retried_and_never_fails_training(tmp_path, monkeypatch, caplog):
    """Two stages registering the same dataset at once: sqlite's unique row makes one insert fail."""
    from ampbench.tracking.tracker import Tracker

    store = empty_store(tmp_path / "mlflow.db")  # migrated once per session, not in every test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    tracker = Tracker("race")
    run_id = tracker.start("r", {})
    real, calls = tracker.client.log_inputs, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("UNIQUE constraint failed: datasets.experiment_id, datasets.name")
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker.client, "log_inputs", flaky)
    tracker.log_dataset(run_id, "cifar10-train", "ab" * 20, "/data.tar.gz", "training")
    assert len(calls) == 2
    assert [d.dataset.name for d in tracker.client.get_run(run_id).inputs.dataset_inputs] == ["cifar10-train"]

    def broken(*args, **kwargs):
        raise RuntimeError("store down")

    monkeypatch.setattr(tracker.client, "log_inputs", broken)
    tracker.log_dataset(run_id, "cifar10-test", "cd" * 20, "/data.tar.gz", "evaluation")  # no raise
    assert "could not record dataset cifar10-test" in caplog.text


def test_epoch_hooks_close_returns_when_the_store_times_out():
    """The sender's failed flush and close() racing: close() must not wait for ever."""
    import threading

    from ampbench.tracking.epoch_hooks import EpochHooks

    class SlowDeadStore:
        uri = "test://down"

        def log_metrics(self, run_id, metrics, step=None):
            time.sleep(0.3)
            raise RuntimeError("store down")

    hooks = EpochHooks(SlowDeadStore(), "run")
    hooks.on_epoch(1, {"train_loss": 1.0})
    time.sleep(0.05)  # the sender is inside its failing flush
    closing = threading.Thread(target=hooks.close)
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "close() hung"
    assert hooks.state() == [[1, {"train_loss": 1.0}]]  # kept for the checkpoint / a re-run


def test_a_store_that_refuses_epochs_is_said_once_then_its_recovery(caplog):
    """Hostile pass WARN: "did not take epoch 1" after epochs 1, 2 and 3, naming the oldest epoch
    kept, not the one just trained; nothing said when the store took them again."""
    import logging

    from ampbench.tracking.epoch_hooks import EpochHooks

    class FlakyStore:
        uri, down, taken = "test://flaky", True, []

        def log_metrics(self, run_id, metrics, step=None):
            if self.down:
                raise RuntimeError("store down")
            self.taken.append(step)

    caplog.set_level(logging.INFO)
    flaky = FlakyStore()
    hooks = EpochHooks(flaky, "run", background=False)
    for epoch in (1, 2, 3):
        hooks.on_epoch(epoch, {"train_loss": 1.0})
        hooks.flush(quiet=True)
    said = [r.getMessage() for r in caplog.records if "did not take" in r.getMessage()]
    assert said == [
        "MLflow store test://flaky did not take run run's epoch 1 (RuntimeError: store down); "
        "kept in the checkpoint with each later epoch, sent once it answers"
    ], said
    flaky.down = False
    hooks.on_epoch(4, {"train_loss": 1.0})
    assert hooks.flush(quiet=True) and flaky.taken == [1, 2, 3, 4]
    assert "MLflow store test://flaky took run run's epochs kept meanwhile" in caplog.text
