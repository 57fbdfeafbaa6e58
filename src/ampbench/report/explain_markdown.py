"""`ampbench explain`'s report: the rungs' table, the self-check, the batch crossover; and its files,
``<out>.json``, ``<out>.md`` and the chart ``<out>.png`` (report/explain_chart.py)."""

from __future__ import annotations

import json
from pathlib import Path

CPU_NOTE = (
    "Measured on a CPU: these figures say nothing about any GPU (no tensor cores, no cuDNN, no CUDA "
    "graphs); run `ampbench explain` on the GPU you care about."
)


def to_markdown(res: dict) -> str:
    lines = [f"# Why AMP pays or not: {res['hardware']}", ""]
    if res["note"]:
        lines += [f"**{res['note']}**", ""]
    o, vs_tf32 = res["options"], any("speedup_vs_tf32" in c for r in res["rungs"] for c in r["cells"])
    lines += [
        f"TF32 off{' but in the tf32 cells' if vs_tf32 else ''}. "
        f"Per cell: {o['windows']} windows of {o['steps']} steps after a warm-up epoch, "
        f"images/s as median (min–max); device busy and host syncs from torch.profiler over "
        f"{o['profile_steps']} steps; energy from NVML's counter "
        f"({'present' if res['energy_counter'] else 'n/a here'}). "
        f"MLflow run: {res.get('run_id') or 'not recorded'}.",
        "",
        "| rung | change | batch | precision | images/s | min–max | ms/step | speed-up vs fp32 "
        + ("| vs tf32 " if vs_tf32 else "")
        + "| device busy | host syncs/step | peak MB | TFLOP/s | J/image |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if vs_tf32 else ""),
    ]
    for r in res["rungs"]:
        for i, c in enumerate(r["cells"]):
            change = r["change"] if i == 0 else ""
            joules = "n/a" if c["joules_per_image"] is None else f"{c['joules_per_image'] * 1e3:.3f} m"
            ips, lo, hi = (
                f"{c[k]:,.0f}"
                for k in ("images_per_second", "images_per_second_min", "images_per_second_max")
            )
            ips += " (noisy)" if c.get("noisy") else ""  # the self-check below says why
            lines.append(
                f"| {r['rung']} | {change} | {r['batch']} | {c['precision']} | {ips} | {lo}–{hi} "
                f"| {c['ms_per_step']:.2f} | {c['speedup_vs_fp32']:.2f}x "
                + (f"| {c['speedup_vs_tf32']:.2f}x " if vs_tf32 else "")
                + f"| {c['device_busy']:.0%} "
                f"| {c['host_syncs_per_step']:.1f} "
                f"| {c['peak_memory_mb']:,.0f} | {c['tflops']:.1f} | {joules} |"
            )
    lines += [
        "",
        _self_check(
            f"{r['rung']} {c['precision']}" for r in res["rungs"] for c in r["cells"] if c.get("noisy")
        ),
    ]
    if res.get("crossover"):
        lines += _crossover_lines(res["crossover"])
    return "\n".join(lines) + "\n"


def _crossover_lines(cross: dict) -> list[str]:
    """The batch crossover's table, then what it shows in one sentence, its best ratio named."""
    names = [k for k in cross["rows"][0] if k != "batch"]
    lines = [
        "",
        "Batch crossover (the defaults' bare step, images/s):",
        "",
        "| batch | " + " | ".join(names) + " | autocast / fp32 |",
    ]
    lines.append("|---" * (len(names) + 2) + "|")
    for row in cross["rows"]:
        vals = " | ".join(f"{row[n]:,.0f}" for n in names)
        lines.append(f"| {row['batch']} | {vals} | {row['autocast'] / row['fp32']:.2f}x |")
    best = max(cross["rows"], key=lambda row: row["autocast"] / row["fp32"])
    lines += [
        "",
        "In this bare step (no data loading, unlike the rungs above), autocast reaches 1.5x fp32 "
        f"{_from_batch(cross, 'autocast_1_5x_from_batch')}, "
        f"2x {_from_batch(cross, 'autocast_2x_from_batch')} "
        f"(its best: {best['autocast'] / best['fp32']:.2f}x at batch {best['batch']}).",
    ]
    return lines


def _self_check(noisy) -> str:
    """One line: every measure steady, or which are noisy (report/selfcheck.py)."""
    noisy = list(noisy)
    if not noisy:
        return "Self-check: every cell's windows within 5% of their mean (CV)."
    return (
        f"Self-check: noisy (windows vary more than 5%, CV): {', '.join(noisy)}; re-run on a quiet machine."
    )


def _from_batch(cross: dict, key: str) -> str:
    tried = [r["batch"] for r in cross["rows"]]
    return f"from batch {cross[key]}" if cross[key] else f"at no batch tried ({tried[0]}–{tried[-1]})"


def write(res: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(to_markdown(res), encoding="utf-8")
    from ampbench.report.explain_chart import draw

    draw(res, out.with_suffix(".png"))
