"""Numeric faults: a non-finite loss or a GradScaler scale below train.scale_floor is divergence
(training stops at that epoch); skipped steps of a healthy scaler are logged, not divergence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ampbench import config
from ampbench.training import loop, parallel, precision
from conftest import REPO, make_dataset, run_cli, runs


class _Recorder:
    def __init__(self) -> None:
        self.metrics: list[dict] = []

    def on_epoch(self, epoch: int, metrics: dict) -> None:
        self.metrics.append(metrics)


def _train_in_process(tmp_path: Path, precision_name: str, **train) -> tuple[dict, list[dict]]:
    """trainer.train_seed directly (no MLflow): 60 images, batch 20, 3 steps per epoch."""
    cfg = config.load_config(REPO / "params.yaml")
    cfg = config.replace(
        cfg,
        model={"fc_dim": 32},
        train={"epochs": 3, "batch_size": 20, "seeds": (0,), "checkpoint_every_s": 0.0, "lr": 0.05, **train},
    )
    strategy = parallel.Single()
    strategy.setup()
    job = loop.Job(
        cfg, precision.REGISTRY[precision_name], strategy, make_dataset(), 0, tmp_path / "checkpoint.pt"
    )
    hooks = _Recorder()
    out = loop.train_seed(job, hooks)
    return out["result"].to_dict(), hooks.metrics


def test_nonfinite_loss_is_divergence(tmp_path, one_thread):
    result, metrics = _train_in_process(tmp_path, "fp32", lr=1e30)
    assert result["diverged"] and result["diverged_epoch"] == 1
    assert metrics[0]["nonfinite_losses"] > 0
    assert 0 <= result["diverged_step"] < 3
    assert result["epochs_completed"] == 1  # training stops at the diverged epoch


# Slow: five epochs of bfloat16 autocast, emulated on CPUs without native bfloat16 (AVX2 only).
@pytest.mark.slow
def test_gradscaler_scale_below_floor_is_divergence(tmp_path, one_thread):
    result, metrics = _train_in_process(tmp_path, "autocast_gradscaler", scale_floor=1e30)
    assert result["grad_scaler_used"]  # GradScaler('cpu') is real on CPU
    assert metrics[0]["nonfinite_losses"] == 0 and metrics[0]["skipped_steps"] == 0
    assert metrics[0]["grad_scale"] < 1e30
    assert result["diverged"] and result["diverged_epoch"] == 1 and result["epochs_completed"] == 1
    healthy, _ = _train_in_process(tmp_path, "autocast_gradscaler", epochs=2)
    assert not healthy["diverged"]  # the default floor does not flag a healthy run


@pytest.mark.slow
def test_gradscaler_skipped_steps_are_logged(project):
    run_cli(
        project,
        "train",
        "--parallel",
        "single",
        "--precision",
        "autocast_gradscaler",
        "--set",
        "train.lr=1e30",
    )
    (run,) = runs(project, kind="seed")
    assert run.info.status == "FINISHED"
    assert run.data.params["grad_scaler_used"] == "True"
    assert run.data.metrics["amp/skipped_steps"] > 0 and run.data.metrics["amp/nonfinite_losses"] > 0
    # Skipping non-finite steps is the scaler doing its job; only a collapsed scale (below
    # train.scale_floor) or non-finite weights count as divergence.
    assert run.data.metrics["train/diverged"] == 0 and run.data.tags["diverged"] == "false"
