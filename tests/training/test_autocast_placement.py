"""The tutorial's claim 4 demonstration (train.dp_autocast_outside_forward): where autocast is
entered, and the dtype each DataParallel replica really ran (the `replica_dtypes` fact).

On the CPU DataParallel calls the module directly, so these tests check the mechanics only; the
claim itself needs two GPUs (the `gpu` test below, and docs/FINDINGS.md's claim-4 section).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampbench.config import Config, ModelConfig, replace
from ampbench.training import build, claim4, parallel, precision
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


def _outer(model: nn.Module) -> list[claim4.OuterAutocast]:
    return [m for m in model.modules() if isinstance(m, claim4.OuterAutocast)]


def test_flag_on_moves_autocast_into_the_step_and_records_the_dtype():
    trainer, dtypes = _one_step(outside=True)
    raw, facts, called = trainer.raw_model, trainer.facts, trainer.model
    assert not raw.amp_enabled
    # What the step calls enters autocast around the (parallel-wrapped) model: the tutorial's placement.
    assert isinstance(called, claim4.OuterAutocast)
    assert (called.device_type, called.dtype) == ("cpu", torch.bfloat16)
    assert facts["autocast_placement"] == "outside_forward" and facts["amp_dtype"] == "bfloat16"
    # dp on the CPU calls the module in this thread: the outer autocast reaches it, dtype and all.
    assert dtypes == "cpu=bfloat16"


def test_flag_off_leaves_autocast_in_forward():
    trainer, dtypes = _one_step(outside=False)
    assert trainer.raw_model.amp_enabled and "autocast_placement" not in trainer.facts
    assert not _outer(trainer.model)  # the default step carries no trace of the demonstration
    assert dtypes == "cpu=bfloat16"


def test_flag_on_fp32_has_nothing_to_move():
    trainer, dtypes = _one_step(outside=True, prec="fp32")
    assert not _outer(trainer.model) and trainer.facts["autocast_placement"] == "none"
    assert dtypes == "cpu=float32"


def test_probe_ignores_evaluation_and_the_outer_autocast_encloses_the_wrapper():
    model = AlexNet(TINY.model).eval()
    probe = DtypeProbe(model)
    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    model(x)
    assert probe.fact() == ""
    model.amp_enabled = True
    outer, fact = claim4.autocast_outside(model, nn.DataParallel(model))
    assert fact == {"autocast_placement": "outside_forward"} and not model.amp_enabled
    # Around DataParallel, not inside it: what its replica threads re-enter is the claim.
    assert isinstance(outer.inner, nn.DataParallel)
    model.train()
    with torch.no_grad():
        outer(x)
    assert probe.fact() == "cpu=bfloat16"  # the model's forward did not switch the outer one off


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
