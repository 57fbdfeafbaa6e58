"""docs/FINDINGS.md's why (the overhead ladder from `ampbench explain`), what AMP saves (memory,
energy), and the Chinese edition docs/FINDINGS.zh.md (issue #24), from hand-made inputs."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from test_findings import BENCH, PROJECT, TUTORIAL, _write

from ampbench.report import claims, ladder
from ampbench.report import findings_report as findings
from ampbench.report.sentences import Words

ZH = Words("zh")
# (rung, fp32 images/s, autocast images/s, device busy fp32 / autocast): R4's step is the biggest
LADDER = [("R0", 30e3, 28.5e3, 0.31, 0.12), ("R1", 60e3, 84e3, 0.7, 0.4), ("R2", 80e3, 160e3, 0.9, 0.7)]
LADDER += [("R3", 86e3, 198e3, 0.95, 0.8), ("R4", 87e3, 331e3, 0.99, 0.97), ("R5", 90e3, 378e3, 0.99, 0.98)]


def _cell(precision: str, ips: float, busy: float) -> dict:
    return {
        "precision": precision,
        "images_per_second": ips,
        "device_busy": busy,
        "host_syncs_per_step": 0.0 if precision != "fp32" else 1.0,
        "peak_memory_mb": 1900.0 if precision == "fp32" else 1300.0,
    }


EXPLAIN = {
    "hardware": "NVIDIA H200",
    "device_type": "cuda",
    "options": {"windows": 5, "steps": 40},
    "defaults_rung": "R4",
    "run_id": "e" * 32,
    "rungs": [
        {
            "rung": name,
            "change": f"change {name}",
            "batch": 128 if name < "R2" else 512,
            "cells": [
                _cell("fp32", fp, b32),
                _cell("autocast", ac, bac),
                _cell("autocast_gradscaler", ac * 0.95, bac),
            ],
        }
        for name, fp, ac, b32, bac in LADDER
    ],
    "crossover": {"autocast_1_5x_from_batch": 256, "autocast_2x_from_batch": 1024},
}


def _with_savings(study: dict) -> dict:
    """PROJECT with memory and energy: autocast 0.70x fp32's memory, 0.36x its energy."""
    out = copy.deepcopy(study)
    for precision, mb, joules in (
        ("fp32", 2000, 7600),
        ("autocast", 1400, 2700),
        ("autocast_gradscaler", 1400, 2850),
    ):
        for s in out[f"single-{precision}"]["seeds"]:
            s.update(peak_memory_mb=mb, train_joules=joules, images_per_joule=1e6 / joules)
    return out


def _numbers(text: str) -> Counter:
    return Counter(re.findall(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?", text))  # 1,234.5 whole


def test_the_ladder_has_every_rung_its_ratios_and_says_where_amp_starts_to_pay():
    text = findings.build(PROJECT, TUTORIAL, BENCH, {}, explain=EXPLAIN)
    why = text[text.index("## Why AMP pays or not") : text.index("## What AMP saves")]
    for name, fp, ac, _, _ in LADDER:
        row = next(line for line in why.splitlines() if line.startswith(f"| {name} |"))
        assert f"| {ac / fp:.2f}x |" in row, row  # each speed-up is its rung's own images/s ratio
    assert "busy 31% of the wall time in fp32 and 12% with autocast" in why
    assert "the device waits for the host most of the time" in why  # R0's autocast busy < 50%
    assert "The largest single gain in autocast's speed-up comes at R4, change R4: 2.30x to 3.80x." in why
    assert "At the project's defaults (R4) autocast trains at 3.80x fp32" in why
    assert "from batch 256 and 2x from batch 1024" in why and f"explain run `{'e' * 32}`" in why
    assert text.index("## Claim 2") < text.index("## Why AMP") < text.index("## Claim 3")  # after 1 and 2
    older = {k: v for k, v in EXPLAIN.items() if k != "defaults_rung"}  # or a CPU's R0-R2: no defaults
    text = findings.build(PROJECT, TUTORIAL, None, {}, explain=older)
    assert "At the project's defaults" not in text and "to the project's defaults and beyond" in text
    cross = {
        "rows": [{"batch": 8}, {"batch": 32}],
        "autocast_1_5x_from_batch": 32,
        "autocast_2x_from_batch": None,
    }
    text = findings.build(PROJECT, TUTORIAL, None, {}, explain={**EXPLAIN, "crossover": cross})
    assert "1.5x fp32 from batch 32 and 2x at no batch tried (8–32)." in text


def test_without_a_ladder_the_report_says_how_to_make_one(tmp_path: Path):
    text = findings.build(PROJECT, TUTORIAL, None, {})
    assert "No ladder given: `make explain`" in text
    with pytest.raises(ladder.LadderError, match="make explain"):
        ladder.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"rungs": [{"rung": "R0", "cells": []}]}))
    with pytest.raises(ladder.LadderError, match="no rungs with fp32 and autocast"):
        ladder.load(tmp_path / "bad.json")


def test_what_amp_saves_memory_and_energy_against_fp32():
    text = findings.build(_with_savings(PROJECT), TUTORIAL, None, {})
    saves = text[text.index("## What AMP saves") : text.index("## Claim 3")]
    assert "- project's defaults: peak memory with autocast 0.70x fp32's (-600 MB)" in saves
    assert "training energy with autocast 0.36x fp32's, with GradScaler 0.38x" in saves
    assert (
        "| project's defaults | single-autocast | 1,400 ± 0 | 0.70x | 2.70 ± 0.00 | 370 ± 0 | 0.36x |"
        in saves
    )
    assert "- tutorial's conditions: " in saves and "energy not recorded" in saves  # no energy there


def test_the_chinese_edition_has_the_same_numbers_run_ids_and_verdicts(tmp_path: Path):
    project = _write(tmp_path / "reports", _with_savings(PROJECT))
    tutorial = _write(tmp_path / "tutorial" / "reports", TUTORIAL)
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    (tmp_path / "explain.json").write_text(json.dumps(EXPLAIN))
    out = tmp_path / "docs" / "FINDINGS.md"
    findings.main(project, tutorial, tmp_path / "bench.json", out, None, 0.5, tmp_path / "explain.json")
    en, zh = out.read_text(), (tmp_path / "docs" / "FINDINGS.zh.md").read_text()
    assert _numbers(zh) == _numbers(en), (_numbers(zh) - _numbers(en), _numbers(en) - _numbers(zh))
    assert sorted(re.findall(r"`([0-9a-f]{32})`", zh)) == sorted(re.findall(r"`([0-9a-f]{32})`", en))
    english, chinese = findings.verdicts(en), findings.verdicts(zh, ZH)
    assert sorted(chinese) == [1, 2, 3, 4]
    assert {n: ZH.name(v) for n, (v, _) in english.items()} == {n: v for n, (v, _) in chinese.items()}
    assert all(ZH.name(v) != v for v in claims.VERDICTS)  # every verdict word has its Chinese
    assert "## 摘要" in zh and "Verdict" not in zh and "[FINDINGS.md](FINDINGS.md)" in zh
    assert "[FINDINGS.zh.md](FINDINGS.zh.md)" in en
    assert "整个训练步由 CUDA graph 重放" not in zh  # made-up rung changes are shown as they are


def test_every_rung_explain_measures_has_its_chinese():
    from ampbench.measuring.rungs import RUNGS

    assert all(ZH.name(change) != change or change == "batch 512" for _, change, _ in RUNGS)
