"""The variant names: data-parallel strategy x precision, ``<parallel>-<precision>``.

The names only, without torch: the CLI offers them and the configuration checks them before anything
heavy is imported. The implementations are registries keyed by the same names, in the same order
(``training/parallel.py``'s ``STRATEGIES``, ``training/precision.py``'s registry; tests/config/test_config.py
checks that they agree).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from ampbench.paths import missing

PARALLELS = ("single", "dp", "ddp")
PRECISIONS = ("fp32", "tf32", "autocast", "autocast_gradscaler", "autocast_bf16")
AXES = {"parallel": PARALLELS, "precision": PRECISIONS}  # params.yaml `variants:` (DVC's matrix)


def variant_name(parallel: str, precision: str) -> str:
    """``single-autocast``: a variant's name (model folder, metrics file, MLflow run)."""
    return f"{parallel}-{precision}"


def split_name(variant: str) -> tuple[str, str]:
    """(parallel, precision) of a variant's name: the inverse of ``variant_name``."""
    parallel, _, precision = variant.partition("-")
    return parallel, precision


VARIANTS = tuple(variant_name(p, q) for p in PARALLELS for q in PRECISIONS)


def study_variants(params_file: str | Path = "params.yaml", overrides: Iterable[str] = ()) -> list[str]:
    """The variants dvc.yaml's matrix builds from params.yaml (every variant if it says nothing),
    with a command's `--set variants.parallel=[...]` / `variants.precision=[...]` applied (final
    pass J: compare checked them, then answered for the file's variants)."""
    try:
        axes = (yaml.safe_load(Path(params_file).read_text(encoding="utf-8")) or {}).get("variants") or {}
    except (OSError, yaml.YAMLError, AttributeError, RecursionError):
        axes = {}  # the config's strict reader says what is wrong with the file
    for item in overrides:  # already checked by the config's loader
        key, sep, text = item.partition("=")
        section, _, axis = key.strip().partition(".")
        if sep and section == "variants" and axis in AXES:
            axes = {**axes, axis: yaml.safe_load(text)}
    return [
        variant_name(p, q) for p in axes.get("parallel", PARALLELS) for q in axes.get("precision", PRECISIONS)
    ]


def train_first(path: Path, variant: str, given: Iterable[str] = ()) -> FileNotFoundError:
    """``path``, a model file that is not there, and the training that makes it: with the settings
    given to this command (``given``, its --params and --set words: hostile pass D8, without them it
    trained other seeds), and its DVC stage where params.yaml's matrix makes one and nothing is
    given (hostile pass T)."""
    import shlex

    parallel, precision = split_name(variant)
    given = list(given)
    command = shlex.join(["ampbench", "train", "--parallel", parallel, "--precision", precision, *given])
    stage = f", or `dvc repro train@{variant}`" if variant in study_variants() and not given else ""
    return FileNotFoundError(f"{path} {missing(path)}: train {variant} first (`{command}`{stage})")
