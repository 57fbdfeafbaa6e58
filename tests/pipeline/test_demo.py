"""The quick study, `make demo DATA=...`, end to end on CPU in a copy of the project: nine trained
variants, nine metrics files, a comparison that says it is a demo on a subset, the runs in
`cifar10-amp-demo` and none in `cifar10-amp`, and the real study's outputs untouched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ampbench.config import load_config
from conftest import REPO, VENV_BIN, clean_env, image_folder_archive, make_dataset, mlflow_client

VARIANTS = [f"{p}-{q}" for p in ("single", "dp", "ddp") for q in ("fp32", "autocast", "autocast_gradscaler")]
STUDY_FILES = (
    "data/prepared/cifar10.pt",
    "models/single-fp32/seed-0/model.pt",
    "reports/metrics/single-fp32.json",
    "reports/comparison.md",
)


@pytest.mark.parametrize("folder", ["demo", "tutorial"])
def test_folder_runs_the_same_pipeline(folder: str):
    """<folder>/dvc.yaml is the study's dvc.yaml (make demo / make tutorial re-sync it; CI catches a
    forgotten copy), its src is the study's, and its runs go to an experiment of their own."""
    assert (REPO / folder / "dvc.yaml").read_text() == (REPO / "dvc.yaml").read_text()
    # a DVC subrepo (the root's views list none of its files), set up as the root is
    for name in (".dvcignore", ".dvc/config", ".dvc/plots/variants.json"):
        assert (REPO / folder / name).read_text() == (REPO / name).read_text(), name
    assert (REPO / folder / "src").resolve() == (REPO / "src").resolve()
    params = yaml.safe_load((REPO / folder / "params.yaml").read_text())
    assert params["tracking"]["experiment"] != "cifar10-amp"
    assert params["tracking"]["conditions"] == folder
    load_config(REPO / folder / "params.yaml")  # valid as written
    # DVC reads a stage's params from this file alone (no defaults): each key a stage names must
    # be written here, or `dvc repro` stops at that stage ("Parameters ... are missing").
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    named = {key for stage in stages.values() for key in stage.get("params", [])}
    missing = [key for key in sorted(named) if not _has_key(params, key)]
    assert not missing, f"{folder}/params.yaml lacks {missing}, which dvc.yaml's stages read"


def _has_key(params: dict, dotted: str) -> bool:
    node = params
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_demo_is_a_subset():
    demo = yaml.safe_load((REPO / "demo" / "params.yaml").read_text())
    assert demo["data"]["train_per_class"] > 0 and demo["data"]["test_per_class"] > 0


def test_tutorial_has_the_tutorials_conditions():
    t = load_config(REPO / "tutorial" / "params.yaml").train
    assert (t.loader, t.workers, t.cuda_graph, t.batch_size, t.lr) == ("dataloader", 8, False, 128, 0.05)
    axes = yaml.safe_load((REPO / "tutorial" / "params.yaml").read_text())["variants"]
    assert axes["parallel"] == ["single"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_make_demo_end_to_end(tmp_path: Path):
    proj = tmp_path / "proj"
    skip = (
        ".venv",
        ".git",
        "data",
        "models",
        "reports",
        "checkpoints",
        "mlflow.db",
        "mlruns",
        "dvc.lock",
        "tmp",
        "cache",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        "*.egg-info",
        ".gpu",
    )
    caches = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info")
    outputs = {REPO, REPO / "demo", REPO / "tutorial"}  # their data/, models/... (not src/ampbench/data)

    def ignore(folder, names):
        return set(skip) & set(names) if Path(folder) in outputs else caches(folder, names)

    shutil.copytree(REPO, proj, symlinks=True, ignore=ignore)
    # A stand-in venv whose tools are this one's; .installed newer than requirements: no install.
    venv = proj / ".venv" / "bin"
    venv.mkdir(parents=True)
    for tool in ("dvc", "ampbench"):
        os.symlink(VENV_BIN / tool, venv / tool)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{VENV_BIN / "python"}" "$@"\n')  # finds its packages
    (venv / "python").chmod(0o755)
    (proj / ".venv" / ".installed").touch()
    # The real study's outputs, which the demo must leave alone.
    from ampbench.data import prepared

    prepared.save_dataset(make_dataset(), proj / STUDY_FILES[0])
    for name in STUDY_FILES[1:]:
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(f"the study's {name}\n")
    before = {name: _digest(proj / name) for name in STUDY_FILES}
    demo = yaml.safe_load((proj / "demo" / "params.yaml").read_text())
    archive = image_folder_archive(tmp_path, demo["data"]["train_per_class"], demo["data"]["test_per_class"])
    env = clean_env(PYTHONPATH=str(proj / "src"))
    env.pop("OMP_NUM_THREADS")  # what `make demo` sets is part of the test
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):  # under `make test`: `make demo` as typed in a shell,
        env.pop(name, None)  # not a sub-make (which adds "Entering/Leaving directory" lines)
    # a committed clone, the demo's dvc.lock as committed (make clean-demo writes it): git status
    # must be as clean after the demo as before
    subprocess.run(["make", "clean-demo"], cwd=proj, env=env, check=True, capture_output=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (git + ["init", "-q"], git + ["add", "-A"], git + ["commit", "-qm", "clone"]):
        subprocess.run(cmd, cwd=proj, check=True, capture_output=True)

    proc = subprocess.run(
        ["make", "demo", f"DATA={archive}"], cwd=proj, env=env, capture_output=True, text=True, timeout=900
    )
    (tmp_path / "make-demo.log").write_text(proc.stdout + proc.stderr)  # to read when it fails
    assert proc.returncode == 0, f"make demo: {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"

    out = proj / "demo"
    assert sorted(p.parent.parent.name for p in out.glob("models/*/seed-*/model.pt")) == sorted(VARIANTS)
    assert sorted(p.stem for p in out.glob("reports/metrics/*.json")) == sorted(VARIANTS)
    comparison = (out / "reports" / "comparison.md").read_text()
    assert "DEMO ON A SUBSET, NOT THE STUDY'S RESULT" in comparison.split("|")[0]
    assert all(f"| {v} |" in comparison for v in VARIANTS)
    # The terminal: the answer at the end, in a few lines, not the table and no diagnostics
    said = proc.stdout.splitlines()
    assert said[-1].startswith("Start the UI first") and said[-2].startswith("Browse the runs: http")
    assert f"ui --backend-store-uri sqlite:///{proj / 'mlflow.db'}" in said[-1]  # beside the link it serves
    answer = ("Answer: the fastest, ", "Answer: no variant trains faster than single-fp32")  # CPU: either
    assert said[-5].startswith(answer) and said[-4].startswith("A demo on a subset"), said[-5:]
    files = (
        "The table and chart: demo/reports/comparison.md, comparison.png; in DVC: cd demo && dvc metrics show"
    )
    assert said[-3] == files
    output = proc.stdout + proc.stderr
    assert len(output.splitlines()) <= 60, output
    for noise in ("No file hash info", "warmup_fraction", "ERROR", "Traceback", "DEMO ON A SUBSET"):
        assert noise not in output, noise
    for diagnostic in ("stage time", "evaluate_stage_seconds", "the whole study still needs", "torchrun"):
        assert diagnostic not in output, diagnostic
    for dvc_noise in ("> ampbench", "Updating lock file", "git add", "autostage", "dvc push"):
        assert dvc_noise not in output, dvc_noise
    # DATA became data.url for the run (in dvc.lock), the committed params.yaml put back: git is clean
    assert str(archive) in (out / "dvc.lock").read_text()
    assert str(archive) not in (out / "params.yaml").read_text()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=proj, capture_output=True, text=True)
    assert status.stdout == "", status.stdout
    assert {p.name for p in out.glob("data/prepared/*")} >= {"cifar10.pt", "source.json"}

    client = mlflow_client(proj)  # the repo's store, not one in demo/
    assert not (out / "mlflow.db").exists()
    study = client.get_experiment_by_name("cifar10-amp")
    assert study is None or not client.search_runs([study.experiment_id])
    exp = client.get_experiment_by_name(demo["tracking"]["experiment"])
    found = client.search_runs([exp.experiment_id])
    seeds = [r for r in found if r.data.tags.get("variant") and r.data.params.get("seed") is not None]
    assert sorted(r.data.tags["variant"] for r in seeds) == sorted(VARIANTS * len(demo["train"]["seeds"]))
    assert all(r.info.status == "FINISHED" and "test/accuracy" in r.data.metrics for r in seeds)
    assert [r.info.run_name for r in found].count("compare") == 1

    assert {name: _digest(proj / name) for name in STUDY_FILES} == before
    assert not (proj / "dvc.lock").exists() and not (proj / "checkpoints").exists()

    # DVC's views in demo/ (a DVC subrepo): the demo's answer only, a row per variant
    shown = subprocess.run(
        [str(VENV_BIN / "dvc"), "metrics", "show"], cwd=out, env=clean_env(), capture_output=True, text=True
    )
    rows = [line for line in shown.stdout.splitlines() if line.strip()]
    assert sorted(line.split()[0] for line in rows[1:]) == sorted(
        f"reports/answer/{v}.json" for v in VARIANTS
    )
    assert max(map(len, rows)) <= 200 and "failed" not in shown.stdout + shown.stderr

    # make clean-demo takes DVC's run cache too: otherwise `dvc repro` restores the nine models
    # (the run cache matches their command, deps and params) and nothing trains again
    assert list((out / ".dvc" / "cache" / "runs").iterdir())
    cleaned = subprocess.run(["make", "clean-demo"], cwd=proj, env=env, capture_output=True, text=True)
    assert cleaned.returncode == 0 and "trains all nine variants again" in cleaned.stdout
    assert "MLflow keeps the demo's runs" in cleaned.stdout and "rm -rf mlflow.db mlruns" in cleaned.stdout
    assert not (out / ".dvc" / "cache").exists() and not (out / "models").exists()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=proj, capture_output=True, text=True)
    assert status.stdout == "", status.stdout
