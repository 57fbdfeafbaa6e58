"""`ampbench bench`'s report: the table of every measure, the self-check, the kernel profiles; and
its files, ``<out>.json`` and ``<out>.md``."""

from __future__ import annotations

import json
from pathlib import Path

PROFILE_ROWS = 25  # kernels listed per profiled variant in the markdown (the JSON has all)


def to_markdown(res: dict) -> str:
    lines = [
        f"Hardware: {res['hardware']}; torch {res['torch']}; TF32 off; cudnn.benchmark "
        f"{'on' if res['cudnn_benchmark'] else 'off'}; batch {res['batch']}; "
        f"{res['gflop_per_image']:.3f} GFLOP per training image (counted). Median and min–max over "
        f"{res['windows']} windows per measure: pipeline one full epoch ({res['pipeline_steps']} "
        f"steps) and ceiling {res['steps']} steps, alternating; dataloader {res['dataloader_steps']} "
        f"steps; each trainer warmed up first ({res['warmup']}+ steps, graph capture and compile included: "
        "warm-up s).",
        "",
        "| measure | variant | compile | amp dtype | images/s (median) | min–max | ms/step | of ceiling "
        "| TFLOP/s | peak MB | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['measure']} | {r['variant']} | {r.get('compile', 'none')} | {r['amp_dtype']} "
            f"| {r['images_per_second']:,.0f} "
            f"| {r['images_per_second_min']:,.0f}–{r['images_per_second_max']:,.0f} "
            f"| {r['ms_per_step']:.2f} | {r['fraction_of_ceiling']:.0%} | {r['tflops']:.1f} "
            f"| {r['peak_memory_mb']:,.0f} | {r['warmup_seconds']:.2f} |"
        )
    noisy = [f"{r['measure']} {r['variant']} ({r['noisy']})" for r in res["rows"] if r.get("noisy")]
    lines += [
        "",
        "Self-check: "
        + (
            "; ".join(noisy) + ": re-run on a quiet machine."
            if noisy
            else "every measure's windows within 5% of their mean (CV)."
        ),
    ]
    for variant, p in res.get("profiles", {}).items():
        lines += [
            "",
            f"Profile of the ceiling step, {variant} ({p['steps']} steps, torch.profiler): kernels "
            f"(CPU: operators' self time) busy {p['busy_ms_per_step']:.3f} ms of {p['ms_per_step']:.3f} ms "
            "per step.",
            "",
            "| kernel / operator | µs/step | calls/step |",
            "|---|---|---|",
        ]
        lines += [
            f"| `{k['kernel'][:100]}` | {k['us_per_step']:.1f} | {k['calls_per_step']:g} |"
            for k in p["kernels"][:PROFILE_ROWS]
        ]
    return "\n".join(lines) + "\n"


def write(res: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(to_markdown(res), encoding="utf-8")
