"""The MLflow side of a train stage (rank 0 only): the variant run, each seed's run, the stage's
time breakdown and its system metrics. train.py decides what to train and when; this records it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

from ampbench.checkpoints.state import ModelFile
from ampbench.config import Config
from ampbench.data import prepared
from ampbench.seed_result import TIME_PARTS, SeedResult
from ampbench.timing import StageClock
from ampbench.tracking import trash, view
from ampbench.tracking.tracker import (
    CONDITIONS_TAG,
    KIND_TAG,
    EpochHooks,
    Tracker,
    TrackingError,
    environment_facts,
)
from ampbench.tracking.waiting import said_while_waiting
from ampbench.training import loop

log = logging.getLogger(__name__)

EPOCH_KEY = "epoch_seconds"  # in every epoch's metrics (training/step.py)


def log_breakdown(stage: Stage, clock: StageClock, results: list[SeedResult]) -> None:
    """The stage's seconds by part, on the variant run (time/*) and in the log."""
    seeds = {k: sum(getattr(r, k) or 0.0 for r in results) for k in TIME_PARTS}
    values = {**clock.breakdown(), **{f"time/seeds_{k}": v for k, v in seeds.items()}}
    nan = float("nan")
    log.debug(  # a diagnostic: the run's time/* metrics hold it for the UI
        "stage time %.1f s: start-up %.1f s, set-up %.1f s, seeds %.1f s (training %.1f s, "
        "evaluation %.1f s, checkpoints %.1f s, logging %.1f s, model files %.1f s), publish %.2f s",
        values.get("time/stage_seconds", nan),
        values.get("time/startup_seconds", nan),
        clock.parts["setup"],
        clock.parts.get("seeds", 0.0),
        seeds["train_seconds"],
        seeds["eval_seconds"],
        seeds["checkpoint_seconds"],
        seeds["logging_seconds"],
        seeds["model_save_seconds"],
        clock.parts["publish"],
    )
    stage.tracker.log_metrics(stage.variant_run_id, values)


def end_variant_run(stage: Stage | None, status: str) -> None:
    # none yet: its making was refused; `mlflow run` ends its own
    if stage and stage.variant_run_id and stage.variant_run_id != stage.tracker.launcher_run_id:
        stage.tracker.end_quietly(stage.variant_run_id, status)


class Stage:
    """What every seed of a train stage shares on rank 0: the store, the variant run, the data."""

    def __init__(
        self, tracker: Tracker, variant_run_id: str, data_file: Path, cfg: Config, fresh: bool = False
    ) -> None:
        self.tracker, self.variant_run_id = tracker, variant_run_id  # "": not made yet
        self.fresh = fresh  # `--fresh`: its re-run would train the finished seeds again
        self.fresh_command: str | None = None  # the stage's own command with --fresh, where known
        self.data_digest = prepared.file_digest(data_file)
        self.data_source = cfg.data.url
        self.system_metrics = cfg.tracking.system_metrics == "always" or (
            cfg.tracking.system_metrics == "auto" and torch.cuda.is_available()
        )


def write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def variant_run(
    tracker: Tracker, work: Path, variant: str, cfg: Config, fresh: bool = False, again: str | None = None
) -> str:
    """The variant's MLflow run: the one an interrupted stage started, else a new one; under
    ``--fresh`` a new one, as each seed's (hostile pass E: the old and the new seed run of a seed
    side by side under one variant run)."""
    digest, known = cfg.digest(), read_json(work / "variant.json")
    status = known and known.get("config_digest") == digest and tracker.status(known["run_id"])
    if known and status == "RUNNING" and fresh:  # left by a kill -9: not RUNNING for ever
        tracker.end(known["run_id"], "KILLED")
    if known and known.get("config_digest") == digest and not fresh:  # hostile pass H: one silently
        trash.refuse_deleted(tracker, known["run_id"], "the variant's", variant, again)  # replaced
    if known and status and not fresh:
        tracker.resume(known["run_id"])
        return known["run_id"]
    parallel_name, precision_name = variant.split("-", 1)
    tags = {"parallel": parallel_name, "precision": precision_name, "model": cfg.model.name}
    params = {
        "variant": variant,
        **tags,
        "seeds": ",".join(map(str, cfg.train.seeds)),
        "config_digest": digest,
        **environment_facts(),
    }
    colour = {view.COLOR_TAG: view.COLORS[variant]} if variant in view.COLORS else {}  # one per variant
    run_id = tracker.variant_run(variant, {**tags, **colour, CONDITIONS_TAG: cfg.tracking.conditions}, params)
    write_json(work / "variant.json", {"run_id": run_id, "config_digest": digest})
    return run_id


def seed_run(stage: Stage, job: loop.Job, variant: str, digest: str, extra: dict, fresh: bool = False) -> str:
    """A new seed run, or the one a crash before the first checkpoint left behind. Not under
    ``--fresh``, nor one that finished (hostile pass: a seed trained, its publish refused, then
    `--fresh`: every epoch logged twice into the finished run, "continuing MLflow run ... (it
    ended before its first checkpoint)")."""
    record = job.checkpoint_path.with_name("run.json")
    known = read_json(record)
    status = known and known.get("config_digest") == digest and stage.tracker.status(known["run_id"])
    if known and status == "RUNNING" and fresh:  # left by a kill -9: not RUNNING for ever
        stage.tracker.end(known["run_id"], "KILLED")
    if known and status and status != "FINISHED" and not fresh:
        stage.tracker.resume(known["run_id"])
        log.info(
            "seed %d: continuing MLflow run %s (it ended before its first checkpoint)",
            job.seed,
            known["run_id"],
        )
        return known["run_id"]
    parallel_name, precision_name = variant.split("-", 1)
    params = {
        **job.cfg.flat(),
        "variant": variant,
        "parallel": parallel_name,
        "precision": precision_name,
        "seed": job.seed,
        **environment_facts(),
        **extra,
    }
    tags = {
        KIND_TAG: "seed",
        "variant": variant,
        "parallel": parallel_name,
        "precision": precision_name,
        "seed": job.seed,
        CONDITIONS_TAG: job.cfg.tracking.conditions,
    }
    run_id = stage.tracker.start(f"{variant}/seed-{job.seed}", tags, params, parent=stage.variant_run_id)
    stage.tracker.log_dataset(run_id, "cifar10-train", stage.data_digest, stage.data_source, "training")
    # also for the DDP launcher; settings: what a refused resume names (checkpoints/work.py)
    write_json(record, {"run_id": run_id, "config_digest": digest, "settings": job.cfg.digested()})
    return run_id


def open_seed_run(
    stage: Stage, job: loop.Job, variant: str, digest: str, extra: dict, resume, fresh: bool = False
):
    """(run id, hooks): the seed's run (the checkpoint's, ``resume``, if any, else ``seed_run``'s)
    and the EpochHooks that send its epochs: none the run holds already (a run continued without a
    checkpoint may hold the epoch a kill came after)."""
    run_id = resume.run_id if resume else seed_run(stage, job, variant, digest, extra, fresh)
    if resume:
        trash.refuse_deleted(stage.tracker, run_id, f"seed {job.seed}'s", variant, stage.fresh_command)
        stage.tracker.resume(run_id)
    log.debug("seed %d: MLflow run %s (%s)", job.seed, run_id, stage.tracker.uri)
    held = held_epochs(stage.tracker, run_id)
    pending = [p for p in resume.hooks or [] if p[0] not in held] if resume else None
    return run_id, EpochHooks(stage.tracker, run_id, pending, held=held)


def held_epochs(tracker, run_id: str) -> set[int]:
    """The epochs whose metrics the run already holds. A checkpoint keeps what the store had not
    taken when it was written; what was sent after it (a stop's last send, the sends before a
    kill -9, an epoch trained again after one) would otherwise be logged twice by the resumed
    run (the hostile pass saw an epoch four times after four stops). Every epoch's metrics go in
    one batch, so one key that every epoch has tells. A store that cannot answer: none (as before)."""
    try:
        return tracker.logged_steps(run_id, EPOCH_KEY)
    except Exception as err:  # noqa: BLE001 - the sends that follow say what is wrong with the store
        log.debug("could not read run %s's logged epochs (%s): sending every epoch", run_id, err)
        return set()


def end_seed_run(stage: Stage, run_id: str, hooks: EpochHooks, status: str) -> None:
    """A seed stopped (KILLED) or failed (FAILED): the epochs sent arrive before its run ends."""
    hooks.close()
    stage.tracker.end_quietly(run_id, status)


def close_seed_run(stage: Stage, saved: ModelFile, final: Path) -> None:
    """Send what the store missed, the summary and the facts, then end the seed run FINISHED.

    Idempotent: a re-run after a store outage calls it again for a seed it does not retrain.
    """
    tracker, run_id, result = stage.tracker, saved.run_id, saved.result
    if tracker.status(run_id) == "FINISHED":
        return
    trash.refuse_deleted(tracker, run_id, f"seed {saved.seed}'s", saved.variant, stage.fresh_command)
    held = held_epochs(tracker, run_id) if saved.pending_metrics else set()
    pending = [p for p in saved.pending_metrics or [] if p[0] not in held]
    hooks = EpochHooks(tracker, run_id, pending, background=False)
    try:
        with said_while_waiting(f"seed {saved.seed}", tracker.uri):
            hooks.flush()
            tracker.log_params(run_id, result.params())
            tracker.log_metrics(run_id, result.metrics(), step=len(saved.history))
            tracker.set_tags(run_id, {"diverged": str(result.diverged).lower()})
            tracker.end(run_id, "FINISHED")
    except Exception as err:
        # hostile pass H: under --fresh, "the same command" trained the seed again into a new run
        same = "the same command without --fresh" if stage.fresh else "the same command"
        raise TrackingError(
            f"seed {saved.seed} trained, but MLflow store {tracker.uri} did not take run {run_id}'s "
            f"records ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}). The "
            f"model and the missing metrics are kept in {final}: once the store answers, re-run {same}; "
            f"it sends them to run {run_id} and trains nothing again."
        ) from None


def system_metrics(stage: Stage, run_id: str) -> SystemMetrics | None:
    """CPU/GPU utilisation and memory over the whole stage, on the variant run (the row the UI
    shows; system/ charts), if enabled. One sampler per stage: starting NVML and a sampler per
    seed cost about a second each time, for seeds that train in seconds."""
    return SystemMetrics(run_id, stage.tracker.uri) if stage.system_metrics else None


class SystemMetrics:
    """MLflow's system-metrics sampler in a process of its own (`ampbench system-metrics`), which
    ends when the training process closes its stdin or dies. In the training process its thread
    took the GIL every second and cost the AMP variants about 10% of their images/s on an H200
    (docs/BENCHMARKS.md); with a warm-start server the process is a fork that starts at once."""

    READY = b"sampling\n"

    def __init__(self, run_id: str, uri: str, ready_timeout_s: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ampbench", "system-metrics", run_id, uri],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout: float) -> None:
        """Until the sampler samples: its start (imports, NVML, the store) is seconds of work a
        plain process does beside the first seed otherwise, whose epochs then ran ~30% slower on
        the H200 host. Without the line in time (or a sampler that died) training goes on."""
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line != self.READY:
            log.warning("system metrics: the sampler did not start within %.0f s; training goes on", timeout)

    def finish(self) -> None:
        """Stop sampling: the sampler logs what it holds and ends the run's system metrics."""
        with contextlib.suppress(OSError):  # an explicit stop: forked DataLoader workers hold the pipe
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def system_metrics_main(run_id: str, uri: str) -> int:
    """The sampler process: MLflow's monitor on `run_id` until stdin closes."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # its "Started monitoring" / "Stopping" / "Successfully terminated": 3 lines a stage of noise
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    # 1 s: a seed trains in seconds on a fast GPU, MLflow's default 10 s would record nothing.
    monitor = SystemMetricsMonitor(run_id, sampling_interval=1, resume_logging=True, tracking_uri=uri)
    monitor.start()
    sys.stdout.buffer.write(SystemMetrics.READY)  # the trainer waits for this line
    sys.stdout.buffer.flush()
    try:
        sys.stdin.buffer.readline()  # "stop", or EOF when the training process is gone
    finally:
        monitor.finish()
    return 0
