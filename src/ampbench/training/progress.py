"""A progress bar over a train stage's whole work, and honest time estimates from its first steps.

``StageProgress`` (``for_stage``: one per train stage) is told about every step by the loop. It
draws a bar over the stage's work beside the per-epoch bar, times the first steps after the
warm-up (two device syncs, and one at the first epoch's end), and logs on rank 0: the expected
time of this stage (at DEBUG in a demo), again after the first epoch from its steps and test
evaluation as they really took; the time the whole study still needs (not in a demo); and, when
the study is long on a CPU, a pointer to ``make demo``. Step counting and ``ampbench estimate``
(``preflight``) live in ``ampbench.training.study_cost``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from ampbench.config import Config
from ampbench.timing import process_seconds
from ampbench.training.heartbeat import Heartbeat
from ampbench.training.measure import sync
from ampbench.training.study_cost import (
    eval_steps,
    fmt_duration,
    fmt_step,
    long_on_cpu_hint,
    preflight,
    remaining_seed_steps,
    seed_work,
    study_variants,
)

# Re-exported: `ampbench estimate` calls progress.preflight.
__all__ = ["StageProgress", "fmt_duration", "for_stage", "preflight"]

log = logging.getLogger(__name__)


class StageProgress:
    """One train stage's progress bar, step timing and time estimates (quiet on ranks > 0)."""

    def __init__(
        self,
        cfg: Config,
        variant: str,
        steps_per_epoch: int,
        n_test: int,
        device_type: str,
        enabled: bool = True,
        warmup_steps: int = 2,
        min_timed_s: float = 1.0,
        min_timed_steps: int = 3,
        models_dir: Path = Path("models"),
        work_dir: Path = Path("checkpoints"),
        params_file: str | Path = "params.yaml",
        overrides: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.cfg, self.variant, self.spe, self.n_test = cfg, variant, steps_per_epoch, n_test
        self.device_type, self.enabled = device_type, enabled
        self.seeds = list(cfg.train.seeds)
        self.warmup_steps, self.min_timed_s, self.min_timed_steps = warmup_steps, min_timed_s, min_timed_steps
        self.models_dir, self.work_dir = models_dir, work_dir
        self.variants = study_variants(params_file, overrides)  # the command's --set narrows them too
        self.per_seed = cfg.train.epochs * steps_per_epoch
        self.created = time.perf_counter()
        self.startup_s = process_seconds()  # imports, data loading, tracking preflight
        self.seed_setup_s: float | None = None
        self.step_s: float | None = None
        self.eval_s: float | None = None  # one test evaluation, once one was timed
        self.estimate: dict | None = None
        self.corrected = False  # the estimate after the first epoch was made
        # A GPU's first evaluation runs its shapes for the first time (cuDNN autotuning: 1.7 s
        # where later ones take 0.1 s), so its second is timed; a CPU's first is typical.
        self._epochs_to_time, self._epochs_timed = (2 if device_type == "cuda" else 1), 0
        self._epoch_steps, self._last_step_t = 0, 0.0
        self.seed = self.epoch = self.step_in_epoch = 0
        self._calls = 0
        self._t0 = 0.0  # perf_counter at the start of the timed steps
        self._epoch_t0 = time.perf_counter()
        self.bar = None
        if enabled:
            from tqdm import tqdm

            total, desc = len(self.seeds) * self.per_seed, f"{variant} (all seeds)"
            self.bar = tqdm(total=total, desc=desc, unit="step", position=0, dynamic_ncols=True, disable=None)
        # No bar drawn (output not a terminal): a line every HEARTBEAT_S instead, timed from start.
        no_bar = enabled and getattr(self.bar, "disable", True)
        self.heartbeat = Heartbeat(no_bar, self.created - self.startup_s)

    def start_seed(self, seed: int, epoch: int = 0, step: int = 0) -> None:
        """A seed starts (or resumes at epoch/step): the stage bar jumps to its place."""
        self.seed, self.epoch, self.step_in_epoch = seed, epoch, step
        self._calls = 0  # time the first steps of this seed's model, not the previous one's
        if self.seed_setup_s is None:
            self.seed_setup_s = time.perf_counter() - self.created
        self._epoch_t0, self._epoch_steps = time.perf_counter(), 0
        if self.bar is not None:
            self.bar.n = self.seeds.index(seed) * self.per_seed + epoch * self.spe + step
            self.bar.refresh()

    def step(self, device: torch.device | None = None) -> bool:
        """One training step is done (its kernels may still run: syncs only to time the window).
        True once the step time is measured, or a heartbeat line is due: the caller then calls
        :meth:`report` (outside its clock: a log line, not training)."""
        measured = self._time_step(device)
        return self.heartbeat.due(self._last_step_t) or measured

    def _time_step(self, device: torch.device | None) -> bool:
        self.step_in_epoch += 1
        self._epoch_steps += 1
        if self._epochs_timed < self._epochs_to_time and self.step_in_epoch == self.spe:
            # A GPU step returns when queued: unsynced (at most twice; the epoch clock syncs
            # here anyway) the steps look fast and the evaluation absorbs their queue.
            sync(device)
        self._last_step_t = time.perf_counter()
        if self.bar is not None:
            self.bar.update()
        if self.step_s is not None:
            return False
        self._calls += 1
        if self._calls == self.warmup_steps:
            sync(device)
            self._t0, self._timed = time.perf_counter(), 0
        elif self._calls > self.warmup_steps:
            self._timed += 1
            elapsed = time.perf_counter() - self._t0
            if self._timed >= self.min_timed_steps and elapsed >= self.min_timed_s:
                sync(device)
                self.step_s = (time.perf_counter() - self._t0) / self._timed
                return True
        return False

    def epoch_done(self, device: torch.device | None = None, say: bool = True) -> None:
        """An epoch ended (after evaluation and checkpoint). After the first one this process
        trained, the estimate is made again from how long its steps and its evaluation took, and
        said unless ``say`` is False (a stop is under way: its lines come next)."""
        now = time.perf_counter()
        measure = self._epochs_timed < self._epochs_to_time and self._epoch_steps
        if measure:
            self._measure_epoch(now)
        self.epoch, self.step_in_epoch, self._epoch_steps = self.epoch + 1, 0, 0
        self._epoch_t0 = now
        if measure and say and self.stage_left_s() > 0:  # what is left from the next epoch on
            self.report(corrected=self.estimate is not None)

    def _measure_epoch(self, now: float) -> None:
        """Step time from the first epoch's steps after the warm-up (all of them if it had none
        timed); the time from its last step to its end is its evaluation where it had one (not a
        GPU's first)."""
        self._epochs_timed += 1
        if not self.corrected:
            self.corrected = True
            timed = self._epoch_steps - self.warmup_steps
            if self._t0 and timed > 0:
                self.step_s = (self._last_step_t - self._t0) / timed
            else:
                self.step_s = (self._last_step_t - self._epoch_t0) / self._epoch_steps
        evaluated = self.cfg.train.eval_each_epoch or self.epoch == self.cfg.train.epochs - 1
        if evaluated and self._epochs_timed == self._epochs_to_time:
            self.eval_s = now - self._last_step_t  # its checkpoint and logging too: ms

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # --- estimates ---------------------------------------------------------------------------
    def _one_eval_s(self) -> float:
        """One test evaluation: as timed, else in step units at the measured step time."""
        return self.eval_s if self.eval_s is not None else eval_steps(self.cfg, self.n_test) * self._step()

    def _step(self) -> float:
        """The step time, once measured (the estimates are made only then)."""
        assert self.step_s is not None, "no step time measured yet"
        return self.step_s

    def stage_left_s(self) -> float:
        cfg, later = self.cfg, self.seeds[self.seeds.index(self.seed) + 1 :]
        steps, evals = seed_work(cfg, self.spe, self.epoch, self.step_in_epoch)
        whole_steps, whole_evals = seed_work(cfg, self.spe)
        steps, evals = steps + len(later) * whole_steps, evals + len(later) * whole_evals
        return steps * self._step() + evals * self._one_eval_s() + len(later) * (self.seed_setup_s or 0.0)

    def study_left_s(self, stage_left: float) -> tuple[float, int]:
        """Seconds the rest of the study needs after this stage, and how many variants it counts."""
        cfg, total, others = self.cfg, 0.0, 0
        for variant in (v for v in self.variants if v != self.variant):
            steps = sum(
                remaining_seed_steps(cfg, variant, s, self.spe, self.n_test, self.models_dir, self.work_dir)
                for s in self.seeds
            )
            if steps:
                others += 1
                total += steps * self._step() + len(self.seeds) * (self.seed_setup_s or 0.0)
                total += self.startup_s  # the stage's own start: imports, data, tracking
        # evaluate (startup + one test pass per seed) and compare stages of every variant
        n_variants, test_pass = len(self.variants), self._one_eval_s()
        per_eval = self.startup_s + len(self.seeds) * test_pass
        return total + n_variants * per_eval + self.startup_s, others

    def report(self, corrected: bool = False) -> dict | None:
        """Log the stage and study estimates once the step time is known (rank 0); `corrected`:
        again after the first epoch, from its measured steps and evaluation. Else a heartbeat."""
        if not corrected and (self.step_s is None or self.estimate is not None):
            self.heartbeat.say(self, self.stage_left_s() if self.step_s is not None else None)
            return self.estimate
        elapsed = process_seconds()
        stage_left = self.stage_left_s()
        study_left, others = self.study_left_s(stage_left)
        first = self.estimate
        self.estimate = {
            "step_seconds": self.step_s,
            "eval_seconds": self.eval_s,
            "stage_seconds": elapsed + stage_left,
            "stage_left_seconds": stage_left,
            "study_left_seconds": stage_left + study_left,
            # `ampbench variant` / `mlflow run`: the evaluate stage after it, in this process
            "run_left_seconds": stage_left + len(self.seeds) * self._one_eval_s(),
        }
        if not self.enabled:
            return self.estimate
        if self.bar is not None:
            self.bar.set_postfix_str(f"stage ~{fmt_duration(elapsed + stage_left)}", refresh=True)
        variant_only = os.environ.get("AMPBENCH_SCOPE") == "variant"  # `mlflow run`: no study
        if corrected and first is not None:
            # Said where it moved the stage's own time (start-up aside) by over a quarter, or
            # where one run is all there is to watch; else for --debug only.
            own, moved = elapsed + stage_left - self.startup_s, elapsed + stage_left - first["stage_seconds"]
            said = variant_only or abs(moved) > 0.25 * own
            log.log(logging.INFO if said else logging.DEBUG, "%s", self._corrected_line(elapsed))
            return self.estimate
        t = self.cfg.train
        stage = (
            f"{self.variant}: {fmt_step(self._step())} per step of {t.batch_size} images on "
            f"{self.device_type} (measured after the warm-up). Expected time of this stage "
            f"({len(self.seeds)} seed(s) x {t.epochs} epochs x {self.spe} steps): "
            f"{fmt_duration(elapsed + stage_left)} in all, {fmt_duration(stage_left)} left"
        )
        if variant_only:  # `ampbench variant` / `mlflow run`: one run to watch, no study
            log.info("%s; %s", stage, self._run_end(elapsed))
            return self.estimate
        if self.cfg.data.train_per_class or self.cfg.data.test_per_class:  # a demo: seconds, no study
            log.debug("%s.", stage)
            return self.estimate
        log.info(
            "%s. The whole study still needs about %s on this machine (this stage, %d other "
            "unfinished variant(s) of the study's %d, their evaluations and the comparison), assuming "
            "the others run at this one's speed.",
            stage,
            fmt_duration(stage_left + study_left),
            others,
            len(self.variants),
        )
        if hint := long_on_cpu_hint(self.device_type, self.variant, stage_left + study_left):
            log.warning("%s", hint)
        return self.estimate

    def _run_end(self, elapsed: float) -> str:
        """`ampbench variant`'s words: the evaluation after the stage, and when the run ends."""
        e = self.estimate or {}
        evaluation = e["run_left_seconds"] - e["stage_left_seconds"]
        return (
            f"then its evaluation, about {fmt_duration(evaluation)}: the run ends in about "
            f"{fmt_duration(e['run_left_seconds'])} ({fmt_duration(elapsed + e['run_left_seconds'])} in all)."
        )

    def _corrected_line(self, elapsed: float) -> str:
        e = self.estimate or {}
        measured = f"steps {fmt_step(self._step())} each" + (
            f", test evaluation {self.eval_s:.1f} s" if self.eval_s is not None else ""
        )
        which = "first" if self._epochs_timed == 1 else "second"
        head = f"{self.variant}, after its {which} epoch ({measured}): this stage needs about "
        head += f"{fmt_duration(e['stage_left_seconds'])} more ({fmt_duration(e['stage_seconds'])} in all)"
        if os.environ.get("AMPBENCH_SCOPE") == "variant":
            return f"{head}; {self._run_end(elapsed)}"
        return f"{head}; the whole study about {fmt_duration(e['study_left_seconds'])} more."


def for_stage(
    cfg: Config, variant: str, dataset: dict, strategy, models_dir: Path, work_dir: Path, overrides=()
) -> StageProgress:
    """The StageProgress of one train stage (what train.train_variant builds before its seeds)."""
    steps_per_epoch = len(dataset["train_labels"]) // cfg.train.batch_size
    # CUDA graphs: eager warm-up steps, then the capture; CPU: the first steps allocate.
    warmup = getattr(strategy, "graph_warmup_steps", 0) + 2 if strategy.device.type == "cuda" else 2
    return StageProgress(
        cfg,
        variant,
        steps_per_epoch,
        len(dataset["test_labels"]),
        strategy.device.type,
        enabled=strategy.is_main,
        warmup_steps=warmup,
        models_dir=models_dir,
        work_dir=work_dir,
        overrides=overrides,
    )
