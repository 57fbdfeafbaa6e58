"""The background checkpoint writer: what lands on disk is the state at save time, errors come
back to the trainer, and a kill -9 of the trainer does not stop a write in progress."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from ampbench.checkpoints import files
from ampbench.checkpoints.writer import CheckpointWriter


def _state(value: float) -> dict:
    return {
        "model": {"w": torch.full((300, 300), value), "n": torch.arange(3)},
        "epoch": int(value),
        "history": [{"epoch": 1, "loss": 0.5}],
        "stats": None,
    }


def test_the_file_holds_the_state_at_save_time_and_close_cleans_up(tmp_path: Path):
    writer = CheckpointWriter()
    state = _state(1.0)
    writer.save(state, tmp_path / "ck.pt")
    state["model"]["w"].fill_(7.0)  # training goes on while the writer writes
    writer.wait()
    saved = files.load(tmp_path / "ck.pt")
    assert torch.equal(saved["model"]["w"], torch.full((300, 300), 1.0))
    assert saved["history"] == [{"epoch": 1, "loss": 0.5}] and saved["epoch"] == 1 and saved["stats"] is None
    writer.save(_state(2.0), tmp_path / "ck.pt", wait=True)
    assert files.load(tmp_path / "ck.pt")["epoch"] == 2 and writer.writes == 2
    writer.close()
    assert not glob.glob(f"/dev/shm/ampbench-ckpt-{os.getpid()}-*")
    assert not list(tmp_path.glob(".ck.pt.*"))  # no temp file left


def test_a_failed_write_raises_in_the_trainer(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = CheckpointWriter()
    writer.save(_state(1.0), blocker / "ck.pt")
    with pytest.raises(files.CheckpointError, match="could not write checkpoint"):
        writer.wait()
    writer.close()


def test_kill_9_of_the_trainer_does_not_stop_the_write_in_flight(tmp_path: Path):
    """The trainer dies right after handing over a large snapshot: the checkpoint still lands."""
    script = textwrap.dedent(f"""
        import os, signal, torch
        from pathlib import Path
        from ampbench.checkpoints.writer import CheckpointWriter
        w = CheckpointWriter()
        w.save({{"w": torch.ones(3000, 3000), "epoch": 5}}, Path({str(tmp_path / "ck.pt")!r}), wait=True)
        w.save({{"w": torch.full((3000, 3000), 2.0), "epoch": 6}}, Path({str(tmp_path / "ck.pt")!r}))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    assert proc.wait(120) == -signal.SIGKILL
    for _ in range(600):  # the orphaned writer finishes and exits
        try:
            saved = files.load(tmp_path / "ck.pt")
        except files.CheckpointError:
            saved = None
        if saved and saved["epoch"] == 6 and not glob.glob(f"/dev/shm/ampbench-ckpt-{proc.pid}-*"):
            break
        time.sleep(0.1)
    assert saved["epoch"] == 6 and torch.equal(saved["w"], torch.full((3000, 3000), 2.0))
    assert not glob.glob(f"/dev/shm/ampbench-ckpt-{proc.pid}-*")  # the writer removed them


def test_close_does_not_wait_for_forked_children_holding_the_pipe(tmp_path: Path):
    """DataLoader workers are forked from the trainer and inherit its end of the writer's pipe."""
    writer = CheckpointWriter()
    writer.save(_state(1.0), tmp_path / "ck.pt", wait=True)
    child = os.fork()
    if child == 0:  # a stand-in for a DataLoader worker
        time.sleep(20)
        os._exit(0)
    try:
        t0 = time.monotonic()
        writer.close()
        assert time.monotonic() - t0 < 10
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_epoch_hooks_close_returns_when_the_store_times_out():
    """The sender's failed flush and close() racing: close() must not wait for ever."""
    import threading

    from ampbench.tracking.epoch_hooks import EpochHooks

    class SlowDeadStore:
        uri = "test://down"

        def log_metrics(self, run_id, metrics, step=None):
            time.sleep(0.3)
            raise RuntimeError("store down")

    hooks = EpochHooks(SlowDeadStore(), "run")
    hooks.on_epoch(1, {"train_loss": 1.0})
    time.sleep(0.05)  # the sender is inside its failing flush
    closing = threading.Thread(target=hooks.close)
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "close() hung"
    assert hooks.state() == [[1, {"train_loss": 1.0}]]  # kept for the checkpoint / a re-run
