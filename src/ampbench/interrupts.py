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
import os
import signal
import sys
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
    hook, sys.unraisablehook = sys.unraisablehook, _finalizer_failed
    try:
        yield
    finally:
        sys.unraisablehook = hook
        if mine and signal.getsignal(signal.SIGINT) is _on_sigint:  # a stage may have set its own
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _finalizer_failed(unraisable) -> None:
    """sys.unraisablehook: a Ctrl-C raised inside a finalizer (a weakref callback, SQLAlchemy's
    registry) is dropped by Python with an "Exception ignored in" traceback (final pass G: bench and
    explain printed one, then measured on for 35-54 s). It is noted (``came``); ``check`` stops the
    command at its next boundary. Anything else is printed as Python does."""
    global came
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
        return
    came = True  # raised by another handler than ours (a library's): noted all the same


def _on_sigint(signum, frame) -> None:
    global came
    came = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def held():
    """Within (main thread): a Ctrl-C waits, then is delivered on leaving to the handler that was
    there (Python's raises KeyboardInterrupt; a train stage's sets its stop flag). For code that
    runs Python from C++, where a KeyboardInterrupt aborts the process (pybind11's
    error_already_set: SIGABRT) or vanishes: torch's import, torch.save's writer (hostile re-run:
    Ctrl-C in the download stage aborted it, or was ignored and the study trained on)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs Python's signal handlers
        return
    arrived: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if arrived and callable(before):
        before(signal.SIGINT, None)
    elif arrived and before == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came (and was swallowed on its way)."""
    if came:
        raise KeyboardInterrupt
