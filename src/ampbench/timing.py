"""Where a stage's seconds go: the process's age, and the stage's breakdown for MLflow (`time/*`)."""

from __future__ import annotations

import math
import os
import time


def process_age() -> float:
    """Seconds since this process started (interpreter start and imports included), from the kernel's
    record of it (/proc); nan without /proc."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return math.nan
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def process_seconds() -> float:
    """Wall time since this process started (``process_age``; without /proc, since this module
    loaded)."""
    age = process_age()
    return max(0.0, age) if age == age else time.monotonic() - _LOADED


_LOADED = time.monotonic()


_command_start: list[float] = []  # set when a later command of this process begins


def command_starts() -> None:
    """Another command begins in this process (`ampbench variant` runs download, train and evaluate
    in one): the next StageClock counts its start-up from here, not from the process's start, so
    that evaluate's start-up is not the training before it."""
    _command_start[:] = [time.perf_counter()]


def command_age() -> float:
    """Seconds since this command began: its process's start, or the later start that
    ``command_starts`` or ``started_before`` set."""
    return time.perf_counter() - _command_start[0] if _command_start else process_seconds()


def started_before(seconds: float) -> None:
    """This process is a warm server's fork for a client that started ``seconds`` ago: start-ups
    count from the client's start, as they would have in a process of its own."""
    _command_start[:] = [time.perf_counter() - seconds]


class StageClock:
    """Named parts of a stage, each timed from the end of the previous one: `mark("setup")` after the
    set-up is done records its seconds. ``breakdown()`` adds the start-up (process start to this
    clock's creation) and the stage total, as `time/<part>_seconds` MLflow metric names."""

    def __init__(self, startup: float | None = None) -> None:
        # startup: the process's age (default), or 0 for a later part of a process that does
        # several units of work (evaluate's variants after the first)
        if startup is None:
            startup = time.perf_counter() - _command_start[0] if _command_start else process_age()
        self.startup = startup
        self.t0 = self.last = time.perf_counter()
        self.parts: dict[str, float] = {}

    def mark(self, part: str) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        return seconds

    def breakdown(self, prefix: str = "") -> dict[str, float]:
        """`time/<prefix><part>_seconds` for start-up, every part, and the stage so far."""
        out = {f"time/{prefix}startup_seconds": self.startup}
        out.update({f"time/{prefix}{k}_seconds": v for k, v in self.parts.items()})
        out[f"time/{prefix}stage_seconds"] = self.startup + time.perf_counter() - self.t0
        return {k: v for k, v in out.items() if not math.isnan(v)}
