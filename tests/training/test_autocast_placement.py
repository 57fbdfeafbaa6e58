"""The tutorial's claim 4 demonstration (train.dp_autocast_outside_forward): the precision's
autocast wrapper outside the parallel wrapper instead of inside it, and the dtype each
DataParallel replica really ran (the `replica_dtypes` fact).

On the CPU DataParallel calls the module directly, so these tests check the mechanics, and the
replica threads are made by hand as torch's parallel_apply makes them; the claim itself on real
replicas needs two GPUs (the `gpu` test below, and docs/FINDINGS.md's claim-4 section).
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from ampbench.config import Config, ModelConfig, replace
from ampbench.training import build, dp_autocast_outside, parallel, precision
from ampbench.training.model import AlexNet, DtypeProbe
from conftest import mlflow_client, run_cli

TINY = Config(model=ModelConfig(fc_dim=16))


def _one_step(outside: bool, prec: str = "autocast_bf16", parallel_name: str = "dp"):
    """One eager training step; returns (the trainer, the replica dtypes the probe recorded)."""
    train = {"dp_autocast_outside_forward": outside, "cuda_graph": False}
    cfg = replace(TINY, train=train)
    strategy = parallel.make(parallel_name)
    strategy.setup()
    trainer = build.setup(cfg, precision.REGISTRY[prec], strategy, 10, 100)
    probe = DtypeProbe(trainer.raw_model)
    step = build.make_step(trainer, cfg, strategy)
    x = torch.randint(0, 255, (8, 3, 32, 32), dtype=torch.uint8, device=strategy.device)
    step(x, torch.arange(8, device=strategy.device) % 10)
    return trainer, probe.fact()


def _wrappers(model: nn.Module) -> list[precision.AutocastForward]:
    return [m for m in model.modules() if isinstance(m, precision.AutocastForward)]


def test_flag_on_moves_autocast_into_the_step_and_records_the_dtype():
    trainer, dtypes = _one_step(outside=True)
    raw, facts, called = trainer.raw_model, trainer.facts, trainer.model
    # What the step calls is the precision's wrapper around the (parallel-wrapped) model: the
    # tutorial's placement; the model itself is not wrapped a second time.
    assert isinstance(called, precision.AutocastForward) and len(_wrappers(called)) == 1
    assert (called.device_type, called.dtype) == ("cpu", torch.bfloat16)
    assert called.net is raw  # dp on a CPU returns the model itself; no wrapper inside it
    assert not _wrappers(raw)
    assert facts["autocast_placement"] == "outside_forward" and facts["amp_dtype"] == "bfloat16"
    # dp on the CPU calls the module in this thread: the outer autocast reaches it, dtype and all.
    assert dtypes == "cpu=bfloat16"


def test_flag_off_puts_the_wrapper_inside_the_parallel_wrapper():
    trainer, dtypes = _one_step(outside=False)
    assert "autocast_placement" not in trainer.facts
    # inside: the wrapper is what the strategy wrapped (dp on a CPU returns it as is)
    assert isinstance(trainer.model, precision.AutocastForward) and trainer.model.net is trainer.raw_model
    assert dtypes == "cpu=bfloat16"


def test_flag_on_fp32_has_nothing_to_move():
    trainer, dtypes = _one_step(outside=True, prec="fp32")
    assert not _wrappers(trainer.model) and trainer.facts["autocast_placement"] == "none"
    assert dtypes == "cpu=float32"


def test_probe_ignores_evaluation_and_the_wrapper_goes_around_dataparallel():
    model = AlexNet(TINY.model).eval()
    probe = DtypeProbe(model)
    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    model(x)
    assert probe.fact() == ""
    run = precision.REGISTRY["autocast"].setup(model, torch.device("cpu"))
    outer, fact = dp_autocast_outside.autocast_outside(run, nn.DataParallel(model))
    assert fact == {"autocast_placement": "outside_forward"}
    # Around DataParallel, not inside it: what its replica threads re-enter is the claim.
    assert isinstance(outer.net, nn.DataParallel)
    model.train()
    with torch.no_grad():
        outer(x)
    assert probe.fact() == "cpu=bfloat16"


class _Plain(nn.Module):
    """A model that knows nothing of AMP: no attributes, no autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_wrapper_inside_gives_every_replica_thread_the_configured_dtype():
    """float16 on a CPU, whose autocast default is bfloat16: a thread that lost the dtype shows it.
    Inside, each replica thread calls the wrapper, which enters its own autocast; outside (claim
    4's placement), the threads get only the enabled flag and run the thread default."""
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    plain, x = _Plain(), torch.randn(2, 3, 2, 2)
    seen: list[torch.dtype] = []
    hook = plain.fc.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    inside = _ThreadedReplicas(precision.AutocastForward(plain, "cpu", torch.float16))
    with torch.no_grad():
        out = inside(x)
    assert seen == [torch.float16, torch.float16] and out.dtype == torch.float32
    seen.clear()
    outside = precision.AutocastForward(_ThreadedReplicas(plain), "cpu", torch.float16)
    with torch.no_grad():
        outside(x)
    hook.remove()
    assert seen == [torch.bfloat16, torch.bfloat16]


class _ThreadedReplicas(nn.Module):
    """Two replica threads, each re-entering autocast as parallel_apply does (enabled flag only)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        enabled, outs = torch.is_autocast_enabled("cpu"), []

        def replica(part: torch.Tensor) -> None:
            with torch.autocast("cpu", enabled=enabled):
                outs.append(self.net(part))

        threads = [threading.Thread(target=replica, args=(p,)) for p in x.chunk(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return torch.cat([o.float() for o in outs])  # outputs of mixed dtypes: cat wants one


@pytest.mark.slow  # a whole train stage as a subprocess
def test_the_run_records_replica_dtypes_and_placement(project):
    run_cli(
        project,
        "train",
        "--parallel",
        "dp",
        "--precision",
        "autocast",
        "--set",
        "train.dp_autocast_outside_forward=true",
    )
    client = mlflow_client(project)
    exp = client.get_experiment_by_name("cifar10-amp")
    seed = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ampbench.kind") == "seed"]
    assert len(seed) == 1
    params = seed[0].data.params
    assert params["replica_dtypes"] == "cpu=bfloat16"
    assert params["autocast_placement"] == "outside_forward"
    assert params["train.dp_autocast_outside_forward"] == "True"
    assert seed[0].data.tags["ampbench.conditions"] == "project"


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs >= 2 CUDA GPUs: DataParallel on one "
    "GPU calls the module directly, so no replica thread runs",
)
@pytest.mark.parametrize(("prec", "dtype"), [("autocast", "float16"), ("autocast_bf16", "bfloat16")])
def test_dataparallel_replicas_under_an_outer_autocast(prec, dtype):
    """What torch's parallel_apply does (torch 2.14): each replica thread re-enters autocast with
    `enabled=torch.is_autocast_enabled()` and no dtype, so the replicas run autocast in the
    thread's default CUDA dtype, float16, whatever the outer dtype; never float32. Inside forward
    (the project's placement) every replica runs the configured dtype."""
    _, outside = _one_step(outside=True, prec=prec)
    _, inside = _one_step(outside=False, prec=prec)
    n = torch.cuda.device_count()
    assert inside == ",".join(f"cuda:{i}={dtype}" for i in range(n))
    assert outside == ",".join(f"cuda:{i}=float16" for i in range(n))
