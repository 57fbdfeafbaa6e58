"""A report input that is not there says why: a folder on its way that is a file is named (hostile
re-run: reports/metrics as a file read as "reports/metrics/single-fp32.json missing")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampbench.paths import missing
from ampbench.report.compare import compare


def test_a_file_where_the_metrics_folder_belongs_is_named(tmp_path: Path):
    (tmp_path / "metrics").write_text("x", encoding="utf-8")
    with pytest.raises(FileNotFoundError) as err:
        compare(tmp_path / "metrics", ["single-fp32"], tmp_path / "out")
    assert f"{tmp_path / 'metrics'} is a file, not a folder (move it away first)" in str(err.value)


def test_a_plainly_missing_file_says_missing(tmp_path: Path):
    assert missing(tmp_path / "metrics" / "single-fp32.json") == "missing"
    (tmp_path / "models").write_text("x", encoding="utf-8")
    assert "models is a file, not a folder" in missing(tmp_path / "models" / "v" / "seed-0" / "model.pt")


@pytest.mark.parametrize("text", ["", '{"variant": "dp-fp32", "seeds": [', "[]"])
def test_an_empty_or_cut_metrics_file_is_named_with_the_fix(tmp_path: Path, text: str):
    """Hostile pass D: an empty or cut reports/metrics/<variant>.json (what a full disk leaves)
    said "Expecting value: line 1 column 1 (char 0)", naming no file and no fix."""
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "dp-fp32.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        compare(tmp_path / "metrics", ["dp-fp32"], tmp_path / "out")
    said = str(err.value)
    assert said.startswith(f"{tmp_path / 'metrics' / 'dp-fp32.json'} is not a metrics file ("), said
    assert said.endswith("write it again with `ampbench evaluate --variants dp-fp32` (or `dvc repro`)"), said


SEED = {"seed": 0, "test_accuracy": 0.5, "images_per_second": 100.0, "diverged": False, "devices_used": 1}
SEED1 = {**SEED, "seed": 1}


@pytest.mark.parametrize(
    ("seeds", "why"),
    [
        (
            [SEED, {k: v for k, v in SEED1.items() if k != "test_accuracy"}],
            "seed entry 1 has no test_accuracy",
        ),
        ([1, 2], "seed entry 0 is 1, not a record"),
        ([SEED, {**SEED1, "test_accuracy": "high"}], "seed entry 1's test_accuracy is 'high', not a number"),
        ([], "no list of seeds"),
        ([SEED, {**SEED1, "test_accuracy": -3.0}], "seed entry 1's test_accuracy is -3.0, not in [0, 1]"),
        ([SEED, {**SEED1, "seed": "zero"}], "seed entry 1's seed is 'zero': not a seed"),
        ([SEED, SEED1, SEED], "seed entry 2's seed is 0: a repeat"),
        (
            [{**SEED, "images_per_second": float("nan")}],
            "seed entry 0's images_per_second is nan, not in [0, inf]",
        ),
    ],
)
def test_a_metrics_file_with_a_damaged_seed_is_refused_by_compare_and_findings(tmp_path: Path, seeds, why):
    """Hostile pass B7: a seed without test_accuracy (or seeds [1, 2]) was a 29-line traceback in
    compare, and findings took the other seed's accuracy for the mean, exit 0."""
    from ampbench.report import findings_report

    (tmp_path / "metrics").mkdir()
    for variant in ("single-fp32", "single-autocast", "single-autocast_gradscaler"):
        record = {"variant": variant, "seeds": seeds if variant == "single-autocast" else [SEED, SEED1]}
        (tmp_path / "metrics" / f"{variant}.json").write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        compare(tmp_path / "metrics", ["single-fp32", "single-autocast"], tmp_path / "out")
    assert (
        f"single-autocast.json is not a metrics file ({why}): write it again with `ampbench evaluate"
        in str(err.value)
    )
    with pytest.raises(findings_report.FindingsError) as err:
        findings_report.load_study(tmp_path, "the project's study", "`make run`")
    assert str(err.value).endswith(f"not a metrics file ({why}); re-run its evaluate stage: `make run`")
