"""MLflow names of the flat metric keys that training and evaluation report.

Metric names carry a section before the last ``/`` (``test/accuracy``, ``train/loss``,
``class_accuracy/cat``): the MLflow UI groups its charts by it. Callers use flat keys
(``test_accuracy``) and the DVC metrics files stay flat; ``metric_name`` maps one to the other.
"""

from __future__ import annotations

import re

# Flat keys of the training core and evaluation -> sectioned MLflow names.
_NAMES = {
    "train_loss": "train/loss",
    "train_accuracy": "train/accuracy",
    "lr": "train/lr",
    "epochs_completed": "train/epochs_completed",
    "diverged": "train/diverged",
    "diverged_runs": "train/diverged_runs",
    "diverged_epoch": "train/diverged_epoch",
    "diverged_step": "train/diverged_step",
    "test_accuracy": "test/accuracy",
    "precision_macro": "test/precision_macro",
    "recall_macro": "test/recall_macro",
    "f1_macro": "test/f1_macro",
    "accuracy_delta": "test/accuracy_delta_vs_single_fp32",
    "p_value": "test/p_value_vs_single_fp32",
    "epoch_seconds": "time/epoch_seconds",
    "train_seconds": "time/train_seconds",
    "first_epoch_seconds": "time/first_epoch_seconds",
    "compile_seconds": "time/compile_seconds",
    "recompiles": "compile/recompiles",
    "epoch_images_per_second": "speed/epoch_images_per_second",
    "images_per_second": "speed/images_per_second",
    "speedup": "speed/speedup_vs_single_fp32",
    "peak_memory_mb": "memory/peak_mb",
    "peak_reserved_mb": "memory/peak_reserved_mb",
    "warmup_peak_memory_mb": "memory/warmup_peak_mb",
    "epoch_cv": "speed/epoch_cv",
    "disturbed_epochs": "speed/disturbed_epochs",
    "epoch_joules": "energy/epoch_joules",
    "train_joules": "energy/train_joules",
    "images_per_joule": "energy/images_per_joule",
    "grad_scale": "amp/grad_scale",
    "skipped_steps": "amp/skipped_steps",
    "nonfinite_losses": "amp/nonfinite_losses",
}


def class_keys(classes: list[str]) -> list[str]:
    """Each class's name as an MLflow metric name takes it: characters MLflow refuses (anything but
    letters, digits, _ - . and spaces) as _, and one made the same as an earlier one numbered
    (hostile pass J: a class "cat (wild)" failed every evaluate, the store blamed)."""
    keys: list[str] = []
    for i, name in enumerate(classes):
        key = re.sub(r"[^\w.\- ]", "_", str(name)).strip(" .") or f"class {i}"
        keys.append(key if key not in keys else f"{key}_{i}")
    return keys


def metric_name(key: str) -> str:
    """The MLflow name of a flat metric key: ``test_accuracy_std`` -> ``test/accuracy_std``."""
    if key.startswith("class_accuracy_"):
        return "class_accuracy/" + key.removeprefix("class_accuracy_")
    for suffix in ("", "_std", "_mean"):
        base = key.removesuffix(suffix) if suffix else key
        if (suffix == "" or key.endswith(suffix)) and base in _NAMES:
            return _NAMES[base] + suffix
    return key if "/" in key else f"other/{key}"
