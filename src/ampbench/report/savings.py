"""docs/FINDINGS.md's "What AMP saves" (issue #24): peak memory and training energy of the single-GPU
variants in both studies, each against fp32 of the same study. The tutorial's first stated reason
for AMP is lower memory; this section says what it saved, measured.
"""

from __future__ import annotations

import math

from ampbench.report import stats
from ampbench.report.claims import AC, FP32, GS, cite, seed_values
from ampbench.report.sentences import ENGLISH, Words


def _mean(rec: dict, key: str) -> float:
    """Mean over seeds; nan unless every seed has the value (energy: absent without NVML)."""
    values = seed_values(rec, key)
    return stats.mean_std(values)[0] if len(values) == len(rec["seeds"]) else math.nan


def _spread(rec: dict, key: str, spec: str, w: Words, scale: float = 1.0) -> str:
    """Mean ± std over seeds, as every figure of the report (n/a unless every seed has it)."""
    values = seed_values(rec, key)
    if not values or len(values) < len(rec["seeds"]):
        return w("na")
    mean, std = stats.mean_std([v * scale for v in values])
    return f"{format(mean, spec)} ± {format(std, spec)}"


def _x(a: float, b: float, w: Words) -> str:
    return w("na") if math.isnan(a) or math.isnan(b) or not b else f"{a / b:.2f}x"


def section(studies: dict, w: Words = ENGLISH) -> str:
    lines = [w("mem.head"), "", w("mem.intro"), "", w("mem.table"), "|---" * 8 + "|"]
    for label, runs in studies.items():
        base = runs[f"single-{FP32}"]
        for precision in (FP32, AC, GS):
            rec = runs[f"single-{precision}"]
            mb, joules = _mean(rec, "peak_memory_mb"), _mean(rec, "train_joules")
            lines.append(
                f"| {w.name(label)} | single-{precision} | {_spread(rec, 'peak_memory_mb', ',.0f', w)} "
                f"| {_x(mb, _mean(base, 'peak_memory_mb'), w)} "
                f"| {_spread(rec, 'train_joules', ',.2f', w, 1e-3)} "
                f"| {_spread(rec, 'images_per_joule', ',.0f', w)} "
                f"| {_x(joules, _mean(base, 'train_joules'), w)} | {cite(rec, w)} |"
            )
    lines += ["", *[_bullet(label, runs, w) for label, runs in studies.items()]]
    return "\n".join(lines)


def _num(value: float, spec: str, w: Words) -> str:
    return w("na") if math.isnan(value) else format(value, spec)


def _bullet(label: str, runs: dict, w: Words) -> str:
    mem = {p: _mean(runs[f"single-{p}"], "peak_memory_mb") for p in (FP32, AC, GS)}
    energy = {p: _mean(runs[f"single-{p}"], "train_joules") for p in (FP32, AC, GS)}
    said = (
        w("mem.no_energy")
        if math.isnan(energy[FP32]) or math.isnan(energy[AC])
        else w("mem.energy", e_ac=_x(energy[AC], energy[FP32], w), e_gs=_x(energy[GS], energy[FP32], w))
    )
    if math.isnan(mem[FP32]) or math.isnan(mem[AC]):
        return w("mem.no_memory", label=w.name(label), energy=said)
    return w(
        "mem.bullet",
        label=w.name(label),
        mem_ac=_x(mem[AC], mem[FP32], w),
        delta=_num(mem[AC] - mem[FP32], "+,.0f", w),
        mem_gs=_x(mem[GS], mem[FP32], w),
        energy=said,
    )
