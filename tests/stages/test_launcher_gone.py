"""A stage whose pipeline tool dies stops as on SIGTERM (stages/stop.py ``watch_launcher``), and a
model too large for the host's memory under DDP is refused by the launcher before torchrun starts
(stages/launch.py ``check_fits``). docs/RELIABILITY.md maps each to its test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import (
    DDP,
    DDP_WORK0,
    REPO,
    SEED0,
    SINGLE,
    VENV_BIN,
    WORK0,
    alive,
    descendants,
    load_pt,
    long_project,
    new_project,
    run_cli,
    run_status,
    runs,
    stage_log,
    venv_env,
    wait_for_checkpoint,
)

FIND_LAUNCHER = "from ampbench.stages.stop import pipeline_launcher; print(pipeline_launcher())"


def _launcher_seen_by(shell_cmd: str, env: dict) -> str:
    """What pipeline_launcher() says in a python started by ``sh -c shell_cmd`` from this process."""
    out = subprocess.run(["sh", "-c", shell_cmd], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_launcher_is_the_process_that_set_dvc_stage_past_a_shell_that_stays():
    py = f"{sys.executable} -c '{FIND_LAUNCHER}'"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("DVC_STAGE", None)
    # `; true`: the shell cannot exec the command, so it stays between DVC (here: this test) and it
    assert _launcher_seen_by(f"{py}; true", {**env, "DVC_STAGE": "train@single-fp32"}) == str(os.getpid())
    # started from a user's shell (nohup ampbench train ... &): no pipeline, nothing watched
    assert _launcher_seen_by(f"{py}; true", env) == "None"


LAUNCHERS = {  # what started the stage: a plain `dvc repro`, and `make run`'s dvc with the stage plain
    "dvc": [str(VENV_BIN / "dvc")],
    "dvc_run": [sys.executable, "-m", "ampbench.dvc_run"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_kill_9_of_dvc_stops_its_plain_stage_as_sigterm_and_the_rerun_resumes(tmp_path, procs, launcher):
    proj = _dvc_project(tmp_path, epochs=20)
    ckpt = proj / WORK0 / "checkpoint.pt"
    repro = [*LAUNCHERS[launcher], "repro", "--single-item", "train@single-fp32"]
    proc = procs.start(proj, cmd=repro, env=venv_env(AMPBENCH_WARM="0"), name="dvc")
    wait_for_checkpoint(proc, ckpt, proj / "dvc.log", min_epoch=1)
    stage = procs.adopt([p for p in descendants(proc.pid) if "ampbench" in " ".join(_cmdline(p))])
    assert stage, f"no ampbench process under dvc: {descendants(proc.pid)}"
    os.kill(proc.pid, signal.SIGKILL)  # dvc only: before, its stage trained on with PPID 1
    proc.wait(30)
    deadline = time.monotonic() + 10  # a few seconds: it polls every 0.5 s
    while any(alive(p) for p in stage) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in stage if alive(p)], "the stage outlived dvc:\n" + stage_log(proj, "dvc")
    log = stage_log(proj, "dvc")
    assert "the pipeline that started this stage" in log and "is gone: stopping as on SIGTERM" in log
    # under DVC the line names the pipeline, whose re-run resumes (hostile pass L: its own command left
    # dvc.lock stale); the pipeline command names itself to its stages (hostile pass O)
    named = (
        "To resume: dvc repro --single-item train@single-fp32"
        if launcher == "dvc_run"
        else "To resume, run the pipeline command that started this stage again"
    )
    assert named in log, log
    assert "Traceback" not in log
    saved = load_pt(ckpt)
    assert saved["step"] > 0  # the stop saved mid-epoch, as a SIGTERM's does
    assert run_status(proj, saved["run_id"]) == "KILLED"
    assert [r.info.status for r in runs(proj, kind="variant")] == ["KILLED"]
    assert not (proj / SEED0).exists()

    done = run_cli(proj, *SINGLE, env=venv_env(), timeout=600)
    assert f"resuming seed 0 at epoch {saved['epoch'] + 1} step {saved['step']}" in done.stderr
    assert load_pt(proj / SEED0 / "model.pt")["run_id"] == saved["run_id"]
    assert [r.info.status for r in runs(proj, kind="seed")] == ["FINISHED"]


@pytest.mark.slow
def test_kill_9_of_dvc_stops_its_ddp_launcher_and_every_worker_as_sigterm(tmp_path, procs):
    proj = _dvc_project(tmp_path, per_class=12, epochs=60)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    proc = procs.start(
        proj, cmd=[str(VENV_BIN / "dvc"), "repro", "--single-item", "train@ddp-fp32"], name="dvc"
    )
    wait_for_checkpoint(proc, ckpt, proj / "dvc.log", min_epoch=1)
    tree = procs.adopt(descendants(proc.pid))  # the launcher (torchrun's agent) and its 2 workers
    assert len(tree) >= 3, tree
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 15  # a step boundary, a checkpoint, then torchrun's own wait
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = stage_log(proj, "dvc")
    assert not [p for p in tree if alive(p)], "DDP processes outlived dvc:\n" + log
    assert "is gone: stopping as on SIGTERM" in log and log.count("SIGTERM received") == 1
    assert "stopped by SIGTERM" in log
    saved = load_pt(ckpt)
    assert saved["step"] > 0 and run_status(proj, saved["run_id"]) == "KILLED"


def _dvc_project(tmp_path, **train):
    """A long project whose dvc.yaml's code dependencies exist, DVC-initialised."""
    proj = long_project(tmp_path / "proj", **train)
    shutil.copytree(
        REPO / "src" / "ampbench", proj / "src" / "ampbench", ignore=shutil.ignore_patterns("__pycache__")
    )
    dvc = str(VENV_BIN / "dvc")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=proj, env=venv_env(), check=True, timeout=120)
    return proj


def _cmdline(pid: int) -> list[str]:
    try:
        return (open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")).split("\0")
    except OSError:
        return []


def test_a_ddp_model_too_large_for_the_host_is_one_line_before_torchrun(tmp_path):
    proj = new_project(tmp_path / "proj")
    t0 = time.monotonic()
    out = run_cli(proj, *DDP, "--set", "model.fc_dim=200000", env=venv_env(), check=False, timeout=60)
    assert time.monotonic() - t0 < 30
    assert out.returncode == 2, out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "model.fc_dim: 200000 makes a model of" in lines[0]
    assert "for each of its 2 processes: choose a smaller model.fc_dim" in lines[0]
    assert "Traceback" not in out.stderr and "torchrun" not in out.stderr.lower()
    assert runs(proj) == []


@pytest.mark.parametrize("parallel", ["single", "ddp"])
def test_a_schedule_too_short_for_one_cycle_is_one_line_before_any_run(tmp_path, parallel):
    """The hostile re-run: `train.epochs=1` on a tiny train set (3 steps) was one line only after
    MLflow runs were made (single), and torchrun's report with a traceback (ddp)."""
    proj = new_project(tmp_path / "proj")
    args = ("train", "--parallel", parallel, "--precision", "fp32", "--set", "train.epochs=1")
    out = run_cli(proj, *args, env=venv_env(), check=False, timeout=60)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode != 0 and len(lines) == 1, lines
    assert "the one-cycle schedule needs at least 4" in lines[0]
    assert "Traceback" not in out.stderr and "torchrun" not in out.stderr.lower()
    assert runs(proj) == []


def test_a_stage_whose_launcher_died_before_it_looked_knows(tmp_path):
    """Hostile re-run: `mlflow run` SIGTERMed 0.5 s after starting its command left `ampbench
    variant` training as an orphan: by the time the stage looked for its launcher, none was left
    to watch. A stage reparented to init, which lacks the launcher's variable, stops at once."""
    out = tmp_path / "said"
    probe = (
        "import time; time.sleep(1.0); from ampbench.processes import orphaned_by; "
        f"open({str(out)!r}, 'w').write(str(orphaned_by('MLFLOW_RUN_ID')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_RUN_ID": "abc123"}
    # the shell starts the probe in the background and exits at once: the probe's launcher is gone
    subprocess.run(["sh", "-c", f'{sys.executable} -c "{probe}" &'], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert out.read_text() == "True"
    # a launcher still there (this test, past the shell that stays): not orphaned
    ask = 'from ampbench.processes import orphaned_by; print(orphaned_by("MLFLOW_RUN_ID"))'
    assert _launcher_seen_by(f"{sys.executable} -c '{ask}'; true", env) == "False"
