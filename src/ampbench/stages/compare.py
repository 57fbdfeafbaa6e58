"""Stage `compare`: the variants side by side (report/compare.py), tracked in MLflow.

    ampbench compare                                  # params.yaml's `variants:` (DVC's matrix)
    ampbench compare --variants single-fp32,single-autocast

Writes ``reports/comparison.{md,csv,png}`` and ``reports/summary.json`` from the evaluate stages'
metrics files, and the answer in the shapes DVC's views read (report/answer.py: ``reports/answer/``
for `dvc metrics show`, ``reports/views/`` for `dvc plots show`), and logs them to MLflow
(tracking/compare_runs.py).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ampbench import outputs
from ampbench.config import Config, ConfigError
from ampbench.paths import MODELS_DIR, REPORTS_DIR, temp_workspace_root
from ampbench.stages.starting import StartingLine
from ampbench.variants import VARIANTS, study_variants

OUTPUTS = ("comparison.md", "comparison.csv", "comparison.png", "summary.json")

log = logging.getLogger(__name__)


class StaleMetricsError(ValueError):
    """An evaluate metrics file of a model that was trained again since; says what to run."""


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--variants", default=None, help="comma-separated variant names (default: params.yaml's `variants:`)"
    )
    c.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare variants trained with different settings (refused otherwise), the table labelled so",
    )


def main(cfg: Config, args, argv: list[str]) -> int:
    with StartingLine("compare", doing="reading the variants' scores, opening the MLflow store"):
        return _compare(cfg, args)


def _compare(cfg: Config, args) -> int:
    from ampbench.report import answer, compare, mixed
    from ampbench.tracking import compare_runs, store
    from ampbench.tracking.tracker import Tracker

    variants = [v.strip() for v in (args.variants or "").split(",") if v.strip()]
    if args.variants is not None and not variants:
        raise ConfigError(f"--variants {args.variants!r} names no variant; leave it out for the study's")
    if repeated := sorted({v for v in variants if variants.count(v) > 1}):
        raise ConfigError(f"--variants: {', '.join(repeated)} named twice; name each variant once")
    variants = variants or study_variants(args.params, args.overrides)  # dvc.yaml's matrix
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    records = _records(variants)
    if stale := replaced_since(records, MODELS_DIR):  # scores of models no longer there
        raise StaleMetricsError(stale)
    label = mixed.check(records, args.allow_mixed)  # one study, one configuration
    subset = compare.subset_notice(cfg)
    notice = "\n\n".join(n for n in (subset, label) if n)
    tracker = Tracker.from_config(cfg)
    tracker.preflight()
    if gone := runs_not_in(tracker, records):  # a store replaced or deleted since evaluate
        raise StaleMetricsError(gone)
    with outputs.staged(REPORTS_DIR, whole=(answer.ANSWER_DIR, answer.VIEWS_DIR)) as staging:
        rows = compare.compare(REPORTS_DIR / "metrics", variants, staging, notice, mixed=bool(label))
        answer.write(rows, REPORTS_DIR / "plots" / "curves", staging, mixed=bool(label))
    log.debug(
        "%s", (REPORTS_DIR / "comparison.md").read_text(encoding="utf-8")
    )  # the terminal gets the answer only
    compare_runs.log_comparison(tracker, rows, variants, [REPORTS_DIR / name for name in OUTPUTS], notice)
    print("\n".join(ending(rows, bool(subset), mixed=bool(label))), flush=True)
    print(f"Browse the runs: {tracker.link()}")
    if command := store.ui_command(tracker.uri):
        print(f"Start the UI first (it serves that address): {command}")
    return 0


def ending(rows: list[dict], subset: bool, mixed: bool = False) -> list[str]:
    """The command's last words before the link: the answer in a line or two, and where the files
    are, from the folder the user typed the command in (DVC_ROOT: demo/'s parent for `make demo`).
    ``mixed`` (--allow-mixed over variants trained differently) labels the answer as the table is."""
    from ampbench.report.compare import BASELINE

    ranked = [r for r in rows if r["speedup"] == r["speedup"]]  # NaN: no baseline to compare with
    best = max(ranked, key=lambda r: r["speedup"]) if ranked else None
    lines = ["Answer: see the table (no single-fp32 baseline to compare with)."]
    if best:
        tested = {"yes": ", a significant difference", "no": ", no significant difference"}
        lines[0] = (
            f"Answer: the fastest, {best['variant']}, trains at {best['speedup']:.2f}x the images/s of "
            f"{BASELINE}; test accuracy {100 * best['test_accuracy_mean']:.2f}% "
            f"({100 * best['accuracy_delta']:+.2f} points{tested.get(best.get('significant', ''), '')})."
        )
    if best and best["variant"] == BASELINE:  # not "the fastest, single-fp32, ... 1.00x single-fp32"
        lines[0] = f"Answer: no variant trains faster than {BASELINE} here; see the table."
    if len(rows) == 1:  # hostile pass H: "no variant trains faster" of a variant compared with none
        lines[0] = f"Answer: only {rows[0]['variant']} was compared, so nothing ranks it; see the table."
    if mixed:
        lines[0] = lines[0].replace("Answer:", "Answer (MIXED SETTINGS, --allow-mixed: not one study):", 1)
    if best and len(rows) > 1 and (caveat := _caveat(best, rows)):
        lines.append(caveat)
    if subset:
        lines.append(
            "A demo on a subset: it shows the pipeline end to end, not what AMP buys (the study: make run)."
        )
    lines.append(_where_the_files_are())
    return lines


def _where_the_files_are() -> str:
    if temp_workspace_root() is not None:  # hostile pass Q: a path into DVC's copy, deleted as it ends
        name = os.environ.get("DVC_EXP_NAME") or "<experiment>"
        return (
            "The table and chart are in DVC's temporary copy of this experiment, which goes as it ends; "
            f"its answer stays with it (dvc exp show): `dvc exp apply {name}`, then `dvc repro`, writes "
            "them in the workspace"
        )
    root = os.environ.get("DVC_ROOT") or os.getcwd()
    reports, here = os.path.relpath(REPORTS_DIR.absolute(), root), os.path.relpath(os.getcwd(), root)
    metrics = "dvc metrics show" if here == "." else f"cd {here} && dvc metrics show"
    return f"The table and chart: {reports}/comparison.md, comparison.png; in DVC: {metrics}"


def _caveat(best: dict, rows: list[dict]) -> str:
    """What the answer line rests on that the table flags (hostile pass WARN: comparison.md called
    all nine variants noisy, the printed answer said nothing of it): the noisy rows it compares."""
    from ampbench.report.compare import BASELINE

    base = [r for r in rows if r["variant"] == BASELINE]
    # once each: the baseline may be the best (hostile pass G: "single-fp32's and single-fp32's")
    named = list({r["variant"]: r for r in (best, *base) if r.get("noisy")}.values())
    if not named:
        return ""
    which = " and ".join(f"{r['variant']}'s" for r in named)
    return (
        f"Not one to quote yet: {which} images/s {'are' if len(named) > 1 else 'is'} noisy (the "
        "self-check in comparison.md says why); re-run on a quiet machine."
    )


EVALUATE_FIRST = "run `ampbench evaluate` first (`dvc repro` runs both)"


def replaced_since(records: dict[str, dict], models_dir: Path) -> str:
    """'' when each metrics record scores the model files there are (or they are not here); else
    one line naming a variant whose model was trained again after it was evaluated (an evaluate
    refused since, or never run): a comparison of models that no longer exist."""
    from ampbench.checkpoints import state  # torch: once a metrics file names a run

    for variant, record in records.items():
        for row in record.get("seeds", []):
            path = models_dir / variant / f"seed-{row.get('seed')}" / "model.pt"
            if row.get("run_id") and not path.exists() and any(path.parent.parent.glob("seed-*/model.pt")):
                # its variant's models are here, this seed's not (hostile pass R: ranked, exit 0)
                return f"reports/metrics/{variant}.json scores {path}, gone since: {_bring_back(variant)}"
            if not (row.get("run_id") and path.exists()):
                continue
            try:
                now = state.ModelFile.load(path, mmap=True).run_id
            except Exception:  # noqa: BLE001 - a damaged file is evaluate's to report
                continue
            if now != row["run_id"]:
                return (
                    f"reports/metrics/{variant}.json scores a model since replaced ({path} is now run "
                    f"{now}, the metrics are of run {row['run_id']}): {EVALUATE_FIRST}"
                )
    return ""


def _bring_back(variant: str) -> str:
    """What brings a removed model back and scores it again (hostile pass Z: "run `ampbench
    evaluate` first", which then refused for want of the model)."""
    parallel, _, precision = variant.partition("-")
    train = f"`ampbench train --parallel {parallel} --precision {precision}`, then `ampbench evaluate`"
    if variant not in study_variants():
        return f"train it again, {train}"
    return f"`dvc repro` brings it back (from DVC's cache, else by training) and scores it again; or {train}"


def runs_not_in(tracker, records: dict[str, dict]) -> str:
    """'' when the store holds every variant run the metrics files name; else one line naming the
    first it does not hold (hostile pass: a deleted mlflow.db gave "failed (MlflowException: Run
    with id=... not found); check the store" after the reports were written)."""
    from ampbench.tracking import store, trash

    for variant, record in records.items():
        for run_id in sorted(
            {s["variant_run_id"] for s in record.get("seeds", []) if s.get("variant_run_id")}
        ):
            if tracker.status(run_id) is None and trash.deleted(tracker, run_id):  # hostile pass E
                return (
                    f"reports/metrics/{variant}.json names MLflow run {run_id}, deleted in store "
                    f"{tracker.uri}: restore it ({trash.restore_command(tracker, run_id)}), or train and "
                    f"evaluate {variant} again"
                )
            if tracker.status(run_id) is None:
                return (
                    f"reports/metrics/{variant}.json names MLflow run {run_id}, which store {tracker.uri} "
                    f"does not hold: {store.where_the_runs_are()}, or train and evaluate again"
                )
            if moved := _other_experiment(tracker, run_id):  # hostile pass P: a link to none of them
                return (
                    f"reports/metrics/{variant}.json names MLflow run {run_id}, of experiment {moved!r}, "
                    f"not of tracking.experiment {tracker.experiment!r} (changed, or the experiment "
                    f"renamed, since it was trained): set tracking.experiment: {moved} in params.yaml, "
                    "or train and evaluate again"
                )
    return ""


def _other_experiment(tracker, run_id: str) -> str:
    """The name of the experiment holding ``run_id`` where it is not the study's; else ''."""
    held = tracker.client.get_run(run_id).info.experiment_id
    return "" if held == tracker.experiment_id() else tracker.client.get_experiment(held).name


def _records(variants: list[str]) -> dict[str, dict]:
    """The evaluate metrics files there are (a missing one: compare.compare says so)."""
    from ampbench.report.compare import read_record

    files = {v: REPORTS_DIR / "metrics" / f"{v}.json" for v in variants}
    return {v: read_record(f, v) for v, f in files.items() if f.exists()}
