"""The DDP strategy's faults: a collective whose peer never joins times out (train.
collective_timeout_s) instead of hanging, and more workers than GPUs is refused at setup.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ampbench.training import parallel
from conftest import free_port, venv_env

HANG = """
import os, sys, time
rank, port, timeout = sys.argv[1:]
os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
import torch
from ampbench.training import parallel

ddp = parallel.Distributed(collective_timeout_s=float(timeout))
ddp.setup()
if rank == "1":
    time.sleep(300)  # alive, but never joins the collective
t0 = time.monotonic()
try:
    ddp.all_sum(torch.ones(1))
    print("RETURNED")
except Exception as err:
    print(f"RAISED after {time.monotonic() - t0:.2f} s: {type(err).__name__}: {err}", flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_hung_collective_times_out(tmp_path, procs):
    (tmp_path / "hang.py").write_text(HANG)
    port, timeout = str(free_port()), 2
    env = venv_env()
    cmd = [sys.executable, "hang.py", "1", port, str(timeout)]
    peer = procs.start(tmp_path, name="rank1", env=env, cmd=cmd)
    rank0 = subprocess.run(
        [sys.executable, "hang.py", "0", port, str(timeout)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert peer.poll() is None  # rank 1 was alive all along: a hang, not a crash
    out = rank0.stdout + rank0.stderr
    assert "RAISED after" in out, out
    waited = float(out.split("RAISED after ")[1].split(" s")[0])
    assert timeout - 0.5 <= waited < timeout + 20, out
    assert "Timed out" in out or "timeout" in out.lower(), out


def test_more_ddp_workers_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match=r"2 processes on this node but only 1 GPU\(s\)"):
        parallel.Distributed().setup()
