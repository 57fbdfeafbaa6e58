"""The `ampbench` command's first instant (``python -m ampbench`` too); imported by nothing else.

A Ctrl-C while the command line's own modules load (about 0.06 s: YAML, the settings' rules) was a
KeyboardInterrupt traceback from inside an import (hostile pass V; pass W: `import signal` alone,
its enum, took tens of ms). The handler is set as this module is imported, with modules the
interpreter has loaded already; until ``cli.main`` takes over (``interrupts.command_started``) a
Ctrl-C ends the command with one line: nothing has run yet, so there is nothing to stop, save or
end. Only the interpreter's own start-up (its site-packages' .pth files) comes before.
"""

import _signal  # built in and loaded at start-up: no import of its own
import os
import sys


def _before_start(signum: int, frame) -> None:
    command = " ".join(sys.argv[1:2])
    # under a pipeline, its own command resumes it (hostile pass J: "run the same command again"
    # named a stage's `ampbench train`, which the user never typed)
    again = os.environ.get("AMPBENCH_RESUME_COMMAND")
    how = f"the stages that finished are kept. To resume: {again}" if again else "run the same command again"
    if not again and os.environ.get("DVC_STAGE"):  # pass O: a plain `dvc repro` or dvc_run started it
        how = "the stages that finished are kept; run the pipeline command that started it again"
    said = {2: "Ctrl-C", 15: "SIGTERM", 1: "SIGHUP"}.get(signum, f"signal {signum}")
    print(f"interrupted ({said}): `ampbench {command}` stopped before it started; {how}", file=sys.stderr)
    sys.stderr.flush()
    if command == "variant" and os.environ.get("MLFLOW_RUN_ID") and os.fork() == 0:
        # `mlflow run`'s run, made before this started, ends KILLED, not RUNNING for good (hostile
        # pass M: a SIGTERM to its group 0.3 s in): by a child of its own, as this exits at once
        os.setsid()
        end = "from ampbench.commands import variant; variant.stopped_outside_its_stages()"
        os.execv(sys.executable, [sys.executable, "-c", end])
    os._exit(128 + signum)


# Ctrl-C, SIGTERM (a job's stop, `mlflow run`'s group) and SIGHUP; an inherited ignore is kept
for _sig, _usual in (
    (_signal.SIGINT, _signal.default_int_handler),
    (15, _signal.SIG_DFL),
    (1, _signal.SIG_DFL),
):
    if _signal.getsignal(_sig) is _usual:
        _signal.signal(_sig, _before_start)


def run() -> int:
    """The console script's entry: ``cli.run`` once the command line is loaded."""
    from ampbench import interrupts

    interrupts.before_start = _before_start
    from ampbench import cli

    return cli.run()
