"""explain's ladder on a GPU measures tf32 beside true fp32 and shows AMP's gain against both."""

from __future__ import annotations

import torch

from ampbench.measuring import rungs
from ampbench.report import explain_markdown


def _cell(precision: str, ips: float, fp32: float, tf32: float) -> dict:
    return {
        "precision": precision,
        "images_per_second": ips,
        "images_per_second_min": ips,
        "images_per_second_max": ips,
        "ms_per_step": 1.0,
        "speedup_vs_fp32": ips / fp32,
        "speedup_vs_tf32": ips / tf32,
        "device_busy": 0.5,
        "host_syncs_per_step": 0.0,
        "peak_memory_mb": 100.0,
        "tflops": 1.0,
        "joules_per_image": None,
    }


def test_cuda_ladder_has_tf32_and_a_column_against_it():
    assert rungs.precisions(torch.device("cuda"))[:3] == ["fp32", "tf32", "autocast"]
    assert "tf32" not in rungs.precisions(torch.device("cpu"))  # a CPU has no TF32
    cells = [_cell(p, x, 100.0, 150.0) for p, x in (("fp32", 100.0), ("tf32", 150.0), ("autocast", 300.0))]
    res = {
        "hardware": "GPU",
        "note": "",
        "options": {"windows": 2, "steps": 2, "profile_steps": 1},
        "energy_counter": False,
        "rungs": [{"rung": "R4", "change": "graphs", "batch": 512, "cells": cells}],
    }
    md = explain_markdown.to_markdown(res)
    assert "TF32 off but in the tf32 cells." in md
    assert "| speed-up vs fp32 | vs tf32 | device busy |" in md
    assert "| 3.00x | 2.00x | 50% |" in md


def test_findings_ladder_says_the_gain_against_tf32_in_both_languages():
    from ampbench.report import ladder
    from ampbench.report.sentences import Words

    cells = [_cell(p, x, 100.0, 150.0) for p, x in (("fp32", 100.0), ("tf32", 150.0), ("autocast", 300.0))]
    res = {
        "hardware": "GPU",
        "device_type": "cuda",
        "options": {"windows": 2, "steps": 2},
        "defaults_rung": "R4",
        "rungs": [{"rung": "R4", "change": "graphs", "batch": 512, "cells": cells}],
    }
    text = ladder.section(res)
    assert "rather than true fp32, autocast trains at 2.00x there (R4); TF32 itself at 1.50x fp32." in text
    assert "autocast 在该处（R4）的训练速度是其 2.00x；TF32 本身是 fp32 的 1.50x" in ladder.section(
        res, Words("zh")
    )
