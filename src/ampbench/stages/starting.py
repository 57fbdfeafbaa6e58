"""A line while a train stage starts: on a loaded machine the fork or imports, the data, the
model and its warm-up steps can take over half a minute before the first progress line (hostile
re-run: 32.6 s after DVC's "Running stage" on a 2-core machine running CI beside it). The evaluate
and compare stages use it too (hostile re-run: 31-32 s before their first line under load).

``StartingLine`` logs one line ``STARTING_S`` seconds into the stage (half the 30 s a user waits
before wondering) unless the stage said something first (any ampbench line at INFO or above:
its estimate, "resuming seed ...", a fault).
It says so again every ``AGAIN_S`` until then. Its thread ends at the first such line, so nothing
of it runs beside the timed steps after the stage's first line (the first epoch is the warm-up).

Its filter runs for every line, a signal handler's included (a stop's "SIGHUP received"), which may
run at any bytecode of the filter's own run. So the filter takes no lock: a flag, and a byte down
a pipe to wake the watch (CI: the stop handler's line waited forever for the lock of a
``threading.Event.set`` the interrupted line held).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading

from ampbench.timing import command_age

TRAINING = "loading the data, building the model, timing its first steps"
STARTING_S = 15.0  # a fault found in the first seconds (a store that does not answer: ~10 s) stays one line
AGAIN_S = 20.0  # then a line this often until the stage's first line

log = logging.getLogger(__name__)


class StartingLine(logging.Filter):
    def __init__(
        self, variant: str, seconds: float | None = None, on: bool = True, doing: str = TRAINING
    ) -> None:
        """``on``: False for a DDP worker of rank > 0 (rank 0 speaks for the stage); ``doing``: what
        the stage does meanwhile (evaluate and compare say their own)."""
        super().__init__()
        self.variant, self.on, self.doing = variant, on, doing
        self.first_s = STARTING_S if seconds is None else seconds
        self.said = False  # the stage's own first line, or its end (read by the watch, never locked)
        self._wake = (-1, -1)  # the watch's pipe: read end, write end
        self.thread = threading.Thread(target=self._watch, name="starting-line", daemon=True)
        self.handlers = list(logging.getLogger().handlers)

    def __enter__(self) -> StartingLine:
        if self.on:
            self._wake = os.pipe()
            for handler in self.handlers:
                handler.addFilter(self)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._spoke()
        for handler in self.handlers:
            handler.removeFilter(self)
        if self.thread.is_alive():
            self.thread.join(5)  # woken by the byte: it only has to see it
        if not self.thread.is_alive():  # else it may still wait on the pipe: it stays
            for fd in self._wake:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def filter(self, record: logging.LogRecord) -> bool:
        """Every record passes; the first ampbench line of the stage ends the watch."""
        if record.levelno >= logging.INFO and record.name.startswith("ampbench") and record.name != __name__:
            self._spoke()
        return True

    def _spoke(self) -> None:
        if not self.said:  # a handler's line in between writes a second byte: harmless
            self.said = True
            with contextlib.suppress(OSError):  # not entered (off): no pipe, nobody waits
                os.write(self._wake[1], b"!")

    def _watch(self) -> None:
        # Again every AGAIN_S until the stage speaks: a start that never ends (a model factory that
        # hangs, a data set on a stalled disk) is not a silence either (final pass H: 78 s).
        wait = self.first_s
        while not self.said and not select.select([self._wake[0]], [], [], wait)[0] and not self.said:
            # counted from the command's start, its imports included (hostile re-run: "15 s so
            # far" came 23-25 s after the command was started on a loaded machine)
            log.info("%s: starting (%.0f s so far): %s", self.variant, command_age(), self.doing)
            wait = AGAIN_S
