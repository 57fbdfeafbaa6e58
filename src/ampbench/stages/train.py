"""Stage `train@<parallel>-<precision>`: train one variant once per seed, tracked in MLflow.

    ampbench train --parallel single --precision autocast
    ampbench train --parallel ddp --precision fp32        # launches torchrun itself

Work in progress lives in ``checkpoints/<variant>/`` (git-ignored and no DVC output, so neither
``dvc repro`` nor ``dvc exp run`` deletes it): ``variant.json`` (the variant's MLflow run),
``seed-<s>/run.json`` (the seed's run), ``seed-<s>/checkpoint.pt`` while the seed trains and
``seed-<s>/model.pt`` once it is done (``checkpoints.state``: SeedCheckpoint, ModelFile).
Re-running the stage after a crash skips finished seeds, resumes the interrupted one from its
checkpoint, and reuses every MLflow run it had started.
Only when every seed is done are the models published (hard links) as
``models/<variant>/seed-<s>/model.pt``, the stage's DVC output, and the work folder removed; a
later run (``dvc repro -f``) therefore trains every seed afresh, in new runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import NamedTuple

from ampbench import interrupts
from ampbench.checkpoints import work as work_folder
from ampbench.checkpoints.state import ModelFile
from ampbench.config import Config
from ampbench.data import prepared
from ampbench.seed_result import SeedResult
from ampbench.timing import StageClock
from ampbench.tracking import train_runs
from ampbench.tracking.tracker import Tracker
from ampbench.training import build, factory, loader, loop, memory_check, parallel, precision, progress
from ampbench.variants import variant_name

log = logging.getLogger(__name__)


class Trained(NamedTuple):
    """One seed the stage trained (or found trained): its MLflow run and result."""

    seed: int
    run_id: str | None
    result: SeedResult


def train_variant(
    cfg: Config,
    parallel_name: str,
    precision_name: str,
    models_dir: Path,
    data_file: Path,
    fresh: bool = False,
    stop=None,
    work_dir: Path = Path("checkpoints"),
    before_publish=None,
    command: list[str] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> list[Trained]:
    """Train every seed of one variant; return each seed's result (rank 0; others get []).

    ``before_publish`` (rank 0, once every seed is done): a last check that may refuse to publish.
    ``command``: the stage's own arguments (what a fix that starts afresh repeats, with --fresh);
    ``overrides``: its --set (variants.* narrow the study its estimates count)."""
    clock = StageClock()  # where the stage's seconds go: time/* on the variant run
    variant = variant_name(parallel_name, precision_name)
    strategy = parallel.make(parallel_name, cfg.train.collective_timeout_s)
    strategy.setup()
    build.import_compiler_early()  # overlaps the set-up below
    try:
        # Everything that can be checked is checked before MLflow or models/ are touched.
        per_process = strategy.per_process_batch(cfg.train.batch_size)
        dataset = prepared.load_dataset(data_file)
        loader.check_batch(cfg.train.batch_size, dataset, cfg.train.epochs)
        memory_check.check_fits(cfg, strategy.device, len(dataset["classes"]), memory_check.local_processes())
        if cfg.model.name != "alexnet":  # its factory and dry forward checked before any run (CPU)
            factory.build(cfg.model, len(dataset["classes"]), cfg.data.image_size)
        tf32 = precision.set_tf32(precision.REGISTRY[precision_name].tf32_on(strategy.device))  # as setup
        work = work_dir / variant
        work_folder.refuse_foreign(work, cfg.train.seeds, cfg.digest(), variant, fresh, cfg.digested())
        work_folder.check_writable(work, models_dir / variant)
        stage = None  # rank 0 only: several ranks creating a new sqlite store race its migrations
        if strategy.is_main:
            tracker = Tracker.from_config(cfg)
            tracker.preflight()
            stage = train_runs.Stage(tracker, "", data_file, cfg, fresh)  # its variant run: _train_seeds
            stage.fresh_command = work_folder.fresh_command(command) if command else None
            log.debug("%s: MLflow runs at %s", variant, tracker.link())  # compare prints it, last
        seeds = _SeedPlan(cfg, precision_name, strategy, dataset, work, stop, fresh)
        seeds.extra = {"per_process_batch": per_process, **tf32}
        seeds.before_publish = before_publish or (lambda: None)
        seeds.overrides = overrides
        results = _train_seeds(seeds, variant, stage, clock, models_dir, work_dir)
        return results if strategy.is_main else []
    finally:
        strategy.teardown()


class _SeedPlan:
    """What every seed of the stage shares: settings, precision, strategy, data, work folder."""

    def __init__(self, cfg, precision_name, strategy, dataset, work: Path, stop, fresh: bool) -> None:
        self.cfg, self.precision, self.strategy, self.dataset = (
            cfg,
            precision.REGISTRY[precision_name],
            strategy,
            dataset,
        )
        self.work, self.stop, self.fresh, self.extra = work, stop or (lambda: False), fresh, {}
        self.overrides: list[str] | tuple[str, ...] = ()  # the command's --set

    def job(self, seed: int, prog) -> loop.Job:
        ckpt = self.work / f"seed-{seed}" / "checkpoint.pt"
        job = loop.Job(self.cfg, self.precision, self.strategy, self.dataset, seed, ckpt, self.stop)
        job.progress = prog
        return job


def _train_seeds(plan: _SeedPlan, variant, stage, clock, models_dir: Path, work_dir: Path) -> list[Trained]:
    """Each seed in turn, then publish; the variant run ends FINISHED, KILLED or FAILED."""
    cfg, strategy = plan.cfg, plan.strategy
    monitor = None
    try:
        if stage:  # a stop while the run is made waits until variant.json names it, then ends it
            with interrupts.held():  # KILLED below (hostile pass V: left RUNNING for good)
                stage.variant_run_id = train_runs.variant_run(
                    stage.tracker, plan.work, variant, cfg, plan.fresh, stage.fresh_command
                )
            monitor = train_runs.system_metrics(stage, stage.variant_run_id)
        clock.mark("setup")  # CUDA and process group, data, MLflow store and variant run
        results = []
        prog = progress.for_stage(cfg, variant, plan.dataset, strategy, models_dir, work_dir, plan.overrides)
        for seed in cfg.train.seeds:
            if results and strategy.any(plan.stop()):  # not a next seed's run and set-up (hostile pass F)
                raise loop.Stopped(
                    f"stopped after seed {results[-1].seed}, before seed {seed}: the seeds trained are kept"
                )
            results.append(_train_one(plan.job(seed, prog), variant, stage, plan.extra, plan.fresh))
            clock.mark("seeds")
            if strategy.world_size == 1:  # params.yaml changed: no next seed (DDP's ranks go on together)
                plan.before_publish()
        prog.close()
        if strategy.any(plan.stop()):  # a stop after the last step boundary (hostile pass Q: dropped,
            # and the pipeline went on): the seeds wait unpublished; the re-run publishes, trains nothing
            raise loop.Stopped("stopped after the last training step, before publishing: every seed is kept")
        if strategy.is_main:
            plan.before_publish()  # e.g. params.yaml changed meanwhile: nothing is published
            work_folder.publish(plan.work, models_dir / variant, cfg.train.seeds)
            clock.mark("publish")
            train_runs.log_breakdown(stage, clock, [t.result for t in results])
    except BaseException as err:
        # A re-run resumes the variant run too (variant.json); until then it is not RUNNING.
        stopped = isinstance(err, (loop.Stopped, KeyboardInterrupt))
        train_runs.end_variant_run(stage, "KILLED" if stopped else "FAILED")
        raise
    finally:
        if monitor:
            monitor.finish()
    train_runs.end_variant_run(stage, "FINISHED")
    return results


def _train_one(
    job: loop.Job, variant: str, stage: train_runs.Stage | None, extra: dict, fresh: bool
) -> Trained:
    cfg, strategy, main = job.cfg, job.strategy, job.strategy.is_main
    digest = cfg.digest()
    done = work_folder.finished(job.checkpoint_path.with_name("model.pt"), variant, digest, fresh)
    strategy.barrier()  # every rank has decided before rank 0 may write anything
    if done:
        if main:  # once, not once per DDP worker (hostile pass C)
            said = "seed %d: already trained in this stage (run %s), not trained again"
            log.info(said, job.seed, done.run_id)
            train_runs.close_seed_run(stage, done, job.checkpoint_path.with_name("model.pt"))
        return Trained(job.seed, done.run_id, done.result)
    resume = work_folder.load_resume(
        job.checkpoint_path, digest, variant, fresh, strategy, job.cfg.digested()
    )
    run_id, hooks, meta = None, None, {}
    try:
        if main:  # a stop while the seed's run is made waits until run.json names it (as the variant's)
            with interrupts.held():
                run_id, hooks = train_runs.open_seed_run(stage, job, variant, digest, extra, resume, fresh)
        meta = {"config_digest": digest, "variant": variant, "run_id": run_id}
        out = loop.train_seed(job, hooks, resume, meta)
    except BaseException as err:
        if main and hooks:
            train_runs.end_seed_run(
                stage, run_id, hooks, "KILLED" if isinstance(err, loop.Stopped) else "FAILED"
            )
        raise
    if main:
        hooks.close()  # the sender's last try; what it could not send stays pending (model.pt)
        t0 = time.perf_counter()
        saved = _model_file(job, out, variant, run_id, stage.variant_run_id, hooks.state())
        try:
            saved.save(job.checkpoint_path.with_name("model.pt"))
        except BaseException:  # a full disk: the run ends FAILED, not RUNNING for good (final pass L)
            train_runs.end_seed_run(stage, run_id, hooks, "FAILED")
            raise
        job.checkpoint_path.unlink(missing_ok=True)
        out["result"].model_save_seconds = time.perf_counter() - t0  # in memory: the file is written
        train_runs.close_seed_run(stage, saved, job.checkpoint_path.with_name("model.pt"))
    strategy.barrier()
    return Trained(job.seed, run_id, out["result"])


def _model_file(job: loop.Job, out: dict, variant: str, run_id, variant_run_id, pending) -> ModelFile:
    """What model.pt holds of a seed ``loop.train_seed`` trained (``out``)."""
    return ModelFile(
        state_dict=out["state_dict"],
        config=dataclasses.asdict(job.cfg),
        variant=variant,
        seed=job.seed,
        run_id=run_id,
        variant_run_id=variant_run_id,
        config_digest=job.cfg.digest(),
        classes=list(job.data["classes"]),
        result=out["result"],
        history=out["history"],
        pending_metrics=pending,
    )
