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
    """What an interpreter's exit does that matters, in its order: threading's exit hooks run and
    non-daemon threads joined, atexit handlers run, stdout and stderr flushed (writers close their
    files with ``with``); the exit status.

    ``threading._shutdown`` is what the interpreter itself calls first. Joining the threads by hand
    is not the same: an executor's idle worker (inductor's compile pool) waits for work until the
    executor's exit hook tells it to stop, so a bare join waited forever (CI, a cold compile cache).
    """
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing can reach it anyway
            stream.flush()
    return 0 if code is None else code if isinstance(code, int) else 1
