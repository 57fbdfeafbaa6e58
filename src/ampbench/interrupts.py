"""Ctrl-C remembered, so that a KeyboardInterrupt a library swallows still stops the command.

Python raises Ctrl-C's KeyboardInterrupt wherever the main thread happens to be. Inside an import
that catches it (hostile re-run: the download stage's `import torchvision` half-imported numpy and
went on; 5 s later, a RecursionError traceback) or inside C++ that calls back into Python, it may
never reach the command. ``noted`` (around ``cli.main``'s command) notes the Ctrl-C before raising it;
long loops call ``check``, and ``cli.main`` ends an interrupted command as interrupted however it
ended. A stage with its own stop handling (train) replaces the handler with its own.
"""

from __future__ import annotations

import contextlib
import signal
import threading

came = False  # a Ctrl-C arrived within noted()


@contextlib.contextmanager
def noted():
    """Within: each Ctrl-C noted, then raised as Python's own handler would (only where that one is
    set); the handler before is put back after (tests run several commands in one process)."""
    global came
    came = False
    mine = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if mine:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        if mine and signal.getsignal(signal.SIGINT) is _on_sigint:  # a stage may have set its own
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _on_sigint(signum, frame) -> None:
    global came
    came = True
    raise KeyboardInterrupt


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came (and was swallowed on its way)."""
    if came:
        raise KeyboardInterrupt
