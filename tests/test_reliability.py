"""Reliability: what happens when training is killed, crashes, diverges, is misconfigured or
cannot reach its tracking store. docs/RELIABILITY.md maps every fault tried here to its test.

Stages run as real subprocesses (`python -m ampbench ...`) in throwaway project folders, so signals,
exit codes, checkpoints on disk and MLflow run states are the real ones. A seed in progress lives in
``checkpoints/<variant>/seed-<s>/`` (``checkpoint.pt``, ``run.json``, then ``model.pt``); only a
finished stage publishes ``models/<variant>/seed-<s>/model.pt``. Each variant has a variant run with
one nested seed run per seed in MLflow. Sizes are tiny (AlexNet
with fc_dim 32, 6-24 images per class) so that the whole file fits in a few minutes on 2 CPU cores.

Fault injection: the code has no fault hook. Tests that need a worker to crash put a
``sitecustomize.py`` on PYTHONPATH (see ``TEST_HOOK``) that makes ``step.Step`` raise at a
chosen step in a chosen rank, or makes importing mlflow fail in a rank; nothing in src/ knows
about it.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from ampbench import config
from ampbench.checkpoints import files
from ampbench.checkpoints.state import ModelFile, SeedCheckpoint
from ampbench.seed_result import CARRIED, SeedResult
from ampbench.stages import launch
from ampbench.training import loop, parallel, precision
from conftest import (
    LONG_EPOCHS,
    REPO,
    VENV_BIN,
    alive,
    crash_at_step,
    descendants,
    free_port,
    load_pt,
    long_project,
    make_dataset,
    mlflow_client,
    new_project,
    run_cli,
    runs,
    venv_env,
    wait_for_checkpoint,
    write_params,
)

SINGLE = ("train", "--parallel", "single", "--precision", "fp32")
DDP = ("train", "--parallel", "ddp", "--precision", "fp32")
SEED0 = Path("models/single-fp32/seed-0")  # the published model.pt of a finished stage
WORK = Path("checkpoints/single-fp32")  # the stage's work in progress (no DVC output)
WORK0 = WORK / "seed-0"  # checkpoint.pt, run.json, model.pt of a seed in progress
DDP_WORK0 = Path("checkpoints/ddp-fp32/seed-0")
NOTHING_MEASURED = SeedResult.from_dict(dict.fromkeys(CARRIED))  # a model file's result, all None

TEST_HOOK = '''
"""Test-only hooks (tests/test_reliability.py), active only when their variable is set.

AMPBENCH_TEST_FAULT=<rank>:<step>: step.Step raises at that step in that rank.
AMPBENCH_TEST_NO_MLFLOW=<rank>,...: importing mlflow fails in those ranks.
"""
import os
import sys

if os.environ.get("RANK") in os.environ.get("AMPBENCH_TEST_NO_MLFLOW", "").split(","):

    class _NoMlflow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mlflow":
                raise ImportError(f"rank {os.environ['RANK']} imported {name}: only rank 0 may use MLflow")

    sys.meta_path.insert(0, _NoMlflow())

_spec = os.environ.get("AMPBENCH_TEST_FAULT", "")
if _spec and os.environ.get("RANK", "0") == _spec.split(":")[0]:
    from ampbench.training import step

    _at, _step = int(_spec.split(":")[1]), step.Step.__call__

    def _faulty(self, images, labels):
        if self.calls + 1 >= _at:
            raise RuntimeError(f"injected fault: rank {os.environ.get('RANK', '0')} step {self.calls + 1}")
        return _step(self, images, labels)

    step.Step.__call__ = _faulty
'''


# ---------------------------------------------------------------- helpers
def _log(project: Path, name: str = "train") -> str:
    return (project / f"{name}.log").read_text(errors="replace")


def _wait(proc: subprocess.Popen, timeout: float, log: Path) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {timeout} s after the signal:\n{log.read_text()}")


def _status(project: Path, run_id: str) -> str:
    return mlflow_client(project).get_run(run_id).info.status


def _metric_steps(project: Path, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in mlflow_client(project).get_metric_history(run_id, key))


def _run_json(project: Path, work0: Path = WORK0) -> dict:
    return json.loads((project / work0 / "run.json").read_text())


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"weights differ from the uninterrupted run in {differ}"


def _hook_env(tmp_path: Path, **variables: str) -> dict:
    """Environment that loads TEST_HOOK (a sitecustomize.py) with the given AMPBENCH_TEST_* set."""
    hook = tmp_path / "test-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(TEST_HOOK)
    # Keep a PYTHONPATH that puts the code under test first (a worktree's src/): without it the
    # workers would import whatever ampbench the venv has installed.
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return venv_env(PYTHONPATH=pythonpath, **variables)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """model.pt of an uninterrupted LONG run: what every interrupted-and-resumed run must equal."""
    proj = long_project(tmp_path_factory.mktemp("reference") / "proj")
    run_cli(proj, *SINGLE, env=venv_env())
    return load_pt(proj / SEED0 / "model.pt")


# ---------------------------------------------------------------- 1. kill -9 and resume
@pytest.mark.slow
def test_sigkill_then_rerun_resumes_same_run_with_identical_weights(tmp_path, procs, reference):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.5)  # land mid-epoch, well after the epoch's metrics were logged
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    saved = load_pt(ckpt)  # the last complete epoch before the kill
    assert 1 <= saved["epoch"] < LONG_EPOCHS and saved["step"] == 0
    assert not (proj / WORK0 / "model.pt").exists() and not (proj / SEED0).exists()
    run_id = saved["run_id"]
    assert _run_json(proj)["run_id"] == run_id
    variant_run = json.loads((proj / WORK / "variant.json").read_text())["run_id"]
    assert _status(proj, run_id) == "RUNNING"  # nobody could mark it: the resume continues it

    done = run_cli(proj, *SINGLE, env=venv_env())
    assert f"resuming seed 0 at epoch {saved['epoch'] + 1} step 0" in done.stderr  # 1-based
    final = load_pt(proj / SEED0 / "model.pt")
    assert (final["run_id"], final["variant_run_id"]) == (run_id, variant_run)
    assert not (proj / WORK).exists()  # published: the work folder is gone
    assert [r.info.run_id for r in runs(proj, kind="seed")] == [run_id]  # one run for the variant and seed
    assert [r.info.run_id for r in runs(proj, kind="variant")] == [variant_run]  # reused, not a second one
    assert _status(proj, run_id) == _status(proj, variant_run) == "FINISHED"
    assert [h["epoch"] for h in final["history"]] == list(range(1, LONG_EPOCHS + 1))
    # Every epoch is recorded; one killed after logging but before its checkpoint is logged again.
    assert sorted(set(_metric_steps(proj, run_id, "train/loss"))) == list(range(1, LONG_EPOCHS + 1))
    _assert_same_weights(final["state_dict"], reference["state_dict"])


@pytest.mark.slow
def test_dvc_repro_resumes_after_kill_and_reruns_only_when_forced(tmp_path, procs):
    """Through DVC: kill -9 of the whole `dvc repro` process group, repro again resumes (the
    checkpoint lives in checkpoints/, no DVC output, so DVC deletes nothing it needs although the
    models/ out is not persist); an unchanged repro runs nothing; `dvc repro -f` trains a fresh run."""
    proj = long_project(tmp_path / "proj", epochs=4)
    train_outs = yaml.safe_load((proj / "dvc.yaml").read_text())["stages"]["train"]["outs"]
    assert "persist" not in json.dumps(train_outs), train_outs  # resume must not depend on it
    shutil.copytree(
        REPO / "src" / "ampbench", proj / "src" / "ampbench", ignore=shutil.ignore_patterns("__pycache__")
    )  # the stage's deps
    dvc = [str(VENV_BIN / "dvc")]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=proj, env=venv_env(), check=True, timeout=120)
    repro = [*dvc, "repro", "--single-item", "train@single-fp32"]
    ckpt = proj / WORK0 / "checkpoint.pt"

    proc = procs.start(proj, cmd=repro, name="dvc")
    wait_for_checkpoint(proc, ckpt, proj / "dvc.log", min_epoch=1)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # dvc and the training it started
    proc.wait(30)
    run_id = load_pt(ckpt)["run_id"]
    assert not (proj / SEED0 / "model.pt").exists()

    def dvc_repro(*extra: str) -> str:
        out = subprocess.run(
            [*repro[:2], *extra, *repro[2:]],
            cwd=proj,
            env=venv_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr

    assert "resuming seed 0 at epoch" in dvc_repro()  # DVC deleted the models/ out, not the checkpoint
    assert load_pt(proj / SEED0 / "model.pt")["run_id"] == run_id
    assert not (proj / WORK).exists()
    assert [(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")] == [(run_id, "FINISHED")]
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED"]

    assert "didn't change" in dvc_repro()  # unchanged pipeline: no new run
    assert len(runs(proj)) == 2  # the variant run and its seed run

    dvc_repro("-f")  # forced: a finished seed trains afresh, in a new run
    fresh = load_pt(proj / SEED0 / "model.pt")["run_id"]
    assert fresh != run_id
    seeds = {(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")}
    assert seeds == {(run_id, "FINISHED"), (fresh, "FINISHED")}
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED", "FINISHED"]


# ---------------------------------------------------------------- 2. atomic checkpoint writes
def _half_then(exc: BaseException):
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        raise exc

    return save


@pytest.mark.parametrize(
    "exc",
    [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt(), RuntimeError("serializer failed")],
    ids=["oserror", "ctrl-c", "runtimeerror"],
)
def test_interrupted_checkpoint_write_keeps_previous_checkpoint(tmp_path, monkeypatch, exc):
    path = tmp_path / "checkpoint.pt"
    files.save({"epoch": 1, "w": torch.ones(1000)}, path)
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", _half_then(exc))
    with pytest.raises(files.CheckpointError if isinstance(exc, OSError) else type(exc)):
        files.save({"epoch": 2, "w": torch.zeros(1000)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # no temp file left behind
    assert files.load(path)["epoch"] == 1


def test_failed_fsync_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    files.save({"epoch": 1}, path)
    before = path.read_bytes()

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(files.CheckpointError, match="Input/output error"):
        files.save({"epoch": 2}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


@pytest.mark.parametrize("how", ["enospc-raised", "dev-full"])
def test_full_disk_is_a_clear_checkpoint_error(tmp_path, monkeypatch, how):
    path = tmp_path / "checkpoint.pt"
    files.save({"epoch": 1}, path)
    before = path.read_bytes()
    if how == "dev-full":  # the kernel's own ENOSPC: every write to /dev/full fails
        if not Path("/dev/full").exists():
            pytest.fail("/dev/full is missing (Linux only)")

        def dev_full(path, mode):
            return builtins.open("/dev/full", mode)  # noqa: SIM115 (files.save closes it)

        monkeypatch.setattr(files, "open", dev_full, raising=False)
    else:
        monkeypatch.setattr(torch, "save", _half_then(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    no_space = "No space left on device: could not write checkpoint"
    with pytest.raises(files.CheckpointError, match=no_space) as err:
        files.save({"epoch": 2, "w": torch.zeros(100_000)}, path)
    assert str(path) in str(err.value)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


KILLED_MID_SAVE = """
import io, os, signal, sys, torch
from pathlib import Path
from ampbench.checkpoints import files
path = Path(sys.argv[1])
files.save({"epoch": 5, "w": torch.ones(1000)}, path)
real = torch.save
def half_then_die(obj, f, *args, **kwargs):
    buf = io.BytesIO()
    real(obj, buf)
    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = half_then_die
files.save({"epoch": 6, "w": torch.zeros(1000)}, path)
"""


def test_kill_9_during_a_checkpoint_save_keeps_the_previous_one(tmp_path):
    """The loop saves in its own process: a kill -9 half-way through the write leaves the previous
    checkpoint whole, and the dead writer's temp file goes at the next save."""
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(path)], env=venv_env(), timeout=120)
    assert proc.returncode == -signal.SIGKILL
    saved = files.load(path)
    assert saved["epoch"] == 5 and torch.equal(saved["w"], torch.ones(1000))
    (stale,) = tmp_path.glob(".checkpoint.pt.tmp-*")  # half a checkpoint, of a writer now dead
    files.save({"epoch": 7}, path)
    assert not stale.exists() and files.load(path) == {"epoch": 7}


def _seed_job(tmp_path: Path, stop=lambda: False, **train) -> loop.Job:
    """One fp32 seed in this process (no MLflow): 60 images, batch 20, 3 steps per epoch, 3 epochs."""
    cfg = config.load_config(REPO / "params.yaml")
    train = {"epochs": 3, "batch_size": 20, "seeds": (0,), "lr": 0.05, **train}
    cfg = config.replace(cfg, model={"fc_dim": 32}, train=train)
    strategy = parallel.Single()
    strategy.setup()
    ckpt = tmp_path / "checkpoint.pt"
    return loop.Job(cfg, precision.REGISTRY["fp32"], strategy, make_dataset(), 0, ckpt, stop)


def test_checkpoint_every_s_zero_saves_every_epoch_end_and_the_default_none_in_a_short_seed(tmp_path):
    out = loop.train_seed(_seed_job(tmp_path, checkpoint_every_s=0.0))
    assert out["result"].checkpoints_written == 2  # epochs 1 and 2: the last one is model.pt's
    assert out["result"].checkpoint_seconds > 0
    saved = SeedCheckpoint.load(tmp_path / "checkpoint.pt")
    assert (saved.epoch, saved.step, saved.stats, len(saved.history)) == (2, 0, None, 2)
    (tmp_path / "checkpoint.pt").unlink()
    default = config.load_config(REPO / "params.yaml").train.checkpoint_every_s
    assert default == 60  # a seed that trains in seconds (an H200's) writes none
    out = loop.train_seed(_seed_job(tmp_path, checkpoint_every_s=default))
    assert out["result"].checkpoints_written == 0 and not (tmp_path / "checkpoint.pt").exists()


def test_timed_saves_mid_epoch_change_nothing_and_a_crash_resumes_exactly(tmp_path, one_thread):
    """checkpoint_every_s: 1e-9 saves at every step boundary; a crash resumes from the last one."""
    reference = loop.train_seed(_seed_job(tmp_path / "reference", checkpoint_every_s=1e9))
    timed = loop.train_seed(_seed_job(tmp_path / "timed", checkpoint_every_s=1e-9))
    assert timed["result"].checkpoints_written == 3 * 2 + 2  # steps 1-2 of each epoch, 2 ends
    _assert_same_weights(timed["state_dict"], reference["state_dict"])

    with pytest.raises(RuntimeError, match="crash"):
        # crash at epoch 2's 2nd step, after a save at its 1st
        loop.train_seed(_seed_job(tmp_path / "crashed", crash_at_step(5), checkpoint_every_s=1e-9))
    saved = SeedCheckpoint.load(tmp_path / "crashed" / "checkpoint.pt")
    assert (saved.epoch, saved.step, len(saved.history)) == (1, 1, 1) and saved.stats is not None
    resumed = loop.train_seed(_seed_job(tmp_path / "crashed", checkpoint_every_s=1e9), resume=saved)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    _assert_same_weights(resumed["state_dict"], reference["state_dict"])


def test_a_failed_checkpoint_write_raises_in_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    job = _seed_job(tmp_path, checkpoint_every_s=0.0)
    job.checkpoint_path = blocker / "checkpoint.pt"
    with pytest.raises(files.CheckpointError, match="could not write checkpoint"):
        loop.train_seed(job)


# ---------------------------------------------------------------- 3 + 4. stop signals, changed config
@pytest.mark.slow
def test_sigterm_saves_mid_epoch_marks_killed_and_resume_is_exact(tmp_path, procs, reference):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGTERM)
    assert _wait(proc, 60, proj / "train.log") == 143
    saved = load_pt(ckpt)
    assert saved["epoch"] >= 1 and saved["step"] > 0  # a stop saves mid-epoch, at a step boundary
    assert "SIGTERM received" in _log(proj)
    assert _status(proj, saved["run_id"]) == "KILLED"
    assert [r.info.status for r in runs(proj, kind="variant")] == ["KILLED"]  # not left RUNNING

    done = run_cli(proj, *SINGLE, env=venv_env())
    assert f"resuming seed 0 at epoch {saved['epoch'] + 1} step {saved['step']}" in done.stderr
    final = load_pt(proj / SEED0 / "model.pt")
    assert final["run_id"] == saved["run_id"]
    assert [r.info.status for r in runs(proj, kind="seed")] == ["FINISHED"]
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED"]
    _assert_same_weights(final["state_dict"], reference["state_dict"])  # mid-epoch resume is exact too


@pytest.mark.slow
def test_changed_config_refuses_to_resume_until_fresh(tmp_path, procs):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the same graceful stop as SIGTERM
    assert _wait(proc, 60, proj / "train.log") == 128 + signal.SIGINT  # 130, as for any Ctrl-C
    assert "SIGINT received" in _log(proj)
    killed = load_pt(ckpt)["run_id"]
    assert _status(proj, killed) == "KILLED"
    before = ckpt.read_bytes()

    write_params(proj, train={"epochs": LONG_EPOCHS, "lr": 0.02})  # was 0.05
    refused = run_cli(proj, *SINGLE, env=venv_env(), check=False)
    assert refused.returncode == 1
    assert "--fresh" in refused.stderr and str(WORK0 / "checkpoint.pt") in refused.stderr
    assert ckpt.read_bytes() == before
    assert [r.info.run_id for r in runs(proj, kind="seed")] == [killed]
    assert len(runs(proj, kind="variant")) == 1  # refused before any run was created

    run_cli(proj, *SINGLE, "--fresh", "--set", "train.epochs=1", env=venv_env())
    fresh = load_pt(proj / SEED0 / "model.pt")["run_id"]
    assert fresh != killed and not ckpt.exists() and not (proj / WORK).exists()
    seeds = {(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")}
    assert seeds == {(killed, "KILLED"), (fresh, "FINISHED")}


@pytest.mark.slow
def test_sigterm_to_ddp_launcher_stops_every_worker(tmp_path, procs):
    # 6 steps per epoch, fewer than train.stop_check_every (20): ranks must also agree at epoch ends.
    proj = long_project(tmp_path / "proj", per_class=12)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *DDP, env=_hook_env(tmp_path, AMPBENCH_TEST_NO_MLFLOW="1"))
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)  # proves rank 1 never used MLflow
    time.sleep(0.3)
    tree = procs.adopt(descendants(proc.pid))
    assert len(tree) >= 2, f"expected 2 workers under the launcher (torchrun's agent), found {tree}"
    os.kill(proc.pid, signal.SIGTERM)  # the launcher only; its torchrun agent stops the workers
    assert _wait(proc, 90, proj / "train.log") == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tree if alive(p)], "DDP processes outlived the launcher"
    log = _log(proj)
    assert log.count("SIGTERM received") == 2
    assert "[rank 0] ampbench.stages.train_main: stopped at epoch" in log
    assert "To resume, run the same command again: ampbench train --parallel ddp" in log
    saved = load_pt(ckpt)
    assert saved["step"] > 0  # the stop saved a checkpoint (epoch-end saves have step 0)
    assert _status(proj, saved["run_id"]) == "KILLED"


@pytest.mark.slow
def test_sigkill_of_ddp_launcher_group_leaves_no_orphan_workers(tmp_path, procs):
    """torchrun starts each worker in a session of its own, so kill -9 of the launcher's process
    group (a CI timeout, `kill -9 -PGID`) reaches the launcher and torchrun but not the workers."""
    proj = long_project(tmp_path / "proj", per_class=12, epochs=10)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *DDP)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.3)
    tree = procs.adopt(descendants(proc.pid))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tree if alive(p)], "orphaned DDP workers kept running"
    assert "parent process" in _log(proj) and "is gone" in _log(proj)
    assert not (proj / DDP_WORK0 / "model.pt").exists()  # they stopped instead of finishing
    assert not (proj / "models").exists()
    saved = load_pt(ckpt)
    assert saved["step"] > 0 and _status(proj, saved["run_id"]) == "KILLED"


# ---------------------------------------------------------------- 5. crashes and hangs
@pytest.mark.slow
def test_crashing_ddp_worker_ends_job_with_its_traceback(tmp_path, procs):
    proj = long_project(tmp_path / "proj", per_class=12)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    # Rank 1 raises at its 8th step: the 2nd step of epoch 2 (6 steps per epoch).
    proc = procs.start(proj, *DDP, env=_hook_env(tmp_path, AMPBENCH_TEST_FAULT="1:8"))
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    t0 = time.monotonic()
    code = _wait(proc, 120, proj / "train.log")
    assert code != 0 and time.monotonic() - t0 < 60
    log = _log(proj)
    assert "RuntimeError: injected fault: rank 1 step 8" in log  # the worker's own traceback
    assert "Root Cause" in log and "rank      : 1" in log
    saved = load_pt(ckpt)
    assert saved["epoch"] == 1  # a crash loses at most the current epoch
    assert _status(proj, saved["run_id"]) == "FAILED"


@pytest.mark.slow
def test_exception_in_training_marks_run_failed(tmp_path, project):
    # Single process: 3 steps per epoch, the fault hits the 5th step (epoch 2).
    proc = run_cli(project, *SINGLE, env=_hook_env(tmp_path, AMPBENCH_TEST_FAULT="0:5"), check=False)
    assert proc.returncode == 1
    assert "RuntimeError: injected fault: rank 0 step 5" in proc.stderr
    (run,) = runs(project, kind="seed")
    assert run.info.status == "FAILED"
    assert [r.info.status for r in runs(project, kind="variant")] == ["FAILED"]
    assert load_pt(project / WORK0 / "checkpoint.pt")["epoch"] == 1
    assert _run_json(project)["run_id"] == run.info.run_id


def test_launcher_restores_its_signal_handlers_and_fails_runs_on_any_agent_error(project, monkeypatch):
    """torchrun's agent runs in the launcher: whatever way it fails, the launcher's own signal
    handlers come back (a later Ctrl-C is a KeyboardInterrupt again) and dangling runs are ended."""
    from torch.distributed import run as torch_run

    def broken_agent(args):  # e.g. a rendezvous error, after installing its handlers
        signal.signal(signal.SIGTERM, lambda *a: None)
        signal.signal(signal.SIGINT, lambda *a: None)
        raise RuntimeError("rendezvous failed")

    failed_runs = []
    monkeypatch.setattr(torch_run, "main", broken_agent)
    monkeypatch.setattr(launch, "_fail_dangling_runs", lambda cfg, work: failed_runs.append(work))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    cfg = config.load_config(project / "params.yaml")
    assert launch.torchrun(list(DDP), cfg, project / "checkpoints" / "ddp-fp32", "To resume: again") == 1
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert failed_runs == [project / "checkpoints" / "ddp-fp32"]


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_dangling_runs_are_failed_after_a_failed_ddp_job(project, monkeypatch):
    """If rank 0 itself dies (kill -9, OOM killer) nobody ends its run: the launcher does."""
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    for key in [k for k in os.environ if k.startswith(("MLFLOW_", "DVC_"))]:
        monkeypatch.delenv(key)
    cfg = config.load_config("params.yaml")
    tracker = Tracker.from_config(cfg)
    running = tracker.start("ddp-fp32/seed-0", {}, {})
    finished = tracker.start("ddp-fp32/seed-1", {}, {})
    tracker.end(finished, "FINISHED")
    variant = Path("checkpoints/ddp-fp32")  # run.json: written before the first checkpoint
    for seed, run_id in ((0, running), (1, finished)):
        (variant / f"seed-{seed}").mkdir(parents=True)
        record = {"run_id": run_id, "config_digest": "x"}
        (variant / f"seed-{seed}" / "run.json").write_text(json.dumps(record))

    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def dead_job(args):  # torchrun's agent, after a worker died
        raise ChildFailedError("ampbench", {0: ProcessFailure(0, pid=1, exitcode=-9, error_file="<N/A>")})

    monkeypatch.setattr(torch_run, "main", dead_job)
    assert launch.torchrun(list(DDP), cfg, variant, "To resume: again") == 1
    assert _status(project, running) == "FAILED"
    assert _status(project, finished) == "FINISHED"


HANG = """
import os, sys, time
rank, port, timeout = sys.argv[1:]
os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
import torch
from ampbench.training import parallel

ddp = parallel.Distributed(collective_timeout_s=float(timeout))
ddp.setup()
if rank == "1":
    time.sleep(300)  # alive, but never joins the collective
t0 = time.monotonic()
try:
    ddp.all_sum(torch.ones(1))
    print("RETURNED")
except Exception as err:
    print(f"RAISED after {time.monotonic() - t0:.2f} s: {type(err).__name__}: {err}", flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_hung_collective_times_out(tmp_path, procs):
    (tmp_path / "hang.py").write_text(HANG)
    port, timeout = str(free_port()), 2
    env = venv_env()
    cmd = [sys.executable, "hang.py", "1", port, str(timeout)]
    peer = procs.start(tmp_path, name="rank1", env=env, cmd=cmd)
    rank0 = subprocess.run(
        [sys.executable, "hang.py", "0", port, str(timeout)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert peer.poll() is None  # rank 1 was alive all along: a hang, not a crash
    out = rank0.stdout + rank0.stderr
    assert "RAISED after" in out, out
    waited = float(out.split("RAISED after ")[1].split(" s")[0])
    assert timeout - 0.5 <= waited < timeout + 20, out
    assert "Timed out" in out or "timeout" in out.lower(), out


# ---------------------------------------------------------------- 6. numeric faults
class _Recorder:
    def __init__(self) -> None:
        self.metrics: list[dict] = []

    def on_epoch(self, epoch: int, metrics: dict) -> None:
        self.metrics.append(metrics)


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _train_in_process(tmp_path: Path, precision_name: str, **train) -> tuple[dict, list[dict]]:
    """trainer.train_seed directly (no MLflow): 60 images, batch 20, 3 steps per epoch."""
    cfg = config.load_config(REPO / "params.yaml")
    cfg = config.replace(
        cfg,
        model={"fc_dim": 32},
        train={"epochs": 3, "batch_size": 20, "seeds": (0,), "checkpoint_every_s": 0.0, "lr": 0.05, **train},
    )
    strategy = parallel.Single()
    strategy.setup()
    job = loop.Job(
        cfg, precision.REGISTRY[precision_name], strategy, make_dataset(), 0, tmp_path / "checkpoint.pt"
    )
    hooks = _Recorder()
    out = loop.train_seed(job, hooks)
    return out["result"].to_dict(), hooks.metrics


def test_nonfinite_loss_is_divergence(tmp_path, one_thread):
    result, metrics = _train_in_process(tmp_path, "fp32", lr=1e30)
    assert result["diverged"] and result["diverged_epoch"] == 1
    assert metrics[0]["nonfinite_losses"] > 0
    assert 0 <= result["diverged_step"] < 3
    assert result["epochs_completed"] == 1  # training stops at the diverged epoch


# Slow: five epochs of bfloat16 autocast, emulated on CPUs without native bfloat16 (AVX2 only).
@pytest.mark.slow
def test_gradscaler_scale_below_floor_is_divergence(tmp_path, one_thread):
    result, metrics = _train_in_process(tmp_path, "autocast_gradscaler", scale_floor=1e30)
    assert result["grad_scaler_used"]  # GradScaler('cpu') is real on CPU
    assert metrics[0]["nonfinite_losses"] == 0 and metrics[0]["skipped_steps"] == 0
    assert metrics[0]["grad_scale"] < 1e30
    assert result["diverged"] and result["diverged_epoch"] == 1 and result["epochs_completed"] == 1
    healthy, _ = _train_in_process(tmp_path, "autocast_gradscaler", epochs=2)
    assert not healthy["diverged"]  # the default floor does not flag a healthy run


@pytest.mark.slow
def test_gradscaler_skipped_steps_are_logged(project):
    run_cli(
        project,
        "train",
        "--parallel",
        "single",
        "--precision",
        "autocast_gradscaler",
        "--set",
        "train.lr=1e30",
    )
    (run,) = runs(project, kind="seed")
    assert run.info.status == "FINISHED"
    assert run.data.params["grad_scaler_used"] == "True"
    assert run.data.metrics["amp/skipped_steps"] > 0 and run.data.metrics["amp/nonfinite_losses"] > 0
    # Skipping non-finite steps is the scaler doing its job; only a collapsed scale (below
    # train.scale_floor) or non-finite weights count as divergence.
    assert run.data.metrics["train/diverged"] == 0 and run.data.tags["diverged"] == "false"


# ---------------------------------------------------------------- 7. nothing runs as something it is not
@pytest.mark.slow
def test_dp_without_gpus_records_one_device_and_warns(project):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ GPUs: DataParallel really splits the batch here")
    proc = run_cli(project, "train", "--parallel", "dp", "--precision", "fp32")
    assert "effectively single-device" in proc.stderr
    (run,) = runs(project, kind="seed")
    params = run.data.params
    assert params["devices_used"] == "1" and params["world_size"] == "1"
    assert params["grad_scaler_used"] == "False" and params["autocast_used"] == "False"


def test_autocast_unavailable_is_reported_as_not_used(monkeypatch, caplog):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    model = torch.nn.Linear(2, 2)
    run = precision.REGISTRY["autocast"].setup(model, torch.device("cpu"))
    assert run.facts["autocast_used"] is False and run.facts["amp_dtype"] == "float32"
    assert run.wrap(model) is model  # no autocast wrapper where autocast cannot run
    assert "autocast is not available" in caplog.text


def test_gradscaler_disabled_by_pytorch_is_reported_as_not_used(caplog):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: GradScaler('cuda') is really enabled here")
    prec = precision.REGISTRY["autocast_gradscaler"]
    run = prec.setup(torch.nn.Linear(2, 2), torch.device("cuda"))
    assert run.facts["grad_scaler_used"] is False
    assert "GradScaler requested but disabled" in caplog.text


# ---------------------------------------------------------------- 8. checkpoints that are not weights
class _Payload:
    """Unpickling this would create a folder: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.mark.parametrize("kind", ["object", "function"])
def test_checkpoint_that_is_not_plain_weights_is_rejected(project, tmp_path, kind):
    marker = tmp_path / "code-ran"
    model_pt = _unsafe_model_pt(project, marker, kind)
    with pytest.raises(files.CheckpointError, match="not a readable plain-weights checkpoint"):
        files.load(model_pt)
    assert not marker.exists()


def test_files_of_another_format_or_kind_or_lacking_fields_are_refused_with_the_fix(tmp_path):
    ckpt = tmp_path / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt"
    files.save({"epoch": 1, "run_id": "x", "config_digest": "d"}, ckpt)  # an older version's dict
    with pytest.raises(files.CheckpointError) as err:
        SeedCheckpoint.load(ckpt)
    message = str(err.value)
    assert str(ckpt) in message and "older ampbench (checkpoint format 1" in message and "--fresh" in message

    model_pt = ckpt.with_name("model.pt")
    model = ModelFile({}, {}, "single-fp32", 0, "r", "v", "d", [], NOTHING_MEASURED, [], None)
    model.save(model_pt)
    assert ModelFile.load(model_pt) == model
    assert model.matches("d", "single-fp32") and not model.matches("d", "single-autocast")
    with pytest.raises(files.CheckpointError, match="is a 'model' file, not a checkpoint file"):
        SeedCheckpoint.load(model_pt)
    raw = files.load(model_pt)
    del raw["history"]
    files.save(raw, model_pt)
    fix = "re-train: `ampbench train --parallel single --precision fp32`"
    with pytest.raises(files.CheckpointError, match=f"lacks history .*{re.escape(fix)}"):
        ModelFile.load(model_pt)
    files.save({**raw, "format": ModelFile.FORMAT + 1}, model_pt)
    with pytest.raises(files.CheckpointError, match="written by a newer ampbench"):
        ModelFile.load(model_pt)


def test_fresh_discards_a_checkpoint_that_cannot_be_resumed(tmp_path):
    """Without --fresh an old-format checkpoint stops the stage (its message says --fresh); with it,
    the checkpoint is discarded and the seed starts over."""
    from ampbench.checkpoints import work

    ckpt = tmp_path / "checkpoint.pt"
    files.save({"epoch": 1, "run_id": "x", "config_digest": "d", "variant": "single-fp32"}, ckpt)
    with pytest.raises(files.CheckpointError, match="--fresh"):
        work.load_resume(ckpt, "d", "single-fp32", False, parallel.Single())
    assert ckpt.exists()
    assert work.load_resume(ckpt, "d", "single-fp32", True, parallel.Single()) is None
    assert not ckpt.exists()


@pytest.mark.slow
def test_evaluate_stage_refuses_a_model_that_is_not_plain_weights(project, tmp_path):
    """The evaluate stage goes through the same files.load: one end-to-end run is enough."""
    marker = tmp_path / "code-ran"
    _unsafe_model_pt(project, marker, "object")
    proc = run_cli(project, "evaluate", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 1
    assert "not a readable plain-weights checkpoint" in proc.stderr and str(SEED0 / "model.pt") in proc.stderr
    assert not marker.exists()


def _unsafe_model_pt(project: Path, marker: Path, kind: str) -> Path:
    """A model.pt whose unpickling would run code (an object's __reduce__, or a function)."""
    model_pt = project / SEED0 / "model.pt"
    model_pt.parent.mkdir(parents=True)
    payload = _Payload(marker) if kind == "object" else os.getcwd
    torch.save({"state_dict": payload, "config": {}, "classes": [], "run_id": "x"}, model_pt)
    return model_pt


def _fake_model(
    project: Path, variant: str, seed: int, run_id: str = "0" * 32, weights_fc_dim: int = 32
) -> ModelFile:
    """A model.pt as training writes it (no training needed), weights from an AlexNet of `weights_fc_dim`."""
    from ampbench.training.model import AlexNet

    cfg = config.load_config(project / "params.yaml")
    net = AlexNet(config.replace(cfg, model={"fc_dim": weights_fc_dim}).model, 10)
    return ModelFile(
        state_dict=net.state_dict(),
        config=dataclasses.asdict(cfg),
        variant=variant,
        seed=seed,
        run_id=run_id,
        variant_run_id=None,  # no variant run: evaluate logs no aggregates
        config_digest=cfg.digest(),
        classes=list(make_dataset()["classes"]),
        result=NOTHING_MEASURED,
        history=[{"epoch": 1}],
        pending_metrics=None,
    )


def _evaluate(project: Path, variant: str, tracker=None) -> dict:
    from ampbench.data import prepared
    from ampbench.stages import evaluate

    dataset = prepared.load_dataset(project / "data" / "prepared" / "cifar10.pt")
    return evaluate.evaluate_variant(variant, (0,), project / "models", dataset, project / "reports", tracker)


@pytest.mark.parametrize(("variant", "seed"), [("single-autocast", 0), ("single-fp32", 1)])
def test_model_of_another_variant_or_seed_is_refused(project, variant, seed):
    """A model.pt copied into another variant's (or seed's) folder must not be scored as that one."""
    from ampbench.stages.evaluate import ModelFileError

    _fake_model(project, variant, seed).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32")
    message = str(err.value)
    assert f"{variant!r} seed {seed}" in message and "'single-fp32' seed 0" in message, message
    assert str(project / SEED0 / "model.pt") in message
    assert not (project / "reports" / "metrics").exists()
    _fake_model(project, "single-fp32", 0).save(project / SEED0 / "model.pt")
    assert _evaluate(project, "single-fp32")["seeds"][0]["run_id"] == "0" * 32  # the right file passes


def test_model_whose_weights_do_not_match_its_config_is_refused(project):
    from ampbench.stages.evaluate import ModelFileError

    _fake_model(project, "single-fp32", 0, weights_fc_dim=16).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32")
    message = str(err.value)
    assert "weights do not match the model config stored with them" in message
    assert "size mismatch" in message and "dvc repro -f train@single-fp32" in message, message


def test_model_whose_run_is_not_in_the_store_is_refused(project, monkeypatch):
    from ampbench.stages.evaluate import ModelFileError
    from ampbench.tracking.tracker import Tracker

    uri = f"sqlite:///{project / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_id = "f" * 32
    _fake_model(project, "single-fp32", 0, run_id=run_id).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32", Tracker("cifar10-amp"))
    message = str(err.value)
    assert run_id in message and uri in message and "MLFLOW_TRACKING_URI" in message, message
    assert not (project / "reports" / "metrics").exists()


def test_evaluate_logs_each_model_as_a_reference_with_its_scores(project, monkeypatch):
    """tracking.log_model: reference (the default): one external MLflow model per seed, pointing at
    the model file, the seed's test scores linked to it, and no copy of the weights in the store."""
    from ampbench.data import prepared
    from ampbench.stages import evaluate
    from ampbench.tracking.tracker import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.chdir(project)
    tracker = Tracker("cifar10-amp")
    run_id = tracker.start("single-fp32/seed-0", {"ampbench.kind": "seed"})
    _fake_model(project, "single-fp32", 0, run_id=run_id).save(project / SEED0 / "model.pt")
    dataset = prepared.load_dataset(project / "data" / "prepared" / "cifar10.pt")
    summary = evaluate.evaluate_variant(
        "single-fp32", (0,), project / "models", dataset, project / "reports", tracker, log_model="reference"
    )
    models = tracker.client.search_logged_models([tracker.experiment_id()])
    assert [(m.name, m.source_run_id) for m in models] == [("single-fp32-seed-0", run_id)]
    model = models[0]
    assert model.tags["mlflow.model.isExternal"] == "true"
    assert (project / model.tags["ampbench.model_file"]).resolve() == (project / SEED0 / "model.pt").resolve()
    linked = {m.key: m.value for m in model.metrics}
    assert linked["test/accuracy"] == summary["seeds"][0]["test_accuracy"]
    assert tracker.client.get_run(run_id).data.metrics["test/accuracy"] == linked["test/accuracy"]
    stored = [f for f in (project / "mlruns").rglob("*") if f.is_file()]
    assert stored and all(f.stat().st_size < 1_000_000 for f in stored)  # stubs and PNGs, no weights


def _module_file(module: str) -> Path | None:
    """The file Python runs for an ampbench module (`x.py` or `x/__init__.py`); None for others."""
    base = REPO / "src" / Path(*module.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()), None)


def _ampbench_imports(module: str) -> set[str]:
    """ampbench modules that `module` imports anywhere in its file (lazy imports in functions too)."""
    import ast

    tree = ast.parse(_module_file(module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from ampbench import data`
    return {m for m in found if m.split(".")[0] == "ampbench" and _module_file(m)}


def _import_closure(module: str) -> set[str]:
    """`module` and every ampbench module it imports, transitively; each package's __init__ too."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            parts = m.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # packages run their __init__
            todo += _ampbench_imports(m)
    return seen


def _command_code(command: str) -> set[Path]:
    """The files `ampbench <command>` runs: the CLI, the command's main (cli.COMMANDS) and their
    imports, and the processes they start as `python -m ampbench [helper]` (torchrun's workers, the
    system-metrics sampler), found by those names in the code."""
    from ampbench import cli

    modules = _import_closure("ampbench.cli") | _import_closure(cli.command_module(command).__name__)
    while True:
        text = "".join(_module_file(m).read_text() for m in modules - {"ampbench.cli"})
        started = {"ampbench.__main__"} if '"-m", "ampbench"' in text else set()
        started |= {target.split(":")[0] for name, target in cli.HELPERS.items() if f'"{name}"' in text}
        more = set().union(*map(_import_closure, started)) - modules
        if not more:
            return {_module_file(m) for m in modules}
        modules |= more


def test_every_stage_depends_on_all_the_code_it_runs():
    """A stage whose deps miss a module it imports keeps stale results after that module changes; one
    whose deps cover code it never runs re-runs for nothing (a report wording fix retraining)."""
    import tomllib

    import yaml

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    stages.update(yaml.safe_load((REPO / "explain" / "dvc.yaml").read_text())["stages"])  # outside the study
    missing, extra, code = {}, {}, {}
    for name, stage in stages.items():
        program, command = stage["cmd"].split()[:2]
        assert scripts[program] == "ampbench.cli:run", stage["cmd"]
        code[name] = _command_code(command)
        deps = [REPO / d for d in stage["deps"]]
        uncovered = [f for f in code[name] if not any(f.is_relative_to(d) for d in deps)]
        covered = {f for d in deps if d.is_relative_to(REPO / "src") for f in [d, *d.rglob("*.py")]}
        unused = [f for f in covered if f.suffix == ".py" and f not in code[name]]
        missing.update({name: sorted(str(f.relative_to(REPO)) for f in uncovered)} if uncovered else {})
        extra.update({name: sorted(str(f.relative_to(REPO)) for f in unused)} if unused else {})
    assert code["explain"] and stages["explain"]["wdir"] == ".."  # its paths are the root's
    assert not missing, f"dvc.yaml stages lack deps on code they import: {missing}"
    assert not extra, f"dvc.yaml stages depend on code they never run (list files instead): {extra}"
    # The walk itself: lazy imports inside functions are followed, started processes too, and the
    # stages stay apart (comparing trains nothing, the report's prose re-runs nothing).
    src = REPO / "src" / "ampbench"
    assert {src / "stages" / "train.py", src / "training" / "loop.py", src / "__main__.py"} <= code["train"]
    assert not any(f.is_relative_to(src / "training") for f in code["compare"] | code["download"])
    assert all(src / "report" / "findings.py" not in files for files in code.values())


@pytest.mark.slow
def test_bytecode_caches_are_not_part_of_the_code_dependency(tmp_path):
    """Importing src/ampbench writes __pycache__ there; as part of the dep, every run would change it."""
    shutil.copy(REPO / ".dvcignore", tmp_path / ".dvcignore")
    dvc = str(VENV_BIN / "dvc")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=tmp_path, env=venv_env(), check=True, timeout=120)
    check = [
        str(VENV_BIN / "dvc"),
        "check-ignore",
        "src/ampbench/__pycache__/cli.cpython-311.pyc",
        "src/ampbench/cli.py",
    ]
    out = subprocess.run(check, cwd=tmp_path, env=venv_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["src/ampbench/__pycache__/cli.cpython-311.pyc"], out.stdout + out.stderr


# ---------------------------------------------------------------- 9. bad configuration
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
    assert proc.returncode == 1
    assert "train.batch_size=100 is larger than the train set (60 images)" in proc.stderr
    _no_side_effects(project)


def test_more_ddp_workers_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match=r"2 processes on this node but only 1 GPU\(s\)"):
        parallel.Distributed().setup()


# ---------------------------------------------------------------- 10. tracking
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
        assert _wait(proc, 240, project / f"{name}.log") == 0, _log(project, name)
    finished = [r for r in runs(project) if r.info.status == "FINISHED"]
    assert sorted(r.info.run_name for r in finished) == [
        "single-autocast",
        "single-autocast/seed-0",
        "single-fp32",
        "single-fp32/seed-0",
    ]
    run_cli(project, *SINGLE, "--set", "train.seeds=[1]")  # the store stays usable
    assert len(runs(project, kind="seed")) == 3


# ---------------------------------------------------------------- 11. dependencies
@pytest.mark.slow
def test_installed_packages_have_no_known_vulnerabilities(tmp_path):
    """pip-audit of the installed environment against PyPI's vulnerability data (needs pypi.org)."""
    report = tmp_path / "audit.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip_audit",
            "--local",
            "--skip-editable",
            "--progress-spinner",
            "off",
            "--format",
            "json",
            "--output",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    if not report.exists():
        pytest.fail(f"pip-audit produced no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    deps = json.loads(report.read_text())["dependencies"]
    vulns = [
        f"{d['name']} {d['version']}: {v['id']} (fixed in: {', '.join(v['fix_versions']) or '-'})"
        for d in deps
        for v in d.get("vulns", [])
    ]
    deps = [d for d in deps if "editable" not in d.get("skip_reason", "")]  # ampbench itself
    skipped = [f"{d['name']}: {d['skip_reason']}" for d in deps if d.get("skip_reason")]
    if deps and len(skipped) == len(deps) and not vulns:
        # Not silent: the skip reason is printed in pytest's summary (-ra). Machines whose package
        # index is a mirror without PyPI's JSON API (this project's CI) cannot audit at all.
        pytest.skip(
            f"pip-audit could audit none of the {len(deps)} installed packages: no vulnerability data "
            f"reachable from this machine (first: {skipped[0]}); run it where pypi.org is reachable"
        )
    problems = []
    if vulns:
        problems.append("known vulnerabilities:\n  " + "\n  ".join(vulns))
    if skipped:  # pip-audit still says "No known vulnerabilities found" and exits 0 for these
        problems.append(
            f"{len(skipped)} of {len(deps)} packages could not be audited, so the audit proves nothing "
            "(pip-audit asks https://pypi.org/pypi/<name>/<version>/json; is pypi.org reachable and "
            "serving its JSON API?):\n  " + "\n  ".join(skipped[:10])
        )
    assert not problems, "\n".join(problems)


def test_stale_temp_file_of_a_killed_writer_is_removed(tmp_path):
    path = tmp_path / "checkpoint.pt"
    stale = tmp_path / ".checkpoint.pt.tmp-99999"
    stale.write_bytes(b"half a checkpoint")
    files.save({"epoch": 1}, path)
    assert not stale.exists()
    assert files.load(path) == {"epoch": 1}


def test_the_import_graph_has_no_cycle_and_no_stage_is_imported_from_below():
    """Every module's imports (lazy ones too) form no cycle; only stages/ and commands/ import them
    (the CLI names each command's module as a string), so a capability folder never reaches up into
    a command."""
    src = REPO / "src"
    modules = {
        ".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for f in src.rglob("*.py")
    }
    graph = {m: set(_ampbench_imports(m)) - {m} for m in modules}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            assert state.get(other) != 1, f"import cycle: {' -> '.join([*path, module, other])}"
            if other not in state:
                visit(other, [*path, module])
        state[module] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [])
    entries = ("ampbench.stages.", "ampbench.commands.")  # what cli.COMMANDS names
    upward = {m: sorted(i for i in graph[m] if i.startswith(entries)) for m in modules}
    assert not {m: i for m, i in upward.items() if i and not m.startswith(entries)}


def test_no_module_over_300_lines_and_no_function_over_60():
    """Modules with one job and functions that fit a screen (the package's layout rule)."""
    import ast

    big = []
    for f in sorted((REPO / "src" / "ampbench").rglob("*.py")):
        text = f.read_text()
        if text.count("\n") > 300:
            big.append(f"{f.relative_to(REPO)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.end_lineno - node.lineno >= 60
            ):
                big.append(
                    f"{f.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
                )
    assert not big, big
