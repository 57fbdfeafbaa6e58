"""A line every ``EVERY_S`` while a call to the MLflow store waits: a store another process holds
locked answers only when it lets go (SQLite waits, then gives up), and nothing is printed meanwhile
(final pass L: a lock taken mid-training, then 67 s without a line before the stage's one-line
error). Only around store calls outside any timed region (a seed's records after its training)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

FIRST_S, EVERY_S = 5.0, 20.0  # soon: the epochs' sender may have waited on the same lock before

log = logging.getLogger(__name__)


@contextmanager
def said_while_waiting(what: str, uri: str):
    """Within: "<what>: waiting for MLflow store <uri> (N s so far) ..." FIRST_S seconds in, then
    every EVERY_S (final re-check: 33.7 s without a line, the epochs' own wait on the lock before)."""
    done, t0 = threading.Event(), time.monotonic()

    def remind() -> None:
        wait = FIRST_S
        while not done.wait(wait):
            wait = EVERY_S
            log.info(
                "%s: waiting for MLflow store %s (%.0f s so far); another process may hold it locked",
                what,
                uri,
                time.monotonic() - t0,
            )

    thread = threading.Thread(target=remind, name="store-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
