"""`ampbench explain`'s report says what its figures are: a noisy cell is flagged in its own row, and
the crossover's sentence names what it measured and its best ratio, so it never contradicts a row."""

from __future__ import annotations

from ampbench.report.explain_markdown import to_markdown


def _cell(precision: str, ips: float, spread: float, noisy: str = "") -> dict:
    return {
        "precision": precision,
        "images_per_second": ips,
        "images_per_second_min": ips - spread,
        "images_per_second_max": ips + spread,
        "ms_per_step": 16 / ips * 1e3,
        "speedup_vs_fp32": ips / 100.0,
        "device_busy": 0.9,
        "host_syncs_per_step": 0.0,
        "peak_memory_mb": 900.0,
        "tflops": 0.1,
        "joules_per_image": None,
        "noisy": noisy,
    }


def _report(rows: list[dict]) -> str:
    cells = [_cell("fp32", 100.0, 1.0), _cell("autocast", 175.0, 40.0, noisy="noisy (CV 12%)")]
    return to_markdown(
        {
            "hardware": "a CPU",
            "note": "",
            "options": {"windows": 2, "steps": 3, "profile_steps": 2},
            "energy_counter": False,
            "run_id": None,
            "rungs": [{"rung": "R0", "change": "the tutorial's conditions", "batch": 16, "cells": cells}],
            "crossover": {
                "rows": rows,
                "autocast_1_5x_from_batch": next(
                    (r["batch"] for r in rows if r["autocast"] >= 1.5 * r["fp32"]), None
                ),
                "autocast_2x_from_batch": next(
                    (r["batch"] for r in rows if r["autocast"] >= 2 * r["fp32"]), None
                ),
            },
        }
    )


def test_a_noisy_cell_is_flagged_in_its_row_and_a_steady_one_is_not():
    md = _report([{"batch": 8, "fp32": 100.0, "autocast": 110.0}])
    rows = {line.split("|")[4].strip(): line for line in md.splitlines() if line.startswith("| R0 |")}
    assert "175 (noisy)" in rows["autocast"] and "(noisy)" not in rows["fp32"]
    assert "Self-check: noisy" in md and "R0 autocast" in md


def test_the_crossover_sentence_names_its_scope_and_best_ratio():
    md = _report(
        [{"batch": 8, "fp32": 100.0, "autocast": 110.0}, {"batch": 16, "fp32": 100.0, "autocast": 120.0}]
    )
    sentence = next(line for line in md.splitlines() if line.startswith("In this bare step"))
    assert "no data loading, unlike the rungs above" in sentence
    assert "1.5x fp32 at no batch tried (8–16)" in sentence and "(its best: 1.20x at batch 16)" in sentence
    md = _report([{"batch": 8, "fp32": 100.0, "autocast": 160.0}])
    assert "1.5x fp32 from batch 8" in md and "(its best: 1.60x at batch 8)" in md
