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
