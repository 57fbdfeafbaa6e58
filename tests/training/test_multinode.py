"""DDP over several machines, the way users outgrow one: an outer `torchrun --nnodes N` per node
(SLURM starts one per node), c10d rendezvous, the same `ampbench train --parallel ddp` command.

Two torchrun agents on 127.0.0.1 stand for two nodes sharing the project folder (models/,
checkpoints/ and the tracking store are what nodes must share: docs/PIPELINE.md). The result must
equal one node's with the same number of processes, and losing a node mid-training must stop the
other with its work saved, so that the same command resumes exactly.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import REPO, clean_env, free_port, new_project

pytestmark = pytest.mark.slow  # torchrun agents and their workers as subprocesses

# Enough steps that a node can be lost mid-training on a 2-core machine (30 steps per epoch).
SECTIONS = {"train": {"epochs": 6, "batch_size": 20, "seeds": [0], "checkpoint_every_s": 0}}
PER_CLASS = 60
TRAIN = ["-m", "ampbench", "train", "--parallel", "ddp", "--precision", "fp32"]
VARIANT_DIR = Path("models") / "ddp-fp32" / "seed-0"


def _env() -> dict:
    return clean_env(CUDA_VISIBLE_DEVICES="")


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, *TRAIN]


def _nodes(*args: str) -> list[str]:
    """The documented multi-node form: torchrun's agent, ending in one line (ampbench.nodes)."""
    return [sys.executable, "-m", "ampbench.nodes", *args, *TRAIN]


def _two_nodes(project: Path) -> list[subprocess.Popen]:
    """Two agents of one job, one worker each, meeting at a c10d rendezvous on 127.0.0.1."""
    rdzv = [
        *("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"),
        *("--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-nodes"),
    ]
    return [
        subprocess.Popen(
            _nodes(*rdzv),
            cwd=project,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]


def _finish(agents: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    return [(a.wait(timeout=timeout), a.communicate()[0]) for a in agents]


def _weights(project: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(project / VARIANT_DIR / "model.pt", map_location="cpu", weights_only=True)
    return saved["state_dict"]


def _assert_same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The reference: one agent with two workers (a single node)."""
    project = new_project(tmp_path_factory.mktemp("one") / "proj", per_class=PER_CLASS, **SECTIONS)
    cmd = _torchrun("--standalone", "--nnodes", "1", "--nproc-per-node", "2")
    proc = subprocess.run(cmd, cwd=project, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _weights(project)


def test_two_nodes_train_what_one_node_trains(tmp_path, one_node):
    project = new_project(tmp_path / "proj", per_class=PER_CLASS, **SECTIONS)
    results = _finish(_two_nodes(project))
    assert [rc for rc, _ in results] == [0, 0], "\n".join(out for _, out in results)
    _assert_same_weights(_weights(project), one_node)


def _worker_rank(agent: subprocess.Popen) -> int | None:
    for child in psutil.Process(agent.pid).children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None:
            return int(rank)
    return None


def _kill_node(agent: subprocess.Popen) -> None:
    """A node lost: its agent and its workers (torchrun puts each worker in a session of its own)."""
    procs = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _wait_for_checkpoint(project: Path, agents: list[subprocess.Popen], timeout: float = 240) -> None:
    work = project / "checkpoints" / "ddp-fp32"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(work.rglob("*.pt")):
            return
        if any(a.poll() is not None for a in agents):
            pytest.fail("an agent ended before the first checkpoint: " + "\n".join(_finish(agents)[0][1:]))
        time.sleep(0.2)
    pytest.fail(f"no checkpoint under {work} within {timeout} s")


def test_a_lost_node_stops_the_other_and_the_same_command_resumes_exactly(tmp_path, one_node):
    project = new_project(tmp_path / "proj", per_class=PER_CLASS, **SECTIONS)
    agents = _two_nodes(project)
    _wait_for_checkpoint(project, agents)
    ranks = [_worker_rank(a) for a in agents]
    assert sorted(r for r in ranks if r is not None) == [0, 1], ranks
    lost, survivor = (agents[0], agents[1]) if ranks[0] == 1 else (agents[1], agents[0])
    _kill_node(lost)
    started = time.monotonic()
    rc, out = survivor.wait(timeout=120), survivor.communicate()[0]
    lost.wait(timeout=30)
    assert rc != 0, out
    # The surviving worker says so in one line: its collective failed ("another process ... is
    # gone"), or its agent stopped it first (a stop: checkpoint saved, how to resume). What
    # torchrun's own agent prints is torch's, but never a traceback of ours, not even inside its
    # report (@record used to write the survivor's Stopped into it).
    gone = "another process of this DDP job is gone" in out
    assert gone or ("checkpoint saved" in out and "To resume" in out), out
    assert "Traceback" not in out and "ChildFailedError" not in out, out  # not ours, not torchrun's
    assert not re.search(r'File "[^"]*/ampbench/', out), out
    if gone:  # its agent's ending: the worker's exit, or the store of a lost host node (CI saw both)
        ending = ("ampbench.nodes: this node's worker of rank", "ampbench.nodes: the job's rendezvous failed")
        assert any(e in out for e in ending) and "to resume" in out, out
    assert time.monotonic() - started < 90, f"the surviving node took too long to stop:\n{out}"
    assert not (project / VARIANT_DIR / "model.pt").exists(), "the interrupted seed was published"
    assert any((project / "checkpoints" / "ddp-fp32").rglob("*.pt")), "the checkpoint was lost"

    results = _finish(_two_nodes(project))
    assert [r for r, _ in results] == [0, 0], "\n".join(o for _, o in results)
    assert any("resum" in o.lower() for _, o in results), "the re-run did not say it resumed"
    _assert_same_weights(_weights(project), one_node)


@pytest.mark.parametrize("ending", ["stopped", "peer gone"])
def test_a_workers_stop_or_lost_peer_is_not_written_into_torchruns_report(ending, tmp_path, monkeypatch):
    """torchrun prints a failed worker's error file in its report: a stop (its agent's SIGTERM)
    or a lost peer is the worker's one line and exit status, never its traceback there."""
    import argparse

    import torch.distributed as dist

    from ampbench.config import load_config
    from ampbench.stages import train, train_main
    from ampbench.training import loop

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "2")
    failure = loop.Stopped("stopped at seed 0 epoch 4 step 7; checkpoint saved") if ending == "stopped" else (
        dist.DistError("Connection reset by peer"))  # fmt: skip

    def ends(*args, **kwargs):
        raise failure

    monkeypatch.setattr(train, "train_variant", ends)
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(parallel="ddp", precision="fp32", fresh=False, params=str(REPO / "params.yaml"),
                              overrides=[])  # fmt: skip
    monkeypatch.setattr(train_main, "all_overrides", lambda args: [])
    status = train_main._train_here(load_config(REPO / "params.yaml"), args, ["train"], tmp_path / "w")
    assert status == (143 if ending == "stopped" else 1)
    assert not error_file.exists(), error_file.read_text()


@pytest.mark.parametrize("error", ["RendezvousConnectionError", "RendezvousTimeoutError"])
def test_a_lost_rendezvous_store_ends_the_agent_in_one_line(error, monkeypatch, capsys):
    """CI: the lost node hosted the c10d store; the survivor's agent asked the store how many nodes
    wait before it saw its worker's exit, and ampbench.nodes ended in torch's 50-line traceback."""
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.rendezvous import api

    from ampbench import nodes

    def lost(argv):
        raise getattr(api, error)("The connection to the C10d store has failed. See inner exception.")

    monkeypatch.setattr(torch_run, "main", lost)
    assert nodes.main(["--nnodes", "2", "-m", "ampbench", "train"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ampbench.nodes: the job's rendezvous failed"), err
    assert error in err and "run the same command on every node to resume" in err, err
