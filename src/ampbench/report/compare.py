"""Stage `compare`: the nine variants side by side, mean ± std over seeds.

    ampbench compare

Reads ``reports/metrics/<variant>.json`` (written by evaluate) and writes
``reports/comparison.{md,csv,png}`` and ``reports/summary.json`` (the DVC metrics of the whole
study, one short entry per variant, so `dvc exp show` fits a terminal): test accuracy, train
seconds, images/s, peak memory and energy (NVML, where the GPU has a counter), the
speed-up against ``single-fp32``, whether each accuracy difference against ``single-fp32`` is
statistically meaningful (Welch's two-sample t-test over seeds, p < 0.05), devices really used,
and diverged runs. The same table and chart are logged to MLflow in a run named ``compare``;
each variant's run gets its speed-up, accuracy difference and p-value.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
from pathlib import Path

from ampbench.paths import missing
from ampbench.report import selfcheck, stats
from ampbench.report.chart import chart, energy_measured
from ampbench.seed_result import SUMMARISED, unusable

log = logging.getLogger(__name__)

BASELINE = "single-fp32"
# PyTorch's own default on Ampere and newer (TF32 convolutions): AMP's gain against what a user
# runs today, beside the gain against true fp32; only where the study has the tf32 variant.
TF32_BASELINE = "single-tf32"
TF32_NOTE = (
    f" vs {TF32_BASELINE}: images/s against fp32 with TF32 math, PyTorch's default for convolutions "
    "on Ampere and newer GPUs (single-fp32 is true fp32, TF32 off)."
)
COLUMNS = (
    "variant",
    "seeds",
    "diverged",
    "test_accuracy_mean",
    "test_accuracy_std",
    "accuracy_delta",
    "p_value",
    "significant",
    "train_seconds_mean",
    "train_seconds_std",
    "images_per_second_mean",
    "images_per_second_std",
    "speedup",
    "speedup_vs_tf32",
    "peak_memory_mb_mean",
    "peak_memory_mb_std",
    "train_joules_mean",
    "train_joules_std",
    "images_per_joule_mean",
    "images_per_joule_std",
    "devices_used",
    "device_name",
    "amp_dtype",
    "noisy",
)


def summarize(records: dict[str, dict]) -> list[dict]:
    """One row per variant from the per-variant metrics files (``{variant: summary}``)."""
    base = records.get(BASELINE)
    base_acc = [r["test_accuracy"] for r in base["seeds"]] if base else []
    base_ips = stats.mean_std([r["images_per_second"] for r in base["seeds"]])[0] if base else math.nan
    tf32 = records.get(TF32_BASELINE)
    tf32_ips = stats.mean_std([r["images_per_second"] for r in tf32["seeds"]])[0] if tf32 else math.nan
    rows = []
    for variant, rec in records.items():
        seeds = rec["seeds"]
        row = {
            "variant": variant,
            "seeds": len(seeds),
            "diverged": sum(bool(s.get("diverged")) for s in seeds),
        }
        for key in SUMMARISED:
            values = [s.get(key) for s in seeds]  # energy: None on a seed without NVML's counter
            measured = [] if None in values else [float(v) for v in values]
            row[f"{key}_mean"], row[f"{key}_std"] = stats.mean_std(measured)
        acc = [s["test_accuracy"] for s in seeds]
        row["accuracy_delta"] = (
            row["test_accuracy_mean"] - statistics.fmean(base_acc) if base_acc else math.nan
        )
        row["p_value"] = stats.welch_p(acc, base_acc) if variant != BASELINE else math.nan
        row["significant"] = (
            "n/a" if math.isnan(row["p_value"]) else ("yes" if row["p_value"] < stats.ALPHA else "no")
        )
        row["speedup"] = row["images_per_second_mean"] / base_ips if base_ips else math.nan
        row["speedup_vs_tf32"] = row["images_per_second_mean"] / tf32_ips if tf32_ips else math.nan
        row["devices_used"] = ",".join(sorted({str(s.get("devices_used", "?")) for s in seeds}))
        row["device_name"] = seeds[0].get("device_name", "")
        row["amp_dtype"] = seeds[0].get("amp_dtype", "")
        row["noisy"] = selfcheck.of_seeds(seeds)  # '' when steady
        row["variant_run_ids"] = sorted({s["variant_run_id"] for s in seeds if s.get("variant_run_id")})
        rows.append(row)
    return rows


def _times(ratio: float) -> str:
    """A speed-up as the table shows it; n/a without its baseline (hostile pass P: "nanx")."""
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"


def _fmt(mean: float, std: float, digits: int) -> str:
    return "n/a" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def to_markdown(rows: list[dict], notice: str = "") -> str:
    energy = energy_measured(rows)  # else two columns of n/a: said once in the note instead
    tf32 = any(not math.isnan(r.get("speedup_vs_tf32", math.nan)) for r in rows)
    head = (
        "| variant | seeds | diverged | test accuracy | Δ vs single-fp32 | p (Welch) | significant "
        "| train s | images/s | speed-up |"
        + (f" vs {TF32_BASELINE} |" if tf32 else "")
        + " peak MB |"
        + (" energy kJ | images/J |" if energy else "")
        + " devices | amp dtype |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p = "n/a" if math.isnan(r["p_value"]) else f"{r['p_value']:.3f}"
        delta = "n/a" if math.isnan(r["accuracy_delta"]) else f"{r['accuracy_delta']:+.4f}"
        joules = (
            f"| {_fmt(r['train_joules_mean'] / 1e3, r['train_joules_std'] / 1e3, 2)} "
            f"| {_fmt(r['images_per_joule_mean'], r['images_per_joule_std'], 0)} "
        )
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {r['diverged']} "
            f"| {_fmt(r['test_accuracy_mean'], r['test_accuracy_std'], 4)} | {delta} | {p} "
            f"| {r['significant']} | {_fmt(r['train_seconds_mean'], r['train_seconds_std'], 1)} "
            f"| {_fmt(r['images_per_second_mean'], r['images_per_second_std'], 0)} "
            f"| {_times(r['speedup'])} "
            + (f"| {_times(r['speedup_vs_tf32'])} " if tf32 else "")
            + f"| {_fmt(r['peak_memory_mb_mean'], r['peak_memory_mb_std'], 0)} "
            + (joules if energy else "")
            + f"| {r['devices_used']} | {r['amp_dtype']} |"
        )
    noisy = [f"**{r['variant']}** {r['noisy']}" for r in rows if r.get("noisy")]
    check = (
        "Self-check: " + "; ".join(noisy) + ". A noisy variant's images/s is several speeds averaged: "
        "re-run it on a quiet machine before quoting it."
        if noisy
        else f"Self-check: every variant steady (each seed's epochs after the first within "
        f"{selfcheck.LIMIT:.0%} of their mean (CV), seeds' images/s within {selfcheck.LIMIT:.0%})."
    )
    device = rows[0]["device_name"] if rows else "?"
    said = (
        "Energy: the GPUs' alone, from NVML's energy counter over each seed's training (all epochs, "
        "all GPUs it used, idle power included; not the host's CPUs); n/a for a variant where a seed "
        "lacks it."
        if energy
        else "Energy: not measured here (no NVML energy counter: a CPU, or a GPU without one)."
    )
    note = (
        f"\nHardware: {device}. Mean ± std over seeds; images/s excludes each run's first "
        f"(warm-up) epoch; speed-up is images/s against {BASELINE}; significance: Welch's "
        f"two-sample t-test on per-seed test accuracy against {BASELINE}, p < {stats.ALPHA}. "
        "Diverged runs are counted in their variant and included in its means. Peak MB: device "
        f"memory of GPU 0 / rank 0 on CUDA, the process's peak resident memory on CPU. {said}"
        + (TF32_NOTE if tf32 else "")
        + "\n"
    )
    title = "# Comparison of the variants\n\n" + (f"{notice}\n\n" if notice else "")
    return title + "\n".join(lines) + "\n\n" + check + "\n" + note


def read_record(path: Path, variant: str) -> dict:
    """An evaluate metrics file, or a ValueError naming it and the fix (hostile pass D: an empty or
    cut file, what a full disk leaves, said "Expecting value: line 1 column 1 (char 0)")."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        why = f"not a metrics file ({err})"
    else:
        if not (fault := unusable(record)):
            return record
        why = f"not a metrics file ({fault})"
    raise ValueError(
        f"{path} is {why}: write it again with `ampbench evaluate --variants {variant}` (or `dvc repro`)"
    )


def compare(
    metrics_dir: Path, variants: list[str], out_dir: Path, notice: str = "", mixed: bool = False
) -> list[dict]:
    records = {}
    for v in variants:
        f = metrics_dir / f"{v}.json"
        if not f.exists():
            raise FileNotFoundError(f"{f} {missing(f)}: run `ampbench evaluate` for {v} first")
        records[v] = read_record(f, v)
    rows = summarize(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.md").write_text(to_markdown(rows, notice), encoding="utf-8")
    with open(out_dir / "comparison.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    chart(rows, out_dir / "comparison.png", notice)
    (out_dir / "summary.json").write_text(
        json.dumps({**({"mixed_settings": True} if mixed else {}), **summary_metrics(rows)}, indent=1) + "\n",
        encoding="utf-8",
    )
    return rows


def subset_notice(cfg) -> str:
    """The comparison's first words when it was made on a subset (the quick study): say so plainly."""
    d, t = cfg.data, cfg.train
    if not (d.train_per_class or d.test_per_class):
        return ""
    train = f"{d.train_per_class} of 5,000" if d.train_per_class else "all 5,000"
    test = f"{d.test_per_class} of 1,000" if d.test_per_class else "all 1,000"
    return (
        f"> **DEMO ON A SUBSET, NOT THE STUDY'S RESULT.** Quick study (`{cfg.tracking.experiment}`): "
        f"{train} train and {test} test images per class, {t.epochs} epoch(s), batch {t.batch_size}, "
        f"seeds {', '.join(map(str, t.seeds))}, model {cfg.model.name}"
        + (f" (FC width {cfg.model.fc_dim})" if cfg.model.name == "alexnet" else "")
        + ". It shows the "
        "pipeline end to end (download, nine trains, nine evaluations, this comparison, MLflow); its "
        "accuracies, speeds and significance tests say nothing about what mixed precision or data "
        "parallelism buy. The study itself: `make run`."
    )


def summary_metrics(rows: list[dict]) -> dict:
    """The study's answer in a few numbers per variant (DVC metrics: `dvc exp show`, `metrics diff`)."""
    keep = {
        "test_accuracy_mean": "test_accuracy",
        "images_per_second_mean": "images_per_second",
        "train_seconds_mean": "train_seconds",
        "speedup": "speedup",
        "speedup_vs_tf32": "speedup_vs_tf32",
    }
    return {
        r["variant"]: {short: round(r[k], 4) for k, short in keep.items() if not math.isnan(r[k])}
        for r in rows
    }
