"""The train stage when training fails: a crashing DDP worker ends the job with its traceback, an
exception marks the runs FAILED, and the launcher ends the runs its dead workers left RUNNING.
Workers crash through conftest's TEST_HOOK (a sitecustomize.py): nothing in src/ knows about it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ampbench import config
from ampbench.stages import launch
from conftest import (
    DDP,
    DDP_WORK0,
    SINGLE,
    WORK0,
    hook_env,
    load_pt,
    long_project,
    run_cli,
    run_json,
    run_status,
    runs,
    stage_log,
    wait_exit,
    wait_for_checkpoint,
)


@pytest.mark.slow
def test_crashing_ddp_worker_ends_job_with_its_traceback(tmp_path, procs):
    proj = long_project(tmp_path / "proj", per_class=12)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    # Rank 1 raises at its 8th step: the 2nd step of epoch 2 (6 steps per epoch).
    proc = procs.start(proj, *DDP, env=hook_env(tmp_path, AMPBENCH_TEST_FAULT="1:8"))
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    t0 = time.monotonic()
    code = wait_exit(proc, 120, proj / "train.log")
    assert code != 0 and time.monotonic() - t0 < 60
    log = stage_log(proj)
    assert "RuntimeError: injected fault: rank 1 step 8" in log  # the worker's own traceback
    assert "Root Cause" in log and "rank      : 1" in log
    saved = load_pt(ckpt)
    assert saved["epoch"] == 1  # a crash loses at most the current epoch
    assert run_status(proj, saved["run_id"]) == "FAILED"


@pytest.mark.slow
def test_exception_in_training_marks_run_failed(tmp_path, project):
    # Single process: 3 steps per epoch, the fault hits the 5th step (epoch 2).
    proc = run_cli(project, *SINGLE, env=hook_env(tmp_path, AMPBENCH_TEST_FAULT="0:5"), check=False)
    assert proc.returncode == 1
    assert "RuntimeError: injected fault: rank 0 step 5" in proc.stderr
    (run,) = runs(project, kind="seed")
    assert run.info.status == "FAILED"
    assert [r.info.status for r in runs(project, kind="variant")] == ["FAILED"]
    assert load_pt(project / WORK0 / "checkpoint.pt")["epoch"] == 1
    assert run_json(project)["run_id"] == run.info.run_id


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
    assert run_status(project, running) == "FAILED"
    assert run_status(project, finished) == "FINISHED"
