"""Warm starts: a pipeline stage runs in a process forked from one that has already imported torch,
MLflow and scikit-learn, instead of importing them again.

`dvc repro` starts one process per stage, 19 in the study; each paid 3-6.5 s of imports on the H200
host before doing anything (docs/BENCHMARKS.md). So ``ampbench download|train|evaluate|compare``
(and the checkpoint writer a train stage starts) first look for a warm server of this exact code
(``warm_server``): if one answers, this process hands it its arguments, working folder,
environment and stdin/stdout/stderr, the server forks a child that runs the stage, and this
process waits for the child's exit status and exits with it. Nothing but the standard library is
imported on that path. If none answers, the stage runs here as before and a server is started in
the background for the stages that follow; it exits after ``AMPBENCH_WARM_IDLE_S`` (60) seconds
without work.

What a user sees does not change: output, exit codes, signals (SIGINT/SIGTERM/SIGHUP are passed
on to the child, so Ctrl-C stops at a step boundary and saves, as before), and a kill -9 of this
process kills the child at once (the server sees the connection close), as it would the stage.
The child never shares CUDA with anything: the server imports modules only and never initialises
a device. Linux only; ``AMPBENCH_WARM=0`` turns it off (tests do, except the ones about it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from ampbench.timing import process_age  # standard library only, like this module

PACKAGE = Path(__file__).resolve().parent
# Helper processes of a train stage, started as `ampbench <name> args...`: module:function(*args).
HELPERS = {"checkpoint-writer": "ampbench.checkpoint_writer:serve_stdio",
           "system-metrics": "ampbench.train_runs:system_metrics_main"}  # fmt: skip
# The stages of the pipeline (one process each under DVC) and the helpers.
FORWARDED = {"download", "train", "evaluate", "compare", *HELPERS}
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
IDLE_S = 60.0


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get("AMPBENCH_WARM", "1").lower() not in ("0", "off", "no")


def fingerprint() -> str:
    """This code and interpreter: a server of any other (an edit under src/, another venv or
    PYTHONPATH) has another socket and is never used. sys.path[0] is the script's or the working
    folder, which differs between `ampbench` and `python -m ampbench`, so it is left out."""
    h = hashlib.sha256(json.dumps([sys.executable, sys.path[1:]]).encode())
    for f in sorted(PACKAGE.glob("*.py")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def socket_path() -> Path:
    base = os.environ.get("AMPBENCH_WARM_DIR") or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    folder = Path(base) / f"ampbench-warm-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()  # a folder someone else made (in /tmp) would get our environment and terminal
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a private folder of this user; warm starts are off")
    return folder / f"{fingerprint()}.sock"


def main(argv: list[str] | None = None) -> int:
    """The `ampbench` command: forward to a warm server if there is one, else run here."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FORWARDED and enabled():
        code = forward(argv)
        if code is not None:
            return code
    return run(argv)


def run(argv: list[str]) -> int:
    """Run one command in this process: a helper's function, or the cli."""
    if argv and argv[0] in HELPERS:
        import importlib

        module, function = HELPERS[argv[0]].split(":")
        return getattr(importlib.import_module(module), function)(*argv[1:])
    from ampbench.cli import main as cli_main

    return cli_main(argv)


def forward(argv: list[str]) -> int | None:
    """Run argv in a warm server's child; its exit code, or None when no server could take it
    (then one is started for the next stage, unless one is starting already)."""
    try:
        path = socket_path()
    except OSError as err:
        print(f"ampbench: {err}", file=sys.stderr)
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        _start_server(path)
        return None
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
               "age": process_age()}  # fmt: skip
    try:
        socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        lines = _Lines(sock)
        started = json.loads(lines.next(timeout=None) or b"null")
    except (OSError, ValueError):
        started = None
    if not started:  # the server went away before it forked: nothing ran yet
        sock.close()
        return None
    return _wait(sock, lines, started["pid"], watch_parent="RANK" in os.environ and argv[0] not in HELPERS)


class _Lines:
    """Newline-framed JSON messages from the server, read with a timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def next(self, timeout: float | None) -> bytes | None:
        """The next line; b"" when the server closed the connection; None on timeout."""
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            chunk = self.sock.recv(4096)
            if not chunk:
                return b""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def _wait(sock: socket.socket, lines: _Lines, child: int, watch_parent: bool) -> int:
    """Pass signals on to the child until the server reports how it ended; exit the same way."""
    parent = os.getppid()

    def pass_on(signum, frame):
        with contextlib.suppress(OSError):
            sock.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, pass_on)
    while True:
        try:
            line = lines.next(timeout=0.5)
        except OSError:
            line = b""
        if line is not None:
            break
        # A DDP worker whose torchrun died (kill -9) stops, as train.StopFlag does directly (not
        # a helper: a checkpoint writer whose trainer died finishes its write).
        if watch_parent and os.getppid() != parent:
            parent = os.getppid()
            pass_on(signal.SIGTERM, None)
    if not line:
        print(f"ampbench: the warm-start server ended while stage process {child} ran; it may still "
              f"be running (AMPBENCH_WARM=0 runs stages without it)", file=sys.stderr)  # fmt: skip
        return 1
    status = json.loads(line)
    if "signal" in status:  # die the same way, so that the caller sees the same status
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
        return 128 + status["signal"]
    return int(status["exit"])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _start_server(path: Path) -> None:
    """Start a server for `path` in the background unless one holds its lock (starting up)."""
    lock = path.with_suffix(".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a server holds it: still importing
        os.close(fd)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    log = path.with_suffix(".log")
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started by pid {os.getpid()}\n".encode())
        out.flush()
        # Without the thread counts torchrun sets per worker: torch reads them at import, and the
        # server's import serves every later stage (a child sets them again from its own).
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        subprocess.Popen([sys.executable, "-m", "ampbench.warm_server", str(path)], stdin=subprocess.DEVNULL,
                         stdout=out, stderr=subprocess.STDOUT, cwd=path.parent, env=env,
                         start_new_session=True)  # fmt: skip
