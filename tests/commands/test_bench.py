"""`ampbench bench` runs on CPU (small batch) so CI keeps it working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import mlflow_client, paced, run_cli, runs


@pytest.mark.slow
def test_bench_on_cpu(project: Path):
    out = project / "reports" / "bench"
    proc = run_cli(
        project,
        "bench",
        "--variants",
        "single-fp32,single-autocast_gradscaler",
        "--batch-size",
        "20",
        "--steps",
        "2",
        "--windows",
        "3",
        "--warmup",
        "1",
        "--workers",
        "0",
        "--max-images",
        "40",
        "--profile",
        "2",
        "--out",
        str(out),
    )
    res = json.loads(out.with_suffix(".json").read_text())
    # hostile pass R: bench said neither where its report went nor that MLflow recorded it
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(
        f"The report: {out.with_suffix('.md')} (also .json); MLflow run {res['run_id']} "
    ), last
    assert "in experiment cifar10-amp-bench; start the UI first" in last
    measures = [(r["measure"], r["variant"]) for r in res["rows"]]
    assert measures == [
        ("pipeline", "single-fp32"),
        ("ceiling", "single-fp32"),
        ("pipeline", "single-autocast_gradscaler"),
        ("ceiling", "single-autocast_gradscaler"),
        ("dataloader (0 workers)", "single-autocast_gradscaler"),
    ]
    assert res["windows"] == 3 and res["pipeline_steps"] == 2  # 40 images, batch 20: whole epochs
    for r in res["rows"]:
        ips = r["windows"]
        assert len(ips) == 3 and min(ips) > 0
        assert r["images_per_second_min"] <= r["images_per_second"] <= r["images_per_second_max"]
        assert r["images_per_second"] == sorted(ips)[1]  # the median
        assert (r["images_per_second_min"], r["images_per_second_max"]) == (min(ips), max(ips))
        assert abs(r["ms_per_step"] * r["images_per_second"] / 1e3 - 20) < 1e-6  # batch 20
        assert r["warmup_seconds"] > 0  # measured, apart from the windows
    # Every ratio is one of medians of this run.
    ceiling = {r["variant"]: r["images_per_second"] for r in res["rows"] if r["measure"] == "ceiling"}
    for r in res["rows"]:
        assert r["fraction_of_ceiling"] == r["images_per_second"] / ceiling[r["variant"]]
    assert [r["amp_dtype"] for r in res["rows"][:2]] == ["float32", "float32"]
    assert res["rows"][2]["amp_dtype"] == "bfloat16"
    assert 0.01 < res["gflop_per_image"] < 1  # counted by torch's FLOP counter, tiny model
    assert res["tf32"] is False and res["batch"] == 20
    md = out.with_suffix(".md").read_text()
    assert "Median and min–max over 3 windows per measure" in md
    pipe = res["rows"][0]
    lo, hi = f"{pipe['images_per_second_min']:,.0f}", f"{pipe['images_per_second_max']:,.0f}"
    assert f"| pipeline | single-fp32 | none | float32 | {pipe['images_per_second']:,.0f} | {lo}–{hi} |" in md
    # --profile: per-operator time of the ceiling step (CPU), per variant, busiest first.
    assert set(res["profiles"]) == {"single-fp32", "single-autocast_gradscaler"}
    for name, prof in res["profiles"].items():
        times = [k["us_per_step"] for k in prof["kernels"]]
        assert times == sorted(times, reverse=True) and times[0] > 0
        names = {k["kernel"] for k in prof["kernels"]}
        assert any("conv" in n for n in names), names  # the model's convolutions show up
        assert f"Profile of the ceiling step, {name}" in md
    # GradScaler's inf check shows up only where a scaler is used.
    scaler_ops = [
        {k["kernel"] for k in res["profiles"][v]["kernels"] if "non_finite" in k["kernel"]}
        for v in ("single-fp32", "single-autocast_gradscaler")
    ]
    assert not scaler_ops[0] and scaler_ops[1]
    # Recorded in MLflow, apart from the study's experiment; the files name that run.
    assert runs(project) == []
    (run,) = runs(project, experiment="cifar10-amp-bench", kind="bench")
    assert res["run_id"] == run.info.run_id and run.info.status == "FINISHED"
    assert run.data.metrics["bench/pipeline/single-fp32/images_per_second"] == pipe["images_per_second"]
    assert (
        run.data.metrics["bench/dataloader/single-autocast_gradscaler/fraction_of_ceiling"]
        == (res["rows"][-1]["fraction_of_ceiling"])
    )
    assert run.data.params["batch"] == "20" and run.data.params["windows"] == "3"
    files = {a.path for a in mlflow_client(project).list_artifacts(run.info.run_id)}
    assert files == {"bench.json", "bench.md"}
    # Hostile pass: minutes without a line. The plan first, then a line as each variant is measured.
    said = [
        line.split(": ", 1)[1]
        for line in proc.stderr.splitlines()
        if " INFO ampbench" in line and not paced(line)
    ]
    assert (
        said[0].startswith("bench on ") and "single-fp32, single-autocast_gradscaler at batch 20" in said[0]
    )
    assert said[1].startswith("single-fp32: warmed up; timing 3 windows of one epoch (2 steps)"), said
    assert said[2].startswith("single-fp32: pipeline "), said
    assert any(line.startswith("the DataLoader reference (0 workers") for line in said), said


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_a_batch_larger_than_the_data_is_refused_before_measuring(project: Path):
    proc = run_cli(project, "bench", "--batch-size", "100", "--max-images", "40", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--max-images 40 is fewer images than one batch of 100" in proc.stderr  # the option to fix
    assert "warmed up" not in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(project, "bench", "--batch-size", "100", check=False)  # the data set itself is smaller
    assert proc.returncode == 2 and "train.batch_size=100 is larger than the train set (" in proc.stderr


@pytest.mark.slow  # inductor compiles the step: minutes on 2 cores with a cold cache
@pytest.mark.serial  # alone: compiling beside other tests' work took over 5 min on the CI machine
def test_bench_measures_compiled_and_eager_side_by_side(project: Path):
    out = project / "reports" / "bench"
    args = ["--batch-size", "20", "--steps", "2", "--windows", "2", "--warmup", "1", "--workers", "0"]
    compiled = ["--variants", "single-fp32", "--compile", "none,default"]
    run_cli(project, "bench", *compiled, *args, "--out", str(out), timeout=900)
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["compile"] == ["none", "default"]
    rows = [(r["measure"], r["compile"]) for r in res["rows"]]
    assert rows == [
        ("pipeline", "none"),
        ("ceiling", "none"),
        ("dataloader (0 workers)", "none"),
        ("pipeline", "default"),
        ("ceiling", "default"),
        ("dataloader (0 workers)", "default"),
    ]
    for r in res["rows"]:  # each mode's ratios are to its own ceiling
        ceiling = next(c for c in res["rows"] if c["measure"] == "ceiling" and c["compile"] == r["compile"])
        assert r["fraction_of_ceiling"] == r["images_per_second"] / ceiling["images_per_second"]
    assert "| ceiling | single-fp32 | default | float32 |" in out.with_suffix(".md").read_text()
    (run,) = runs(project, experiment="cifar10-amp-bench", kind="bench")
    assert "bench/ceiling/single-fp32/compile-default/images_per_second" in run.data.metrics
    proc = run_cli(project, "bench", "--compile", "fast", check=False)
    assert proc.returncode == 1 and "--compile: fast not one of none, default" in proc.stderr


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_bench_refuses_ddp(project: Path):
    proc = run_cli(project, "bench", "--variants", "ddp-fp32", check=False)
    assert proc.returncode == 1
    assert "ddp-fp32 not benchmarkable" in proc.stderr


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_bench_refuses_zero_windows(project: Path):
    proc = run_cli(project, "bench", "--windows", "0", check=False)
    assert proc.returncode == 2  # argparse's usage error, before anything runs
    assert "--windows: must be at least 1, got 0" in proc.stderr


def test_a_failing_store_never_costs_the_bench_its_results(project: Path, monkeypatch):
    """The files are written before MLflow is touched; a store that fails after the run started
    leaves that run FAILED and files that name no run."""
    from ampbench import config
    from ampbench.report import bench_markdown
    from ampbench.tracking import measurement_runs
    from ampbench.tracking.tracker import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    cfg = config.load_config(project / "params.yaml")
    row = {
        "measure": "ceiling",
        "variant": "single-fp32",
        "amp_dtype": "float32",
        "images_per_second": 100.0,
        "images_per_second_min": 90.0,
        "images_per_second_max": 110.0,
        "ms_per_step": 200.0,
        "fraction_of_ceiling": 1.0,
        "tflops": 0.0,
        "peak_memory_mb": 1.0,
        "warmup_seconds": 0.1,
    }
    res = {
        "hardware": "cpu",
        "torch": "x",
        "tf32": False,
        "batch": 20,
        "steps": 2,
        "warmup": 1,
        "windows": 3,
        "cudnn_benchmark": False,
        "train_images": 40,
        "pipeline_steps": 2,
        "dataloader_steps": 2,
        "gflop_per_image": 0.1,
        "profiles": {},
        "rows": [row],
    }
    out = project / "reports" / "bench"
    out.parent.mkdir(parents=True, exist_ok=True)

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Tracker, "log_artifact", broken)

    def record():
        params, metrics = measurement_runs.bench_figures(res)
        return measurement_runs.record(
            cfg, "bench", res, out, params, metrics, bench_markdown.write, (".json", ".md")
        )

    assert record() is None
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == res["rows"]
    assert "run_id" not in json.loads(out.with_suffix(".json").read_text())
    (run,) = runs(project, experiment="cifar10-amp-bench")
    assert run.info.status == "FAILED"
    monkeypatch.undo()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    run_id = record()
    assert run_id and json.loads(out.with_suffix(".json").read_text())["run_id"] == run_id


@pytest.mark.parametrize(
    "option",
    [["bench", "--workers", "-3"], ["bench", "--max-images", "-1"], ["explain", "--max-images", "-2"]],
)
def test_a_negative_count_is_a_usage_error_before_anything_runs(option, capsys):
    """Final pass J: bench ran its whole measurement (over 100 s) with --workers -3 or --max-images -1."""
    from ampbench import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(option)
    assert exit_.value.code == 2 and "must be 0 or more" in capsys.readouterr().err
