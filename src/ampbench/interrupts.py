"""Ctrl-C remembered, so that a KeyboardInterrupt a library swallows still stops the command.

Python raises Ctrl-C's KeyboardInterrupt wherever the main thread happens to be. Inside an import
that catches it (hostile re-run: the download stage's `import torchvision` half-imported numpy and
went on; 5 s later, a RecursionError traceback) or inside C++ that calls back into Python, it may
never reach the command. ``noted`` (around ``cli.main``'s command) notes the Ctrl-C before raising it;
long loops call ``check``, and ``cli.main`` ends an interrupted command as interrupted however it
ended. A stage with its own stop handling (train) replaces the handler with its own.

SIGTERM (``timeout``, a batch system) and SIGHUP (the terminal closed) stop a command the same
way, where nothing ignores them: a KeyboardInterrupt, so its MLflow runs end and its half-written
reports go, with its line and 128 + the signal (hostile pass G: evaluate and compare died of
them without a word, a ``compare`` run left RUNNING for good).

Once a command's work is complete and kept (``completed``: a train stage's last seed), a stop
signal ends nothing: it is said once and kept (``late``) for what runs next in the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

came = False  # a Ctrl-C (or SIGTERM, SIGHUP) arrived within noted()
signum = 0  # which
within = False  # noted() is on: ``came`` is this command's
done = ""  # the command's work is complete and kept (``completed``): a stop from here ends nothing
late = 0  # the stop that came after it: said once, read by what runs next in this process
_told = False  # ``late`` is said (or another process says it)
last = False  # the process ends after this command (cli.run): no Ctrl-C handler is put back
# and Ctrl-\, a batch system's warnings, `timeout -s ALRM` (hostile pass Q: each killed download,
# estimate and compare without a line)
STOPS = (
    *(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT),
    *(signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM),
)
# ampbench.entry's Ctrl-C handler while the command line loads: one line, at once (nothing ran yet)
before_start: object = None


def command_started() -> None:
    """cli.main's command is there: a Ctrl-C is Python's KeyboardInterrupt again (``noted``
    takes it), no longer ``before_start``'s line."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if before_start is not None and signal.getsignal(sig) is before_start:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


@contextlib.contextmanager
def noted():
    """Within: each Ctrl-C noted, then raised as Python's own handler would (only where that one is
    set); the handler before is put back after (tests run several commands in one process). A
    command within another's (`ampbench variant`'s train and evaluate) says its own stop, which
    ``said`` marks as said for the outer one."""
    global came, signum, within, done, late, _told, _finished
    outer, before = not within, done
    came, signum, within, done, late, _told = False, 0, True, "", 0, False
    main = threading.current_thread() is threading.main_thread()
    usual = {sig: signal.SIG_DFL for sig in STOPS} | {signal.SIGINT: signal.default_int_handler}
    mine = [sig for sig in STOPS if main and signal.getsignal(sig) is usual[sig]]  # not where ignored
    for sig in mine:
        signal.signal(sig, _on_sigint)
    hook, sys.unraisablehook = sys.unraisablehook, _finalizer_failed
    try:
        yield
    finally:
        _finished, within, done = done, not outer, before
        sys.unraisablehook = hook
        # The process's last command: a stop from here has nothing left to stop, and would only break
        # its exit (hostile pass G: a traceback; pass H: SIGTERM's death, without a word, of a train
        # command whose every seed was kept). Said once where the work was complete (``_ending``).
        for sig in mine:
            if signal.getsignal(sig) is _on_sigint:  # a stage may have set its own
                signal.signal(sig, _ending if last and outer else usual[sig])


def _ending(sig, frame) -> None:
    """The last command's handler as its process ends: a stop says, once, that its work is kept
    (where it was complete) and ends nothing; the same signal again after a second (not a flood:
    someone insists on an exit that hangs) ends the process as that signal does."""
    global _since
    now, since = time.monotonic(), _since
    _since = now
    if since and now - since >= 1.0:
        logging.getLogger(__name__).warning("%s again: ending now", signal.Signals(sig).name)
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)
    if _finished:
        came_after(sig, _finished)


_finished = ""  # the last command's ``done``: what a stop as its process ends says
_since = 0.0  # the last stop as the process ended


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


def completed(what: str, say: bool = True) -> None:
    """Within ``noted``: the command's work is done and kept (a train stage's every seed). A stop
    signal from here to the command's end ends nothing: it is said once, "<signal> <what>", and kept
    in ``late`` (hostile pass G: a Ctrl-C just after the last seed's line said "stopped before it
    finished; run the same command again", which would have trained every seed again). ``say``
    False: another process says it (a DDP worker other than its node's first)."""
    global done, _told
    if within:
        done, _told = done or what, _told or not say  # the first, most precise, stands


def came_after(sig: int, what: str) -> None:
    """A stop signal after the work was complete: said once a command, kept in ``late``."""
    global late, _told
    late = late or sig
    if not _told:
        _told = True
        logging.getLogger(__name__).warning("%s %s", signal.Signals(sig).name, what)


def _on_sigint(sig, frame) -> None:
    global came, signum
    if done:  # the work is complete: nothing to stop
        came_after(sig, done)
        return
    came, signum = True, signum or sig
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
    # SIGTERM and SIGHUP too where a handler of ours takes them (noted's, a train stage's)
    held_now = [sig for sig in STOPS if sig == signal.SIGINT or callable(signal.getsignal(sig))]
    arrived: list[int] = []
    before = {sig: signal.signal(sig, lambda sig, frame: arrived.append(sig)) for sig in held_now}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    for sig in dict.fromkeys(arrived):  # each once, in the order they came
        if callable(before[sig]):
            before[sig](sig, None)
        elif before[sig] == signal.SIG_DFL:
            os.kill(os.getpid(), sig)


def said() -> None:
    """The stop is said, with its command's status: a command this one runs within (`ampbench
    variant`) returns that status without saying it again (hostile pass H: said twice)."""
    global came
    came = came and not within


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came (and was swallowed on its way)."""
    if came:
        raise KeyboardInterrupt
