"""Class names become MLflow metric names MLflow takes (hostile pass J: an ImageFolder with classes
"cat (wild)", "jack-o'-lantern" and "crane, bird" trained, then every evaluate failed with
"MLflow store ... failed (... Invalid value "class_accuracy/cat (wild)" ...); check the store")."""

from __future__ import annotations

import torch
from mlflow.utils.validation import path_not_unique, validate_param_and_metric_name

from ampbench.stages.evaluate import scores
from ampbench.tracking.metric_names import class_keys, metric_name

NAMES = ["cat (wild)", "jack-o'-lantern", "crane, bird", "a\u200bb", "cat _wild_", "..", "ü猫", "airplane"]


def test_every_class_name_gives_a_metric_name_mlflow_takes_and_none_twice():
    keys = class_keys(NAMES)
    names = [metric_name(f"class_accuracy_{k}") for k in keys]
    assert all(validate_param_and_metric_name(n) and not path_not_unique(n) for n in names), names
    assert len(set(names)) == len(NAMES)
    assert keys[0] == "cat _wild_" and keys[-2:] == ["ü猫", "airplane"]  # kept where MLflow takes it


def test_evaluate_scores_such_classes_under_those_names():
    labels = torch.arange(len(NAMES))
    metrics, _, _ = scores(labels.numpy(), labels.numpy(), NAMES)
    assert {k for k in metrics if k.startswith("class_accuracy_")} == {
        f"class_accuracy_{k}" for k in class_keys(NAMES)
    }
