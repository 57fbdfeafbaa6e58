"""A stage that needs the prepared data set, run before any download: one line with the fix, before
anything else (hostile pass: `ampbench evaluate` said "[Errno 2] No such file or directory:
'data/prepared/cifar10.pt'" after 7-10 s, with no fix)."""

from __future__ import annotations

import logging
import shutil

import pytest

from ampbench import cli, output
from conftest import REPO


@pytest.mark.parametrize("command", [["evaluate"], ["train", "--parallel", "single", "--precision", "fp32"]])
def test_a_stage_before_any_download_says_to_download(command, tmp_path, monkeypatch, caplog):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(output, "logging_to_stderr", lambda verbose: None)  # caplog's handler, not a new one
    caplog.set_level(logging.INFO)
    assert cli.main(command) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    fix = "run `ampbench download` / `dvc repro download` first"
    assert errors == [f"data/prepared/cifar10.pt not found; {fix}"]
    assert not (tmp_path / "mlflow.db").exists()  # before any run, store or lock


def test_a_missing_model_is_refused_before_any_variant_is_evaluated(tmp_path):
    """Hostile pass WARN: three variants evaluated (15 s), then "models/dp-fp32/seed-0/model.pt
    missing: run `ampbench train` for dp-fp32 first", where plain `ampbench train` trains single-fp32."""
    from ampbench.stages import evaluate

    with pytest.raises(FileNotFoundError) as err:
        evaluate.check_models(["dp-autocast_gradscaler"], (0,), tmp_path / "models")
    assert str(err.value).endswith(
        "missing: train dp-autocast_gradscaler first (`ampbench train --parallel dp --precision "
        "autocast_gradscaler`, or `dvc repro train@dp-autocast_gradscaler`)"
    ), err.value


def test_a_missing_model_outside_the_matrix_names_no_stage_that_is_not_there(tmp_path):
    """Hostile pass T: `evaluate --variants single-tf32` said "or `dvc repro train@single-tf32`",
    a stage params.yaml's variants do not make."""
    from ampbench.stages import evaluate
    from ampbench.variants import study_variants

    assert "single-tf32" not in study_variants()  # the shipped matrix
    with pytest.raises(FileNotFoundError) as err:
        evaluate.check_models(["single-tf32"], (0,), tmp_path / "models")
    assert str(err.value).endswith("(`ampbench train --parallel single --precision tf32`)"), err.value


def test_a_missing_model_names_the_training_with_the_settings_given(tmp_path):
    """Hostile pass D8: `ampbench evaluate --set train.seeds=[5]` said to run `ampbench train --parallel
    single --precision fp32`, which trained params.yaml's seeds (45 s), then the same error again."""
    import argparse

    from ampbench.stages import evaluate, evaluate_main

    args = argparse.Namespace(params="other.yaml", overrides=["train.seeds=[5]"])
    with pytest.raises(FileNotFoundError) as err:
        evaluate.check_models(["single-fp32"], (5,), tmp_path / "models", evaluate_main._given(args))
    assert str(err.value).endswith(
        "missing: train single-fp32 first (`ampbench train --parallel single --precision fp32 --params "
        "other.yaml --set 'train.seeds=[5]'`)"  # no DVC stage: it trains params.yaml's settings
    ), err.value
    assert evaluate_main._given(argparse.Namespace(params="params.yaml", overrides=None)) == []
