"""The train stage's stop request: a signal only sets a flag; the loop stops at the next step
boundary, saves a checkpoint and ends its runs KILLED (stages/train.py, training/loop.py).

SIGTERM, Ctrl-C (SIGINT) and SIGHUP (the terminal or SSH session that started the stage closed)
are stop requests; SIGHUP not where it was ignored when the stage started (``nohup``: training
goes on, as nohup promises).

So is the end of the pipeline tool that started the stage (``dvc repro`` or ``make run``'s
``python -m ampbench.dvc_run``, killed with kill -9): its stage would otherwise train on as an
orphan that a re-run finds holding the variant. Only a pipeline tool is watched, known by the
variable DVC sets for every stage command (DVC_STAGE, dvc/stage/run.py): a stage a user started
from a shell, ``nohup ampbench train ... &`` included, outlives that shell as it always did.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PIPELINE_STAGE_ENV = "DVC_STAGE"  # DVC sets it to the stage's name for each stage command
POLL_S = 0.5


class StopFlag:
    """SIGTERM / Ctrl-C / SIGHUP only set a flag; the loop stops at the next step boundary.

    A second signal of the same kind a second or more later: the default behaviour (stop now).
    With ``watch_parent`` (DDP workers) the death of the parent process sets the flag too:
    torchrun starts workers in sessions of their own, so a kill -9 of the launcher's process
    group would otherwise leave them training on as orphans. Without it, a stage DVC started
    stops the same way when DVC is gone (``watch_launcher``).
    """

    def __init__(self, watch_parent: bool = False) -> None:
        self.signum, self.since = 0, 0.0
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's is kept
                signal.signal(sig, self._handle)
        if watch_parent:
            parent = os.getppid()

            def parent_gone() -> None:
                log.warning("parent process %d is gone: stopping at the next step boundary", parent)
                self._launcher_gone()

            watch_process(parent, lambda: os.getppid() == parent, parent_gone, "parent-watch")
        else:
            watch_launcher(self._launcher_gone)

    def _launcher_gone(self) -> None:
        self.signum = self.signum or signal.SIGTERM  # as if the launcher had sent SIGTERM first

    def _handle(self, signum, frame) -> None:
        if self.signum == signum:
            # Within a second it is the same stop arriving twice (a SIGTERM to a whole job reaches a
            # warm stage directly and through its client), not a second request.
            if time.monotonic() - self.since < 1.0:
                return
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum, self.since = signum, time.monotonic()
        log.warning("%s received: stopping at the next step boundary", signal.Signals(signum).name)

    def __call__(self) -> bool:
        return bool(self.signum)


def watch_launcher(on_gone) -> int | None:
    """Call ``on_gone()`` (from a thread) once the pipeline tool that started this stage is gone;
    its pid, or None (nothing watched) where no pipeline tool started it."""
    launcher = pipeline_launcher()
    if launcher is None:
        return None

    def gone() -> None:
        log.warning("the pipeline that started this stage (pid %d) is gone: stopping as on SIGTERM", launcher)
        on_gone()

    watch_process(launcher, lambda: _is_ancestor(launcher), gone, "launcher-watch")
    return launcher


def watch_process(pid: int, alive, on_gone, name: str) -> threading.Thread:
    """Call ``on_gone()`` from a daemon thread once process ``pid`` has exited; ``alive()`` says
    whether pid is still the process meant (not one that reused its number).

    The thread sleeps in the kernel on a pidfd (Linux 5.3+) and runs no Python code until the
    process exits: nothing of the tool's own may run inside a timed epoch, and a poll of /proc
    every half second would. Without pidfds it polls ``alive`` every ``POLL_S``."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # not Linux, an old kernel, or already gone
            fd = None
        try:
            if fd is not None:
                if alive():  # checked after opening: the pidfd is of the process meant
                    select.select([fd], [], [])
            else:
                while alive():
                    time.sleep(POLL_S)
        finally:
            if fd is not None:
                os.close(fd)
        on_gone()

    thread = threading.Thread(target=watch, name=name, daemon=True)
    thread.start()
    return thread


def pipeline_launcher() -> int | None:
    """The pid of the DVC process that started this stage; None outside a DVC stage or without /proc.

    DVC runs a stage's command as ``$SHELL -c CMD``; a shell that does not exec the command stays
    in between, so the launcher is the nearest ancestor whose environment lacks this stage's
    DVC_STAGE (a DVC nested in another stage has the outer stage's name)."""
    stage = os.environ.get(PIPELINE_STAGE_ENV)
    if not stage or not Path("/proc/self/stat").exists():
        return None
    pid = os.getppid()
    while pid > 1 and _environ(pid).get(PIPELINE_STAGE_ENV) == stage:
        pid = _parent(pid)
    return pid if pid > 1 else None


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read: no stage's shell
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _parent(pid: int) -> int:
    try:  # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _is_ancestor(pid: int) -> bool:
    """Whether pid is still an ancestor of this process: a dead launcher's children are
    reparented at once, so neither a zombie nor a reused pid passes."""
    ancestor = os.getppid()
    for _ in range(64):  # deeper than any real process tree
        if ancestor == pid:
            return True
        if ancestor <= 1:
            return False
        ancestor = _parent(ancestor)
    return False
