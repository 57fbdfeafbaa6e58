"""A stop that comes before the training loop is there (a model factory that never returns) stops
the stage at once; once the loop has asked, a stop waits for its step boundary (final pass I:
"stopping at the next step boundary", then 105 s of silence; a second Ctrl-C killed it without a
word)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from ampbench.stages.stop import StopFlag
from ampbench.training.stopping import Stopped


def test_a_stop_before_the_first_step_raises_at_once(handlers, monkeypatch, caplog):
    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    StopFlag()  # its handlers hold it
    with pytest.raises(Stopped, match="before the first training step"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the factory that never returns
    assert "SIGINT received before the first training step: stopping now" in caplog.text


def test_after_the_loop_asked_a_stop_waits_for_its_step_boundary(handlers, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    flag = StopFlag()
    assert flag() is False  # the loop's first question, after its first step
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # the handler ran: no exception, the flag is set
    assert flag() is True and flag.signum == signal.SIGINT


def test_a_ddp_worker_keeps_to_the_flag_from_the_start(handlers, monkeypatch):
    """Its peers must stop at the same step: a worker raising alone would leave them waiting."""
    monkeypatch.setenv("RANK", "1")
    flag = StopFlag()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert flag() is True


def test_a_stop_while_the_data_set_loads_is_a_stop_not_a_damaged_file(
    handlers, monkeypatch, tmp_path, caplog
):
    """CI, a warm stage Ctrl-C'd at its first instant: the Stopped raised inside torch.load was
    caught as a load failure, "data/prepared/cifar10.pt is unreadable (stopped before the first
    training step ...); delete it and re-download", exit 70 (and a user told to delete good data)."""
    import torch

    from ampbench.data import prepared

    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    path = tmp_path / "cifar10.pt"
    path.write_bytes(b"any")

    def load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # a large file read: the handler runs in here

    monkeypatch.setattr(torch, "load", load)
    StopFlag()
    with pytest.raises(Stopped, match="before the first training step"):
        prepared.load_dataset(path)
