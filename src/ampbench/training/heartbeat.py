"""A train stage's progress line every ``HEARTBEAT_S`` seconds where no bar is drawn.

The bars (tqdm) show only on a terminal. Where output goes to a log file, a ``| tee``, CI or a
notebook cell, a stage on a CPU would otherwise say nothing from its first estimate to its end
of seed: an hour for the study's fp32 variant on two cores. The line is logged from the step
loop at a step boundary, inside the epoch clock's pause (training/loop.py): it is not counted as
training time.
"""

from __future__ import annotations

import logging
import time

from ampbench.training.study_cost import fmt_duration

HEARTBEAT_S = 20.0  # under the 30 s a user waits before wondering whether anything happens

log = logging.getLogger("ampbench.training.progress")


class Heartbeat:
    """Whether a line is due: ``on`` only where no bar is drawn; ``since``: the perf_counter of
    the last line this stage printed (or of the process's start)."""

    def __init__(self, on: bool, since: float) -> None:
        self.on, self.last, self.pending = on, since, False

    def due(self, now: float) -> bool:
        """Called at each step (with the step's perf_counter): True once a line is due."""
        if self.on and now - self.last >= HEARTBEAT_S:
            self.pending = True
        return self.pending

    def said(self) -> None:
        """A heartbeat was printed: the wait starts over. (Other lines do not reset it: a heartbeat
        soon after an estimate costs a line; one missing after a line at DEBUG would cost a wait.)"""
        self.last, self.pending = time.perf_counter(), False

    def say(self, stage, left_s: float | None) -> None:
        """The line for ``stage`` (a ``progress.StageProgress``): where it is (seed, epoch of
        epochs, step of steps), the share of its steps done and, once the step time is measured,
        the time left."""
        s = stage
        done = s.seeds.index(s.seed) * s.per_seed + s.epoch * s.spe + s.step_in_epoch
        left = f", about {fmt_duration(left_s)} left" if left_s is not None else ""
        log.info(
            "%s: seed %d, epoch %d/%d, step %d/%d: %.0f%% of this stage done%s",
            s.variant, s.seed, s.epoch + 1, s.cfg.train.epochs, s.step_in_epoch, s.spe,
            100 * done / (len(s.seeds) * s.per_seed), left,
        )  # fmt: skip
        self.said()
