"""train.compile on a CPU: a compiled step computes what the eager step computes (within floating
point), compiles once per seed (no recompiles), reports its compile time apart, and resumes from a
checkpoint. The H200 numbers: docs/BENCHMARKS.md "torch.compile"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampbench import config
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.training import loop, parallel, precision
from conftest import REPO, crash_at_step, make_dataset, write_params


def _job(folder: Path, stop=lambda: False, **train) -> loop.Job:
    """One fp32 seed in this process (no MLflow): 60 images, batch 20, 3 steps per epoch, 3 epochs."""
    cfg = config.load_config(REPO / "params.yaml")
    train = {"epochs": 3, "batch_size": 20, "seeds": (0,), "lr": 0.05, "checkpoint_every_s": 1e9, **train}
    cfg = config.replace(cfg, model={"fc_dim": 32}, train=train)
    strategy = parallel.Single()
    strategy.setup()
    return loop.Job(
        cfg, precision.REGISTRY["fp32"], strategy, make_dataset(), 0, folder / "checkpoint.pt", stop
    )


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=f"{k} differs")


@pytest.mark.slow  # inductor compiles forward and backward: ~50 s on 2 cores with a cold cache
@pytest.mark.serial  # alone: compiling beside other tests' work is several times slower
def test_compiled_training_equals_eager_compiles_once_and_resumes(tmp_path):
    torch.set_num_threads(1)  # the same reductions in both runs
    eager = loop.train_seed(_job(tmp_path / "eager"))
    compiled = loop.train_seed(_job(tmp_path / "compiled", compile="default"))
    # Epoch 1 starts from the same weights: its loss agrees to float32's rounding; later epochs
    # drift by the fused kernels' other summation order, as any two kernels' would.
    losses = [
        (c["train_loss"], e["train_loss"]) for c, e in zip(compiled["history"], eager["history"], strict=True)
    ]
    assert losses[0][0] == pytest.approx(losses[0][1], rel=1e-5), losses
    assert all(c == pytest.approx(e, rel=5e-3) for c, e in losses), losses
    result = compiled["result"]
    assert (result.compile, result.recompiles) == ("default", 0)
    assert result.compile_seconds > 0 and eager["result"].compile_seconds is None

    folder = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(_job(folder, crash_at_step(5), compile="default", checkpoint_every_s=1e-9))
    saved = SeedCheckpoint.load(folder / "checkpoint.pt")
    assert (saved.epoch, saved.step) == (1, 1)
    resumed = loop.train_seed(_job(folder, compile="default"), resume=saved)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    assert resumed["result"].recompiles == 0
    _close(resumed["state_dict"], compiled["state_dict"])  # the same compiled kernels: as if never stopped


@pytest.mark.no_store
def test_compile_mode_is_validated(project):
    write_params(project, train={"compile": "fast"})
    with pytest.raises(config.ConfigError, match="train.compile: 'fast' must be one of none, default"):
        config.load_config(project / "params.yaml")
    write_params(project, train={"compile": "default", "dp_autocast_outside_forward": True})
    with pytest.raises(config.ConfigError, match="must be none with train.dp_autocast_outside_forward"):
        config.load_config(project / "params.yaml")
    assert config.load_config(REPO / "params.yaml").train.compile == "none"
