"""The command's side: a warm server that lives exactly as long as the command that starts it.

    with warm.scope.serving():   # ampbench.dvc_run, which `make run`, `make demo` and `make tutorial` use
        dvc_main(argv)           # stages DVC starts find the server through AMPBENCH_WARM_SOCKET

The server is this process's child: same session, cgroup, resource limits, CPU affinity, priority
and user, so `taskset`, `nice`, `ulimit`, `systemd-run`, SLURM and `time` act on the stages as on
any child process. Its socket lies in a private folder made for this command, so no other command
(another study of the same user, a plain `dvc repro`) ever reaches it. It ends when this process
does: its stdin is a pipe from here (end of file, whatever the way this process ended) and it
dies with this process's thread (PR_SET_PDEATHSIG). Its log is the folder's server.log, shown
with --debug / AMPBENCH_DEBUG=1; ``AMPBENCH_WARM=0`` runs every stage plain.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ampbench.warm import SOCKET_ENV

PREFIX = "ampbench-warm-"
OWNER = "owner.pid"  # the command whose server the folder holds


UNOWNED_S = 60.0  # a folder still without its owner's pid this long after it was made: left by a kill


def sweep_stale(tmp: Path) -> list[Path]:
    """Remove the folders of this user's commands that are gone (kill -9, a hang-up: no cleanup
    ran; their servers ended with their stdin, or it was killed before it wrote its pid: hostile
    pass G found 29 such folders in /tmp); the folders removed. Another command's, or one being
    made (no owner yet, for under UNOWNED_S), is left alone."""
    removed = []
    for folder in tmp.glob(f"{PREFIX}*"):
        try:
            if folder.stat().st_uid != os.geteuid():
                continue
            if not (folder / OWNER).exists() and time.time() - folder.stat().st_mtime > UNOWNED_S:
                raise ProcessLookupError  # its maker died between making it and naming itself
            owner = int((folder / OWNER).read_text(encoding="utf-8"))
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except (OSError, ValueError):  # not ours to judge, or being made
            continue
    return removed


def enabled() -> bool:
    off = os.environ.get("AMPBENCH_WARM", "1").lower() in ("0", "off", "no", "false")
    return sys.platform == "linux" and not off and SOCKET_ENV not in os.environ


@contextlib.contextmanager
def serving() -> Iterator[Path | None]:
    """Start the command's warm server; the folder of its socket and log (None: off here)."""
    if not enabled():
        yield None
        return
    sweep_stale(Path(tempfile.gettempdir()))
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))  # 0700, this user's
    (folder / OWNER).write_text(str(os.getpid()), encoding="utf-8")
    log = folder / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "ampbench.warm.server", str(folder / "socket")],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=folder,
            process_group=0,  # terminal signals reach the stages through their clients only
        )
    os.environ[SOCKET_ENV] = str(folder / "socket")
    try:
        yield folder
    finally:
        os.environ.pop(SOCKET_ENV, None)
        try:
            _stop(server, folder / "socket")
            if os.environ.get("AMPBENCH_DEBUG", "").lower() not in ("", "0", "no", "off"):
                sys.stderr.write(log.read_text(errors="replace", encoding="utf-8"))
        finally:  # a second Ctrl-C while the server ends still leaves no folder behind
            shutil.rmtree(folder, ignore_errors=True)


def _stop(server: subprocess.Popen, socket: Path) -> None:
    """End of file on its stdin (and a SIGCONT, in case it was stopped): it stops what runs (none,
    normally) and exits.

    A server still importing (no socket yet: a command that ran no stage, `dvc repro` with all
    up to date) has forked nothing and would read its stdin only once its imports end, seconds
    later: it is ended at once. A Ctrl-C while it ends is the user in a hurry, not an error: it
    ends the server at once, and the command's own ending (its status, its last lines) stands.
    """
    with contextlib.suppress(OSError):
        server.stdin.close()
    with contextlib.suppress(OSError):  # stopped (kill -STOP), it would never read that end of file
        server.send_signal(signal.SIGCONT)
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, lambda signum, frame: server.kill()) if main else None
    try:
        if not socket.exists():
            server.kill()
        server.wait(timeout=150)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    finally:
        if main:
            signal.signal(signal.SIGINT, before)
