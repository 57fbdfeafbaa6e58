"""How a stage process ends (``ampbench.process_exit.finish`` then ``os._exit``): what the interpreter's
own exit would have done, and no hang on threads that only that exit knows how to stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, os, threading, time
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)  # as inductor's compile pool: an idle worker waiting for work
    pool.submit(int).result()
    atexit.register(lambda: print("atexit ran", end=""))  # a pipe: buffered until finish flushes it
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined"))).start()

    from ampbench.process_exit import finish

    os._exit(finish(3))
    """
)


def test_finish_runs_exit_hooks_joins_threads_and_does_not_wait_on_idle_executors():
    # it hung on CI: joining an idle executor worker by hand waits forever (cold compile cache)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    # the interpreter's order (threads, then atexit), and stdout flushed although os._exit skips it
    assert proc.stdout.splitlines() == ["thread joined", "atexit ran"], proc.stdout
