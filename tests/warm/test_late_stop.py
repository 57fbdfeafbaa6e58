"""A stop that reaches the warm client after its stage has ended: no stage can take it any more."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from ampbench.warm import client


@pytest.fixture
def handlers_kept():
    saved = {sig: signal.getsignal(sig) for sig in client.PASSED_ON}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("handlers_kept")
@pytest.mark.parametrize(("code", "said"), [(0, 1), (1, 0)])
def test_a_stop_after_the_stage_ended_is_said_once_where_its_work_was_done(capsys, code, said):
    """Hostile pass Q: Ctrl-C 0.1 s after the pipeline's last training line: the client passed it on
    to a stage already gone, exit 0, and nothing was said (at 0.3 s DVC's "came after" was)."""
    ended = subprocess.Popen(["true"])
    ended.wait()  # the stage: gone, as at the end of its exit
    ours, server = socket.socketpair()

    def the_server() -> None:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)  # the job's Ctrl-C, passed on to nobody
        time.sleep(0.2)
        server.sendall(f'{{"exit": {code}}}\n'.encode())

    threading.Thread(target=the_server, daemon=True).start()
    stage = client._Stage(os.getpid(), ended.pid, "train")  # noqa: SLF001
    assert client._wait(ours, client._Lines(ours), stage, [], watch_parent=False) == code  # noqa: SLF001
    os.kill(os.getpid(), signal.SIGTERM)  # again, after: still nothing to stop, nothing said twice
    time.sleep(0.05)
    err = capsys.readouterr().err
    line = "ampbench: SIGINT came as `ampbench train` ended: its work is done and kept\n"
    assert err.count(line) == said and err.count("came as") == said, err


def test_the_client_waits_for_a_stopped_stage_to_be_gone_not_only_past_its_exit_call(monkeypatch):
    """CI (stop 46): the client said the stage was stopped while the kernel still freed it (its
    PF_EXITING flag set, not yet a zombie), and the caller's next look found it alive."""
    from ampbench import processes

    states = iter(["R", "R", "Z"])  # past its exit call twice, then a zombie
    read: list[str] = []

    class Stat:
        def __init__(self, path: str) -> None:
            pass

        def read_text(self, encoding: str) -> str:
            read.append(next(states))
            flags = processes.PF_EXITING | 0x400000
            return f"4242 (python) {read[-1]} 1 1 1 0 -1 {flags} 0 0"

    monkeypatch.setattr(processes, "Path", Stat)
    client._wait_gone(4242, at_most_s=10)
    assert read == ["R", "R", "Z"]
    states = iter(["R"])
    read.clear()
    assert processes.exiting(4242) and read == ["R"]  # a stop sent now reaches no handler
