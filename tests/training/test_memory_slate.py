"""Each seed's peak memory must not carry what earlier seeds of the process left on the GPU.

torch keeps cuBLAS workspaces per stream for the life of the process and counts them as allocated
memory. On an H100 a new warm-up stream per step made every seed's peak 195 MiB higher than the
one before (DDP: 715 MiB). These tests pin the two fixes without a GPU: one warm-up stream per
device for the process, and the workspaces freed in the clean slate before each seed.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch
from torch import nn

from ampbench.training import measure, parallel, step


class _FakeStream:
    made = 0

    def __init__(self, device=None) -> None:
        _FakeStream.made += 1

    def wait_stream(self, other) -> None:
        pass


def test_warm_up_steps_share_one_stream_per_device(monkeypatch):
    monkeypatch.setattr(step, "_SIDE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    current = _FakeStream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: current)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    runs: list = []
    fake = step.Step.__new__(step.Step)
    fake.use_graph, fake.device = True, torch.device("cuda", 0)
    fake._run = lambda images, labels: runs.append(images)
    _FakeStream.made = 0
    for i in range(11):  # DDP's warm-up steps, then a second seed's
        fake._before_capture(i, None)
    side = step.side_stream(torch.device("cuda", 0))
    assert runs == list(range(11))
    assert _FakeStream.made == 1  # the side stream, made once for every step
    assert step.side_stream(torch.device("cuda", 0)) is side
    assert step.side_stream(torch.device("cuda", 1)) is not side


def test_the_clean_slate_frees_cublas_workspaces_before_the_peak_is_reset(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("workspaces"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    measure.clean_slate(torch.device("cuda", 0))
    assert calls == ["sync", "workspaces", "empty", "reset"]
    calls.clear()
    measure.clean_slate(torch.device("cpu"))
    assert calls == []


def test_ddp_is_built_warmed_up_and_captured_on_one_stream(monkeypatch):
    """Every DDP stage of the 2026-12-07 H100 study printed torch's "The AccumulateGrad node's
    stream does not match the stream of the node that produced the incoming gradient": DDP was
    built on a stream of its own, warmed up on the step's side stream and captured on torch's
    capture stream. DDP keeps each parameter's gradient accumulator, tied to the stream it was
    made on, so all three must be one stream."""
    monkeypatch.setattr(step, "_SIDE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    current = [_FakeStream()]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: current[-1])

    @contextlib.contextmanager
    def on(stream, **_):
        current.append(stream)
        yield
        current.pop()

    built: list = []
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, stream=None, **kw: on(stream))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", lambda m, **_: built.append(current[-1]) or m)
    device = torch.device("cuda", 0)
    strategy = parallel.Distributed.__new__(parallel.Distributed)
    strategy.device = device
    strategy.wrap(nn.Linear(2, 2))

    ran: list = []
    fake = step.Step.__new__(step.Step)
    fake.use_graph, fake.device = True, device
    fake.opt = SimpleNamespace(param_groups=[{"lr": torch.tensor(0.1)}])
    fake._run = lambda images, labels: ran.append(current[-1])
    fake._before_capture(torch.zeros(1), torch.zeros(1))
    assert fake._capture(torch.zeros(1), torch.zeros(1)) is True
    side = step.side_stream(device)
    assert built == [side] and ran == [side, side]  # built, warmed up, captured
