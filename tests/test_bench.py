"""`ampbench bench` runs on CPU (small batch) so CI keeps it working."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli


def test_bench_on_cpu(project: Path):
    out = project / "reports" / "bench"
    run_cli(project, "bench", "--variants", "single-fp32,single-autocast_gradscaler", "--batch-size", "20",
            "--steps", "2", "--warmup", "1", "--workers", "0", "--out", str(out))  # fmt: skip
    res = json.loads(out.with_suffix(".json").read_text())
    measures = [(r["measure"], r["variant"]) for r in res["rows"]]
    assert measures == [
        ("pipeline", "single-fp32"), ("ceiling", "single-fp32"),
        ("pipeline", "single-autocast_gradscaler"), ("ceiling", "single-autocast_gradscaler"),
        ("dataloader (0 workers)", "single-autocast_gradscaler"),
    ]  # fmt: skip
    for r in res["rows"]:
        assert r["images_per_second"] > 0
        assert abs(r["ms_per_step"] * r["images_per_second"] / 1e3 - 20) < 1e-6  # batch 20
        assert r["fraction_of_ceiling"] > 0
    assert [r["amp_dtype"] for r in res["rows"][:2]] == ["float32", "float32"]
    assert res["rows"][2]["amp_dtype"] == "bfloat16"
    assert 0.01 < res["gflop_per_image"] < 1  # counted by torch's FLOP counter, tiny model
    assert res["tf32"] is False and res["batch"] == 20
    assert "| pipeline | single-fp32 |" in out.with_suffix(".md").read_text()


def test_bench_refuses_ddp(project: Path):
    proc = run_cli(project, "bench", "--variants", "ddp-fp32", check=False)
    assert proc.returncode == 1
    assert "ddp-fp32 not benchmarkable" in proc.stderr
