"""How an ampbench process ends: what an interpreter's exit does that matters, without the rest.

With torch, torch._dynamo and MLflow loaded, the interpreter's own shutdown takes 2-3.5 s (H200
host, 2-core CI machine) for nothing the OS would not free. So a stage process (``cli.run``, or a
warm server's child) calls :func:`finish`, then leaves with ``os._exit``.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading


def finish(code) -> int:
    """What an interpreter's exit does that matters: non-daemon threads joined, atexit handlers
    run, stdout and stderr flushed (writers close their files with ``with``); the exit status."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing can reach it anyway
            stream.flush()
    return 0 if code is None else code if isinstance(code, int) else 1
