"""The train stage killed or stopped, then run again: kill -9, SIGTERM and Ctrl-C of a single
process and of a DDP launcher, through DVC too. A resumed seed continues its MLflow run and ends
with the weights of an uninterrupted one; a changed config refuses to resume until --fresh.
docs/RELIABILITY.md maps each fault to its test.

Stages run as real subprocesses (`python -m ampbench ...`) in throwaway project folders, so signals,
exit codes, checkpoints on disk and MLflow run states are the real ones. A seed in progress lives in
``checkpoints/<variant>/seed-<s>/`` (``checkpoint.pt``, ``run.json``, then ``model.pt``); only a
finished stage publishes ``models/<variant>/seed-<s>/model.pt``. Each variant has a variant run with
one nested seed run per seed in MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import (
    DDP,
    DDP_WORK0,
    LONG_EPOCHS,
    REPO,
    SEED0,
    SINGLE,
    VENV_BIN,
    WORK,
    WORK0,
    alive,
    assert_same_weights,
    descendants,
    hook_env,
    load_pt,
    long_project,
    mlflow_client,
    run_cli,
    run_json,
    run_status,
    runs,
    stage_log,
    venv_env,
    wait_exit,
    wait_for_checkpoint,
    write_params,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """model.pt of an uninterrupted LONG run: what every interrupted-and-resumed run must equal."""
    proj = long_project(tmp_path_factory.mktemp("reference") / "proj")
    run_cli(proj, *SINGLE, env=venv_env())
    return load_pt(proj / SEED0 / "model.pt")


def _metric_steps(project: Path, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in mlflow_client(project).get_metric_history(run_id, key))


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_same_run_with_identical_weights(tmp_path, procs, reference):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.5)  # land mid-epoch, well after the epoch's metrics were logged
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    saved = load_pt(ckpt)  # the last complete epoch before the kill
    assert 1 <= saved["epoch"] < LONG_EPOCHS and saved["step"] == 0
    assert not (proj / WORK0 / "model.pt").exists() and not (proj / SEED0).exists()
    run_id = saved["run_id"]
    assert run_json(proj)["run_id"] == run_id
    variant_run = json.loads((proj / WORK / "variant.json").read_text())["run_id"]
    assert run_status(proj, run_id) == "RUNNING"  # nobody could mark it: the resume continues it

    done = run_cli(proj, *SINGLE, env=venv_env())
    assert f"resuming seed 0 at epoch {saved['epoch'] + 1} step 0" in done.stderr  # 1-based
    final = load_pt(proj / SEED0 / "model.pt")
    assert (final["run_id"], final["variant_run_id"]) == (run_id, variant_run)
    assert not (proj / WORK).exists()  # published: the work folder is gone
    assert [r.info.run_id for r in runs(proj, kind="seed")] == [run_id]  # one run for the variant and seed
    assert [r.info.run_id for r in runs(proj, kind="variant")] == [variant_run]  # reused, not a second one
    assert run_status(proj, run_id) == run_status(proj, variant_run) == "FINISHED"
    assert [h["epoch"] for h in final["history"]] == list(range(1, LONG_EPOCHS + 1))
    # Every epoch is recorded once: one logged before the kill and trained again is not logged again.
    assert _metric_steps(proj, run_id, "train/loss") == list(range(1, LONG_EPOCHS + 1))
    assert_same_weights(final["state_dict"], reference["state_dict"])


@pytest.mark.slow
def test_dvc_repro_resumes_after_kill_and_reruns_only_when_forced(tmp_path, procs):
    """Through DVC: kill -9 of the whole `dvc repro` process group, repro again resumes (the
    checkpoint lives in checkpoints/, no DVC output, so DVC deletes nothing it needs although the
    models/ out is not persist); an unchanged repro runs nothing; `dvc repro -f` trains a fresh run."""
    proj = long_project(tmp_path / "proj", epochs=4)
    train_outs = yaml.safe_load((proj / "dvc.yaml").read_text())["stages"]["train"]["outs"]
    assert "persist" not in json.dumps(train_outs), train_outs  # resume must not depend on it
    shutil.copytree(
        REPO / "src" / "ampbench", proj / "src" / "ampbench", ignore=shutil.ignore_patterns("__pycache__")
    )  # the stage's deps
    dvc = [str(VENV_BIN / "dvc")]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=proj, env=venv_env(), check=True, timeout=120)
    repro = [*dvc, "repro", "--single-item", "train@single-fp32"]
    ckpt = proj / WORK0 / "checkpoint.pt"

    proc = procs.start(proj, cmd=repro, name="dvc")
    wait_for_checkpoint(proc, ckpt, proj / "dvc.log", min_epoch=1)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # dvc and the training it started
    proc.wait(30)
    run_id = load_pt(ckpt)["run_id"]
    assert not (proj / SEED0 / "model.pt").exists()

    def dvc_repro(*extra: str) -> str:
        out = subprocess.run(
            [*repro[:2], *extra, *repro[2:]],
            cwd=proj,
            env=venv_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr

    assert "resuming seed 0 at epoch" in dvc_repro()  # DVC deleted the models/ out, not the checkpoint
    assert load_pt(proj / SEED0 / "model.pt")["run_id"] == run_id
    assert not (proj / WORK).exists()
    assert [(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")] == [(run_id, "FINISHED")]
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED"]

    assert "didn't change" in dvc_repro()  # unchanged pipeline: no new run
    assert len(runs(proj)) == 2  # the variant run and its seed run

    dvc_repro("-f")  # forced: a finished seed trains afresh, in a new run
    fresh = load_pt(proj / SEED0 / "model.pt")["run_id"]
    assert fresh != run_id
    seeds = {(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")}
    assert seeds == {(run_id, "FINISHED"), (fresh, "FINISHED")}
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED", "FINISHED"]


@pytest.mark.slow
def test_sigterm_saves_mid_epoch_marks_killed_and_resume_is_exact(tmp_path, procs, reference):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGTERM)
    assert wait_exit(proc, 60, proj / "train.log") == 143
    saved = load_pt(ckpt)
    assert saved["epoch"] >= 1 and saved["step"] > 0  # a stop saves mid-epoch, at a step boundary
    assert "SIGTERM received" in stage_log(proj)
    where = f"stopped at seed 0 epoch {saved['epoch'] + 1} step {saved['step']}; checkpoint saved"
    assert where in stage_log(proj)  # the seed named: a study trains several
    assert run_status(proj, saved["run_id"]) == "KILLED"
    assert [r.info.status for r in runs(proj, kind="variant")] == ["KILLED"]  # not left RUNNING

    done = run_cli(proj, *SINGLE, env=venv_env())
    assert f"resuming seed 0 at epoch {saved['epoch'] + 1} step {saved['step']}" in done.stderr
    final = load_pt(proj / SEED0 / "model.pt")
    assert final["run_id"] == saved["run_id"]
    assert [r.info.status for r in runs(proj, kind="seed")] == ["FINISHED"]
    assert [r.info.status for r in runs(proj, kind="variant")] == ["FINISHED"]
    # once each: the stop sent what its checkpoint held as pending; the resume does not send it again
    assert _metric_steps(proj, final["run_id"], "train/loss") == list(range(1, LONG_EPOCHS + 1))
    assert_same_weights(final["state_dict"], reference["state_dict"])  # mid-epoch resume is exact too


@pytest.mark.slow
def test_changed_config_refuses_to_resume_until_fresh(tmp_path, procs):
    proj = long_project(tmp_path / "proj")
    ckpt = proj / WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *SINGLE)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the same graceful stop as SIGTERM
    assert wait_exit(proc, 60, proj / "train.log") == 128 + signal.SIGINT  # 130, as for any Ctrl-C
    assert "SIGINT received" in stage_log(proj)
    killed = load_pt(ckpt)["run_id"]
    assert run_status(proj, killed) == "KILLED"
    before = ckpt.read_bytes()

    write_params(proj, train={"epochs": LONG_EPOCHS, "lr": 0.02})  # was 0.05
    refused = run_cli(proj, *SINGLE, env=venv_env(), check=False)
    assert refused.returncode == 1
    assert "--fresh" in refused.stderr and str(WORK0 / "checkpoint.pt") in refused.stderr
    assert "(train.lr 0.05 -> 0.02). Resuming would mix two experiments" in refused.stderr  # not only digests
    assert "start over: `ampbench train --parallel single --precision fp32 --fresh`" in refused.stderr
    assert ckpt.read_bytes() == before
    assert [r.info.run_id for r in runs(proj, kind="seed")] == [killed]
    assert len(runs(proj, kind="variant")) == 1  # refused before any run was created

    run_cli(proj, *SINGLE, "--fresh", "--set", "train.epochs=1", env=venv_env())
    fresh = load_pt(proj / SEED0 / "model.pt")["run_id"]
    assert fresh != killed and not ckpt.exists() and not (proj / WORK).exists()
    seeds = {(r.info.run_id, r.info.status) for r in runs(proj, kind="seed")}
    assert seeds == {(killed, "KILLED"), (fresh, "FINISHED")}


@pytest.mark.slow
def test_sigterm_to_ddp_launcher_stops_every_worker(tmp_path, procs):
    # 6 steps per epoch, fewer than train.stop_check_every (20): ranks must also agree at epoch ends.
    proj = long_project(tmp_path / "proj", per_class=12)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *DDP, env=hook_env(tmp_path, AMPBENCH_TEST_NO_MLFLOW="1"))
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)  # proves rank 1 never used MLflow
    time.sleep(0.3)
    tree = procs.adopt(descendants(proc.pid))
    assert len(tree) >= 2, f"expected 2 workers under the launcher (torchrun's agent), found {tree}"
    os.kill(proc.pid, signal.SIGTERM)  # the launcher only; its torchrun agent stops the workers
    assert wait_exit(proc, 90, proj / "train.log") == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tree if alive(p)], "DDP processes outlived the launcher"
    log = stage_log(proj)
    assert log.count("SIGTERM received") == 1  # once per node: rank 1 says it at DEBUG (--verbose)
    assert "[rank 0] ampbench.stages.train_main: stopped at seed 0 epoch" in log
    assert "To resume, run the same command again: ampbench train --parallel ddp" in log
    for note in ("closing signal", "death signal", "OMP_NUM_THREADS"):  # torchrun's: our lines say it
        assert note not in log, log
    saved = load_pt(ckpt)
    assert saved["step"] > 0  # the stop saved a checkpoint (epoch-end saves have step 0)
    assert run_status(proj, saved["run_id"]) == "KILLED"


@pytest.mark.slow
def test_sigkill_of_ddp_launcher_group_leaves_no_orphan_workers(tmp_path, procs):
    """torchrun starts each worker in a session of its own, so kill -9 of the launcher's process
    group (a CI timeout, `kill -9 -PGID`) reaches the launcher and torchrun but not the workers."""
    proj = long_project(tmp_path / "proj", per_class=12, epochs=10)
    ckpt = proj / DDP_WORK0 / "checkpoint.pt"
    proc = procs.start(proj, *DDP)
    wait_for_checkpoint(proc, ckpt, proj / "train.log", min_epoch=1)
    time.sleep(0.3)
    tree = procs.adopt(descendants(proc.pid))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tree if alive(p)], "orphaned DDP workers kept running"
    assert "parent process" in stage_log(proj) and "is gone" in stage_log(proj)
    assert not (proj / DDP_WORK0 / "model.pt").exists()  # they stopped instead of finishing
    assert not (proj / "models").exists()
    saved = load_pt(ckpt)
    assert saved["step"] > 0 and run_status(proj, saved["run_id"]) == "KILLED"
