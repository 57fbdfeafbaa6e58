"""Stage `train@<parallel>-<precision>`: train one variant once per seed, tracked in MLflow.

    ampbench train --parallel single --precision autocast
    ampbench train --parallel ddp --precision fp32        # launches torchrun itself

For each seed it writes ``models/<parallel>-<precision>/seed-<seed>/model.pt`` (weights, config,
MLflow run id, results). While a seed trains, ``checkpoint.pt`` beside it holds everything needed
to resume; re-running the stage after a crash continues from the last complete epoch in the same
MLflow run. A finished seed (``model.pt``, no checkpoint) is trained afresh in a new run, which is
what ``dvc repro -f`` asks for.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

from ampbench import checkpoint, data, engine, loader, parallel, precision
from ampbench.config import Config
from ampbench.tracking import EpochHooks, Tracker, environment_facts

log = logging.getLogger(__name__)


class ResumeError(RuntimeError):
    """A checkpoint exists for a different configuration."""


class StopFlag:
    """SIGTERM / Ctrl-C only set a flag; the loop stops at the next step boundary.

    A second signal of the same kind falls back to the default behaviour (stop now).
    With ``watch_parent`` (DDP workers) the death of the parent process sets the flag too:
    torchrun starts workers in sessions of their own, so a kill -9 of the launcher's process
    group would otherwise leave them training on as orphans.
    """

    def __init__(self, watch_parent: bool = False) -> None:
        self.signum = 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        if watch_parent:
            threading.Thread(target=self._watch, args=(os.getppid(),), daemon=True).start()

    def _watch(self, parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        log.warning("parent process %d is gone: stopping at the next step boundary", parent)
        self.signum = self.signum or signal.SIGTERM

    def _handle(self, signum, frame) -> None:
        if self.signum == signum:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum = signum
        log.warning("%s received: stopping at the next step boundary", signal.Signals(signum).name)

    def __call__(self) -> bool:
        return bool(self.signum)


def variant_name(parallel_name: str, precision_name: str) -> str:
    return f"{parallel_name}-{precision_name}"


def _load_resume(ckpt: Path, digest: str, variant: str, fresh: bool, strategy) -> dict | None:
    state = checkpoint.load(ckpt) if ckpt.exists() else None
    strategy.barrier()  # every rank has read it before rank 0 may discard it
    if state is None:
        return None
    if state.get("config_digest") == digest and state.get("variant") == variant:
        return state
    if fresh:
        if strategy.is_main:
            log.warning("discarding %s (written by another configuration): --fresh", ckpt)
            ckpt.unlink(missing_ok=True)
        return None
    raise ResumeError(
        f"{ckpt} was written by variant {state.get('variant')!r} with config "
        f"{state.get('config_digest')}, but this run is {variant!r} with config {digest}. "
        "Resuming would mix two experiments. Restore the old params to resume, or pass "
        "--fresh (ampbench train ... --fresh) to discard the checkpoint and start over."
    )


def train_variant(cfg: Config, parallel_name: str, precision_name: str, models_dir: Path,
                  data_file: Path, fresh: bool = False, stop=None) -> list[dict]:  # fmt: skip
    """Train every seed of one variant; return each seed's result (rank 0; others get [])."""
    variant = variant_name(parallel_name, precision_name)
    strategy = parallel.make(parallel_name, cfg.train.collective_timeout_s)
    strategy.setup()
    try:
        # Everything that can be checked is checked before MLflow or models/ are touched.
        per_process = strategy.per_process_batch(cfg.train.batch_size)
        dataset = data.load_dataset(data_file)
        loader.check_batch(cfg.train.batch_size, dataset)
        tf32 = precision.disable_tf32()
        tracker = None  # rank 0 only: several ranks creating a new sqlite store race its migrations
        if strategy.is_main:
            tracker = Tracker(cfg.tracking.experiment, cfg.tracking.preflight_timeout_s)
            tracker.preflight()
        out = models_dir / variant
        results = []
        for seed in cfg.train.seeds:
            job = engine.Job(cfg, precision.PRECISIONS[precision_name], strategy, dataset, seed,
                             out / f"seed-{seed}" / "checkpoint.pt", stop or (lambda: False))  # fmt: skip
            extra = {"per_process_batch": per_process, **tf32}
            results.append(_train_one(job, variant, tracker, extra, fresh))
        return results if strategy.is_main else []
    finally:
        strategy.teardown()


def _train_one(job: engine.Job, variant: str, tracker: Tracker | None, extra: dict, fresh: bool) -> dict:
    cfg, strategy, main = job.cfg, job.strategy, job.strategy.is_main
    digest = cfg.digest()
    resume = _load_resume(job.checkpoint_path, digest, variant, fresh, strategy)
    parallel_name, precision_name = variant.split("-", 1)
    run_id = resume["run_id"] if resume else None
    if main and run_id:
        tracker.resume(run_id)
    elif main:
        params = {**cfg.flat(), "variant": variant, "parallel": parallel_name,
                  "precision": precision_name, "seed": job.seed, **environment_facts(), **extra}  # fmt: skip
        tags = {"parallel": parallel_name, "precision": precision_name, "seed": job.seed}
        run_id = tracker.start(variant, tags, params)
        job.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        job.checkpoint_path.with_name("run_id").write_text(run_id + "\n")  # for the launcher
        log.info("seed %d: MLflow run %s (%s)", job.seed, run_id, tracker.uri)
    meta = {"config_digest": digest, "variant": variant, "run_id": run_id}
    hooks = EpochHooks(tracker, run_id) if main else None
    try:
        out = engine.train_seed(job, hooks, resume, meta)
    except engine.Stopped:
        if main:
            tracker.end(run_id, "KILLED")
        raise
    except BaseException:
        if main:
            tracker.end(run_id, "FAILED")
        raise
    result = out["result"]
    if main:
        facts = {k: v for k, v in result.items() if isinstance(v, (str, bool)) and k != "diverged"}
        facts.update(devices_used=result["devices_used"], world_size=result["world_size"])
        tracker.log_params(run_id, facts)
        summary = {k: result[k] for k in ("train_seconds", "first_epoch_seconds",
                   "images_per_second", "peak_memory_mb", "epochs_completed")}  # fmt: skip
        summary["diverged"] = int(result["diverged"])
        if result["diverged"]:
            summary.update(diverged_epoch=result["diverged_epoch"], diverged_step=result["diverged_step"])
        tracker.log_metrics(run_id, summary)
        tracker.set_tags(run_id, {"diverged": str(result["diverged"]).lower()})
        final = job.checkpoint_path.with_name("model.pt")
        checkpoint.save(
            {"state_dict": out["state_dict"], "config": dataclasses.asdict(cfg), "variant": variant,
             "seed": job.seed, "run_id": run_id, "classes": list(job.data["classes"]),
             "result": result, "history": out["history"]},
            final,
        )  # fmt: skip
        job.checkpoint_path.unlink(missing_ok=True)
        tracker.end(run_id, "FINISHED")
    strategy.barrier()
    return {"seed": job.seed, "run_id": run_id, **result}
