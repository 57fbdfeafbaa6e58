"""The `ampbench` command's first instant (``python -m ampbench`` too).

A Ctrl-C while the command line's own modules load (about 0.06 s: YAML, the settings' rules) was a
KeyboardInterrupt traceback from inside an import (hostile pass V). Until ``cli.main`` takes over
(``interrupts.command_started``), it ends the command with one line instead: nothing has run yet, so there is
nothing to stop, save or end.
"""

from __future__ import annotations

import os
import signal
import sys


def _before_start(signum: int, frame) -> None:
    command = " ".join(sys.argv[1:2])
    print(
        f"interrupted (Ctrl-C): `ampbench {command}` stopped before it started; run the same command again",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)


def run() -> int:
    """The console script's entry: ``cli.run`` once the command line is loaded."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an inherited ignore is kept
        signal.signal(signal.SIGINT, _before_start)
    from ampbench import interrupts

    interrupts.before_start = _before_start
    from ampbench import cli

    return cli.run()
