"""A stop under `make run DATA=...`, as a user makes it: Ctrl-C in the terminal, which signals make's
whole process group. One line says what was saved, where and the command that resumes; make ends
by the signal (status 130) with no DVC error and no make error; that command resumes exactly there.
"""

from __future__ import annotations

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

from conftest import (
    LONG_DATA,
    LONG_EPOCHS,
    REPO,
    VENV_BIN,
    image_folder_archive,
    venv_env,
    wait_for_checkpoint,
    write_params,
)


def sh(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


def _make_project(proj: Path) -> None:
    """A committed git + DVC copy of the project (Makefile, dvc.yaml, src) with one variant, long
    enough to be stopped, and a stand-in .venv whose tools are this one's (nothing to install)."""
    for name in ("Makefile", "dvc.yaml", ".dvcignore", ".gitignore", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, proj / name)
    shutil.copytree(REPO / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    write_params(
        proj,
        train={"epochs": LONG_EPOCHS, "seeds": [0]},
        variants={"parallel": ["single"], "precision": ["fp32"]},
    )
    venv = proj / ".venv" / "bin"
    venv.mkdir(parents=True)
    for tool in ("dvc", "ampbench"):
        (venv / tool).symlink_to(VENV_BIN / tool)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # its own prefix
    (venv / "python").chmod(0o755)
    (proj / ".venv" / ".installed").touch()  # newer than requirements.txt: `make install` is done
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (git + ["init", "-q"], [str(VENV_BIN / "dvc"), "init", "-q"], git + ["add", "-A"]):
        sh(cmd, proj)
    sh(git + ["commit", "-qm", "project"], proj)


@pytest.mark.slow
def test_ctrl_c_of_make_run_says_how_to_resume_and_the_rerun_resumes(tmp_path: Path, procs):
    """Ctrl-C (SIGINT to make's process group, as a terminal sends it) during a train stage of
    `make run DATA=...`: one line says what was saved where and the command that resumes; no DVC
    error, no make error, status 130. That command then resumes at the step the stop named."""
    proj = tmp_path / "proj"
    proj.mkdir()
    archive = image_folder_archive(tmp_path, per_class=LONG_DATA, test_per_class=3)
    _make_project(proj)
    env = venv_env(PYTHONPATH=str(proj / "src"))
    make = ["make", "run", f"DATA={archive}"]
    proc = procs.start(proj, cmd=make, env=env, name="stop")
    checkpoint = proj / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt"
    wait_for_checkpoint(proc, checkpoint, proj / "stop.log")
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(120) == -signal.SIGINT  # make ends by the signal: a shell shows status 130
    out = (proj / "stop.log").read_text()
    stop = re.search(
        r"stopped at seed 0 epoch (\d+) step (\d+); checkpoint saved in checkpoints/single-fp32/\. (.*)", out
    )
    assert stop, out
    assert stop[3] == f"To resume: make run DATA='{archive}'"  # quoted: a path with spaces pastes whole
    for noise in ("ERROR", "make: ***", "No file hash info", "Traceback"):
        assert noise not in out, out

    again = subprocess.run(make, cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text
    assert f"resuming seed 0 at epoch {stop[1]} step {stop[2]}" in text  # the stop's own numbers
    assert "No file hash info" not in text and "WARNING" not in text
    assert json.loads((proj / "reports" / "answer" / "single-fp32.json").read_text())["Speedup"] == 1.0


def _stopped_make_run(tmp_path: Path, procs, stop) -> str:
    """`make run DATA=...` stopped by ``stop(make's pid)`` once its train stage has a checkpoint;
    what it printed. It saved, said so, and neither DVC nor make added a line."""
    proj = tmp_path / "proj"
    proj.mkdir()
    archive = image_folder_archive(tmp_path, per_class=LONG_DATA, test_per_class=3)
    _make_project(proj)
    proc = procs.start(proj, cmd=["make", "run", f"DATA={archive}"], env=venv_env(), name="stopped")
    wait_for_checkpoint(
        proc, proj / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt", proj / "stopped.log"
    )
    signum = stop(proc.pid)
    assert proc.wait(120) == -signum  # make ends by the signal
    out = (proj / "stopped.log").read_text()
    saved = r"stopped at seed 0 epoch \d+ step \d+; checkpoint saved in checkpoints/single-fp32/\."
    assert re.search(saved, out), out
    for noise in ("ERROR", "make: ***", "Traceback"):
        assert noise not in out, out
    return out


@pytest.mark.slow
def test_sigterm_to_make_alone_stops_the_stage_with_a_checkpoint(tmp_path: Path, procs):
    """`kill <make's pid>` or `timeout 3h make run`: make passes SIGTERM to its recipe's shell
    only. The shell passes it on, the stage saves and says how to resume, and make ends by the
    signal at once (it used to wait for the whole training)."""
    _stopped_make_run(tmp_path, procs, lambda pid: os.kill(pid, signal.SIGTERM) or signal.SIGTERM)


@pytest.mark.slow
def test_a_hang_up_of_make_runs_group_stops_the_stage_without_a_make_error(tmp_path: Path, procs):
    """SIGHUP to the whole group (the terminal or SSH session of `make run` closed). Hostile
    re-run: the recipe's shell died of it at once and make said "make: *** wait: No child
    processes.  Stop." (or "... Hangup") beside the stage's stop line."""
    _stopped_make_run(tmp_path, procs, lambda pid: os.killpg(pid, signal.SIGHUP) or signal.SIGHUP)


@pytest.mark.slow
def test_make_run_says_a_params_fault_once(tmp_path: Path):
    """A params.yaml that the estimate refuses stops `make run` there: one line, not the same line
    again from the pipeline command, and no training."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _make_project(proj)
    with open(proj / "params.yaml", "a") as params:
        params.write("train:\n  epochs: 3\n")  # a second `train:` section
    proc = subprocess.run(
        ["make", "run"], cwd=proj, env=venv_env(), capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert len(re.findall(r"duplicate|twice|more than once", out)) == 1, out
    assert "dvc repro" not in out and "Traceback" not in out, out


@pytest.mark.slow
def test_make_run_in_a_busy_project_is_refused_before_the_estimate(tmp_path: Path):
    """Hostile re-run: a second `make run` said "busy" only after its estimate's 13 s of timing
    steps beside the running study."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _make_project(proj)
    running = subprocess.Popen(["sleep", "60"])
    try:
        lock = {"write": {"models/single-fp32": {"pid": running.pid, "cmd": "dvc repro"}}, "read": {}}
        (proj / ".dvc" / "tmp").mkdir(exist_ok=True)
        (proj / ".dvc" / "tmp" / "rwlock").write_text(json.dumps(lock))
        proc = subprocess.run(
            ["make", "run"], cwd=proj, env=venv_env(), capture_output=True, text=True, timeout=120
        )
    finally:
        running.kill()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"this project is busy: pid {running.pid} (dvc repro)" in out, out
    assert "ampbench estimate" not in out and "Traceback" not in out, out


@pytest.mark.slow
def test_make_run_with_data_naming_nothing_is_refused_before_params_change(tmp_path: Path):
    """Hostile re-run: `make run DATA=/nonexistent/c.tar.gz` timed the estimate first, then failed,
    leaving params.yaml holding that url for the next plain `make run`."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _make_project(proj)
    before = (proj / "params.yaml").read_text()
    missing = tmp_path / "no such" / "c.tar.gz"
    make = ["make", "run", f"DATA={missing}"]
    proc = subprocess.run(make, cwd=proj, env=venv_env(), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"DATA={missing}: no such file or folder; point DATA at" in out, out
    assert "ampbench estimate" not in out and "Traceback" not in out, out
    assert (proj / "params.yaml").read_text() == before


@pytest.mark.slow
def test_ctrl_c_during_make_runs_estimate_is_one_line_naming_make_run(tmp_path: Path, procs):
    """Hostile pass WARN: "interrupted (Ctrl-C): `ampbench estimate` stopped before it finished;
    run the same command again" (a command the user never typed), then make's "*** [Makefile:63:
    run] Interrupt"."""
    proj = tmp_path / "proj"
    proj.mkdir()
    _make_project(proj)
    proc = procs.start(proj, cmd=["make", "run"], env=venv_env(), name="make")
    deadline = time.monotonic() + 60
    while "ampbench estimate" not in (proj / "make.log").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, (proj / "make.log").read_text()
        time.sleep(0.1)
    time.sleep(1.5)  # the estimate imports torch
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == -signal.SIGINT  # make ends by the signal: a shell shows status 130
    out = (proj / "make.log").read_text()
    said = [line for line in out.splitlines() if "ERROR" in line or "make: ***" in line]
    assert len(said) == 1 and said[0].endswith(
        "interrupted (Ctrl-C): `ampbench estimate` stopped before it finished; nothing ran yet. "
        "To run the study: make run"
    ), out
    assert "dvc repro" not in out and "Traceback" not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGQUIT])
def test_a_batch_systems_signal_to_the_whole_job_stops_the_pipeline_with_its_status(
    tmp_path: Path, procs, sig
):
    """Hostile pass S: SIGQUIT or SIGUSR2 to the group of `python -m ampbench.dvc_run` (`scancel
    --signal`, Ctrl-\\, `timeout -s`): the stage saved, but the pipeline command died of it (-3,
    -12, no line), its DVC locks left for the next run to warn about. Now it waits for its stage
    and ends with 128 + the signal."""
    proj = tmp_path / "proj"
    proj.mkdir()
    archive = image_folder_archive(tmp_path, per_class=LONG_DATA, test_per_class=3)
    _make_project(proj)
    env = venv_env(PYTHONPATH=str(proj / "src"))
    cmd = [sys.executable, "-m", "ampbench.dvc_run", "exp", "run", "-S", f"data.url={archive}"]
    proc = procs.start(proj, cmd=cmd, env=env, name="stop")
    wait_for_checkpoint(proc, proj / "checkpoints/single-fp32/seed-0/checkpoint.pt", proj / "stop.log")
    os.killpg(proc.pid, sig)
    assert proc.wait(120) == 128 + sig, (proj / "stop.log").read_text()[-3000:]
    out = (proj / "stop.log").read_text()
    assert re.search(
        r"stopped at seed 0 epoch \d+ step \d+; checkpoint saved in checkpoints/single-fp32/", out
    )
    assert "Traceback" not in out and "failed to reproduce" not in out, out
