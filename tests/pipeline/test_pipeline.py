"""End to end: `dvc repro` (download -> nine trains -> nine evaluates -> compare) on CPU with a
tiny ImageFolder archive and 2 seeds, run as `make run` runs it (``ampbench.dvc_run``: its stages
in forks of the command's warm server); then the same store through `mlflow server`'s REST API,
and the MLproject entry point through `mlflow run` (tests/pipeline/test_mlflow_run.py).
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import (
    REPO,
    VENV_BIN,
    MlflowServer,
    image_folder_archive,
    mlflow_client,
    runs,
    venv_env,
    write_params,
)

# Every test here needs the whole pipeline run once (minutes) or a real `mlflow server`: the
# module's shared fixtures (make test keeps the module on one worker: conftest.GROUPED_MODULES).
pytestmark = pytest.mark.slow

VARIANTS = [f"{p}-{q}" for p in ("single", "dp", "ddp") for q in ("fp32", "autocast", "autocast_gradscaler")]


def sh(cmd: list[str], cwd: Path, timeout: float = 1800, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=venv_env(**env), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def repro(tmp_path_factory, server) -> Path:
    """A git + DVC project that has run `dvc repro` once against a real `mlflow server`, with 2
    seeds per variant and every seed's model logged as an MLflow model."""
    proj = tmp_path_factory.mktemp("pipeline")
    archive = image_folder_archive(proj.parent)
    shutil.copy(REPO / "dvc.yaml", proj / "dvc.yaml")
    shutil.copytree(REPO / "src", proj / "src")  # the stages' declared deps
    write_params(proj, data={"url": str(archive)}, train={"seeds": [0, 1]}, tracking={"log_model": "export"})
    sh(["git", "init", "-q"], proj)
    sh([str(VENV_BIN / "dvc"), "init", "-q"], proj)
    # AMPBENCH_DEBUG=1: the warm server's log is printed when the command ends
    dvc_run = [str(VENV_BIN / "python"), "-m", "ampbench.dvc_run", "repro"]
    out = sh(dvc_run, proj, MLFLOW_TRACKING_URI=server.uri, AMPBENCH_DEBUG="1")
    (proj / "repro.log").write_text(out.stdout + out.stderr)
    return proj


def test_the_stages_ran_in_the_commands_warm_server(repro: Path):
    """The path users take: make run's stages fork from a server the command started (DDP's
    torchrun workers too), and the server is gone with the command. The stages that start while
    the server still imports (the download, a first train on a slow machine) run plain."""
    log = (repro / "repro.log").read_text()
    served = re.findall(r"warm server: pid \d+ runs `ampbench (\w+)(?: --parallel (\w+))?", log)
    assert "refused" not in log, log[-3000:]
    trains = [p for command, p in served if command == "train"]
    assert trains.count("single") + trains.count("dp") >= 4, served
    assert trains.count("ddp") == 3 * 3, served  # each ddp stage: its agent and 2 CPU workers
    assert ("evaluate", "") in served and ("compare", "") in served, served
    server_pid = int(re.search(r"warm server (\d+): ready", log)[1])
    assert not psutil.pid_exists(server_pid)


def test_repro_tracks_every_seed_with_sectioned_metrics_datasets_and_evaluation(repro: Path, server):
    c = mlflow_client(server.uri)
    variants = {r.info.run_id: r.info.run_name for r in runs(server.uri, kind="variant")}
    seeds = runs(server.uri, kind="seed")
    assert sorted(r.info.run_name for r in seeds) == sorted(f"{v}/seed-{s}" for v in VARIANTS for s in (0, 1))
    digest = hashlib.sha256((repro / "data" / "prepared" / "cifar10.pt").read_bytes()).hexdigest()
    for r in seeds:
        variant = r.info.run_name.split("/")[0]
        assert variants[r.data.tags["mlflow.parentRunId"]] == variant  # nested under its variant
        assert r.info.status == "FINISHED"
        # Every metric has a chart section, and the same names in every run.
        assert all("/" in key for key in r.data.metrics), sorted(r.data.metrics)
        assert {
            "test/accuracy",
            "train/loss",
            "speed/images_per_second",
            "time/train_seconds",
            "memory/peak_mb",
            "amp/grad_scale",
            "class_accuracy/cat",
        } <= set(r.data.metrics)
        assert 0.0 <= r.data.metrics["test/accuracy"] <= 1.0
        inputs = {tuple(t.value for t in d.tags): d.dataset for d in r.inputs.dataset_inputs}
        assert set(inputs) == {("training",), ("evaluation",)}
        assert all(d.digest == digest[: len(d.digest)] and len(d.digest) >= 16 for d in inputs.values())
        names = {a.path for a in c.list_artifacts(r.info.run_id, "evaluation")}
        assert {"evaluation/confusion_matrix.png", "evaluation/confusion_matrix.json"} <= names
        local = c.download_artifacts(r.info.run_id, "evaluation/confusion_matrix.json")
        matrix = json.loads(Path(local).read_text())["matrix"]
        assert sum(map(sum, matrix)) == 30  # every test image counted once
    assert {r.data.metrics["test/accuracy"] for r in seeds} == {
        s["test_accuracy"] for v in VARIANTS for s in _metrics_file(repro, v)["seeds"]
    }


def _metrics_file(repro: Path, variant: str) -> dict:
    return json.loads((repro / "reports" / "metrics" / f"{variant}.json").read_text())


def test_nine_variant_runs_carry_the_mean_and_spread_over_seeds(repro: Path, server):
    variants = runs(server.uri, kind="variant")
    assert sorted(r.info.run_name for r in variants) == sorted(VARIANTS)  # nine rows, not eighteen
    seeds = runs(server.uri, kind="seed")
    for v in variants:
        mine = [s.data.metrics for s in seeds if s.data.tags["mlflow.parentRunId"] == v.info.run_id]
        assert len(mine) == 2 and "mlflow.parentRunId" not in v.data.tags
        for key in ("test/accuracy", "speed/images_per_second", "time/train_seconds"):
            assert math.isclose(v.data.metrics[key], statistics.fmean(m[key] for m in mine), rel_tol=1e-9)
            assert math.isclose(
                v.data.metrics[f"{key}_std"], statistics.stdev(m[key] for m in mine), abs_tol=1e-9
            )
        assert "speed/speedup_vs_single_fp32" in v.data.metrics
        curve = mlflow_client(server.uri).get_metric_history(v.info.run_id, "train/loss")
        assert sorted(m.step for m in curve) == [1, 2]  # the mean per-epoch curve
    compare = runs(server.uri, kind="compare")
    assert [r.info.run_name for r in compare] == ["compare"]
    assert compare[0].data.metrics == {}  # nothing of its own in the training runs' charts
    names = {a.path for a in mlflow_client(server.uri).list_artifacts(compare[0].info.run_id)}
    assert {"comparison.md", "comparison.csv", "comparison.png", "summary.json"} <= names
    assert "workflowType=machine_learning" in (repro / "repro.log").read_text()


PREDICT = """
import json, sys, mlflow.pyfunc, numpy as np, torch
ds = torch.load(sys.argv[2], weights_only=True)
scores = mlflow.pyfunc.load_model(sys.argv[1]).predict(ds["test_images"].numpy())
print(json.dumps(float((np.argmax(scores, 1) == ds["test_labels"].numpy()).mean())))
"""


@pytest.mark.parametrize("variant", ["single-fp32", "single-autocast_gradscaler"])
def test_logged_model_reproduces_the_evaluation_in_a_fresh_process(repro: Path, server, variant):
    c = mlflow_client(server.uri)
    for seed in _metrics_file(repro, variant)["seeds"]:
        models = c.search_logged_models(
            [c.get_run(seed["run_id"]).info.experiment_id],
            filter_string=f"source_run_id = '{seed['run_id']}'",
        )
        assert len(models) == 1, f"{variant} seed {seed['seed']}: {len(models)} logged models"
        uri = f"models:/{models[0].model_id}"
        out = sh(
            [sys.executable, "-c", PREDICT, uri, str(repro / "data" / "prepared" / "cifar10.pt")],
            repro,
            MLFLOW_TRACKING_URI=server.uri,
        )
        assert json.loads(out.stdout.strip().splitlines()[-1]) == seed["test_accuracy"]


def test_dvc_metrics_show_is_the_answer_one_row_per_variant(repro: Path):
    out = sh([str(VENV_BIN / "dvc"), "metrics", "show", "--json"], repro).stdout
    files = next(iter(json.loads(out).values()))["data"]  # keyed by revision ("" or "workspace")
    assert set(files) == {f"reports/answer/{v}.json" for v in VARIANTS}
    columns = {"Speedup", "acc%", "acc_d", "acc_sd", "img/s", "mb"}
    assert all(set(f["data"]) == columns for f in files.values())  # none NaN, none left out
    summary = json.loads((repro / "reports" / "summary.json").read_text())
    assert set(summary) == set(VARIANTS)
    assert all(
        set(v) == {"test_accuracy", "images_per_second", "train_seconds", "speedup"} for v in summary.values()
    )


def test_comparison_equals_the_runs_it_summarizes(repro: Path, server):
    with open(repro / "reports" / "comparison.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(VARIANTS)
    assert (repro / "reports" / "comparison.png").stat().st_size > 10_000
    seeds = runs(server.uri, kind="seed")
    names = {
        "test_accuracy": "test/accuracy",
        "train_seconds": "time/train_seconds",
        "images_per_second": "speed/images_per_second",
        "peak_memory_mb": "memory/peak_mb",
    }
    for variant, row in rows.items():
        mine = [r.data.metrics for r in seeds if r.info.run_name.startswith(f"{variant}/")]
        for key, name in names.items():
            assert math.isclose(
                float(row[f"{key}_mean"]), statistics.fmean(m[name] for m in mine), rel_tol=1e-9
            )
            assert math.isclose(
                float(row[f"{key}_std"]), statistics.stdev(m[name] for m in mine), abs_tol=1e-9
            )
    base_ips = statistics.fmean(
        r.data.metrics["speed/images_per_second"] for r in seeds if r.info.run_name.startswith("single-fp32/")
    )
    ddp = rows["ddp-autocast"]
    assert math.isclose(float(ddp["speedup"]), float(ddp["images_per_second_mean"]) / base_ips, rel_tol=1e-9)
    assert rows["ddp-fp32"]["devices_used"] == "2"


def test_unchanged_pipeline_reruns_nothing(repro: Path, server):
    before = len(runs(server.uri))
    out = sh([str(VENV_BIN / "dvc"), "repro"], repro, MLFLOW_TRACKING_URI=server.uri).stdout
    assert "didn't change" in out or "up to date" in out
    assert len(runs(server.uri)) == before


def test_rest_api_finds_the_seed_runs_by_tag(server):
    base = f"{server.uri}/api/2.0/mlflow"
    with urllib.request.urlopen(f"{base}/experiments/get-by-name?experiment_name=cifar10-amp") as r:
        experiment = json.load(r)["experiment"]
    query = "tags.precision = 'autocast' and tags.`ampbench.kind` = 'seed'"
    body = json.dumps({"experiment_ids": [experiment["experiment_id"]], "max_results": 100, "filter": query})
    req = urllib.request.Request(f"{base}/runs/search", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        found = json.load(r)["runs"]
    names = sorted(run["info"]["run_name"] for run in found)
    assert names == sorted(f"{p}-autocast/seed-{s}" for p in ("single", "dp", "ddp") for s in (0, 1))


def _ui_screenshots():
    spec = importlib.util.spec_from_file_location("ui_screenshots", REPO / "scripts" / "ui_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.browser
def test_printed_link_opens_the_nine_variants_in_a_fresh_browser(repro: Path, server):
    ui = _ui_screenshots()
    if not ui.chromium():
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    links = re.findall(r"Browse the runs: (\S+)", (repro / "repro.log").read_text())
    assert links and links[-1].startswith(server.uri), links
    dom = ui.render(links[-1])
    title = re.search(r"<title>([^<]*)</title>", dom).group(1)
    assert title.startswith("Runs - Experiment"), title  # the training runs, not the GenAI "Overview"
    shown = set(re.findall(r">((?:single|dp|ddp)-(?:fp32|autocast_gradscaler|autocast))<", dom))
    assert shown == set(VARIANTS)
