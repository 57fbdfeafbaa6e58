"""Stage `evaluate`: score each variant's seed models on the full test set.

    ampbench evaluate --parallel single --precision autocast

Loads ``model.pt`` with ``weights_only=True``, predicts in the variant's own precision, and logs
into the same MLflow seed run as the training: test accuracy, per-class accuracy, precision /
recall / F1 (scikit-learn), the confusion matrix as a labelled PNG and a JSON table, the test
data as a dataset input, and the model in MLflow's Models tab (``tracking.log_model``: a
reference to ``model.pt`` by default; ``export``: a ``torch.export`` program that maps uint8
images to the class scores this stage ranks, so ``mlflow.pyfunc.load_model(uri).predict``
reproduces its accuracy), the scores linked to it. The variant's run gets the mean and std over
seeds and the mean per-epoch curves: one row per variant in the UI. Writes DVC metrics
(``reports/metrics/<variant>.json``) and plot data (``reports/plots/{curves,confusion}/<variant>.csv``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix

from ampbench.checkpoints.state import ModelFile
from ampbench.config import Config, ModelConfig
from ampbench.report import mixed
from ampbench.timing import StageClock
from ampbench.tracking import evaluate_runs, store, trash
from ampbench.tracking.metric_names import class_keys
from ampbench.training import factory, precision
from ampbench.training.measure import predict
from ampbench.variants import train_first

FOLDERS = ("metrics", "plots/curves", "plots/confusion")  # under reports/: what `_write` fills

# Settings carried from model.pt's config into the metrics file, so a report made from it
# (`ampbench findings`) states the conditions it measured without trusting today's params.yaml.
CONFIG_KEYS = (
    "train.epochs",
    "train.batch_size",
    "train.loader",
    "train.workers",
    "train.cuda_graph",
    "tracking.conditions",
)


class ModelFileError(ValueError):
    """A model file that cannot be evaluated as this stage's variant and seed; says what to do."""


def _retrain_hint(path: Path) -> str:
    variant = path.parent.parent.name  # models/<variant>/seed-<s>/model.pt
    parallel_name, _, precision_name = variant.partition("-")
    return (
        f"delete {path} and re-train: `dvc repro -f train@{variant}` or "
        f"`ampbench train --parallel {parallel_name} --precision {precision_name}`"
    )


def _build_model(saved: ModelFile, path: Path) -> torch.nn.Module:
    """The model the file's own config describes (the one factory), with its weights (and, for
    models other than alexnet, the train split's statistics); a clear error if they disagree."""
    try:
        size = saved.config.get("data", {}).get("image_size", factory.ALEXNET_SIZE)  # older files: 32
        model = factory.build(ModelConfig(**saved.config["model"]), len(saved.classes), size)
        model.load_state_dict(saved.state_dict)
    except (KeyError, TypeError, RuntimeError) as err:  # missing keys, unknown config keys, shapes
        detail = " ".join(str(err).split())[:400]
        raise ModelFileError(
            f"{path}: its weights do not match the model config stored with them ({type(err).__name__}: "
            f"{detail}); the file is damaged or was edited. {_retrain_hint(path)}"
        ) from None
    return model


def load_model(path: Path, precision_name: str, device: torch.device) -> tuple[torch.nn.Module, ModelFile]:
    """The model, ready to predict, and the file it came from.

    A file that is not a plain-weights ModelFile of this format raises CheckpointError."""
    saved = ModelFile.load(path)
    model = _build_model(saved, path)
    model.to(device)
    run = precision.REGISTRY[precision_name].setup(model, device)  # sets TF32 as the variant trained
    return run.wrap(model), saved


def scores(labels, preds, classes: list[str]) -> tuple[dict, list[list[int]], dict]:
    """Metrics dict (MLflow names), confusion matrix, and scikit-learn's full report."""
    cm = confusion_matrix(labels, preds, labels=list(range(len(classes))))
    report = classification_report(
        labels,
        preds,
        labels=list(range(len(classes))),
        target_names=classes,
        output_dict=True,
        zero_division=0,
    )
    metrics = {
        "test_accuracy": accuracy_score(labels, preds),
        "precision_macro": report["macro avg"]["precision"],
        "recall_macro": report["macro avg"]["recall"],
        "f1_macro": report["macro avg"]["f1-score"],
    }
    for i, name in enumerate(class_keys(classes)):
        metrics[f"class_accuracy_{name}"] = cm[i, i] / max(1, cm[i].sum())
    return metrics, cm.tolist(), report


class Scorer(torch.nn.Module):
    """What the logged MLflow model serves: class scores of uint8 images, exactly as ranked here."""

    def __init__(self, model: torch.nn.Module, flip: bool) -> None:
        super().__init__()
        self.model, self.flip = model, flip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.model(images)
        return logits + self.model(images.flip(3)) if self.flip else logits


def evaluate_variant(
    variant: str,
    seeds,
    models_dir: Path,
    dataset: dict,
    reports_dir: Path,
    tracker=None,
    log_model: str = "none",
    data_ref: dict | None = None,
    clock=None,
) -> dict:
    """Evaluate every seed of a variant; write the DVC metrics and plots; return the metrics.

    ``data_ref`` ({"digest", "source"}) names the test data in MLflow's Dataset column. ``clock``
    (a timing.StageClock started with the process's stage) times the parts: time/evaluate_* on the
    variant run.
    """
    clock = clock or StageClock()
    precision_name = variant.split("-", 1)[1]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    classes = list(dataset["classes"])
    images, labels = dataset["test_images"].to(device), dataset["test_labels"]
    per_seed, curves, confusion_rows, variant_runs = [], [], [], set()
    for seed in seeds:
        path = models_dir / variant / f"seed-{seed}" / "model.pt"
        if not path.exists():
            raise train_first(path, variant)
        model, saved = load_model(path, precision_name, device)
        _check_model_file(saved, variant, seed, path, tracker)
        check_classes(saved, classes, path)
        clock.mark("load")
        flip = saved.config["train"]["eval_flip"]
        preds = predict(model, images, flip).cpu()
        clock.mark("predict")
        scored = scores(labels.numpy(), preds.numpy(), classes)
        clock.mark("scores")
        if tracker is not None:
            scorer = Scorer(model, flip)
            if evaluate_runs.log_seed(
                tracker, log_model, data_ref, clock, path, saved, scorer, images[:2], scored, classes
            ):
                variant_runs.add(saved.variant_run_id)
        per_seed.append(_seed_row(seed, saved, scored[0]))
        curves += [{"seed": seed, **h} for h in saved.history]
        pairs = zip(labels.tolist(), preds.tolist())  # DVC confusion template: a row per sample, first seed
        confusion_rows = confusion_rows or [{"actual": classes[a], "predicted": classes[p]} for a, p in pairs]
    summary = {"variant": variant, **evaluate_runs.aggregates(per_seed), "seeds": per_seed}
    _write(reports_dir, variant, summary, curves, confusion_rows)
    clock.mark("reports")
    evaluate_runs.log_variant(tracker, variant, variant_runs - {None}, summary, curves, clock)
    return summary


def _seed_row(seed: int, saved: ModelFile, metrics: dict) -> dict:
    """One seed's line of the metrics file: its scores, training results and settings."""
    return {
        "seed": seed,
        "run_id": saved.run_id,
        "variant_run_id": saved.variant_run_id,
        **metrics,
        **saved.result.carried(),
        **_settings(saved),
    }


def _settings(saved: ModelFile) -> dict:
    """The settings a model was trained with and their digest: one study, one configuration.
    ``settings``: every digested one, so that a difference outside CONFIG_KEYS (train.lr) is named."""
    digested = {
        f"{section}.{name}": value
        for section, values in saved.config.items()
        if isinstance(values, dict)
        for name, value in values.items()
        if not f"{section}.{name}".startswith(Config.NOT_DIGESTED)
    }
    return {
        "config_digest": saved.config_digest,
        **{k: _setting(saved.config, k) for k in CONFIG_KEYS},
        mixed.SETTINGS: digested,
    }


def settings_of(variants: list[str], seeds, models_dir: Path) -> dict[str, dict]:
    """Each variant's seeds' training settings, from their model files (as the metrics files will
    carry them), for ``report.mixed``; a missing file is ``check_models``' to refuse."""
    records: dict[str, dict] = {}
    for variant in variants:
        rows = []
        for seed in seeds:
            path = models_dir / variant / f"seed-{seed}" / "model.pt"
            if path.exists():  # mapped: the weights are read once, by the evaluation
                rows.append(_settings(ModelFile.load(path, mmap=True)))
        records[variant] = {"seeds": rows}
    return records


def check_models(variants: list[str], seeds, models_dir: Path, given=()) -> None:
    """Every model file is there, before any variant is evaluated (hostile pass: three variants
    evaluated, then the fourth's missing model, with a command that trains another variant);
    ``given``: the --params/--set words the training needs too."""
    for variant in variants:
        for seed in seeds:
            path = models_dir / variant / f"seed-{seed}" / "model.pt"
            if not path.exists():
                raise train_first(path, variant, given)


def _check_model_file(saved: ModelFile, variant: str, seed: int, path: Path, tracker) -> None:
    """Refuse a model whose results would be filed wrongly: another variant/seed, or a foreign run."""
    found = (saved.variant, saved.seed)
    if found != (variant, seed):  # e.g. copied from another variant's folder
        raise ModelFileError(
            f"{path} holds the model of {found[0]!r} seed {found[1]!r}, but this stage evaluates "
            f"{variant!r} seed {seed}: its results (and MLflow run {saved.run_id}) would be filed "
            f"under the wrong variant. Put the right file back, or {_retrain_hint(path)}"
        )
    if tracker is not None:
        _check_run_in_store(tracker, saved.run_id, path)
        runs = (saved.run_id, saved.variant_run_id)
        if line := trash.in_trash(tracker, runs, f"{path} was trained in", _retrain_hint(path)):
            raise ModelFileError(line)


def check_classes(saved: ModelFile, classes: list[str], path: Path) -> None:
    """The model was trained on the classes of the test set it is scored on (final pass L: a
    2-class data set under 10-class models gave an IndexError traceback)."""
    if list(saved.classes) != list(classes):
        raise ModelFileError(
            f"{path} was trained on {len(saved.classes)} classes ({', '.join(saved.classes)[:120]}), the "
            f"prepared test set has {len(classes)} ({', '.join(classes)[:120]}): evaluate with the data "
            "it was trained on (data.url as it was, then `ampbench download`), or train again on this one"
        )


def _check_run_in_store(tracker, run_id: str | None, path: Path) -> None:
    from mlflow.exceptions import MlflowException

    try:
        run = tracker.client.get_run(run_id)
    except MlflowException as err:
        if err.error_code not in trash.NO_SUCH_RUN:
            raise  # the store itself failed: not this file's fault
        raise ModelFileError(
            f"{path} was trained in MLflow run {run_id}, which is not in the tracking store "
            f"{tracker.uri}: {store.where_the_runs_are()}, or {_retrain_hint(path)}"
        ) from None
    # Before scoring: the run's folder may be another user's (a `sudo` run trained or evaluated it).
    store.check_run_artifacts(run.info.artifact_uri, run_id, tracker.uri, evaluate_runs.ARTIFACT_FOLDER)


def _setting(config: dict, dotted: str):
    """One setting of a model file's saved config; None where an older file lacks it."""
    section, name = dotted.split(".")
    return config.get(section, {}).get(name)


def _write(reports_dir: Path, variant: str, summary: dict, curves: list[dict], confusion: list[dict]):
    metrics_file = reports_dir / "metrics" / f"{variant}.json"
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    metrics_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    # reports/plots/<kind>/<variant>.csv: one folder per kind of plot, so that DVC draws each
    # folder with its own template (dvc.yaml's top-level plots)
    for kind, rows in (("curves", curves), ("confusion", confusion)):
        (reports_dir / "plots" / kind).mkdir(parents=True, exist_ok=True)
        with open(reports_dir / "plots" / kind / f"{variant}.csv", "w", newline="", encoding="utf-8") as f:
            fieldnames = list(dict.fromkeys(k for row in rows for k in row))
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)
