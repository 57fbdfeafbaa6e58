"""The train stage's stop request: a signal only sets a flag; the loop stops at the next step
boundary, saves a checkpoint and ends its runs KILLED (stages/train.py, training/loop.py).

SIGTERM, Ctrl-C (SIGINT) and SIGHUP (the terminal or SSH session that started the stage closed)
are stop requests; SIGHUP not where it was ignored when the stage started (``nohup``: training
goes on, as nohup promises).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)


class StopFlag:
    """SIGTERM / Ctrl-C / SIGHUP only set a flag; the loop stops at the next step boundary.

    A second signal of the same kind a second or more later: the default behaviour (stop now).
    With ``watch_parent`` (DDP workers) the death of the parent process sets the flag too:
    torchrun starts workers in sessions of their own, so a kill -9 of the launcher's process
    group would otherwise leave them training on as orphans.
    """

    def __init__(self, watch_parent: bool = False) -> None:
        self.signum, self.since = 0, 0.0
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's is kept
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
            # Within a second it is the same stop arriving twice (a SIGTERM to a whole job reaches a
            # warm stage directly and through its client), not a second request.
            if time.monotonic() - self.since < 1.0:
                return
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum, self.since = signum, time.monotonic()
        log.warning("%s received: stopping at the next step boundary", signal.Signals(signum).name)

    def __call__(self) -> bool:
        return bool(self.signum)
