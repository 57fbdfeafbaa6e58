"""Check a finished study against what its own step does: every epoch's speed, seed by seed.

    python scripts/study_check.py [--models models] [--bench reports/bench.json] [--out FILE.json]

Reads each ``<models>/<variant>/seed-<s>/model.pt`` (its per-epoch history and result) and, with
``--bench``, ``ampbench bench``'s pipeline medians (compile none) of the same machine. Prints, per
variant: the epochs' images/s after the first (min–max), each seed's mean, its peak allocated
memory, and the acceptance checks of the study's measurement:

- every epoch after the first within 5% of bench's pipeline median for its precision;
- seed 0 not slower than seeds 1–2 by more than 3%;
- the variant's images/s within 5% of bench's pipeline;
- peak allocated memory within 2% across seeds.

Exit status 0 when every check holds (or has nothing to check), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _pipeline(bench: dict) -> dict[str, float]:
    """precision -> bench's pipeline median (compile none), from the single-<precision> rows."""
    out = {}
    for r in bench.get("rows", []):
        if r["measure"] == "pipeline" and r.get("compile", "none") == "none":
            out[r["variant"].partition("-")[2]] = r["images_per_second"]
    return out


def check(models: Path, pipeline: dict[str, float]) -> tuple[list[dict], bool]:
    from ampbench.checkpoints.state import ModelFile

    rows, ok = [], True
    for vdir in sorted(p for p in models.iterdir() if p.is_dir()):
        seeds = sorted(vdir.glob("seed-*/model.pt"), key=lambda p: int(p.parent.name.split("-")[1]))
        files = [ModelFile.load(f) for f in seeds]
        if not files:
            continue
        precision = vdir.name.partition("-")[2]
        epochs = {m.seed: [h["epoch_images_per_second"] for h in m.history[1:]] for m in files}
        means = {s: statistics.fmean(v) for s, v in epochs.items() if v}
        peaks = [m.result.peak_memory_mb for m in files]
        ref = pipeline.get(precision)
        row = {
            "variant": vdir.name,
            "seed_means": means,
            "epoch_min": min(min(v) for v in epochs.values() if v),
            "epoch_max": max(max(v) for v in epochs.values() if v),
            "images_per_second": statistics.fmean(means.values()),
            "peak_allocated_mb": peaks,
            "peak_reserved_mb": [getattr(m.result, "peak_reserved_mb", None) for m in files],
            "warmup_peak_mb": [getattr(m.result, "warmup_peak_memory_mb", None) for m in files],
            "epoch_cv": [getattr(m.result, "epoch_cv", None) for m in files],
            "bench_pipeline": ref,
        }
        checks = {"peak_within_2pct": (max(peaks) - min(peaks)) / statistics.fmean(peaks) < 0.02}
        later = [means[s] for s in means if s != min(means)]
        if later:
            checks["seed0_within_3pct"] = means[min(means)] >= statistics.fmean(later) * 0.97
        if ref:
            checks["epochs_within_5pct_of_bench"] = all(
                abs(x - ref) / ref <= 0.05 for v in epochs.values() for x in v
            )
            checks["mean_within_5pct_of_bench"] = abs(row["images_per_second"] - ref) / ref <= 0.05
        row["checks"] = checks
        ok &= all(checks.values())
        rows.append(row)
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="models")
    ap.add_argument("--bench", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    pipeline = _pipeline(json.loads(Path(args.bench).read_text())) if args.bench else {}
    rows, ok = check(Path(args.models), pipeline)
    for r in rows:
        seeds = ", ".join(f"{s}: {v:,.0f}" for s, v in r["seed_means"].items())
        bench = f"{r['bench_pipeline']:,.0f}" if r["bench_pipeline"] else "n/a"
        failed = [k for k, v in r["checks"].items() if not v]
        print(
            f"{r['variant']:28} epochs {r['epoch_min']:>9,.0f}–{r['epoch_max']:<9,.0f} seeds {seeds} "
            f"| bench {bench} | peak MB {', '.join(f'{p:,.0f}' for p in r['peak_allocated_mb'])} "
            f"| {'ok' if not failed else 'FAILS ' + ', '.join(failed)}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"ok": ok, "rows": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
