"""AMP's gain against TF32 beside true fp32: compare's table, its CSV row, the DVC answer."""

from __future__ import annotations

import math

from ampbench.report import answer, compare


def _seed(ips: float) -> dict:
    return {
        "seed": 0,
        "images_per_second": ips,
        "test_accuracy": 0.85,
        "train_seconds": 3.0,
        "peak_memory_mb": 1000.0,
        "diverged": False,
        "devices_used": 1,
    }


def _records(with_tf32: bool) -> dict:
    ips = {"single-fp32": 100.0, "single-autocast": 400.0, **({"single-tf32": 200.0} if with_tf32 else {})}
    return {v: {"seeds": [_seed(x)]} for v, x in ips.items()}


def test_autocast_gain_against_both_baselines():
    rows = {r["variant"]: r for r in compare.summarize(_records(with_tf32=True))}
    assert rows["single-autocast"]["speedup"] == 4.0
    assert rows["single-autocast"]["speedup_vs_tf32"] == 2.0 and rows["single-fp32"]["speedup_vs_tf32"] == 0.5
    md = compare.to_markdown(list(rows.values()))
    assert "| speed-up | vs single-tf32 | peak MB |" in md and "| 4.00x | 2.00x |" in md
    assert "TF32 math, PyTorch's default" in md
    assert answer.answer_metrics(rows["single-autocast"])["Speedup_tf32"] == 2.0
    assert compare.summary_metrics(list(rows.values()))["single-autocast"]["speedup_vs_tf32"] == 2.0


def test_without_tf32_the_table_is_as_before():
    rows = compare.summarize(_records(with_tf32=False))
    assert all(math.isnan(r["speedup_vs_tf32"]) for r in rows)
    md = compare.to_markdown(rows)
    assert "tf32" not in md.lower()
    assert all("Speedup_tf32" not in answer.answer_metrics(r) for r in rows)


def test_a_table_without_single_fp32_says_n_a_not_nanx():
    """Hostile pass P: `compare --variants single-autocast` wrote "nanx" as its speed-up."""
    from ampbench.report import chart

    records = _records(with_tf32=False)
    rows = compare.summarize({"single-autocast": records["single-autocast"]})
    md = compare.to_markdown(rows)
    assert "nan" not in md.lower() and "| n/a |" in md
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    chart._speedup(ax, rows, ["single-autocast"], ["C0"])  # noqa: SLF001 - the bar's label
    assert [t.get_text() for t in ax.texts] == ["  0k img/s"]
    plt.close(fig)
