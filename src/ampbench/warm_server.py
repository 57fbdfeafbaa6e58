"""The warm-start server (see ``ampbench.warm``): imports what the stages need once, then forks a
child per request, which runs the stage as the requesting process would have.

    python -m ampbench.warm_server SOCKET   # started by ampbench.warm, not by hand

One thread and no device: the server imports modules and never initialises CUDA (it refuses to
serve if an import did), so each child is a clean fork that sets up its own GPU, MLflow store and
threads, like a fresh process. A child gets the client's stdin/stdout/stderr (passed over the Unix
socket), working folder, environment, umask and arguments, runs in a process group of its own,
and its exit status goes back to the client. The server passes the client's signals on to it and
kills the child's process group when the client's connection closes without an exit status (the
client was killed). It exits after ``AMPBENCH_WARM_IDLE_S`` seconds without children or
requests, or on SIGTERM; a lock file beside the socket keeps it to one server per socket.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

# What the stages import, in the order they need it. A module that fails to import is only logged:
# a child imports it again, as a fresh process would, and reports the error where it matters.
# torch._dynamo: torch.optim imports it (900 modules, sympy among them) at the first optimizer a
# process builds, which cost each train stage's first seed 4 s of set-up on the H200 host.
PRELOAD = (
    "torch", "torch._dynamo", "torch.distributed.run", "mlflow", "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store", "mlflow.system_metrics.system_metrics_monitor",
    "sklearn.metrics", "scipy.stats", "matplotlib.pyplot",
    "ampbench.cli", "ampbench.fetch", "ampbench.train", "ampbench.evaluate", "ampbench.compare",
    "ampbench.launch", "ampbench.checkpoint_writer", "ampbench.warm",
)  # fmt: skip


def preload() -> dict[str, str]:
    """Import PRELOAD; return the environment variables the imports added (children keep them)."""
    before = dict(os.environ)
    import matplotlib

    matplotlib.use("Agg")  # what evaluate and compare select before they import pyplot
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - logged; the child meets it again
            print(f"warm server: import {name} failed: {err!r}", flush=True)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


class Server:
    def __init__(self, path: Path, idle_s: float) -> None:
        self.path, self.idle_s = path, idle_s
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, dict] = {}  # pid -> {"conn", "buf"}
        self.added_env: dict[str, str] = {}
        self.listener: socket.socket | None = None
        self.inode: int | None = None
        self.lock = -1

    def run(self) -> int:
        self.lock = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another server has this socket
        t0 = time.perf_counter()
        self.added_env = preload()
        import torch

        from ampbench.warm import fingerprint

        if torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
            print("warm server: an import initialised CUDA; not serving", flush=True)
            return 1
        if fingerprint() != self.path.stem:  # edited while importing, or another sys.path
            print(f"warm server: the code is not the one {self.path.name} names; not serving", flush=True)
            return 1
        self.path.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.inode = os.stat(self.path).st_ino  # to tell our socket file from a newer server's
        self.listener.listen(64)
        print(f"warm server {os.getpid()}: ready at {self.path} after {time.perf_counter() - t0:.1f} s of "
              "imports", flush=True)  # fmt: skip
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        try:
            self._loop()
        finally:
            self._forget_socket()
            self._stop_children()
        return 0

    def _stop_children(self, grace_s: float = 60.0) -> None:
        """Stopping the server (SIGTERM) stops its stages as a SIGTERM to each would: they save
        and exit, and their clients hear how. Helpers end with their stage. A second SIGTERM
        changes nothing; clients' signals and deaths are still handled meanwhile."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid, child in self.children.items():
            if not child["helper"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.children and time.monotonic() < deadline:
            for key, _ in self.sel.select(0.1):
                if key.data is not None:  # new requests wait: this server is going
                    self._from_client(key.data)
            self._reap()
        for pid in self.children:
            _kill_group(pid, signal.SIGKILL)

    def _loop(self) -> None:
        last_busy = time.monotonic()
        while True:
            idle = time.monotonic() - last_busy
            if not self.children and idle >= self.idle_s:
                print(f"warm server {os.getpid()}: idle for {idle:.0f} s, exiting", flush=True)
                return
            timeout = 0.2 if self.children else self.idle_s - idle
            for key, _ in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                else:
                    self._from_client(key.data)
            self._reap()
            if self.children:
                last_busy = time.monotonic()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(5)
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            while data and not data.endswith(b"\n"):
                more = conn.recv(1 << 16)
                if not more:
                    raise ConnectionError("request cut short")
                data += more
            request = json.loads(data)
            if len(fds) != 3:
                raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
            from ampbench.warm import HELPERS

            helper = bool(request["argv"]) and request["argv"][0] in HELPERS
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            print(f"warm server: bad request ({err!r})", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        _flush_all()
        server = os.getpid()
        # No SIGTERM between the fork and the child's registration: _stop_children must see it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = self._child(conn, request, fds, helper, server)
            except BaseException:  # noqa: BLE001 - before the command ran: say why, then exit
                traceback.print_exc()
            finally:
                _flush_all()
                os._exit(code)
        for fd in fds:  # only the child may hold them: a pipe must close when the child exits
            os.close(fd)
        self.children[pid] = {"conn": conn, "buf": b"", "watched": True, "helper": helper}
        self._send(pid, {"pid": pid})  # first: once the client knows, it never runs the stage itself
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ, pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        print(f"warm server: pid {pid} runs `ampbench {' '.join(request['argv'])}` in {request['cwd']}",
              flush=True)  # fmt: skip

    def _child(self, conn: socket.socket, request: dict, fds: list[int], helper: bool, server: int) -> int:
        """In the forked child: become the client's process, run its command, return the code."""
        os.setpgid(0, 0)
        if not helper:  # a server killed outright takes its stages along (helpers finish their write)
            _die_with_parent()
            if os.getppid() != server:  # it died before that took effect
                return 1
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        self.sel.close()
        self.listener.close()
        os.close(self.lock)  # else the stage (and its forks) would keep the next server from starting
        for other in self.children.values():
            other["conn"].close()
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**self.added_env, **request["env"]})
        os.umask(request["umask"])
        argv = request["argv"]
        sys.argv = ["ampbench", *argv]
        _as_if_started_here()
        from ampbench import timing

        age = float(request.get("age", 0.0))
        timing.LAUNCHED_BEFORE_S = age if age == age else 0.0  # the client's own start (nan: unknown)
        return run_command(argv)

    def _from_client(self, pid: int) -> None:
        child = self.children[pid]
        try:
            data = child["conn"].recv(4096)
        except OSError:
            data = b""
        if not data:  # the client is gone (kill -9): so goes its stage, as if it had run there
            self.sel.unregister(child["conn"])
            child["watched"] = False
            _kill_group(pid, signal.SIGKILL)
            return
        child["buf"] += data
        while b"\n" in child["buf"]:
            line, child["buf"] = child["buf"].split(b"\n", 1)
            with contextlib.suppress(ValueError, KeyError, TypeError, ProcessLookupError):
                os.kill(pid, int(json.loads(line)["signal"]))

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a signal cut in): their status is lost
                for child in self.children.values():
                    child["conn"].close()
                self.children.clear()
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue
            code = os.waitstatus_to_exitcode(status)
            self._send(pid, {"signal": -code} if code < 0 else {"exit": code})
            child = self.children.pop(pid)
            if child["watched"]:
                self.sel.unregister(child["conn"])
            child["conn"].close()

    def _send(self, pid: int, message: dict) -> None:
        conn = self.children[pid]["conn"]
        try:
            conn.setblocking(True)
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the client is gone; _from_client handles that
        finally:
            conn.setblocking(False)

    def _forget_socket(self) -> None:
        """Remove our socket file (not a newer server's) so that clients start a fresh server."""
        with contextlib.suppress(OSError):
            if self.inode is not None and os.stat(self.path).st_ino == self.inode:
                self.path.unlink()


def run_command(argv: list[str]) -> int:
    """Run one `ampbench` command as a process's main would, and end the way a process ends:
    non-daemon threads joined, atexit handlers run, streams flushed."""
    code = 1
    try:
        from ampbench.warm import run

        code = run(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then the exit code
        traceback.print_exc()
    try:
        threading._shutdown()  # as the interpreter does: wakes idle executors, joins non-daemon threads
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    atexit._run_exitfuncs()
    _flush_all()
    return int(code or 0)


def _flush_all() -> None:
    """Python's streams and C's stdio buffers (os._exit skips libc's exit, which flushes them)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.fflush(None)


def _as_if_started_here() -> None:
    """What a fresh interpreter would have set from the client's environment, set again."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr, write_through=unbuffered)
    tempfile.tempdir = None  # TMPDIR is read again
    threads = os.environ.get("OMP_NUM_THREADS", "")  # torchrun sets 1 per worker; torch read it at import
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def _die_with_parent() -> None:
    """SIGKILL this process if the server dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        _LIBC.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


_LIBC = ctypes.CDLL(None)  # loaded once here, not with dlopen in a forked child


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def main() -> int:
    # Each fork warns that the process has threads (torch's, the BLAS pools' at import): they
    # are idle, and the child uses none of them before it makes its own.
    warnings.filterwarnings("ignore", message=".*use of fork.*", category=DeprecationWarning)
    from ampbench.warm import IDLE_S

    idle_s = float(os.environ.get("AMPBENCH_WARM_IDLE_S", IDLE_S))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return Server(Path(sys.argv[1]), idle_s).run()


if __name__ == "__main__":
    raise SystemExit(main())
