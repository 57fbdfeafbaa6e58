"""The MLproject entry point through a real `mlflow run`, typed as the README says: its runs land
beside the study under the variant's name, its echoed command holds only what was given, and it
ends on its answer, written on its run as `compare` writes a study's (description, tags, metrics).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, VENV_BIN, image_folder_archive, runs, venv_env, write_params

pytestmark = pytest.mark.slow  # two trainings and a `mlflow run` (a minute on a CPU)


def sh(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=venv_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _copy_of_the_project(proj: Path) -> None:
    skip = {".venv", ".git", "data", "models", "reports", "checkpoints", "mlflow.db", "mlruns", ".whl"}
    skip |= {".mirror", ".device*", ".gpu"}
    outputs = {REPO, REPO / "demo", REPO / "tutorial"}  # their data/, models/... (not src/ampbench/data)
    shutil.copytree(
        REPO, proj, ignore=lambda folder, names: skip & set(names) if Path(folder) in outputs else ()
    )


def test_mlflow_run_lands_beside_the_study_and_ends_on_its_answer(tmp_path: Path):
    """`mlflow run . -P precision=autocast ...` (no --experiment-name, no environment variable)
    against a store that already holds a single-fp32 trained alike: its speed-up against it."""
    from ampbench.tracking import view

    proj = tmp_path / "proj"
    _copy_of_the_project(proj)
    write_params(proj)
    archive = image_folder_archive(tmp_path)
    given = ["--epochs", "1", "--batch-size", "10", "--data-url", str(archive)]
    sh([sys.executable, "-m", "ampbench", "variant", "--precision", "fp32", *given], proj)
    params = ["-P", "epochs=1", "-P", "batch_size=10", "-P", f"data_url={archive}"]
    mlflow_run = [str(VENV_BIN / "mlflow"), "run", ".", "--env-manager", "local"]
    out = sh([*mlflow_run, "-P", "precision=autocast", *params], proj)
    echoed = next(line for line in out.stderr.splitlines() if "=== Running command" in line)
    assert "''" not in echoed and "--quick no --epochs 1 --batch_size 10" in echoed, echoed

    launcher = runs(proj, "Default")
    assert [r.info.run_name for r in launcher] == ["single-autocast (mlflow run)"]  # not a random name
    launcher = launcher[0]
    assert 0.0 <= launcher.data.metrics["test/accuracy"] <= 1.0  # the variant's aggregate
    assert launcher.data.tags["ampbench.experiment"] == "cifar10-amp"
    study = {r.info.run_name: r for r in runs(proj)}
    assert set(study) == {
        "single-fp32",
        "single-fp32/seed-0",
        "single-autocast (mlflow run)",
        "single-autocast/seed-0",
    }
    variant = study["single-autocast (mlflow run)"]
    assert launcher.data.tags["ampbench.variant_run_id"] == variant.info.run_id
    assert variant.data.tags["ampbench.launcher_run_id"] == launcher.info.run_id
    assert variant.data.tags["ampbench.kind"] == "variant"
    seed = study["single-autocast/seed-0"]
    assert seed.data.tags["mlflow.parentRunId"] == variant.info.run_id
    assert seed.data.params["train.epochs"] == "1" and seed.data.params["train.batch_size"] == "10"

    # The answer, as compare writes it: the description's first line, the tags, the metrics,
    # on the variant run and on the entry point's own (whose note still points at the seeds).
    for run in (variant, launcher):
        tags = run.data.tags
        line = tags[view.NOTE_TAG].splitlines()[0]
        assert line.endswith(" MB") and line.split(" · ")[0] == tags["speed-up"], tags
        assert tags["speed-up"].endswith("x")  # against the single-fp32 trained alike
        assert {"accuracy", "images/s", "peak MB"} <= set(tags)
        assert "answer/speedup_vs_single_fp32" in run.data.metrics
    assert "cifar10-amp" in launcher.data.tags[view.NOTE_TAG]  # where the seeds are
    last = out.stdout.strip().splitlines()[-3:]
    assert last[0].startswith(f"single-autocast: {variant.data.tags['speed-up']} · acc "), last
    assert last[1].endswith(f"/runs/{variant.info.run_id}?workflowType=machine_learning"), last
    assert last[2].startswith("Start the UI first") and " ui --backend-store-uri sqlite:" in last[2], last


def test_a_killed_mlflow_run_stops_its_stage_and_says_how_to_resume(tmp_path: Path):
    """Hostile pass: SIGTERM to `mlflow run` (SIGTERM ends a Python process outright) left
    `ampbench variant` training on as an orphan, without a line, and `mlflow run`'s run RUNNING."""
    import signal
    import time

    from conftest import load_pt, wait_for_checkpoint

    proj = tmp_path / "proj"
    _copy_of_the_project(proj)
    write_params(proj, train={"epochs": 200, "checkpoint_every_s": 1})
    archive = image_folder_archive(tmp_path)
    log = tmp_path / "mlflow-run.log"
    command = [str(VENV_BIN / "mlflow"), "run", ".", "--env-manager", "local", "-P", f"data_url={archive}"]
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=proj, env=venv_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        ckpt = proj / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt"
        wait_for_checkpoint(proc, ckpt, log, min_epoch=1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while "To resume" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        proc.kill()
    text = log.read_text()
    assert "is gone: stopping as on SIGTERM" in text, text[-3000:]
    assert f"To resume: mlflow run . --env-manager local -P data_url={archive}" in text, text[-3000:]
    assert "Traceback" not in text
    assert load_pt(ckpt)["step"] > 0 or load_pt(ckpt)["epoch"] >= 1
    deadline = time.monotonic() + 20  # the stage ends its runs, `mlflow run`'s own included
    while any(r.info.status == "RUNNING" for r in runs(proj, "Default") + runs(proj)):
        assert time.monotonic() < deadline, [(r.info.run_name, r.info.status) for r in runs(proj)]
        time.sleep(0.5)
    assert {r.info.status for r in runs(proj, "Default") + runs(proj)} == {"KILLED"}
