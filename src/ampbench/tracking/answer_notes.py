"""The answer in words where MLflow shows it: a variant's line, its tags and description, the study's
table (tracking/view.py puts them on the runs; the rows are report.compare's)."""

from __future__ import annotations

import math

BASELINE = "single-fp32"
# The answer as short tags too: a run's page shows its tags on the first screen, its description
# (the note) only below the fold, and cuts a tag's value at about 40 characters.
ANSWER_TAGS = ("speed-up", "accuracy", "images/s", "peak MB", "energy")


def _num(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None or math.isnan(value) else format(value * scale, spec)


def _times(value: float | None) -> str:
    """A speed-up: "3.56x", or "n/a" where there is no baseline to divide by."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.2f}x"


def _delta_pts(row: dict) -> str:
    """' (+0.12 pts)': the accuracy against the baseline's, in points; nothing without one."""
    delta = row.get("accuracy_delta", math.nan)
    return "" if delta is None or math.isnan(delta) else f" ({_num(delta, '+.2f', 100)} pts)"


def summary_line(row: dict) -> str:
    """A variant's answer in one line, most telling first (the runs table shows its start)."""
    speed = _times(row["speedup"])
    return (
        f"{'speed-up n/a' if speed == 'n/a' else speed} · acc {_num(row['test_accuracy_mean'], '.2f', 100)}% "
        f"± {_num(row['test_accuracy_std'], '.2f', 100)}{_delta_pts(row)} "
        f"· {_num(row['images_per_second_mean'], ',.0f')} img/s "
        f"· {_num(row['peak_memory_mb_mean'], ',.0f')} MB"
    )


def answer_tags(row: dict) -> dict[str, str]:
    """The answer line in ANSWER_TAGS pieces (energy only where measured)."""
    tags = {
        "speed-up": _times(row["speedup"]),
        "accuracy": f"{_num(row['test_accuracy_mean'], '.2f', 100)}% ± "
        f"{_num(row['test_accuracy_std'], '.2f', 100)}{_delta_pts(row)}",
        "images/s": _num(row["images_per_second_mean"], ",.0f"),
        "peak MB": _num(row["peak_memory_mb_mean"], ",.0f"),
    }
    if not math.isnan(row.get("speedup_vs_tf32", math.nan)):  # where the study has single-tf32
        tags["vs tf32"] = _times(row["speedup_vs_tf32"])
    joules = row.get("train_joules_mean")
    if joules is not None and not math.isnan(joules):
        tags["energy"] = f"{joules / 1e3:,.2f} kJ"
    if row.get("noisy"):  # report/selfcheck.py: the why is in the description
        tags["self-check"] = "noisy (see description)"
    return tags


def variant_note(row: dict) -> str:
    """A variant run's description: the line, then the same in words."""
    verdict = {"yes": "a significant difference", "no": "no significant difference"}.get(
        row.get("significant", ""), "no test (baseline or too few seeds)"
    )
    ips = f"{_num(row['images_per_second_mean'], ',.0f')} images/s, first epoch excluded"
    if math.isnan(row["speedup"]):  # no baseline of the same settings (a lone `mlflow run`)
        speed = f"{ips}; no speed-up: no {BASELINE} trained with the same settings to compare with"
        against = ""
    else:
        speed = f"{_num(row['speedup'], '.2f')} times the images/s of {BASELINE} ({ips})"
        against = (
            f", {_num(row['accuracy_delta'], '+.4f')} against {BASELINE} "
            f"(Welch p = {_num(row['p_value'], '.3f')}: {verdict})"
        )
    return (
        f"{summary_line(row)}\n\n{row['variant']}: {speed}; test accuracy "
        f"{_num(row['test_accuracy_mean'], '.4f')} ± {_num(row['test_accuracy_std'], '.4f')} "
        f"(mean ± std over {row['seeds']} seeds){against}; peak memory "
        f"{_num(row['peak_memory_mb_mean'], ',.0f')} MB{_energy(row)}. Its seed runs are nested under "
        "this run." + _noisy(row)
    )


def _noisy(row: dict) -> str:
    """The self-check's finding where the variant is noisy (report/selfcheck.py), else nothing."""
    if not row.get("noisy"):
        return ""
    return (
        f"\n\nSelf-check: {row['noisy']}. Its images/s is several speeds averaged: re-run it on a "
        "quiet machine before quoting it."
    )


def _energy(row: dict) -> str:
    """The training's energy where NVML measured it (report.compare's row), else nothing."""
    joules = row.get("train_joules_mean", math.nan)
    if joules is None or math.isnan(joules):
        return ""
    per_joule = _num(row.get("images_per_joule_mean"), ",.0f")
    return f"; training energy {joules / 1e3:,.2f} kJ ({per_joule} images/J)"


def _fastest(rows: list[dict]) -> dict | None:
    ranked = [r for r in rows if not math.isnan(r["speedup"])]
    return max(ranked, key=lambda r: r["speedup"]) if ranked else None


def study_note(rows: list[dict], notice: str = "") -> str:
    """The study in a few lines: the headline, then every variant as a table (markdown)."""
    best, base = _fastest(rows), next((r for r in rows if r["variant"] == BASELINE), None)
    headline = "Answer: see the table below."
    if best and base:
        change = {"yes": "a significant change", "no": "no significant change"}.get(
            best.get("significant", ""), "not tested"
        )
        headline = (
            f"**Answer:** the fastest, {best['variant']}, trains at {_num(best['speedup'], '.2f')}x "
            f"the images/s of {BASELINE}; test accuracy {_num(best['test_accuracy_mean'], '.4f')} against "
            f"{_num(base['test_accuracy_mean'], '.4f')} ({_num(best['accuracy_delta'], '+.4f')}, {change})."
        )
    lines = [
        "| variant | speed-up | images/s | test accuracy | Δ accuracy | peak MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: 0.0 if math.isnan(r["speedup"]) else -r["speedup"]):
        lines.append(
            f"| {r['variant']} | {_num(r['speedup'], '.2f')}x | {_num(r['images_per_second_mean'], ',.0f')} "
            f"| {_num(r['test_accuracy_mean'], '.4f')} ± {_num(r['test_accuracy_std'], '.4f')} "
            f"| {_num(r['accuracy_delta'], '+.4f')} | {_num(r['peak_memory_mb_mean'], ',.0f')} |"
        )
    tail = f"\n\n{notice}" if notice else ""
    return (
        f"{headline} Every variant, mean ± std over seeds (the variant runs carry the same numbers "
        "as `answer/*` metrics; their seed runs are nested under them):\n\n" + "\n".join(lines) + tail + "\n"
    )


def _seed_speedup(metrics: dict, row: dict) -> float:
    """A seed's images/s against the baseline's mean (the variant's speed-up, per seed)."""
    ips, mean, speedup = metrics.get("speed/images_per_second"), row["images_per_second_mean"], row["speedup"]
    if ips is None or math.isnan(speedup) or not mean:
        return math.nan
    return ips * speedup / mean


def seed_tags(metrics: dict, row: dict) -> dict[str, str]:
    """A seed run's own answer as short tags (its page shows tags on the first screen)."""
    acc, ips = metrics.get("test/accuracy"), metrics.get("speed/images_per_second")
    peak = metrics.get("memory/peak_mb")
    tags = {
        "speed-up": _times(_seed_speedup(metrics, row)),
        "accuracy": f"{_num(acc, '.2f', 100)}%",
        "images/s": _num(ips, ",.0f"),
    }
    if peak is not None:
        tags["peak MB"] = _num(peak, ",.0f")
    return tags


def seed_note(name: str, metrics: dict, row: dict) -> str:
    """A seed run's description: its own figures, then its variant's answer over every seed."""
    tags = seed_tags(metrics, row)
    against = "" if tags["speed-up"] == "n/a" else f" ({tags['speed-up']} the mean of {BASELINE})"
    return (
        f"{name}: test accuracy {tags['accuracy']}, {tags['images/s']} images/s{against}, first epoch "
        f"excluded; peak memory {tags.get('peak MB', 'n/a')} MB.\n\nIts variant over {row['seeds']} "
        f"seed(s): {summary_line(row)}"
    )


def experiment_note(rows: list[dict], notice: str = "") -> str:
    """The experiment's description, one line of at most about 100 characters: MLflow shows it in
    a box above the runs table that clips a second line (and, cut shorter, in the experiments list)."""
    best = _fastest(rows)
    fastest = (
        f"fastest {best['variant']} {_times(best['speedup'])}, acc "
        f"{_num(best['test_accuracy_mean'], '.2f', 100)}%"
        if best
        else "see the compare run"
    )
    demo = " (a demo on a subset)" if "SUBSET" in notice else ""
    return f"AMP x data parallelism{demo}, latest study: {fastest}."
