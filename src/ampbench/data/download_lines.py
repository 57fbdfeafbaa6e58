"""What a download says while it runs: a line when the source answers, and where no progress bar
is drawn (output not a terminal: a log, CI, a pipe) a line every ``EVERY_S`` seconds.

Without them a download from a slow or stalled source is silent until the rate floor's window
(``data.timeout_s``, 60 s by default) fails it, possibly three times over: nothing says that a
download started, how far it got or how fast it goes. A timer thread (not the reader) says it, so a
source that sends nothing at all, headers included, is reported too.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from ampbench import interrupts
from ampbench.data.errors import size_text
from ampbench.data.rate_floor import RateFloor, Watcher

log = logging.getLogger(__name__)

EVERY_S = 20.0  # at most this long without a line (the acceptance: never 30 s); tests lower it


def _bar_drawn() -> bool:
    """Whether tqdm draws the download's bar (``disable=None``: only on a terminal)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


class DownloadLines(Watcher):
    """``with DownloadLines(shown_url, final, floor) as lines: ... lines.answered(resp)``: the
    bytes counted are the floor's (``RateFloor.total``)."""

    def __init__(self, shown_url: str, final: Path, floor: RateFloor) -> None:
        self.shown_url = shown_url
        self.final = final
        self.floor = floor
        self.size = -1  # announced (Content-Length), -1: not (yet) known
        self.answered_at = 0.0
        super().__init__("download-lines")

    def wanted(self) -> bool:
        return not _bar_drawn()

    def answered(self, resp) -> None:
        """The source sent its headers: the download starts, said with its size if announced."""
        announced = resp.headers.get("Content-Length") or ""
        self.size = int(announced) if announced.isdigit() else -1
        self.answered_at = time.monotonic()
        size = f" ({size_text(self.size)})" if self.size >= 0 else " (size not announced)"
        log.info("downloading %s%s to %s", self.shown_url, size, self.final)

    def _run(self) -> None:
        seen, last = 0, time.monotonic()
        while not self._done.wait(EVERY_S):
            now, got = time.monotonic(), self.floor.total
            if not self.answered_at:
                log.info("waiting for %s to answer: %.0f s so far", self.shown_url, now - self._started)
            else:
                log.info("%s", self.progress(got, (got - seen) / max(now - last, 1e-9), now))
            seen, last = got, now

    def progress(self, got: int, rate: float, now: float) -> str:
        of = f" of {size_text(self.size)} ({100 * got / self.size:.0f}%)" if self.size > 0 else ""
        return (
            f"downloading {self.final.name}: {size_text(got)}{of} in {now - self.answered_at:.0f} s, "
            f"{size_text(rate)}/s lately"
        )


def counted(items: list, what: str, unit: str):
    """``items``, yielded one by one; where no bar is drawn, a line as the work starts and one
    every ``EVERY_S`` seconds saying how far it got ("extracting c.tar.gz: 23,000 of 60,022
    files"): extracting and decoding CIFAR-10 takes a minute on two cores, silent otherwise."""
    if _bar_drawn():
        for item in items:
            interrupts.check()  # a Ctrl-C that an import or a C++ call-back swallowed stops here
            yield item
        return
    log.info("%s: %s %s", what, f"{len(items):,}", unit)
    said = time.monotonic()
    for i, item in enumerate(items):
        interrupts.check()
        if time.monotonic() - said >= EVERY_S:
            log.info("%s: %s of %s %s", what, f"{i:,}", f"{len(items):,}", unit)
            said = time.monotonic()
        yield item
