"""A Ctrl-C at any moment of a pipeline command (``ampbench.dvc_run``, what `make run` / `make demo`
run) ends it without a traceback: while DVC and the warm server start, while a stage runs, and while
the command stops its warm server after the last stage. With nothing to reproduce, the command does
not wait for a server still importing torch.

The pipeline here is one stage of plain shell, so the moments are reached in seconds; the terminal's
Ctrl-C is a SIGINT to the command's process group (the warm server has a group of its own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import VENV_BIN, alive, venv_env

pytestmark = pytest.mark.slow  # each command starts a warm server: torch and MLflow imported

# The stage, a stand-in for ampbench's (which stop on SIGINT with one line): it waits until the
# warm server is ready (its socket exists), so that the command then stops a real, serving server;
# `hold` then sleeps, to be stopped while it runs.
STAGE = """
import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # as a stage stops: quietly, 130
socket = os.environ.get("AMPBENCH_WARM_SOCKET", "")
deadline = time.monotonic() + 240
while socket and not os.path.exists(socket) and time.monotonic() < deadline:
    time.sleep(0.1)
open("started", "w").close()
if sys.argv[1] == "hold":
    os.execvp("sleep", ["sleep", "120"])
open("out.txt", "w").write("done")
"""


def _project(folder: Path, mode: str) -> Path:
    folder.mkdir()
    (folder / "stage.py").write_text(STAGE)
    (folder / "dvc.yaml").write_text(
        f"stages:\n  work:\n    cmd: {sys.executable} stage.py {mode}\n"
        "    deps: [stage.py]\n    outs: [out.txt]\n"
    )
    subprocess.run([str(VENV_BIN / "dvc"), "init", "-q", "--no-scm"], cwd=folder, check=True)
    return folder


def _start(project: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ampbench.dvc_run", "repro"],
        cwd=project,
        env=venv_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the "terminal" the test presses Ctrl-C in
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {path.name}: {proc.communicate()[0]}"
        time.sleep(0.02)


def _ctrl_c_until_it_ends(proc: subprocess.Popen, every_s: float = 0.05, timeout: float = 60) -> str:
    """Ctrl-C, again and again (an impatient user), until the command has ended; its output."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the command did not end on Ctrl-C"
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(every_s)
    return proc.communicate(timeout=30)[0]


def _servers(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"warm server (\d+): ready", output)]


@pytest.mark.parametrize("moment", ["starting", "in the stage", "stopping the warm server"])
def test_ctrl_c_at_any_moment_gives_no_traceback(tmp_path: Path, moment: str):
    project = _project(tmp_path / "p", "hold" if moment == "in the stage" else "finish")
    proc = _start(project)
    if moment == "starting":
        time.sleep(0.3)  # DVC importing, or the warm server just started
    elif moment == "in the stage":
        _wait_for(project / "started", proc)
    else:  # the stage has finished: DVC writes its lock, then the command stops its server
        _wait_for(project / "out.txt", proc)
    output = _ctrl_c_until_it_ends(proc)
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    if moment == "stopping the warm server":
        assert proc.returncode in (0, 130), output  # finished, or stopped before DVC's last write
    else:
        # 130, or death by SIGINT once the line is out: Python's finalization restores SIGINT's
        # default, and a Ctrl-C every 50 ms may land then (a shell shows 130 for both)
        assert proc.returncode in (130, -signal.SIGINT), output
        assert "Stopped by SIGINT" in output and "To resume" in output, output


def test_nothing_to_reproduce_ends_at_once_and_quietly(tmp_path: Path):
    """`dvc repro` with everything up to date: "up to date" is the last line, and the command ends
    then, not once the warm server it started has imported torch (~8 s on a 2-core machine)."""
    project = _project(tmp_path / "p", "finish")
    first = subprocess.run(
        [sys.executable, "-m", "ampbench.dvc_run", "repro"],
        cwd=project,
        env=venv_env(),
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    said = first.stdout + first.stderr
    for noise in ("Updating lock file", "Generating lock file", "To track the changes", "dvc push"):
        assert noise not in said, f"{noise!r} in:\n{said}"
    assert not [line for line in said.splitlines() if line.startswith("> ") or not line.strip()], said
    assert "Running stage 'work'" in said
    proc = _start(project)
    lines, up_to_date_at = [], None
    for line in proc.stdout:
        lines.append(line)
        if "Data and pipelines are up to date." in line:
            up_to_date_at = time.monotonic()
    proc.wait(60)
    ended_at = time.monotonic()
    assert proc.returncode == 0 and up_to_date_at is not None, "".join(lines)
    assert ended_at - up_to_date_at < 2.0, f"{ended_at - up_to_date_at:.1f} s of silence after 'up to date'"
    assert lines[-1].strip() == "Data and pipelines are up to date.", "".join(lines)


def test_the_warm_server_is_gone_after_a_ctrl_c_while_it_stops(tmp_path: Path):
    """A Ctrl-C while the command stops its server ends the server too (at once, not 150 s later)."""
    project = _project(tmp_path / "p", "finish")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampbench.dvc_run", "repro"],
        cwd=project,
        env=venv_env(AMPBENCH_DEBUG="1"),  # the server's log, with its pid, is printed at the end
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _wait_for(project / "out.txt", proc)
    output = _ctrl_c_until_it_ends(proc)
    assert "Traceback" not in output, output
    for pid in _servers(output):
        deadline = time.monotonic() + 10
        while alive(pid):
            assert time.monotonic() < deadline, f"warm server {pid} outlived its command"
            time.sleep(0.1)


def _stderr_of(code: str) -> str:
    """What a fresh Python prints to stderr running ``code``, which must end with status 0."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=venv_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("hooked", [False, True])
def test_a_ctrl_c_inside_a_finalizer_prints_no_traceback(hooked: bool):
    """A repeated Ctrl-C can land in a finalizer (a DVC progress bar's __del__ while the command
    stops): Python prints "Exception ignored in ... Traceback". The command's hook drops exactly
    that; the control run (without it) shows the test can see the traceback."""
    code = (
        "import sys\n"
        "from ampbench import dvc_run\n"
        f"if {hooked}: sys.unraisablehook = dvc_run.Quiet().finalizer_failed\n"
        "class Bar:\n"
        "    def __del__(self): raise KeyboardInterrupt\n"
        "class Other:\n"
        "    def __del__(self): raise ValueError('a real fault')\n"
        "Bar(); Other()\n"
    )
    stderr = _stderr_of(code)
    assert ("KeyboardInterrupt" in stderr) is not hooked, stderr
    assert "ValueError: a real fault" in stderr  # other faults in finalizers still show


@pytest.mark.parametrize("stopping", [False, True])
def test_a_half_built_progress_bar_after_a_stop_prints_no_traceback(stopping: bool):
    """A Ctrl-C that cuts a DVC progress bar's __init__ short leaves it without the attributes its
    __del__ uses (CI saw "'QueryingProgress' object has no attribute 'postfix'"): once a stop
    signal came, that failure is part of the stop; before one, it is a fault and shows."""
    code = (
        "import signal, sys\n"
        "from ampbench import dvc_run\n"
        "quiet = dvc_run.Quiet()\n"
        "sys.unraisablehook = quiet.finalizer_failed\n"
        f"if {stopping}: quiet.signum = signal.SIGINT\n"
        "class HalfBuilt:\n"
        "    def __init__(self): raise KeyboardInterrupt\n"
        "    def __del__(self): self.postfix['info'] = ''\n"
        "try:\n"
        "    HalfBuilt()\n"
        "except KeyboardInterrupt: pass\n"
    )
    stderr = _stderr_of(code)
    assert ("Traceback" in stderr) is not stopping, stderr


def test_kill_9_of_makes_recipe_shell_stops_the_pipeline_it_started(tmp_path: Path):
    """`make run` is killed under the pipeline (kill -9 of make's recipe shell, then make ends
    with the failed recipe): the pipeline command, whose make is gone, stops as on SIGTERM, the
    stage with it, instead of running on as an orphan that nobody waits for."""
    project = _project(tmp_path / "p", "hold")
    python = sys.executable
    (project / "Makefile").write_text(f"run:\n\t{python} -m ampbench.dvc_run repro; echo recipe-ended\n")
    make = subprocess.Popen(["make", "-s", "run"], cwd=project, env=venv_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    _wait_for(project / "started", make)
    recipe_shell = psutil.Process(make.pid).children()[0]
    pipeline = [p for p in recipe_shell.children() if "ampbench.dvc_run" in " ".join(p.cmdline())][0]
    everything = [pipeline, *pipeline.children(recursive=True)]
    recipe_shell.kill()
    output = make.communicate(timeout=60)[0]  # EOF: every process holding make's output has ended
    assert "make (pid" in output and "is gone: stopping as on SIGTERM" in output, output
    assert "Stopped by SIGTERM during stage 'work'" in output, output
    assert "Traceback" not in output and "recipe-ended" not in output, output
    gone, alive_ = psutil.wait_procs(everything, timeout=10)
    assert not alive_, f"left running: {[p.cmdline() for p in alive_]}"
