"""The warm server (see ``ampbench.warm``): imports what the stages need once, then forks a child
per stage, which runs it as the stage's own process would have.

    python -m ampbench.warm.server SOCKET   # started by ampbench.warm.scope, not by hand

It runs only while the command that started it does: its stdin is a pipe from that command, and
end of file (the command ended, however) or SIGTERM makes it stop its stages as a SIGTERM to each
would (they save and exit), then exit. Terminal signals do not reach it (a process group of its
own); the stages' clients pass theirs on.

A fork copies one thread only, so the server forks only while it has one: numpy's BLAS pool is
held to one thread and Arrow's allocator to no background thread while it imports (no stage does
BLAS or Arrow work), and a request finding a second thread anyway is refused. It never
initialises CUDA: each child sets up its own GPU, MLflow store and threads like a fresh process.
A stage whose context differs (``warm.context``) is refused and runs plain.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from ampbench import output
from ampbench.warm import child, context

# What the stages import, in the order they need it. A module that fails to import is only logged:
# a child imports it again, as a fresh process would, and reports the error where it matters.
PRELOAD = (
    *("torch", "torch._dynamo", "torch.distributed.run", "mlflow", "mlflow.tracking"),
    *("mlflow.store.tracking.sqlalchemy_store", "mlflow.system_metrics.system_metrics_monitor"),
    *("sklearn.metrics", "scipy.stats", "matplotlib.pyplot", "ampbench.cli", "ampbench.stages.download"),
    *("ampbench.stages.train_main", "ampbench.stages.train", "ampbench.stages.evaluate_main"),
    *("ampbench.stages.evaluate", "ampbench.stages.compare", "ampbench.warm.client"),
)
# Held for the server's own imports only (children get the stage's environment back).
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}

GREETING = b'{"ready": true}\n'  # after accept: this server is alive (not stopped) and reading
PARENT_GONE = signal.SIGRTMIN + 1  # the command that started this server died: no one sends it
# A batch system's stop warnings, sent to every process of the job (`scancel --signal=USR1`): the
# server, killed by one (their default), would stop every stage a second time
ONE_JOB = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


def preload() -> dict[str, str]:
    """Import PRELOAD; return the environment variables the imports added (children keep them)."""
    before = dict(os.environ)
    import matplotlib

    matplotlib.use("Agg")  # what evaluate and compare select before they import pyplot
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - logged; the child meets it again
            _log(f"warm server: import {name} failed: {err!r}")
    return {k: v for k, v in os.environ.items() if before.get(k) != v and k not in ONE_THREAD}


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


class Server:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, dict] = {}  # pid -> {"conn", "buf", "watched"}
        self.context = json.loads(json.dumps(context.current()))  # as the client's arrives
        self.added_env: dict[str, str] = {}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stopping = self.signalled = False

    def run(self) -> int:
        t0 = time.perf_counter()
        users = {k: os.environ[k] for k in ONE_THREAD if k in os.environ}
        os.environ.update(ONE_THREAD)  # even over the user's: a second thread would stop every fork
        self.added_env = preload()
        for k in ONE_THREAD:
            os.environ.pop(k)
        os.environ.update(users)  # children get the stage's own values back (child._blas_threads)
        self.context["env"].update(context.import_time_env(self.added_env))
        import torch

        if torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
            _log("warm server: an import initialised CUDA; not serving")
            return 1
        self.listener.bind(str(self.path))
        self.listener.listen(64)
        _log(f"warm server {os.getpid()}: ready after {time.perf_counter() - t0:.1f} s of imports")
        self.sel.register(self.listener, selectors.EVENT_READ, "listener")
        self.sel.register(sys.stdin, selectors.EVENT_READ, "command")
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(PARENT_GONE, self._on_parent_gone)
        while not self.stopping:
            self._serve_once(timeout=0.2)
        self._stop_children()
        return 0

    def _on_sigterm(self, signum, frame) -> None:
        # A SIGTERM to the server is one to the whole job (systemctl stop, scancel, a process
        # group): each stage gets it from its client (or directly) already, so it is not sent
        # a third time; the server stops serving and waits for them.
        self.stopping, self.signalled = True, True

    def _on_parent_gone(self, signum, frame) -> None:
        # The command was killed outright (kill -9): its stages heard nothing, so they get a
        # SIGTERM each from here (_stop_children), as on the end of file that comes with it.
        self.stopping = True

    def _serve_once(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "command":
                if not os.read(sys.stdin.fileno(), 1 << 12):  # the command ended
                    self.sel.unregister(sys.stdin)
                    self.stopping = True
            else:
                self._from_client(key.data)
        self._reap()

    def _stop_children(self, grace_s: float = 120.0) -> None:
        """The command ended: stop every stage as a SIGTERM to it would (it saves, its client hears
        how), then go. After a SIGTERM of its own, the stages have theirs: only wait for them."""
        self.listener.close()
        for pid in [] if self.signalled else self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.children and time.monotonic() < deadline:
            self._serve_once(timeout=0.1)
        for pid in self.children:
            child.kill_group(pid, signal.SIGKILL)

    def _accept(self) -> None:
        """Serve one request; whatever goes wrong with it (a malformed request, fork failing on a
        process limit) refuses that request only, never the stages that run."""
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:  # the client sends its request (and fds) only once greeted: warm.client.GREETING_WAIT_S
            conn.sendall(GREETING)
        except OSError:  # it gave up waiting (this server was stopped) and runs its stage plain
            conn.close()
            return
        try:
            self._serve(conn)
        except Exception as err:  # noqa: BLE001 - this request is refused; the client runs plain
            _log(f"warm server: request failed ({err!r})")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"refused": f"the warm server failed ({err})"}).encode() + b"\n")
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            request, fds = child.receive(conn)
            # a client that gave up waiting for the reply (warm.client.REPLY_WAIT_S: this server
            # was stopped) has failed its stage: it must not run here after all
            refused = self._refusal(request) or ("the client left" if _gone(conn) else "")
        except (OSError, ValueError, KeyError, TypeError) as err:
            _log(f"warm server: bad request ({err!r})")
            refused = f"bad request ({err})"
        command = " ".join(["ampbench", *request.get("argv", [])]) if "request" in locals() else "?"
        if refused:
            _log(f"warm server: refused `{command}`: {refused}")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"refused": refused}).encode() + b"\n")
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        try:
            pid = child.fork(conn, request, fds, self)
        finally:
            for fd in fds:  # only the child may hold them: a pipe must close when the child exits
                os.close(fd)
        self.children[pid] = {"conn": conn, "buf": b"", "watched": True}
        self._send(pid, {"pid": pid})  # first: once the client knows, it never runs the stage itself
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ, pid)
        _log(f"warm server: pid {pid} runs `{command}` in {request['cwd']}")

    def _refusal(self, request: dict) -> str:
        if self.stopping:
            return "the warm server is stopping"
        # what the server's imports added, every child gets: only another value of it differs
        stage = {**request["context"], "env": context.import_time_env({**self.added_env, **request["env"]})}
        found = context.differences(stage, self.context)
        if found:
            return "; ".join(found)
        if thread_count() != 1:  # a fork would copy one of several threads
            return f"the warm server has {thread_count()} threads"
        return ""

    def _from_client(self, pid: int) -> None:
        entry = self.children[pid]
        try:
            data = entry["conn"].recv(4096)
        except OSError:
            data = b""
        if not data:  # the client is gone (kill -9): so goes its stage, as if it had run there
            self.sel.unregister(entry["conn"])
            entry["watched"] = False
            child.kill_group(pid, signal.SIGKILL)
            return
        entry["buf"] += data
        while b"\n" in entry["buf"]:
            line, entry["buf"] = entry["buf"].split(b"\n", 1)
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
                sig = int(json.loads(line)["signal"])
                # stop and continue act on the whole stage (torchrun's workers included)
                os.killpg(pid, sig) if sig in (signal.SIGSTOP, signal.SIGCONT) else os.kill(pid, sig)

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
            entry = self.children.pop(pid)
            if entry["watched"]:
                self.sel.unregister(entry["conn"])
            entry["conn"].close()

    def _send(self, pid: int, message: dict) -> None:
        conn = self.children[pid]["conn"]
        try:
            conn.setblocking(True)
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the client is gone; _from_client handles that
        finally:
            conn.setblocking(False)


def _gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (it sends nothing more before it has the child's pid)."""
    # select first: recv on a socket with a timeout (child.receive's) would wait that long
    readable, _, _ = select.select([conn], [], [], 0)
    return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""


def _log(line: str) -> None:
    """A line in the server's log; a full or broken log never stops the server (or its stages)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)


def main() -> int:
    output.charts_to_files()  # as every command does before it compares environments with this one
    # Not SIGTERM, which is a stop of the whole job whose stages have theirs already: after a
    # kill -9 of the command the server sent none, and a stage trained on as an orphan (pass O).
    child.die_with_parent(PARENT_GONE)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, *ONE_JOB):
        signal.signal(sig, signal.SIG_IGN)  # the command's stages hear these through their clients
    return Server(Path(sys.argv[1])).run()


if __name__ == "__main__":
    raise SystemExit(main())
