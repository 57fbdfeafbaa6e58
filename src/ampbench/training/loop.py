"""The loop over epochs of one seed, the same for every variant. Imports no mlflow.

``train_seed`` reads in one sitting: per epoch, ``train_epoch`` (the steps: no host sync inside;
DDP ranks agree on stopping every `train.stop_check_every` steps), ``evaluate`` (test accuracy)
and ``end_epoch`` (divergence, the epoch's record, the checkpoint). Whatever happens, ``hooks``
hears about it (rank 0 records it in MLflow).

The loop saves a ``SeedCheckpoint`` itself once `train.checkpoint_every_s` seconds passed since
the seed started or last saved (rank 0's clock): at the next step boundary (several processes: the
next one where they agree on stopping), or at an epoch end (0: at every epoch end). A crash loses
at most that many seconds of training; a stop signal (SIGTERM, Ctrl-C) always saves. Every rank
takes the state from the parallel strategy (``strategy.state_dict``: a sharded one gathers it);
rank 0 writes it (atomically: ``ampbench/atomic.py``). The model is read, loaded and evaluated
only through the strategy. The time a save takes is the seed's ``checkpoint_seconds``, and a save
mid-epoch does not count as that epoch's training time.

The timed part of an epoch (``measure.timed_region``) runs the steps alone: the metrics sender
is held back, the cyclic collector is off, energy is read outside the clock, and the estimate's
log line pauses the clock. Each seed starts from a clean slate (``measure.clean_slate``), so its
memory and speed do not depend on the seeds before it in the process.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from ampbench.checkpoints import work
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.config import Config
from ampbench.seed_result import SeedResult
from ampbench.training import build, energy, factory, loader, measure
from ampbench.training.model import DtypeProbe
from ampbench.training.parallel import ParallelStrategy, agree
from ampbench.training.precision import PrecisionStrategy
from ampbench.training.step import epoch_metrics
from ampbench.training.stopping import Stopped

if TYPE_CHECKING:
    from ampbench.training.progress import StageProgress

log = logging.getLogger(__name__)
# tqdm's monitor thread wakes every 10 s to look at the bars: Python code beside the timed steps.
tqdm.monitor_interval = 0


@dataclass
class Job:
    """One seed of one variant: what to train, on what, where its checkpoint goes."""

    cfg: Config
    precision: PrecisionStrategy
    strategy: ParallelStrategy
    data: dict
    seed: int
    checkpoint_path: Path
    stop_requested: Callable[[], bool] = lambda: False
    progress: StageProgress | None = None  # stage bar and time estimates


class NullHooks:
    def on_epoch(self, epoch: int, metrics: dict) -> None:
        pass


def train_seed(job: Job, hooks=None, resume: SeedCheckpoint | None = None, meta: dict | None = None) -> dict:
    """Train one seed; return {"result": SeedResult, "history", "state_dict"}. Raises Stopped after a stop.

    ``resume``: the checkpoint to continue from. ``meta``: its ``config_digest``, ``variant`` and
    ``run_id``, written into every checkpoint. A failed checkpoint write raises CheckpointError.
    """
    measure.clean_slate(job.strategy.device)
    run = SeedTraining(job, hooks or NullHooks(), resume, meta)
    for epoch in range(run.state["epoch"], job.cfg.train.epochs):
        metrics = run.train_epoch(epoch)
        metrics.update(run.evaluate(epoch))
        if run.end_epoch(epoch, metrics):
            break
    return run.summary()


class SeedTraining:
    """One seed's state between epochs: trainer, step, data, history, when it last saved."""

    def __init__(self, job: Job, hooks, resume: SeedCheckpoint | None, meta: dict | None) -> None:
        t0 = time.perf_counter()
        self.job, self.cfg, self.strategy, self.hooks = job, job.cfg, job.strategy, hooks
        t, self.device = job.cfg.train, job.strategy.device
        torch.manual_seed(job.seed)  # identical initial weights on every rank and variant
        self.batches = loader.make(t.loader, job.data, t.batch_size, job.strategy, job.seed, t.workers)
        total = t.epochs * len(self.batches)
        stats = factory.data_stats(job.cfg.model, job.data["train_images"])  # the input's normalisation
        n_classes = len(job.data["classes"])
        self.trainer = build.setup(job.cfg, job.precision, job.strategy, n_classes, total, stats)
        self.step = build.make_step(self.trainer, job.cfg, job.strategy)
        # what each (DataParallel) replica really ran
        # (not under train.compile: the hook's first-call-only record would recompile the graph)
        compiled = self.trainer.compiler.enabled
        self.probe = None if compiled else DtypeProbe(self.trainer.raw_model)
        self.state: dict[str, Any] = {"epoch": 0, "step": 0, "history": [], "stats": None, "elapsed": 0.0}
        self.state["joules"] = 0.0
        # the GPUs this process drives: all visible ones under DataParallel, its own under DDP
        self.energy = energy.Energy(self.device, job.strategy.devices_used() // job.strategy.world_size)
        self.meta = {"config_digest": "", "variant": "", "run_id": None, **(meta or {})}
        if resume:
            work.restore(self.trainer, resume, job.checkpoint_path)
            for key in ("epoch", "step", "history", "stats", "elapsed", "joules"):
                self.state[key] = getattr(resume, key)
            say = log.info if job.strategy.is_main else log.debug  # once, not once per DDP worker
            say("resuming seed %d at epoch %d step %d", job.seed, self.state["epoch"] + 1, self.state["step"])
        self.test = (job.data["test_images"].to(self.device), job.data["test_labels"].to(self.device))
        self.memory = measure.PeakMemory(self.device)
        self.first_epoch = self.state["epoch"]  # this process's warm-up epoch (capture, autotuning)
        self.disturbed = 0  # timed epochs a slow metrics send overlapped
        self.result = {"diverged": False, **self.trainer.facts, **job.strategy.facts()}
        self.saves = {"checkpoint_seconds": 0.0, "checkpoints_written": 0}
        self.last_save = time.perf_counter()  # the timer starts with the seed, not at a first save
        self.times = {"eval_seconds": 0.0, "logging_seconds": 0.0, "setup_seconds": time.perf_counter() - t0}
        if job.progress:
            job.progress.start_seed(job.seed, self.state["epoch"], self.state["step"])

    def train_epoch(self, epoch: int) -> dict:
        """The epoch's steps (from a resumed step if any); raises Stopped on a requested stop."""
        stats = self.step.stats
        first = self.state["step"] if epoch == self.state["epoch"] else 0
        torch.manual_seed((self.job.seed * 100_003 + epoch) * 4099 + self.strategy.rank)  # dropout
        resumed = bool(first and self.state["stats"] is not None)
        stats.reset(self.state["stats"] if resumed else None)
        self.trainer.model.train()
        if epoch > self.first_epoch:
            self.memory.warmup_done()
        with measure.timed_region(self.hooks) as quiet:
            seconds, joules = self._steps(epoch, first, resumed)
        self.disturbed += not quiet
        self.totals = stats.totals(self.strategy)
        lr = float(self.trainer.sched.get_last_lr()[0])  # a device tensor when a CUDA graph is used
        scale = float(self.trainer.precision.scale())
        return epoch_metrics(self.totals, seconds, lr, scale, self._all_joules(joules))

    def _steps(self, epoch: int, first: int, resumed: bool) -> tuple[float, float | None]:
        """The epoch's steps from step `first`, timed: (seconds, joules). Raises Stopped on a stop."""
        t, stats, progress = self.cfg.train, self.step.stats, self.job.progress
        # seconds and joules of training; a resumed epoch's first part counts, its saves do not
        clock = measure.EpochClock(self.device, self.energy, *self._before(resumed))
        n = len(self.batches)
        bar = tqdm(
            self.batches.epoch(epoch, first),
            total=n,
            initial=first,
            leave=False,
            desc=f"seed {self.job.seed} epoch {epoch + 1}/{t.epochs}",
            disable=None if self.strategy.is_main else True,
        )  # None: off without a tty
        for i, (images, labels) in enumerate(bar, start=first):
            self.step(images, labels)
            self.trainer.sched.step()
            # no estimate once a stop is asked for: the stop's lines come next (hostile pass WARN)
            if progress and progress.step(self.device) and not self.job.stop_requested():
                with clock.pause():  # the estimate's log line is not training time
                    progress.report()
            # Every stop_check_every steps and at each epoch end (an epoch may be shorter than that).
            check = self.strategy.world_size == 1 or (i + 1) % t.stop_check_every == 0 or i + 1 == n
            if not check:
                continue
            stop, due = agree(self.strategy, self.job.stop_requested(), i + 1 < n and self.save_due())
            if stop:
                seconds, joules = clock.read()  # every rank is here: their joules summed
                self.save(epoch, i + 1, stats.snapshot(), seconds, self._all_joules(joules))
                where = f"seed {self.job.seed} epoch {epoch + 1} step {i + 1}"
                raise Stopped(f"stopped at {where}; checkpoint saved")
            if due:  # mid-epoch: the epoch end decides for itself
                with clock.pause() as (seconds, joules):
                    self.save(epoch, i + 1, stats.snapshot(), seconds, self._all_joules(joules))
        return clock.read()

    def _before(self, resumed: bool) -> tuple[float, float | None]:
        """A resumed epoch's first part, from its checkpoint: (seconds, joules); else nothing.
        The checkpoint holds every rank's joules summed (None where unknown): rank 0 brings them."""
        if not resumed:
            return 0.0, 0.0
        return self.state["elapsed"], self.state["joules"] if self.strategy.is_main else 0.0

    def _all_joules(self, joules: float | None) -> float | None:
        """The epoch's joules over every process's GPUs (a collective: every rank calls it)."""
        if self.strategy.world_size == 1:
            return joules
        t = torch.tensor([math.nan if joules is None else joules], device=self.device)
        total = float(self.strategy.all_sum(t).item())
        return None if math.isnan(total) else total

    def evaluate(self, epoch: int) -> dict:
        t = self.cfg.train
        if not (t.eval_each_epoch or epoch == t.epochs - 1):
            return {}
        t0 = time.perf_counter()
        acc = measure.accuracy(self.strategy.unwrap(self.trainer.raw_model), *self.test, t.eval_flip)
        self.times["eval_seconds"] += time.perf_counter() - t0
        return {"test_accuracy": acc}

    def end_epoch(self, epoch: int, metrics: dict) -> bool:
        """Divergence check, the epoch's record and checkpoint; True when training must stop."""
        t, totals = self.cfg.train, self.totals
        params = self.trainer.raw_model.parameters()  # this rank's (a shard, where sharded)
        weights_bad = not bool(torch.stack([p.isfinite().all() for p in params]).all())
        scale_bad = self.trainer.precision.diverged(totals.nonfinite, t.scale_floor)
        diverged, save_due = agree(self.strategy, weights_bad or scale_bad, self.save_due())
        self.state["history"].append({"epoch": epoch + 1, **metrics})
        if diverged:
            at = int(totals.first_bad) if totals.first_bad >= 0 else len(self.batches) - 1
            self.result.update(diverged=True, diverged_epoch=epoch + 1, diverged_step=at)
            log.warning("seed %d diverged at epoch %d step %d", self.job.seed, epoch + 1, at)
        # Record first, then checkpoint: a kill in between re-runs this epoch on resume and logs
        # the same values again, where the other order would lose this epoch's metrics.
        t0 = time.perf_counter()
        self.hooks.on_epoch(epoch + 1, metrics)
        self.times["logging_seconds"] += time.perf_counter() - t0
        last = epoch + 1 == t.epochs or diverged  # train.py writes model.pt next
        if not last and (save_due or not t.checkpoint_every_s):  # 0: always
            self.save(epoch + 1, 0, None)
        if self.job.progress:  # no estimate once a stop came (during the evaluation, say)
            self.job.progress.epoch_done(self.device, say=not self.job.stop_requested())
        return diverged

    def save_due(self) -> bool:
        """Rank 0, `train.checkpoint_every_s` > 0, and that many seconds since the last save."""
        every = self.cfg.train.checkpoint_every_s
        return bool(every) and self.strategy.is_main and time.perf_counter() - self.last_save >= every

    def save(
        self, epoch: int, step_in_epoch: int, partial, elapsed: float = 0.0, joules: float | None = 0.0
    ) -> None:
        """Checkpoint, before training goes on: every rank takes the state from the strategy,
        rank 0 writes it atomically; raises CheckpointError.

        (epoch, step_in_epoch): where a resume continues; `partial`: the partial epoch's
        statistics (None at an epoch end); `elapsed`, `joules`: its training seconds and the
        joules of every process's GPUs so far (None: unknown).
        """
        t0 = time.perf_counter()
        trainer_state = self.trainer.state()  # every rank: a sharded strategy gathers it
        if not self.strategy.is_main:
            return
        # metrics the tracking store has not taken yet: a re-run sends them
        pending = self.hooks.state() if hasattr(self.hooks, "state") else None
        checkpoint = SeedCheckpoint(
            epoch=epoch,
            step=step_in_epoch,
            stats=partial,
            elapsed=elapsed,
            joules=joules,
            history=self.state["history"],
            **trainer_state,
            rng_cpu=torch.get_rng_state(),
            seed=self.job.seed,
            hooks=pending,
            **self.meta,
        )
        checkpoint.save(self.job.checkpoint_path)
        self.last_save = time.perf_counter()
        self.saves["checkpoint_seconds"] += self.last_save - t0
        self.saves["checkpoints_written"] += 1

    def summary(self) -> dict:
        hist = self.state["history"]
        steady = [h["epoch_images_per_second"] for h in hist[1:] or hist]
        self.result.update(
            epochs_completed=len(hist),
            train_seconds=sum(h["epoch_seconds"] for h in hist),
            first_epoch_seconds=hist[0]["epoch_seconds"] if hist else math.nan,
            images_per_second=sum(steady) / max(1, len(steady)),
            epoch_cv=measure.spread(steady),  # the self-check: > 5% marks the variant noisy
            disturbed_epochs=self.disturbed,
            **self.memory.facts(),
            **energy.of_seed(hist),
            final_train_accuracy=hist[-1]["train_accuracy"] if hist else math.nan,
            final_test_accuracy=hist[-1].get("test_accuracy", math.nan) if hist else math.nan,
            replica_dtypes=self._replica_dtypes(),
            **self.saves,
            **self.times,
            **self.trainer.compiler.facts(),
            **self.step.graph_facts(),  # a model that could not be captured fell back to eager
        )
        result = SeedResult.from_dict(self.result)
        return {"result": result, "history": hist, "state_dict": self.trainer.weights()}  # every rank

    def _replica_dtypes(self) -> str:
        if self.probe is None:
            return "not recorded under train.compile"
        return self.probe.fact() or "not recorded (no training step ran)"
