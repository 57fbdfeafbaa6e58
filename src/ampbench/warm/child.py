"""A stage in a fork of the warm server: becoming the client's process, then running its command.

The child takes the client's stdin/stdout/stderr, working folder, environment (plus what the
server's imports added), umask and signal dispositions (so `nohup` still ignores SIGHUP), runs in a
process group of its own (the client passes signals on; nothing reaches it twice) and dies with
the server. It then runs ``ampbench <argv>`` through ``cli.main`` and ends as ``cli.run`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import signal
import socket
import sys
import tempfile
import traceback

HELD = {
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTSTP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
}
_LIBC = ctypes.CDLL(None)  # loaded once in the server, not with dlopen in a forked child


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The client's request and its three file descriptors."""
    conn.settimeout(5)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    try:
        if not data:
            raise ConnectionError("the client left before its request")
        while data and not data.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                raise ConnectionError("request cut short")
            data += more
        if len(fds) != 3:
            raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
        request = json.loads(data)
        if not isinstance(request.get("argv"), list):
            raise ValueError("no argv")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return request, fds


def fork(conn: socket.socket, request: dict, fds: list[int], server) -> int:
    """Fork the stage's process; in the parent, its pid (the child never returns)."""
    flush_all()
    parent = os.getpid()
    # Blocked from before the fork until the child has its own handlers: the server ignores these
    # (its clients pass them on), and a signal sent to a child that still had the server's
    # dispositions would be lost. Blocked, it waits, even while ignored (Linux), and arrives after.
    # In the server: no SIGTERM between the fork and the child's registration.
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
        return pid
    code = 70
    try:
        code = _become_client(conn, request, fds, server, parent)
    except KeyboardInterrupt:  # Ctrl-C before the command had its own handler: a stop, not a crash
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - before or around the command: say why, then exit
        traceback.print_exc()
    finally:
        flush_all()
        os._exit(code)


def _become_client(conn, request: dict, fds: list[int], server, parent: int) -> int:
    os.setpgid(0, 0)
    # The server killed outright (kill -9, the OOM killer) stops its stages as a SIGTERM does: a
    # train stage saves and ends its runs KILLED (hostile pass K: SIGKILL left them RUNNING).
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # it died before that took effect
        return 1
    ignored = set(request.get("ignored", []))
    for sig in (*HELD, signal.SIGINT):
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if int(sig) in ignored else default)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # In a process group of its own, a write to a terminal with `stty tostop` would stop the
    # stage (SIGTTOU) where the client could not see it: writes go through, as in the foreground.
    if any(os.isatty(fd) for fd in fds[1:]):
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    server.sel.close()
    server.listener.close()
    for entry in server.children.values():
        entry["conn"].close()
    conn.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**server.added_env, **request["env"]})
    os.umask(int(request["umask"]))
    sys.argv = ["ampbench", *request["argv"]]
    _name(f"ampbench-{request['argv'][0] if request['argv'] else ''}")
    _as_if_started_here(request)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)  # what arrived meanwhile is delivered now
    from ampbench import cli, interrupts, process_exit

    interrupts.last = True  # this process ends with its command, as cli.run's does
    code = 1
    try:
        code = cli.main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    return process_exit.finish(code)


def _as_if_started_here(request: dict) -> None:
    """What a fresh interpreter would have set from the client's environment, set again."""
    age = float(request.get("age", 0.0))
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED")) or bool(request.get("unbuffered"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr, write_through=unbuffered)
    tempfile.tempdir = None  # TMPDIR is read again
    from ampbench import timing

    timing.started_before(age if age == age else 0.0)  # the client's own start (nan: unknown)
    random.seed()  # not the server's state, shared by every stage
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")  # torchrun sets 1 per worker; torch read it at import
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    _blas_threads()


def _blas_threads() -> None:
    """numpy's BLAS as a fresh process would have it: the server loaded it with one thread (a fork
    copies one thread only); the stage's own setting, or one per CPU."""
    env = os.environ
    wanted = (
        env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
    )
    if wanted.isdigit() and int(wanted) > 1:
        with contextlib.suppress(Exception):  # a missing threadpoolctl leaves it at one thread
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=int(wanted), user_api="blas")


def flush_all() -> None:
    """Python's streams and C's stdio buffers (os._exit skips libc's exit, which flushes them)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.fflush(None)


def _name(name: str) -> None:
    """The process's name in ps -e, top and pgrep (Linux prctl PR_SET_NAME, 15 bytes): the stage's
    command, not the server's. Its command line (ps aux, py-spy) stays the server's."""
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.prctl(15, ctypes.c_char_p(name.encode()[:15]))  # 15: PR_SET_NAME


def die_with_parent(sig: int) -> None:
    """Get `sig` when the parent process dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.prctl(1, int(sig))  # 1: PR_SET_PDEATHSIG


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
