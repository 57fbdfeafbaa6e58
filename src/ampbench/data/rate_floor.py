"""A floor under a download's rate: an attempt that brings too little in a window is cut off.

urllib's timeout bounds each socket read, so a source that sends one byte every 20 s (a stalled
mirror, a captive portal, a throttled link) never times out and an attempt lasts for days. Here a
watchdog thread counts the bytes of each window of ``window_s`` seconds (``data.timeout_s``); a
window that brings fewer than ``min_bytes_per_s * window_s`` bytes has the connection's socket shut
down, which wakes the blocked read wherever it is (TLS handshake, headers or body), and the attempt
fails saying how much arrived in how long.

Why a rate floor and not a fixed wall time: a deadline long enough for CIFAR-10's 163 MiB on a slow
link (hours) does nothing against a stall for hours, and one short enough to catch stalls kills an
honest slow download. A floor lets any link at or above it finish (163 MiB at the default
10 KiB/s: 4.6 h, with progress shown) and stops a stall within one window; every attempt is then
bounded by max(window, size / floor), all of them by `data.retries` times that.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
import urllib.request
from typing import NamedTuple, Self

from ampbench.data.errors import size_text


class Floor(NamedTuple):
    """What a download must keep up: `min_bytes_per_s` over every window of `window_s` (0: no floor)."""

    min_bytes_per_s: float
    window_s: float


class Watcher:
    """A daemon thread for the life of a ``with`` block: started on entry where ``wanted()``, told
    to end (``_done`` set) and joined on exit. Subclasses give ``_run``."""

    def __init__(self, name: str) -> None:
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def wanted(self) -> bool:
        return True

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if self.wanted():
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


class RateFloor(Watcher):
    """Watches one download attempt: ``with RateFloor(...) as floor: floor.opener().open(url)``.

    The reader calls ``arrived(n)`` for each chunk; once a window fell short, ``verdict`` says so
    (empty while the rate holds) and the connection is cut. ``min_bytes_per_s`` 0: no floor.
    """

    def __init__(self, min_bytes_per_s: float, window_s: float) -> None:
        self.need = min_bytes_per_s * window_s  # bytes each window must bring
        self.min_bytes_per_s = min_bytes_per_s
        self.window_s = window_s
        self.total = 0
        self.verdict = ""
        self._sock: socket.socket | None = None
        super().__init__("download-rate-floor")

    def wanted(self) -> bool:
        return self.need > 0

    def arrived(self, n: int) -> None:
        self.total += n  # one writer (the reader), one reader (the watchdog): an int is enough

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's default opener (proxies, redirects) whose connections this floor can cut."""
        handlers = [_WatchedHTTP()]
        if hasattr(urllib.request, "HTTPSHandler"):  # absent without the ssl module
            handlers.append(_WatchedHTTPS())
        for handler in handlers:
            handler.floor = self
        return urllib.request.build_opener(*handlers)

    def connection(self, http_class, *args, **kwargs):
        """An http.client connection that tells this floor its socket once connected (redirects
        connect again: the newest socket is the one to cut)."""
        conn = http_class(*args, **kwargs)
        connect = conn.connect

        def connect_watched() -> None:
            connect()
            self._sock = conn.sock

        conn.connect = connect_watched
        return conn

    def _run(self) -> None:
        seen = 0
        while not self._done.wait(self.window_s if not self.verdict else 0.1):
            got, seen = self.total - seen, self.total
            if got < self.need and not self.verdict:
                elapsed = time.monotonic() - self._started
                self.verdict = (
                    f"too slow: {size_text(got)} arrived in the last {self.window_s:g} s "
                    f"({size_text(self.total)} in {elapsed:.1f} s in all), under the floor of "
                    f"{self.min_bytes_per_s / 1024:g} KiB/s (data.min_rate_kib_s)"
                )
            if self.verdict:  # again until a socket exists: DNS and connect come before it
                self._cut()

    def _cut(self) -> None:
        sock = self._sock
        if sock is not None:
            # socket.socket's own shutdown (not SSLSocket's): it acts on the descriptor only,
            # leaving the TLS object to the reading thread, whose blocked read then returns.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watching:
    floor: RateFloor

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(functools.partial(self.floor.connection, http_class), req, **kwargs)


class _WatchedHTTP(_Watching, urllib.request.HTTPHandler):
    pass


if hasattr(urllib.request, "HTTPSHandler"):

    class _WatchedHTTPS(_Watching, urllib.request.HTTPSHandler):
        pass
