"""The study's answer in the shapes DVC's views read (written by the compare stage).

    reports/answer/<variant>.json      DVC metrics: one flat file per variant, so `dvc metrics show`
                                       prints one row per variant and six short columns
    reports/views/speedup.csv          speed-up per variant (`dvc plots show`: a bar chart)
    reports/views/test_accuracy.csv    test accuracy per epoch and variant, mean over seeds (one
                                       line per variant in one chart: .dvc/plots/variants.json)

Values are rounded to the digits that carry information: the seeds' spread of test accuracy is
about 0.1 percentage points, so two decimals in percent; images/s and MB as integers; speed-up to
two decimals.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

ANSWER_DIR = "answer"
VIEWS_DIR = "views"
# key in the metrics file -> (row of report/compare.summarize, scale, digits). `dvc metrics show`
# sorts the columns by name (ASCII: capitals first) and should fit 100 columns beside the longest
# path (reports/answer/ddp-autocast_gradscaler.json): the speed-up first, then test accuracy in
# percent, its difference from single-fp32 and its std over seeds in percentage points, images/s
# and peak MB. 96 columns in all.
METRICS = {
    "Speedup": ("speedup", 1, 2),
    "acc%": ("test_accuracy_mean", 100, 2),
    "acc_d": ("accuracy_delta", 100, 2),
    "acc_sd": ("test_accuracy_std", 100, 2),
    "img/s": ("images_per_second_mean", 1, 0),
    "mb": ("peak_memory_mb_mean", 1, 0),
    "Speedup_tf32": ("speedup_vs_tf32", 1, 2),  # only where the study has single-tf32 (wider)
}


def _rounded(value, digits: int):
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return int(round(value)) if digits == 0 else round(float(value), digits)


def answer_metrics(row: dict) -> dict:
    """One variant's answer: the columns of `dvc metrics show` (NaN left out, not written as null)."""
    values = {
        key: _rounded(row.get(field) * scale if isinstance(row.get(field), (int, float)) else None, digits)
        for key, (field, scale, digits) in METRICS.items()
    }
    return {key: value for key, value in values.items() if value is not None}


def mean_curve(curve_csv: Path) -> list[dict]:
    """Test accuracy per epoch, averaged over the seeds in evaluate's per-variant curve file."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    with open(curve_csv, newline="", encoding="utf-8") as f:
        for record in csv.DictReader(f):
            value = record.get("test_accuracy") or ""
            if value.strip():  # epochs without an evaluation (train.eval_each_epoch: false)
                by_epoch[int(record["epoch"])].append(float(value))
    return [
        {"epoch": epoch, "test_accuracy": round(statistics.fmean(values), 4)}
        for epoch, values in sorted(by_epoch.items())
    ]


def _write_csv(path: Path, fields: list[str], records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)


def write(rows: list[dict], curves_dir: Path, out_dir: Path, mixed: bool = False) -> None:
    """The answer files for `rows` (report/compare.summarize) under out_dir (reports/). ``mixed``
    (compare --allow-mixed over variants trained differently): each metrics file says so in a
    column of its own, ``Mixed: true``, so that `dvc metrics show` shows what the table says."""
    answer, views = out_dir / ANSWER_DIR, out_dir / VIEWS_DIR
    for folder in (answer, views):  # a variant dropped from the study leaves no stale file
        shutil.rmtree(folder, ignore_errors=True)
    answer.mkdir(parents=True)
    for row in rows:
        text = json.dumps({**({"Mixed": True} if mixed else {}), **answer_metrics(row)}, indent=1) + "\n"
        (answer / f"{row['variant']}.json").write_text(text, encoding="utf-8")
    speedups = [{"variant": r["variant"], "speedup": _rounded(r["speedup"], 2)} for r in rows]
    speedups = [s for s in speedups if s["speedup"] is not None]
    _write_csv(views / "speedup.csv", ["variant", "speedup"], speedups)
    curves = []
    for row in rows:
        curve = curves_dir / f"{row['variant']}.csv"
        if curve.exists():
            curves += [{"variant": row["variant"], **point} for point in mean_curve(curve)]
    _write_csv(views / "test_accuracy.csv", ["variant", "epoch", "test_accuracy"], curves)
