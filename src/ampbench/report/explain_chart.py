"""reports/explain.png: which change made AMP pay (left), where the time went (middle), and from
which batch size it pays (right)."""

from __future__ import annotations

from pathlib import Path

COLORS = {
    "fp32": "#888888",
    "autocast": "#1f77b4",
    "autocast_gradscaler": "#ff7f0e",
    "autocast_bf16": "#2ca02c",
}


def draw(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rungs = res["rungs"]
    names = [c["precision"] for c in rungs[0]["cells"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    x = range(len(rungs))
    width = 0.8 / max(1, len(names) - 1)
    for i, name in enumerate(n for n in names if n != "fp32"):
        ratios = [next(c for c in r["cells"] if c["precision"] == name)["speedup_vs_fp32"] for r in rungs]
        axes[0].bar([k + i * width for k in x], ratios, width, label=name, color=COLORS.get(name))
    axes[0].axhline(1.0, color="black", lw=0.8)
    axes[0].set_xticks([k + width for k in x], [r["rung"] for r in rungs])
    axes[0].set_title("AMP's speed-up over the same rung's fp32")
    axes[0].legend(fontsize=8)
    for name in ("fp32", "autocast"):
        busy = [next(c for c in r["cells"] if c["precision"] == name)["device_busy"] * 100 for r in rungs]
        axes[1].plot(list(x), busy, marker="o", label=name, color=COLORS[name])
    axes[1].set_xticks(list(x), [r["rung"] for r in rungs])
    axes[1].set_ylim(0, 105)
    axes[1].set_title("device busy, % of wall time")
    axes[1].legend(fontsize=8)
    cross = res.get("crossover")
    if cross:
        batches = [r["batch"] for r in cross["rows"]]
        for name in names[1:]:
            axes[2].plot(
                batches,
                [r[name] / r["fp32"] for r in cross["rows"]],
                marker="o",
                label=name,
                color=COLORS.get(name),
            )
        axes[2].set_xscale("log", base=2)
        axes[2].set_xticks(batches, [str(b) for b in batches])
        axes[2].axhline(1.0, color="black", lw=0.8)
        axes[2].set_title("speed-up over fp32 by batch (bare step)")
        axes[2].legend(fontsize=8)
    else:
        axes[2].axis("off")
    title = f"Why AMP pays or not: {res['hardware']}"
    fig.suptitle(
        title + (" (CPU: says nothing about any GPU)" if res["note"] else ""),
        color="red" if res["note"] else "black",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
