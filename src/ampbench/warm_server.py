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
import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
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

    def run(self) -> int:
        lock = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another server has this socket
        t0 = time.perf_counter()
        self.added_env = preload()
        import torch

        if torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
            print("warm server: an import initialised CUDA; not serving", flush=True)
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
        return 0

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
        except (OSError, ValueError) as err:
            print(f"warm server: bad request ({err!r})", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = self._child(conn, request, fds)
            finally:
                os._exit(code)
        for fd in fds:  # only the child may hold them: a pipe must close when the child exits
            os.close(fd)
        print(
            f"warm server: pid {pid} runs `ampbench {' '.join(request['argv'])}` in {request['cwd']}",
            flush=True,
        )
        self.children[pid] = {"conn": conn, "buf": b"", "watched": True}
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ, pid)
        self._send(pid, {"pid": pid})

    def _child(self, conn: socket.socket, request: dict, fds: list[int]) -> int:
        """In the forked child: become the client's process, run its command, return the code."""
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.sel.close()
        self.listener.close()
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
        sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())
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
            except ChildProcessError:
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
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return int(code or 0)


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def main() -> int:
    from ampbench.warm import IDLE_S

    idle_s = float(os.environ.get("AMPBENCH_WARM_IDLE_S", IDLE_S))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return Server(Path(sys.argv[1]), idle_s).run()


if __name__ == "__main__":
    raise SystemExit(main())
