"""Lines between measured pieces, so a slow machine is never silent for long: bench and explain
time windows of seconds each (minutes in all on a CPU), and no line may be printed inside a timed
window (the tool never measures itself). Between two pieces (a trainer built, a warm-up, a window,
a profile) ``between`` says where the measurement is, but only when ``EVERY_S`` passed since the
last line of ampbench: a fast GPU's run prints no more than before (hostile re-run: a loaded
2-core CPU was silent 38-54 s in bench and 31-44 s in explain, with a line every 20 s at most).

``watching()`` counts the command's own lines too (a rung's result, a plan), through a logging
filter on the handlers, so a line is added only to a silence.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from ampbench import interrupts

EVERY_S = 10.0  # plus the longest piece (a CPU window under load: ~15 s) stays under 30 s

log = logging.getLogger(__name__)
_last = [time.monotonic()]  # when ampbench last printed a line


def between(fmt: str, *args) -> None:
    """Log `fmt % args` if no line came for EVERY_S seconds; call only outside timed regions. A
    Ctrl-C that a finalizer swallowed stops the measurement here (``interrupts.check``)."""
    interrupts.check()
    if time.monotonic() - _last[0] > EVERY_S:
        log.info(fmt, *args)
        _last[0] = time.monotonic()


class _Heard(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO and record.name.startswith("ampbench"):
            _last[0] = time.monotonic()
        return True


@contextmanager
def watching():
    """While inside, every ampbench line (any module's) restarts the EVERY_S count."""
    heard, handlers = _Heard(), list(logging.getLogger().handlers)
    _last[0] = time.monotonic()
    for handler in handlers:
        handler.addFilter(heard)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(heard)
