"""End to end: `dvc repro` (download -> nine trains -> nine evaluates -> compare) on CPU with a
tiny ImageFolder archive and 2 seeds; then the same store through `mlflow server`'s REST API,
and the MLproject entry point through `mlflow run`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from conftest import REPO, clean_env, make_dataset, mlflow_client, runs, write_params

VARIANTS = [f"{p}-{q}" for p in ("single", "dp", "ddp") for q in ("fp32", "autocast", "autocast_gradscaler")]
BIN = Path(sys.executable).parent


def image_folder_archive(dest: Path) -> Path:
    """A tiny CIFAR-like ImageFolder archive: train/<class>/*.png, test/<class>/*.png."""
    ds = make_dataset(n_train_per_class=6, n_test_per_class=3)
    root = dest / "tiny"
    for split in ("train", "test"):
        for i, (img, label) in enumerate(zip(ds[f"{split}_images"], ds[f"{split}_labels"])):
            folder = root / split / ds["classes"][int(label)]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img.permute(1, 2, 0).numpy()).save(folder / f"{i:04d}.png")
    archive = dest / "tiny-cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "train", "train")
        tar.add(root / "test", "test")
    return archive


def env_with_venv() -> dict:
    return clean_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")


def sh(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env_with_venv(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def repro(tmp_path_factory) -> Path:
    """A git + DVC project that has run `dvc repro` once, with 2 seeds per variant."""
    proj = tmp_path_factory.mktemp("pipeline")
    archive = image_folder_archive(proj.parent)
    shutil.copy(REPO / "dvc.yaml", proj / "dvc.yaml")
    shutil.copytree(REPO / "src", proj / "src")  # the stages' declared deps
    write_params(proj, data={"url": str(archive)}, train={"seeds": [0, 1]})
    sh(["git", "init", "-q"], proj)
    sh([str(BIN / "dvc"), "init", "-q"], proj)
    sh([str(BIN / "dvc"), "repro"], proj)
    return proj


def test_repro_tracks_every_variant_with_evaluation(repro: Path):
    client = mlflow_client(repro)
    finished = [r for r in runs(repro) if r.info.run_name != "compare"]
    assert sorted({r.info.run_name for r in finished}) == sorted(VARIANTS)
    for variant in VARIANTS:
        mine = [r for r in finished if r.info.run_name == variant]
        assert sorted(r.data.params["seed"] for r in mine) == ["0", "1"], variant
        for r in mine:
            assert r.info.status == "FINISHED"
            assert 0.0 <= r.data.metrics["test_accuracy"] <= 1.0
            names = {a.path for a in client.list_artifacts(r.info.run_id, "evaluation")}
            assert {"evaluation/confusion_matrix.png", "evaluation/confusion_matrix.json"} <= names
            local = client.download_artifacts(r.info.run_id, "evaluation/confusion_matrix.json")
            matrix = json.loads(Path(local).read_text())["matrix"]
            assert sum(map(sum, matrix)) == 30  # every test image counted once


def test_dvc_metrics_show_lists_all_nine(repro: Path):
    out = sh([str(BIN / "dvc"), "metrics", "show", "--json"], repro).stdout
    files = next(iter(json.loads(out).values()))["data"]  # keyed by revision ("" or "workspace")
    listed = {Path(name).stem for name in files}
    assert listed == set(VARIANTS)


def test_comparison_equals_the_runs_it_summarizes(repro: Path):
    with open(repro / "reports" / "comparison.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(VARIANTS)
    assert (repro / "reports" / "comparison.png").stat().st_size > 10_000
    tracked = [r for r in runs(repro) if r.info.run_name != "compare"]
    for variant, row in rows.items():
        mine = [r.data.metrics for r in tracked if r.info.run_name == variant]
        for key in ("test_accuracy", "train_seconds", "images_per_second", "peak_memory_mb"):
            assert math.isclose(
                float(row[f"{key}_mean"]), statistics.fmean(m[key] for m in mine), rel_tol=1e-9
            )
            assert math.isclose(
                float(row[f"{key}_std"]), statistics.stdev(m[key] for m in mine), abs_tol=1e-9
            )
    base_ips = statistics.fmean(
        r.data.metrics["images_per_second"] for r in tracked if r.info.run_name == "single-fp32"
    )
    ddp = rows["ddp-autocast"]
    assert math.isclose(float(ddp["speedup"]), float(ddp["images_per_second_mean"]) / base_ips, rel_tol=1e-9)
    assert rows["ddp-fp32"]["devices_used"] == "2"
    compare_runs = [r for r in runs(repro) if r.info.run_name == "compare"]
    assert len(compare_runs) == 1
    names = {a.path for a in mlflow_client(repro).list_artifacts(compare_runs[0].info.run_id)}
    assert {"comparison.md", "comparison.csv", "comparison.png"} <= names


def test_unchanged_pipeline_reruns_nothing(repro: Path):
    before = len(runs(repro))
    out = sh([str(BIN / "dvc"), "repro"], repro).stdout
    assert "didn't change" in out or "up to date" in out
    assert len(runs(repro)) == before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_server_serves_the_runs(repro: Path):
    port = _free_port()
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{repro / 'mlflow.db'}", "--workers", "1"],
        cwd=repro, env=env_with_venv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(
                    f"{base}/experiments/get-by-name?experiment_name=cifar10-amp"
                ) as r:
                    experiment = json.load(r)["experiment"]
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "mlflow server did not answer within 90 s"
                time.sleep(1)
        body = json.dumps({"experiment_ids": [experiment["experiment_id"]], "max_results": 100,
                           "filter": "tags.precision = 'autocast'"}).encode()  # fmt: skip
        req = urllib.request.Request(f"{base}/runs/search", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            found = json.load(r)["runs"]
        names = sorted(run["info"]["run_name"] for run in found)
        assert names == ["ddp-autocast", "ddp-autocast", "dp-autocast", "dp-autocast",
                         "single-autocast", "single-autocast"]  # fmt: skip
        for run in found:
            assert "test_accuracy" in {m["key"] for m in run["data"]["metrics"]}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_mlflow_run_entry_point(tmp_path: Path):
    """`mlflow run` of the MLproject's main entry point, with the local env manager."""
    proj = tmp_path / "proj"
    skip = (".venv", ".git", "data", "models", "reports", "mlflow.db", "mlruns", ".whl", ".mirror")
    shutil.copytree(REPO, proj, ignore=shutil.ignore_patterns(*skip))
    write_params(proj)
    archive = image_folder_archive(tmp_path)
    params = ["-P", "precision=autocast", "-P", "epochs=1", "-P", "batch_size=10"]
    params += ["-P", f"data_url={archive}"]
    cmd = [str(BIN / "mlflow"), "run", ".", "--env-manager", "local", *params]
    sh([*cmd, "--experiment-name", "mlproject-test"], proj)
    found = runs(proj, "mlproject-test")
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.params["precision"] == "autocast"
    assert 0.0 <= parent.data.metrics["test_accuracy"] <= 1.0
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [c.info.run_name for c in children] == ["single-autocast"]
    assert children[0].data.params["train.epochs"] == "1"
    assert children[0].data.params["train.batch_size"] == "10"
