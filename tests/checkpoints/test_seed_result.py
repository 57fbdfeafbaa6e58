"""The typed seed result: model files written before it load unchanged, and its MLflow names,
the metrics file's columns and the summaries all come from its fields."""

from __future__ import annotations

import math

import pytest
import torch

from ampbench.checkpoints import files
from ampbench.checkpoints.state import ModelFile
from ampbench.seed_result import CARRIED, SUMMARISED, TIME_PARTS, SeedResult

# A result as model.pt held it before SeedResult (format 2): a flat dict, keys as the loop wrote them,
# plus a fact of a strategy this version does not know.
OLD_RESULT = {
    "diverged": False,
    "autocast_used": True,
    "amp_dtype": "bfloat16",
    "grad_scaler_used": False,
    "tf32_matmul": False,
    "tf32_cudnn": False,
    "cuda_graph_used": False,
    "world_size": 1,
    "devices_used": 1,
    "device_type": "cpu",
    "device_name": "some cpu (2 cores)",
    "epochs_completed": 2,
    "train_seconds": 3.5,
    "first_epoch_seconds": 2.0,
    "images_per_second": 120.0,
    "epoch_cv": 0.0,
    "disturbed_epochs": 0,
    "peak_memory_mb": 300.0,
    "final_train_accuracy": 0.3,
    "final_test_accuracy": 0.25,
    "replica_dtypes": "cpu=bfloat16",
    "checkpoint_seconds": 0.1,
    "checkpoints_written": 1,
    "eval_seconds": 0.2,
    "logging_seconds": 0.01,
    "setup_seconds": 0.5,
    "compile": "none",
    "recompiles": 0,
    "shard_group": "node-0",  # unknown to this version: kept, logged as a param
}


def _old_model_file(path, result: dict) -> None:
    """model.pt exactly as the version before SeedResult wrote it: plain dicts only."""
    files.save(
        {
            "format": 2,
            "kind": "model",
            "state_dict": {"w": torch.zeros(2)},
            "config": {"train": {"eval_flip": False}},
            "variant": "single-autocast_bf16",
            "seed": 0,
            "run_id": "r",
            "variant_run_id": "v",
            "config_digest": "d",
            "classes": ["a", "b"],
            "result": result,
            "history": [{"epoch": 1}, {"epoch": 2}],
            "pending_metrics": None,
        },
        path,
    )


def test_a_model_file_written_before_the_type_loads_and_round_trips(tmp_path):
    path = tmp_path / "single-autocast_bf16" / "seed-0" / "model.pt"
    _old_model_file(path, OLD_RESULT)
    saved = ModelFile.load(path)
    assert isinstance(saved.result, SeedResult)
    assert saved.result.images_per_second == 120.0 and saved.result.amp_dtype == "bfloat16"
    assert saved.result.train_joules is None  # not measured on a CPU: absent then, None now
    assert saved.result.extra == {"shard_group": "node-0"}
    assert saved.result.to_dict() == OLD_RESULT  # written back, the file's dict is the same
    saved.save(path)
    assert files.load(path)["result"] == OLD_RESULT
    # what evaluate used to carry into the metrics file (its own list of keys then), the same values
    before = ("train_seconds", "images_per_second", "peak_memory_mb", "diverged", "amp_dtype")
    before += ("devices_used", "world_size", "device_name", "epochs_completed", "replica_dtypes")
    assert {k: OLD_RESULT[k] for k in before}.items() <= saved.result.carried().items()
    assert saved.result.carried()["train_joules"] is None and "eval_seconds" not in saved.result.carried()


def test_a_result_lacking_a_measured_field_is_refused_naming_the_file_and_the_fix(tmp_path):
    path = tmp_path / "single-fp32" / "seed-0" / "model.pt"
    _old_model_file(path, {k: v for k, v in OLD_RESULT.items() if k != "train_seconds"})
    with pytest.raises(files.CheckpointError, match="train_seconds") as err:
        ModelFile.load(path)
    assert str(path) in str(err.value) and "ampbench train --parallel single --precision fp32" in str(
        err.value
    )


def test_mlflow_names_come_from_the_fields():
    result = SeedResult.from_dict({**OLD_RESULT, "first_epoch_seconds": math.nan, "model_save_seconds": 0.3})
    metrics, params = result.metrics(), result.params()
    assert metrics["time/eval_seconds"] == 0.2 and metrics["time/model_save_seconds"] == 0.3
    assert metrics["train_seconds"] == 3.5 and "time/train_seconds" not in metrics
    assert metrics["diverged"] == 0.0 and "diverged_epoch" not in metrics  # did not diverge
    assert "first_epoch_seconds" not in metrics  # NaN: nothing to chart
    assert "train_joules" not in metrics and "final_test_accuracy" not in metrics  # unmeasured; not logged
    assert params["amp_dtype"] == "bfloat16" and params["devices_used"] == 1
    assert params["shard_group"] == "node-0" and "diverged" not in params
    assert not set(metrics) & set(params)


def test_the_lists_the_stages_used_to_keep_by_hand_are_the_fields():
    assert SUMMARISED == (
        "test_accuracy",
        "f1_macro",
        "train_seconds",
        "images_per_second",
        "peak_memory_mb",
        "train_joules",
        "images_per_joule",
    )
    assert TIME_PARTS == (
        "train_seconds",
        "eval_seconds",
        "checkpoint_seconds",
        "logging_seconds",
        "setup_seconds",
        "model_save_seconds",
    )
    assert set(SUMMARISED) - {"test_accuracy", "f1_macro"} <= set(CARRIED)
