"""The stage's side of a warm start (standard library only: it runs before anything is imported).

``cli.run`` calls :func:`forward` first. With ``AMPBENCH_WARM_SOCKET`` set (by the command that
started the server) and a stage command, this process waits for the server's greeting (a bounded
time: a stopped server would leave it waiting forever), then sends it its arguments, working
folder, environment, umask, context (``warm.context``), the signals it ignores (``nohup``) and its
stdin/stdout/stderr. The server answers with the pid of the forked child that runs the stage, or
why it will not (then the stage runs here, plain). This process then waits for the child's exit
status and leaves with it: the same output, exit code and death by signal as the stage itself.

Signals sent to this process (kill, Ctrl-C, Ctrl-Z, fg) are passed on to the child, so a stop
still saves and says how to resume. The child runs in a process group of its own, so nothing
reaches it twice. A kill -9 of this process ends the child at once (the server sees the
connection close); SIGSTOP, which no process can catch, stops this process only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from ampbench.processes import exiting
from ampbench.timing import process_age
from ampbench.warm import SOCKET_ENV, context

PASSED_ON = (
    *(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT),
    *(signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM),
)
STOP_NAMES = {sig: signal.Signals(sig).name for sig in PASSED_ON}
# How long a live server takes to greet a new connection: it serves requests one at a time, each
# in milliseconds (at most child.receive's 5 s for a client that stalls mid-request). Past this,
# the server is taken for stopped and the stage runs plain: a false alarm costs one stage's
# imports (~8 s), a true one would otherwise hang the study without a word.
GREETING_WAIT_S = 5.0
# From the request to the forked child's pid (a fork of a large process on a loaded machine).
# Past this the stage fails rather than run plain: the server may have forked it already, and two
# copies of one stage would train the same seed. Generous: a false alarm fails a stage.
REPLY_WAIT_S = 20.0


def forward(argv: list[str]) -> int | None:
    """Run argv (a stage: cli.WARM_COMMANDS) in a fork of the command's warm server; its exit
    status, or None to run it here."""
    path = os.environ.get(SOCKET_ENV)
    if not path or sys.platform != "linux":
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lines = _Lines(sock)
    ignored = [int(s) for s in (*PASSED_ON, signal.SIGTSTP) if signal.getsignal(s) is signal.SIG_IGN]
    try:
        # made before connecting: once greeted, the server waits for nothing but the sending
        request = {
            "argv": argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "umask": _umask(),
            "age": process_age(),
            "ignored": ignored,
            "unbuffered": bool(getattr(sys.stdout, "write_through", False)),  # python -u (torchrun's workers)
            "context": context.current(),
        }
        server = _greeted(sock, lines, path)
        if server is None:
            return None
        socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        answer = lines.next(timeout=REPLY_WAIT_S)
        if answer is None:  # greeted, then silent: it may have forked the stage already
            sock.close()
            print(
                f"ampbench: the warm server (pid {server}) stopped answering while starting this stage "
                f"(stopped? `kill -CONT {server}`); not run here too, as it may have started: "
                "run the command again",
                file=sys.stderr,
            )
            return 1
        reply = json.loads(answer or b"{}")
    except KeyboardInterrupt:  # Ctrl-C before the stage started (a stopped server's wait): a stop
        sock.close()  # a child forked meanwhile is killed by the server, which sees this close
        return 128 + signal.SIGINT
    except (OSError, ValueError) as err:
        sock.close()
        _debug(f"the warm server at {path} did not answer ({err}); running here")
        return None
    if "pid" not in reply:  # refused, or gone before it forked: nothing ran yet
        sock.close()
        _debug(f"running here, not in the warm server: {reply.get('refused', 'it went away')}")
        return None
    try:
        child = _Stage(server, int(reply["pid"]), argv[0])
        return _wait(sock, lines, child, ignored, watch_parent="RANK" in os.environ)
    finally:
        sock.close()


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


class _Stage:
    """The forked child, whose end only its server can tell: a server stopped while it runs is
    said once, in one line, after GREETING_WAIT_S (the stage runs on; this process waits)."""

    def __init__(self, server: int, pid: int, command: str) -> None:
        self.server, self.pid, self.since, self.told = server, pid, 0.0, False
        self.command = command  # `ampbench <command>`

    def check_server(self) -> None:
        if self.told:
            return
        if not _stopped(self.server):
            self.since = 0.0
            return
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since >= GREETING_WAIT_S:
            self.told = True
            print(
                f"ampbench: the warm server (pid {self.server}) is stopped; process {self.pid} runs this "
                f"stage on, and its end is told here once the server continues: `kill -CONT {self.server}`",
                file=sys.stderr,
                flush=True,
            )


def _stopped(pid: int) -> bool:
    """Whether pid is stopped (kill -STOP) or held by a debugger: state T or t in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _wait(sock: socket.socket, lines: _Lines, child: _Stage, ignored: list[int], watch_parent: bool) -> int:
    """Pass signals on until the server reports how the child ended; end the same way."""

    missed: list[int] = []  # stops that reached no stage: it had ended (then said here, once)

    def pass_on(signum: int, frame=None) -> None:
        if signum in STOP_NAMES and exiting(child.pid):
            missed.append(signum)
        with contextlib.suppress(OSError):
            sock.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    def suspend(signum: int, frame) -> None:  # Ctrl-Z: stop the child, then this process
        pass_on(signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, suspend)  # here again after SIGCONT (fg, bg)
        pass_on(signal.SIGCONT)

    for sig in PASSED_ON:
        if sig not in ignored:
            signal.signal(sig, pass_on)
    if signal.SIGTSTP not in ignored:
        signal.signal(signal.SIGTSTP, suspend)
    parent = os.getppid()
    while True:
        try:
            line = lines.next(timeout=0.5)
        except OSError:
            line = b""
        if line is not None:
            break
        child.check_server()
        # A DDP worker whose torchrun died (kill -9) stops, as StopFlag(watch_parent) would.
        if watch_parent and os.getppid() != parent:
            parent = os.getppid()
            pass_on(signal.SIGTERM)
    if not line:  # the server died: its stage got a SIGTERM (child.die_with_parent) and stops
        _wait_gone(child.pid)
        print(
            f"ampbench: the warm server ended while process {child.pid} ran this stage, which was stopped "
            "(what it saved is said above): run the same command again",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    status = json.loads(line)
    if "signal" in status:  # die the same way, so that the caller sees the same status
        for sig in (*PASSED_ON, signal.SIGTSTP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
        return 128 + status["signal"]
    code = int(status["exit"])
    late = _Late(child.command if code == 0 else "")
    for sig in PASSED_ON:
        if sig not in ignored:
            signal.signal(sig, late)  # the stage is over: a stop now stops nothing
    for signum in missed[:1]:
        late(signum)
    return code


class _Late:
    """A stop after the stage ended, which no stage can take: said once where its work was done
    (hostile pass Q: a Ctrl-C 0.1 s after a pipeline's last training line was passed on to a stage
    already gone, and nothing was said); nothing where it failed (it said why)."""

    def __init__(self, command: str) -> None:
        self.command, self.told = command, False

    def __call__(self, signum: int, frame=None) -> None:
        if self.command and not self.told:
            self.told = True
            what = f"came as `ampbench {self.command}` ended: its work is done and kept"
            print(f"ampbench: {STOP_NAMES[signum]} {what}", file=sys.stderr, flush=True)


def _wait_gone(pid: int, at_most_s: float = 300.0) -> None:
    """Until process ``pid`` (the stage, not this process's child) has ended: a stop saves first.
    Past its exit call is not yet ended: the caller's next step may find it (CI, stop 46)."""
    deadline = time.monotonic() + at_most_s
    while time.monotonic() < deadline and not exiting(pid, or_ending=False):
        time.sleep(0.1)


def _greeted(sock: socket.socket, lines: _Lines, path: str) -> int | None:
    """Connect and wait for the server's greeting; its pid, or None (said in one line) to run plain.

    A stopped server (kill -STOP) still has its connections accepted by the kernel: only its
    greeting shows it is alive and serving this connection. Nothing is sent before it: the fds of a
    request queued in a stopped server would hold the stage's stdout open after this process gave
    up (DVC, make and a pipe would wait on them); a client that gives up sends nothing."""
    sock.settimeout(GREETING_WAIT_S)  # connect() blocks too once the listen backlog is full
    try:
        sock.connect(path)
    except BlockingIOError:  # that backlog full: Linux refuses a non-blocking connect at once
        sock.close()
        _plain(f"at {path} takes no connection (stopped?)")
        return None
    # the listener's pid, from the kernel, even while the server is stopped
    server = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    if lines.next(timeout=GREETING_WAIT_S) is None:
        sock.close()
        _plain(f"(pid {server}) did not answer in {GREETING_WAIT_S:.0f} s (stopped? `kill -CONT {server}`)")
        return None
    sock.settimeout(None)
    return server


def _plain(why: str) -> None:
    """Said once: the processes this stage starts (DDP workers) run plain too, without waiting on
    the same server again (hostile pass WARN: the line three times per DDP stage)."""
    os.environ.pop(SOCKET_ENV, None)
    print(f"ampbench: the warm server {why}; running this stage as a plain process", file=sys.stderr)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _debug(message: str) -> None:
    if os.environ.get("AMPBENCH_DEBUG", "").lower() not in ("", "0", "no", "off"):
        print(f"ampbench: {message}", file=sys.stderr, flush=True)
