"""The train stage's estimate corrects itself after the first epoch (training/progress.py): the
evaluation it modelled from the step time is replaced by the one it timed, and `ampbench variant`
(`mlflow run`) counts its evaluate stage too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ampbench.config import Config, replace
from ampbench.training import progress, study_cost


def _stage(tmp_path: Path, **train) -> progress.StageProgress:
    cfg = replace(
        Config(),
        model={"fc_dim": 32},
        train={"epochs": 3, "batch_size": 10, "seeds": (0,), **train},
        data={"train_per_class": 6, "test_per_class": 2},
    )
    return progress.StageProgress(
        cfg,
        "single-fp32",
        6,
        20,
        "cpu",
        enabled=True,
        warmup_steps=2,
        min_timed_s=0.0,
        min_timed_steps=2,
        models_dir=tmp_path / "models",
        work_dir=tmp_path / "work",
        params_file=tmp_path / "params.yaml",
    )


def _epoch(stage: progress.StageProgress, step_s: float, eval_s: float) -> None:
    for _ in range(stage.spe):
        time.sleep(step_s)
        if stage.step():
            stage.report()
    time.sleep(eval_s)  # the loop's evaluation, checkpoint and logging
    stage.epoch_done()


@pytest.mark.parametrize("scope", ["", "variant"])
def test_after_the_first_epoch_the_estimate_uses_the_evaluation_it_timed(
    tmp_path: Path, monkeypatch, caplog, scope: str
):
    monkeypatch.setenv("AMPBENCH_SCOPE", scope)
    stage = _stage(tmp_path)
    stage.start_seed(0)
    step_s, eval_s = 0.02, 0.4  # an evaluation far slower than the model says (a CPU's)
    with caplog.at_level("DEBUG", logger="ampbench.training.progress"):
        _epoch(stage, step_s, eval_s)
    stage.close()
    modelled = study_cost.eval_steps(stage.cfg, stage.n_test) * step_s
    assert modelled < 0.1 * eval_s  # the first estimate could not know
    assert stage.corrected and stage.eval_s == pytest.approx(eval_s, abs=0.1)
    assert stage.step_s == pytest.approx(step_s, rel=0.5)
    # two epochs left, each of 6 steps and one timed evaluation
    left = stage.estimate["stage_left_seconds"]
    assert left == pytest.approx(2 * (6 * stage.step_s + stage.eval_s))
    # `mlflow run`: the evaluate stage after it scores the test set once per seed
    assert stage.estimate["run_left_seconds"] == pytest.approx(left + stage.eval_s)
    lines = [r for r in caplog.records if "after its first epoch" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    # the first estimate missed by far more than 25%: said at INFO in both scopes
    assert lines[0].levelname == "INFO"
    assert ("the run ends in about" in lines[0].getMessage()) == (scope == "variant")


def test_a_correction_that_changes_little_is_not_said_in_a_study(tmp_path: Path, monkeypatch, caplog):
    """In a study (nine stages) a correction within 25% of the first estimate goes to DEBUG only."""
    monkeypatch.setenv("AMPBENCH_SCOPE", "")
    stage = _stage(tmp_path, eval_each_epoch=False)
    stage.start_seed(0)
    with caplog.at_level("DEBUG", logger="ampbench.training.progress"):
        _epoch(stage, 0.05, 0.0)
    stage.close()
    (line,) = [r for r in caplog.records if "after its first epoch" in r.getMessage()]
    assert line.levelname == "DEBUG", line.getMessage()
    assert stage.eval_s is None  # no evaluation in that epoch: the last one is still modelled


def test_an_epoch_shorter_than_the_timing_window_is_the_measurement(tmp_path: Path, caplog):
    """Too few steps to time after the warm-up: the epoch's steps are the step time, its tail the
    evaluation, and the one estimate comes at its end (at DEBUG: a subset is a demo)."""
    stage = _stage(tmp_path)
    stage.min_timed_steps = 100
    stage.start_seed(0)
    with caplog.at_level("DEBUG", logger="ampbench.training.progress"):
        _epoch(stage, 0.02, 0.2)
    stage.close()
    assert stage.estimate is not None and stage.eval_s == pytest.approx(0.2, abs=0.1)
    assert [r.getMessage() for r in caplog.records if "Expected time of this stage" in r.getMessage()]
