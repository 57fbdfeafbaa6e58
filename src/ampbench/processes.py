"""Watching the processes that started this one: who set a variable for its children (DVC's
DVC_STAGE, make's MAKELEVEL), whether it is still an ancestor, and a thread that acts once it
has exited. Used by a train stage (its pipeline tool, a DDP worker's torchrun) and by the pipeline
command (make); Linux's /proc and pidfds, with a polling fallback.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

POLL_S = 0.5  # the fallback's poll, where pidfds are missing


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


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def setter_of(variable: str) -> int | None:
    """The nearest ancestor whose environment does not hold this process's value of `variable`:
    the process that set it for its children (DVC's DVC_STAGE, make's MAKELEVEL), past the shells
    in between; None where this process has no such variable, or without /proc."""
    pid = _past_holders(variable)
    return pid if pid > 1 else None


def orphaned_by(variable: str) -> bool:
    """Whether the process that set `variable` for this one is gone already: the ancestors that
    hold this process's value end at init, which does not (a launcher killed before this process
    could look: its children were reparented). Not where init holds it too (a container whose
    first process got it: `docker run -e`); an init whose environment cannot be read (a sandbox's)
    is taken as not holding it: no supported launcher starts a container's first process."""
    if _past_holders(variable) != 1:
        return False
    value = os.environ[variable]
    try:
        init = Path("/proc/1/environ").read_bytes()
    except OSError:
        return True
    return f"{variable}={value}".encode() not in init.split(b"\0")


def _past_holders(variable: str) -> int:
    """The nearest ancestor whose environment lacks this process's value of `variable` (1: none
    before init; 0: no such variable here, or no /proc)."""
    value = os.environ.get(variable)
    if not value or not Path("/proc/self/stat").exists():
        return 0
    pid = os.getppid()
    while pid > 1 and _environ(pid).get(variable) == value:
        pid = _parent(pid)
    return pid


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


def is_ancestor(pid: int) -> bool:
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


def signal_own_group(signum: int) -> None:
    """``signum`` to this process's descendants in its own process group: what a signal to the
    job would reach of this command's own part (DVC's stage, a warm client), not a script that
    started it."""
    import contextlib

    import psutil

    group = os.getpgrp()
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(process.pid) == group:
                process.send_signal(signum)


PF_EXITING = 0x4  # the kernel's flag (stat's 9th field) on a process past its exit call


def exiting(pid: int, or_ending: bool = True) -> bool:
    """Whether process ``pid`` has ended (reaped or a zombie) or, with ``or_ending``, is past its
    exit call. Freeing a large address space takes the kernel tens of ms, in which `kill` still finds
    the process but no handler of it runs (hostile pass S: a stop then reached nothing, and nothing
    was said); who waits for a process to be gone asks without ``or_ending``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rpartition(")")[2].split()
        return fields[0] in ("Z", "X", "x") or (or_ending and bool(int(fields[6]) & PF_EXITING))
    except (OSError, IndexError, ValueError):
        return True


def stage_commands_ended(variable: str = "DVC_STAGE") -> bool:
    """Whether every child of this process whose environment sets ``variable`` (DVC's stage
    commands) has ended or is ending: a stop sent now reaches no stage."""
    import psutil

    for child in psutil.Process().children():
        try:
            if variable in child.environ() and not exiting(child.pid):
                return False
        except psutil.Error:  # gone meanwhile
            continue
    return True
