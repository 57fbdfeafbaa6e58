"""Stage `compare`: the variants side by side (report/compare.py), tracked in MLflow.

    ampbench compare                                  # params.yaml's `variants:` (DVC's matrix)
    ampbench compare --variants single-fp32,single-autocast

Writes ``reports/comparison.{md,csv,png}`` and ``reports/summary.json`` from the evaluate stages'
metrics files. Each variant's run gets its speed-up, accuracy delta and p-value (its row in the
MLflow UI); a ``compare`` run holds the table and chart only.
"""

from __future__ import annotations

from ampbench.config import Config, ConfigError
from ampbench.paths import REPORTS_DIR
from ampbench.variants import VARIANTS, study_variants

OUTPUTS = ("comparison.md", "comparison.csv", "comparison.png", "summary.json")
ROW_METRICS = ("speedup", "accuracy_delta", "p_value")


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.report import compare
    from ampbench.tracking.tracker import KIND_TAG, Tracker

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    variants = variants or study_variants(args.params)  # dvc.yaml's matrix
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    tracker = Tracker.from_config(cfg)
    tracker.preflight()
    rows = compare.compare(REPORTS_DIR / "metrics", variants, REPORTS_DIR, compare.subset_notice(cfg))
    print((REPORTS_DIR / "comparison.md").read_text())
    # The comparison's numbers go to each variant's run (its row in the UI); the compare run holds
    # the table and chart only, so it adds no charts beside the training runs'.
    for r in rows:
        numbers = {k: r[k] for k in ROW_METRICS if isinstance(r[k], float) and r[k] == r[k]}  # not NaN
        for run_id in r["variant_run_ids"]:
            tracker.log_metrics(run_id, numbers)
    run_id = tracker.start("compare", {KIND_TAG: "compare"}, {"variants": ",".join(variants)})
    for name in OUTPUTS:
        tracker.log_artifact(run_id, REPORTS_DIR / name)
    tracker.end(run_id, "FINISHED")
    print(f"Browse the runs: {tracker.link()}")
    return 0
