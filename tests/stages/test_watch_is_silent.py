"""The threads that watch a stage's launcher (or a DDP worker's parent) run no Python code while
the process they watch lives: they sleep in the kernel on a pidfd, so nothing of the tool's own
runs inside a timed epoch. The control (no pidfds: the fallback polls) shows the test sees polls."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from ampbench.processes import watch_process

NAME = "watch-under-test"


@pytest.mark.parametrize("pidfd", [True, False])
def test_a_watcher_runs_no_python_until_its_process_ends(pidfd: bool, monkeypatch):
    if pidfd and not hasattr(os, "pidfd_open"):
        pytest.skip("os.pidfd_open is Linux-only (3.9+); the polling fallback is tested")
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    calls: list[float] = []

    def tracer(frame, event, arg):
        if threading.current_thread().name == NAME and event == "call":
            calls.append(time.monotonic())
        return None

    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = threading.Event()
    threading.settrace(tracer)  # threads started from here on are traced
    try:
        watch_process(watched.pid, lambda: watched.poll() is None, gone.set, NAME)
        time.sleep(0.3)  # the watcher's start: opening the pidfd, one check
        settled = len(calls)
        time.sleep(1.6)  # three polls' worth for the fallback
        during = len(calls) - settled
    finally:
        threading.settrace(None)
        watched.kill()
    assert gone.wait(5), "the watcher never noticed its process end"
    if pidfd:
        assert during == 0, f"{during} Python calls while the watched process lived"
    else:
        assert during >= 3, f"the fallback polls every 0.5 s, yet {during} calls were seen"
