"""reports/comparison.png: the comparison at a glance, one row per variant in three panels.

1. speed-up over single-fp32 (images/s), each bar labelled with its speed-up and images/s;
2. test accuracy in percent, each variant a point with its spread over seeds, on an axis cut to
   the values (from zero every variant looks the same) beside a line at single-fp32's mean, and
   labelled with its difference from it in points;
3. peak GPU memory (or the process's, on a CPU), labelled;
4. where any variant measured energy (NVML's counter), images per joule, labelled with the
   training's kJ (n/a for a variant a seed lacks it for); no panel at all on a CPU.

A run on a subset (the quick study) says so in red above the panels: its numbers are not the
study's.
"""

from __future__ import annotations

import math
from pathlib import Path

BASELINE = "single-fp32"
DIVERGED, NORMAL = "tab:red", "tab:blue"


def energy_measured(rows: list[dict]) -> bool:
    """Did any variant measure its training's energy (compare's table and this chart show it then)."""
    return any(not math.isnan(r.get("train_joules_mean", math.nan)) for r in rows)


def chart(rows: list[dict], path: Path, notice: str = "") -> None:
    """Write the three panels for `rows` (report.compare.summarize's) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in rows]
    colors = [DIVERGED if r["diverged"] else NORMAL for r in rows]
    energy = energy_measured(rows)
    panels = 4 if energy else 3  # no panel of n/a where nothing measured energy (a CPU)
    fig, axes = plt.subplots(1, panels, figsize=(5.25 * panels, 0.55 * len(rows) + 2.4), sharey=True)
    _speedup(axes[0], rows, names, colors)
    _accuracy(axes[1], rows, names, colors)
    _memory(axes[2], rows, names, colors)
    if energy:
        _energy(axes[3], rows, names, colors)
    axes[0].invert_yaxis()
    seeds = sorted({r["seeds"] for r in rows})
    hardware = (rows[0].get("device_name") if rows else "") or "this machine"
    height = fig.get_figheight()  # inches: the title lines keep their size whatever the rows
    fig.suptitle(
        f"{hardware}: mean ± std over {'/'.join(map(str, seeds))} seeds (red: a seed diverged)",
        y=1 - 0.15 / height,
        va="top",
    )
    if notice:
        banner = "DEMO ON A SUBSET: not the study's result (make run)"
        fig.text(0.5, 1 - 0.45 / height, banner, ha="center", va="top", color="red", fontweight="bold")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.8 if notice else 0.5) / height))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _speedup(ax, rows: list[dict], names: list[str], colors: list[str]) -> None:
    base = next((r["images_per_second_mean"] for r in rows if r["variant"] == BASELINE), math.nan)
    speed = [r["speedup"] for r in rows]
    spread = [r["images_per_second_std"] / base if base else 0.0 for r in rows]
    ax.barh(names, speed, xerr=spread, color=colors, capsize=3)
    for y, (s, e, r) in enumerate(zip(speed, spread, rows, strict=True)):
        label = f"  {'' if math.isnan(s) else f'{s:.2f}x · '}{r['images_per_second_mean'] / 1000:,.0f}k img/s"
        ax.text(s + e, y, label, va="center", fontsize=9)  # past the error bar
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlim(
        0, max([v + e for v, e in zip(speed, spread, strict=True) if not math.isnan(v)], default=1) * 1.6
    )
    ax.set_xlabel(f"speed-up over {BASELINE} (images/s, steady state)")
    ax.grid(axis="x", alpha=0.3)


def _accuracy(ax, rows: list[dict], names: list[str], colors: list[str]) -> None:
    acc = [100 * r["test_accuracy_mean"] for r in rows]
    std = [100 * r["test_accuracy_std"] for r in rows]
    for y, (a, s, c) in enumerate(zip(acc, std, colors, strict=True)):
        ax.errorbar(a, y, xerr=s, fmt="o", color=c, capsize=4)
    base = next((a for a, r in zip(acc, rows, strict=True) if r["variant"] == BASELINE), None)
    if base is not None:
        ax.axvline(base, color="grey", lw=0.8, ls="--")
    low = min(a - s for a, s in zip(acc, std, strict=True))
    high = max(a + s for a, s in zip(acc, std, strict=True))
    pad = max(high - low, 0.2) * 0.6
    ax.set_xlim(low - 0.15 * pad, high + pad)  # room on the right for the labels
    for y, (a, s, r) in enumerate(zip(acc, std, rows, strict=True)):
        delta = "" if math.isnan(r["accuracy_delta"]) else f" ({100 * r['accuracy_delta']:+.2f} pts)"
        ax.text(a + s, y, f"  {a:.2f}%{delta}", va="center", fontsize=9)
    ax.set_xlabel(f"test accuracy, % (dashed: {BASELINE}); axis cut to the values")
    ax.grid(axis="x", alpha=0.3)


def _memory(ax, rows: list[dict], names: list[str], colors: list[str]) -> None:
    mem = [r["peak_memory_mb_mean"] for r in rows]
    std = [r["peak_memory_mb_std"] for r in rows]
    ax.barh(names, mem, xerr=std, color=colors, capsize=3, alpha=0.8)
    for y, (m, e) in enumerate(zip(mem, std, strict=True)):
        ax.text(m + e, y, f"  {m:,.0f} MB", va="center", fontsize=9)
    ax.set_xlim(0, max([m + e for m, e in zip(mem, std, strict=True) if not math.isnan(m)], default=1) * 1.4)
    ax.set_xlabel("peak memory, MB")
    ax.grid(axis="x", alpha=0.3)


def _energy(ax, rows: list[dict], names: list[str], colors: list[str]) -> None:
    per_joule = [r.get("images_per_joule_mean", math.nan) for r in rows]
    std = [r.get("images_per_joule_std", 0.0) for r in rows]
    bars = [0.0 if math.isnan(v) else v for v in per_joule]
    ax.barh(names, bars, xerr=[0.0 if math.isnan(e) else e for e in std], color=colors, capsize=3, alpha=0.8)
    for y, (v, e, r) in enumerate(zip(per_joule, std, rows, strict=True)):
        kj = r.get("train_joules_mean", math.nan) / 1e3
        label = "  n/a" if math.isnan(v) else f"  {v:,.0f} img/J · {kj:,.2f} kJ"
        ax.text(0 if math.isnan(v) else v + e, y, label, va="center", fontsize=9)
    ax.set_xlim(0, max(bars) * 1.6 or 1)
    ax.set_xlabel("images per joule (NVML; label: the training's energy)")
    ax.grid(axis="x", alpha=0.3)
