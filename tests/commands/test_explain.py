"""`ampbench explain` on a CPU: the ladder's rungs that mean something there, every precision, the
speed-ups as ratios of the same rung's medians, the batch crossover, the files and the MLflow run;
R0 is the tutorial's conditions (tutorial/params.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ampbench.measuring import rungs
from conftest import REPO, new_project, paced, run_cli, runs


def test_r0_is_the_tutorials_conditions_and_the_last_eager_rung_the_defaults():
    tutorial = yaml.safe_load((REPO / "tutorial" / "params.yaml").read_text())["train"]
    defaults = yaml.safe_load((REPO / "params.yaml").read_text())["train"]
    r0 = rungs.RUNGS[0][2]
    for key in ("loader", "workers", "batch_size", "cuda_graph", "cudnn_benchmark"):
        assert r0[key] == tutorial[key], key
    train: dict = {}
    for name, _, overrides in rungs.RUNGS:
        train.update(overrides)
        if name == rungs.DEFAULTS_RUNG:
            assert all(defaults[k] == v for k, v in train.items()), train
    assert train["compile"] == "default"  # R5: compile on top of the defaults


@pytest.mark.slow  # `python -m ampbench` in a subprocess: its imports
def test_a_data_set_smaller_than_a_rungs_batch_is_refused_before_measuring(tmp_path: Path):
    """Hostile pass: 40 images, R2's batch 64 refused only after R0 and R1 had measured (76 s)."""
    project = new_project(tmp_path / "proj", per_class=4)
    proc = run_cli(project, "explain", "--out", str(project / "reports" / "explain"), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "explain's rung R2 trains batches of 64 images, more than the 40 train images" in proc.stderr
    assert "R0 fp32" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow  # a minute of CPU training in a subprocess
def test_explain_on_a_cpu_end_to_end(tmp_path: Path):
    project = new_project(tmp_path / "proj", per_class=16)  # R2's batch 64 fits
    out = project / "reports" / "explain"
    args = ["--steps", "2", "--windows", "2", "--profile-steps", "1", "--max-images", "128"]
    proc = run_cli(project, "explain", *args, "--out", str(out))
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["rung"] for r in res["rungs"]] == ["R0", "R1", "R2"]  # the rungs a CPU can say anything about
    assert [r["batch"] for r in res["rungs"]] == [16, 16, 64]  # an eighth of the GPU's
    assert "say nothing about any GPU" in res["note"] and res["note"] in proc.stdout
    for r in res["rungs"]:
        cells = {c["precision"]: c for c in r["cells"]}
        assert list(cells) == ["fp32", "autocast", "autocast_gradscaler"]
        for c in cells.values():
            assert c["speedup_vs_fp32"] == c["images_per_second"] / cells["fp32"]["images_per_second"]
            assert c["images_per_second_min"] <= c["images_per_second"] <= c["images_per_second_max"]
            assert 0 < c["device_busy"] <= 1 and c["host_syncs_per_step"] >= 0
            assert c["joules_per_image"] is None  # no NVML counter on a CPU: 'n/a' in the report
    cross = res["crossover"]
    assert [r["batch"] for r in cross["rows"]] == [8, 16, 32]
    first = next((r["batch"] for r in cross["rows"] if r["autocast"] >= 1.5 * r["fp32"]), None)
    assert cross["autocast_1_5x_from_batch"] == first
    # Hostile pass: a first line after 46 s. The plan first, then a line per rung and precision.
    said = [
        line.split(": ", 1)[1]
        for line in proc.stderr.splitlines()
        if " INFO ampbench" in line and not paced(line)
    ]
    assert (
        said[0].startswith("explain on ") and "rungs R0-R2 x fp32, autocast, autocast_gradscaler" in said[0]
    )
    assert said[1].startswith("R0 fp32: ") and said[2].startswith("R0 autocast: "), said
    md = out.with_suffix(".md").read_text()
    r1 = "| R1 | data and augmentation as tensors on the device (this CPU), no loader workers | 16 | fp32 |"
    assert r1 in md and "| n/a |" in md
    # the words say what the rows ran: the batch column's size, this machine's workers, no GPU
    assert (
        "2 workers, batch 16 (the GPU's 128 / 8)" in md
        and "| R2 | batch 64 (the GPU rung's 512 / 8) | 64 |" in md
    )
    rows = "\n".join(line for line in md.splitlines() if line.startswith("| R"))
    assert "8 workers" not in rows and "on the GPU" not in rows and "batch 128," not in rows, rows
    best = max(cross["rows"], key=lambda r: r["autocast"] / r["fp32"])
    assert f"(its best: {best['autocast'] / best['fp32']:.2f}x at batch {best['batch']})" in md
    # the last line says where the report went; the profiler's and a CPU's GPU-count noise is gone
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith(f"The report: {out.with_suffix('.md')} (also .json, .png)")
    )
    assert "start the UI first" in proc.stdout.strip().splitlines()[-1]
    for noise in ("USDT", "profiler_start", "gpuGetDeviceCount"):
        assert noise not in proc.stdout + proc.stderr, noise
    assert out.with_suffix(".png").stat().st_size > 10_000
    from ampbench.report import ladder  # FINDINGS' why reads this JSON as it is

    why = ladder.section(ladder.load(out.with_suffix(".json")))
    assert "Measured on a CPU" in why and "| R1 | data and augmentation as tensors on the device" in why
    (run,) = runs(project, experiment="cifar10-amp-explain", kind="explain")
    assert res["run_id"] == run.info.run_id and run.info.status == "FINISHED"
    r1 = res["rungs"][1]["cells"][1]
    assert run.data.metrics["explain/R1/autocast/speedup_vs_fp32"] == pytest.approx(r1["speedup_vs_fp32"])


@pytest.mark.slow  # a CPU rung in a subprocess
def test_rungs_measured_apart_in_a_fresh_process(tmp_path: Path, monkeypatch):
    """On a GPU the rungs without cuDNN autotuning run in a process of their own (cuDNN would
    reuse their plans once autotuning is on); the part's rungs come back whole."""
    from ampbench.measuring import rungs as ladder

    project = new_project(tmp_path / "proj", per_class=16)
    monkeypatch.chdir(project)
    opts = {"steps": 2, "windows": 2, "profile_steps": 1, "max_images": 64}
    part = project / "reports" / "explain"
    rungs = ladder.measured_apart(["--params", "params.yaml"], opts, ["R0", "R1"], part)
    assert [r["rung"] for r in rungs] == ["R0", "R1"]
    assert [c["precision"] for c in rungs[0]["cells"]] == ["fp32", "autocast", "autocast_gradscaler"]
    assert not list((project / "reports").glob("explain*"))  # the part's file is gone, nothing else written
    assert runs(project, experiment="cifar10-amp-explain") == []  # only the whole explain records a run


@pytest.mark.slow  # DVC's start, twice
def test_explain_is_a_dvc_stage_outside_the_study(tmp_path: Path):
    """`dvc repro` at the top runs the study only; `dvc repro explain/dvc.yaml` runs explain, in the
    project's root, after the study's download (not yet run here: no dvc.lock)."""
    import shutil
    import subprocess

    from conftest import VENV_BIN, venv_env

    project = new_project(tmp_path / "proj")
    (project / "explain").mkdir()
    shutil.copy(REPO / "explain" / "dvc.yaml", project / "explain" / "dvc.yaml")
    (project / "src").symlink_to(REPO / "src")  # the stages' code deps
    for made_by_the_study in ("models", "reports/metrics", "reports/plots/curves"):  # --dry checks deps exist
        (project / made_by_the_study).mkdir(parents=True)
    dvc = [str(VENV_BIN / "dvc")]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=project, env=venv_env(), check=True, timeout=120)

    def dry(*targets: str) -> str:
        proc = subprocess.run(
            [*dvc, "repro", "--dry", *targets], cwd=project, env=venv_env(), capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    study = dry()
    assert "'download'" in study and "'compare'" in study and "explain" not in study
    alone = dry("explain/dvc.yaml")
    assert "'download'" in alone and "'explain/dvc.yaml:explain'" in alone and "train@" not in alone
    assert "> ampbench explain" in alone
