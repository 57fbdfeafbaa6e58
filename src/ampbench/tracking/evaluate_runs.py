"""The MLflow side of the evaluate stage: each seed run's scores, confusion matrix and report,
its model as an MLflow model, and the variant run's aggregates (one row per variant in the UI).
"""

from __future__ import annotations

import copy
import json
import logging
import statistics
import tempfile
from pathlib import Path

import torch

from ampbench.checkpoints.state import ModelFile
from ampbench.seed_result import SUMMARISED

log = logging.getLogger(__name__)

ARTIFACT_FOLDER = "evaluation"  # in each seed run: the confusion matrix and the report


def aggregates(per_seed: list[dict]) -> dict:
    """Mean and std over seeds of each seed_result.SUMMARISED value (None, std None, unless every
    seed has it: energy, where NVML's counter may be absent), and how many seeds diverged."""
    out: dict = {}
    for key in SUMMARISED:
        values = [float(r[key]) for r in per_seed if r.get(key) is not None]
        complete = bool(values) and len(values) == len(per_seed)
        out[key] = statistics.fmean(values) if complete else None
        out[f"{key}_std"] = (statistics.stdev(values) if len(values) > 1 else 0.0) if complete else None
    out["diverged_runs"] = sum(bool(r.get("diverged")) for r in per_seed)
    return out


EVALUATED_KEY = "f1_macro"  # a score only evaluate logs: its seed run was scored at that step
CURVE_KEYS = ("train_loss", "train_accuracy", "test_accuracy", "epoch_images_per_second", "skipped_steps")


def log_aggregates(tracker, run_id: str, summary: dict, curves: list[dict]) -> None:
    """The variant's row: mean per-epoch curves over seeds, then mean and std of the results."""
    by_epoch: dict[int, list[dict]] = {}
    for row in curves:
        by_epoch.setdefault(int(row["epoch"]), []).append(row)
    means: dict = {}
    for epoch, rows in sorted(by_epoch.items()):
        means = {k: statistics.fmean(r[k] for r in rows) for k in CURVE_KEYS if all(k in r for r in rows)}
        tracker.log_metrics(run_id, means, step=epoch)
    last = max(by_epoch, default=0)
    present = [k for k in SUMMARISED if summary.get(k) is not None and summary[k] == summary[k]]  # not NaN
    # a result the last epoch's curve point already holds (test_accuracy) is not logged twice
    values = {k: summary[k] for k in present if means.get(k) != summary[k]}
    values.update({f"{k}_std": summary[f"{k}_std"] for k in present})
    values["diverged_runs"] = summary["diverged_runs"]
    tracker.log_metrics(run_id, values, step=last)


def reference_model(tracker, run_id: str, name: str, model_file: Path, facts: dict) -> str:
    """The seed's model in the Models tab as an MLflow external model: metadata and a pointer to
    the file DVC tracks, no copy of its weights (milliseconds, against seconds for an export)."""
    import mlflow

    where = str(_in_repo(model_file))
    note = (
        f"Weights: `{where}` (DVC output of the train stage; load it with `torch.load(path, "
        "weights_only=True)`). `tracking.log_model: export` logs a servable MLflow model "
        "instead."
    )
    mlflow.set_tracking_uri(tracker.uri)  # the fluent call below uses the global store
    model = mlflow.create_external_model(
        name=name,
        source_run_id=run_id,
        experiment_id=tracker.experiment_id(),
        model_type="ampbench",
        tags={"ampbench.model_file": where, "mlflow.note.content": note},
        params={k: str(v) for k, v in facts.items()},
    )
    from mlflow.entities import LoggedModelOutput

    # The seed run's "Logged models" names it too (its source_run_id alone shows only in the Models tab).
    tracker.client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    return model.model_id


def _in_repo(path: Path) -> Path:
    from ampbench.tracking.tracker import repo_root

    path, root = path.resolve(), repo_root().resolve()
    return path.relative_to(root) if path.is_relative_to(root) else path


def export_model(tracker, run_id: str, name: str, scorer: torch.nn.Module, example: torch.Tensor) -> str:
    """A servable MLflow model in the seed run: a torch.export program (no pickled code), CPU, any batch."""
    import mlflow.pytorch

    from ampbench.tracking.tracker import temporary_env

    cpu = copy.deepcopy(scorer).cpu().eval()
    # Requirements given, not inferred: inference loads the model in a subprocess (~15 s).
    requirements = [f"torch=={torch.__version__.split('+')[0]}"]
    # The program is exported for the CPU; MLflow checks the input example by loading it on
    # CUDA when CUDA is there, which a CPU program refuses. (Users on a GPU machine load it with
    # model_config={"device": "cpu"}, or MLFLOW_DEFAULT_PREDICTION_DEVICE=cpu.)
    with _active_run(tracker, run_id), temporary_env(MLFLOW_DEFAULT_PREDICTION_DEVICE="cpu"):
        example = example.cpu().numpy()
        info = mlflow.pytorch.log_model(
            cpu, name=name, input_example=example, pip_requirements=requirements, validate_serving_input=False
        )
    return info.model_id


class _active_run:
    """mlflow.pytorch.log_model logs into the active run: make the seed run active, briefly."""

    def __init__(self, tracker, run_id: str) -> None:
        self.tracker, self.run_id = tracker, run_id

    def __enter__(self):
        import mlflow

        mlflow.set_tracking_uri(self.tracker.uri)
        self.status = self.tracker.client.get_run(self.run_id).info.status
        # start_run on a finished run would only resume it; it keeps the status we restore below.
        return mlflow.start_run(run_id=self.run_id)

    def __exit__(self, *exc) -> None:
        import mlflow

        mlflow.end_run()
        self.tracker.end(self.run_id, self.status)


def log_to_run(tracker, run_id, step, title, metrics, cm, report, classes, model_id=None):
    """The seed's scores (linked to its MLflow model, if any, so the Models tab shows them) and files."""
    tracker.log_metrics(run_id, metrics, step=step, model_id=model_id)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        confusion_png(cm, classes, f"{title}: confusion matrix", tmp / "confusion_matrix.png")
        (tmp / "confusion_matrix.json").write_text(
            json.dumps({"classes": classes, "matrix": cm}), encoding="utf-8"
        )
        (tmp / "classification_report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        for name in ("confusion_matrix.png", "confusion_matrix.json", "classification_report.json"):
            tracker.log_artifact(run_id, tmp / name, ARTIFACT_FOLDER)


# Above this many classes the image shows colours only: a count in every cell and a name on every
# tick cost time quadratic in classes (hostile pass H: over 5 minutes for 1000 classes, the
# stage silent meanwhile) for an image nobody could read. The numbers are in confusion_matrix.json.
LABELLED_CLASSES = 30


def confusion_png(cm: list[list[int]], classes: list[str], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    labelled = len(classes) <= LABELLED_CLASSES
    fig, ax = plt.subplots(figsize=(8, 7))
    ConfusionMatrixDisplay(torch.tensor(cm).numpy(), display_labels=classes if labelled else None).plot(
        ax=ax, xticks_rotation=45, colorbar=not labelled, values_format="d", include_values=labelled
    )
    if not labelled:  # class i is row and column i, as in confusion_matrix.json
        ax.set_xticks([]), ax.set_yticks([])
        (
            ax.set_xlabel(f"Predicted label (0-{len(classes) - 1})"),
            ax.set_ylabel(f"True label (0-{len(classes) - 1})"),
        )
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_seed(
    tracker, mode: str, data_ref, clock, path: Path, saved: ModelFile, scorer, example, scored, classes
):
    """Into the seed's run: its model (``tracking.log_model``), scores, confusion matrix, test data;
    False (nothing logged) where the run holds them already: an evaluate re-run for another
    variant's sake scores this unchanged model again (hostile re-run: every metric of every
    variant not retrained was logged once more per evaluate)."""
    run_id, variant, seed = saved.run_id, saved.variant, saved.seed
    step = len(saved.history)  # the last epoch's: no extra point at step 0 on the per-epoch curves
    if step in tracker.logged_steps(run_id, EVALUATED_KEY):
        return False
    model_id = _log_model(tracker, run_id, mode, f"{variant}-seed-{seed}", path, saved, scorer, example)
    clock.mark("model_logging")
    metrics, cm, report = scored
    log_to_run(tracker, run_id, step, f"{variant} seed {seed}", metrics, cm, report, classes, model_id)
    if data_ref:
        tracker.log_dataset(run_id, "cifar10-test", data_ref["digest"], data_ref["source"], "evaluation")
    clock.mark("logging")
    return True


def log_variant(tracker, variant: str, variant_runs: set, summary: dict, curves: list, clock) -> None:
    """Into the variant's run: mean and std over seeds, the mean curves, this stage's time breakdown.
    ``variant_runs``: those of seeds newly scored (none: the run holds all this already)."""
    for variant_run in variant_runs:
        log_aggregates(tracker, variant_run, summary, curves)
    clock.mark("logging")
    times = clock.breakdown(prefix="evaluate_")
    log.debug(  # a diagnostic: the variant run's evaluate_* metrics hold it for the UI
        "%s: evaluate stage %s", variant, ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in times.items())
    )
    for variant_run in variant_runs:
        tracker.log_metrics(variant_run, times)


def _log_model(tracker, run_id: str, mode: str, name: str, path: Path, saved: ModelFile, scorer, example):
    """``tracking.log_model``: the seed's MLflow model (its id), or None for none."""
    if mode == "reference":
        facts = {
            "variant": saved.variant,
            "seed": saved.seed,
            "amp_dtype": saved.result.amp_dtype,
            "config_digest": saved.config_digest,
        }
        return reference_model(tracker, run_id, name, path, facts)
    if mode == "export":
        return export_model(tracker, run_id, name, scorer, example)
    return None


def log_to_launcher(tracker, summary: dict) -> None:
    """Under `mlflow run`, the entry point's run gets the variant's summary too."""
    launcher = tracker.launcher_run_id
    if launcher and launcher not in {s.get("variant_run_id") for s in summary["seeds"]}:
        keys = ("test_accuracy", "test_accuracy_std", "images_per_second", "train_seconds")
        tracker.log_metrics(launcher, {k: summary[k] for k in keys})
