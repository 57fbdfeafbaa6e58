"""`--fresh` starts every seed in a new MLflow run (hostile pass D, N4: a seed trained, its publish
refused as params.yaml changed, then `ampbench train ... --fresh`: "seed 0: continuing MLflow run
... (it ended before its first checkpoint)", and every epoch logged twice into the finished run)."""

from __future__ import annotations

import json
import types

from ampbench import config
from ampbench.tracking import train_runs
from ampbench.tracking.tracker import Tracker
from conftest import REPO, empty_store


def _stage_and_job(tmp_path, monkeypatch):
    store = empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    tracker = Tracker("fresh")
    stage = types.SimpleNamespace(
        tracker=tracker,
        variant_run_id=None,
        data_digest="ab" * 20,
        data_source="/data.tar.gz",
        fresh=False,
        fresh_command=None,
    )
    cfg = config.load_config(REPO / "params.yaml")
    ckpt = tmp_path / "work" / "seed-0" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    return stage, types.SimpleNamespace(cfg=cfg, seed=0, checkpoint_path=ckpt), cfg.digest()


def _recorded(job, run_id: str, digest: str) -> None:
    record = {"run_id": run_id, "config_digest": digest}
    job.checkpoint_path.with_name("run.json").write_text(json.dumps(record), encoding="utf-8")


def test_a_finished_run_is_never_continued_and_fresh_starts_a_new_one(tmp_path, monkeypatch):
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    finished = stage.tracker.start("single-fp32/seed-0", {"ampbench.kind": "seed"})
    stage.tracker.end(finished, "FINISHED")
    _recorded(job, finished, digest)
    assert train_runs.seed_run(stage, job, "single-fp32", digest, {}) != finished
    _recorded(job, finished, digest)
    assert train_runs.seed_run(stage, job, "single-fp32", digest, {}, fresh=True) != finished
    assert stage.tracker.status(finished) == "FINISHED"


def test_fresh_ends_a_run_a_kill_left_running_and_without_it_the_run_goes_on(tmp_path, monkeypatch):
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    killed = stage.tracker.start("single-fp32/seed-0", {"ampbench.kind": "seed"})  # kill -9: RUNNING
    _recorded(job, killed, digest)
    assert train_runs.seed_run(stage, job, "single-fp32", digest, {}) == killed  # a crash: same run
    assert train_runs.seed_run(stage, job, "single-fp32", digest, {}, fresh=True) != killed
    assert stage.tracker.status(killed) == "KILLED"  # not RUNNING for ever


def test_fresh_starts_a_new_variant_run_too(tmp_path, monkeypatch):
    """Hostile pass E: after `--fresh` the refused stage's variant run held the old and the new
    seed run of seed 0 side by side (the UI showed three seeds of two)."""
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    cfg, work = job.cfg, job.checkpoint_path.parent.parent
    first = train_runs.variant_run(stage.tracker, work, "single-fp32", cfg)
    assert train_runs.variant_run(stage.tracker, work, "single-fp32", cfg) == first  # a re-run: the same
    fresh = train_runs.variant_run(stage.tracker, work, "single-fp32", cfg, fresh=True)
    assert fresh != first and stage.tracker.status(first) == "KILLED"  # not RUNNING for ever
