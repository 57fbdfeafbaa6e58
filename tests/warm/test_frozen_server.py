"""A warm server that is stopped (`kill -STOP`, a debugger, a frozen VM) never hangs a study: a
stage waits for its greeting a bounded time, says so in one line and runs plain; a server that
stops after greeting fails the stage in one line instead of running it twice.

The kernel accepts connections into a stopped server's listen backlog, so a connect succeeds
either way: only the server's greeting shows it is alive. The stage's stdin/stdout/stderr are sent
only after it, so that a stopped server never holds them (the pipes below would never close).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest
from test_warm import PY, TRAIN, Command

from ampbench.warm import child, client, server
from conftest import alive, long_project, new_project, venv_env

pytestmark = pytest.mark.slow  # a server imports torch and MLflow: seconds


class Output:
    """A process's stdout and stderr, read through pipes, each line with the time it came."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: dict[str, list[tuple[float, str]]] = {"out": [], "err": []}
        self.readers = [
            threading.Thread(target=self._read, args=(stream, self.lines[name]), daemon=True)
            for name, stream in (("out", proc.stdout), ("err", proc.stderr))
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list) -> None:
        for line in stream:
            into.append((time.monotonic(), line))

    def closed(self, timeout: float) -> bool:
        """Whether both pipes reached end of file: no process holds them any more."""
        deadline = time.monotonic() + timeout
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return not any(reader.is_alive() for reader in self.readers)

    def text(self, name: str) -> str:
        return "".join(line for _, line in self.lines[name])


def test_a_stopped_server_is_waited_for_a_bounded_time_then_the_stage_runs_plain(tmp_path):
    held = Command()
    stopped = True
    os.kill(held.server, signal.SIGSTOP)
    proc = None
    try:
        project = new_project(tmp_path / "p")
        env = {k: v for k, v in held.env.items() if k != "AMPBENCH_DEBUG"}  # only what a user sees
        since = len(held.log())
        start = time.monotonic()
        proc = subprocess.Popen(
            [PY, "-m", "ampbench", *TRAIN],
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        output = Output(proc)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the stage waited 120 s on a stopped server:\n{output.text('err')[-2000:]}")
        # the client sent nothing to the stopped server: its stdout and stderr close with it
        assert output.closed(10), "the stage's output stays open after it ended (held by the server?)"
        err = output.text("err")
        assert code == 0, err[-3000:]
        assert time.monotonic() - start < 90, "the plain stage took too long"
        said = [(t, line) for t, line in output.lines["err"] if "warm server" in line]
        assert len(said) == 1, err[-3000:]
        when, line = said[0]
        assert f"(pid {held.server})" in line and f"kill -CONT {held.server}" in line, line
        assert "running this stage as a plain process" in line, line
        assert when - start < client.GREETING_WAIT_S + 10, f"said after {when - start:.1f} s"
        assert "Traceback" not in err and "test accuracy" in err, err[-3000:]
        assert (project / "models/single-fp32/seed-0/model.pt").exists()
        assert "runs `ampbench" not in held.log()[since:]  # it ran plain, not in a fork

        # continued, the server drops the connection its client gave up on, and serves again
        os.kill(held.server, signal.SIGCONT)
        stopped = False
        since = len(held.log())
        usage = subprocess.run(
            [PY, "-m", "ampbench", "compare", "--nope"], env=env, capture_output=True, text=True, timeout=60
        )
        assert usage.returncode == 2 and "unrecognized arguments: --nope" in usage.stderr, usage.stderr
        assert "warm server" not in usage.stderr, usage.stderr
        held.stage_pid("compare --nope", since)  # it ran in a fork of the server again
        assert "Traceback" not in held.log() and "request failed" not in held.log(), held.log()
    finally:
        if stopped:
            os.kill(held.server, signal.SIGCONT)
        if proc is not None and proc.poll() is None:
            proc.kill()
        held.end()
    # and it still ends with its command, as it should: status 0, its folder removed
    assert held.proc.returncode == 0 and not held.folder.exists()


def test_a_server_stopped_while_its_stage_runs_is_said_once_and_the_end_told_after_sigcont(tmp_path):
    """The stage runs on (a process of its own), but its end reaches the client only through the
    server: the client says so in one line instead of waiting without a word, then ends as the
    stage did once the server continues."""
    held = Command()
    stopped = False
    try:
        project = long_project(tmp_path / "p")
        log = project / "train.log"
        proc, stage = held.start(project, log=log)
        os.kill(held.server, signal.SIGSTOP)
        stopped, start = True, time.monotonic()
        line = f"ampbench: the warm server (pid {held.server}) is stopped; process {stage} runs this stage on"
        while line not in log.read_text():
            assert time.monotonic() - start < 20, log.read_text()[-3000:]  # the issue: a line within 30 s
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(held.server, signal.SIGCONT)
        stopped = False
        assert proc.wait(120) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert text.count("warm server (pid") == 1 and f"kill -CONT {held.server}" in text, text[-3000:]
        assert "Traceback" not in text and (project / "models/single-fp32/seed-0/model.pt").exists()
    finally:
        if stopped:
            os.kill(held.server, signal.SIGCONT)
        held.end()


def test_a_command_whose_server_is_stopped_still_ends_at_once():
    """`make run` ends: a stopped server would never read the end of file that ends it (the command
    waited 150 s without a word, then killed it); continued, it exits cleanly at once."""
    held = Command()
    os.kill(held.server, signal.SIGSTOP)
    start = time.monotonic()
    try:
        held.end()  # closes its stdin and waits up to 60 s
    finally:
        if alive(held.server):
            os.kill(held.server, signal.SIGCONT)
    assert time.monotonic() - start < 30
    assert held.proc.returncode == 0 and not held.folder.exists() and not alive(held.server)


# A client of a server that greeted it and then stopped, as a stage's `ampbench train` runs it.
MID_REQUEST = """
import sys
from ampbench.warm import client
client.REPLY_WAIT_S = 1.0
code = client.forward(["train"])
print("forward returned", code, file=sys.stderr)
sys.exit(code if code is not None else 99)
"""


def test_a_server_stopped_mid_request_fails_the_stage_in_one_line_and_never_runs_it(tmp_path):
    """Greeted, then no reply: the server may have forked the stage already, so the client does not
    run it too; it says so and fails. The server, continued, refuses the request of a client that
    left (it would otherwise start a stage nobody waits for)."""
    path = tmp_path / "socket"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    proc = subprocess.Popen(
        [PY, "-c", MID_REQUEST],
        env=venv_env(AMPBENCH_WARM_SOCKET=str(path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listener.settimeout(30)
    conn, _ = listener.accept()
    try:
        conn.sendall(server.GREETING)
        # the request and fds arrive; this "server" reads them as the real one does, then stops
        request, fds = child.receive(conn)
        for fd in fds:
            os.close(fd)
        assert request["argv"] == ["train"]
        assert not server._gone(conn), "a client waiting for its reply is taken for gone"
        try:
            code = proc.wait(client.REPLY_WAIT_S + 1 + 30)
        except subprocess.TimeoutExpired:
            pytest.fail("the client waited 30 s for a server that stopped mid-request")
        # continued, the real server checks this before it forks: no stage that nobody waits for
        assert server._gone(conn), "a client that gave up is not seen as gone"
    finally:
        conn.close()  # the fds it holds for the client: its pipes can close now
        listener.close()
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate(timeout=30)
    assert code == 1, err
    said = [line for line in err.splitlines() if "warm server" in line]
    assert said == [
        f"ampbench: the warm server (pid {os.getpid()}) stopped answering while starting this stage "
        f"(stopped? `kill -CONT {os.getpid()}`); not run here too, as it may have started: "
        "run the command again"
    ], err
    assert "Traceback" not in err and "forward returned 1" in err, err


def test_a_stage_that_gave_up_on_the_server_starts_its_processes_plain(monkeypatch, capsys):
    """Hostile pass WARN: a DDP stage said "did not answer in 5 s ... running this stage as a plain
    process" three times (its launcher, then each worker, waiting 5 s on the same stopped server)."""
    from ampbench.warm import SOCKET_ENV

    monkeypatch.setenv(SOCKET_ENV, "/nonexistent/socket")
    client._plain("(pid 1) did not answer in 5 s")
    assert SOCKET_ENV not in os.environ  # torchrun's workers inherit this environment
    assert capsys.readouterr().err.count("running this stage as a plain process") == 1
