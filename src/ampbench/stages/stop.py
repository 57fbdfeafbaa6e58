"""The train stage's stop request: a signal only sets a flag; the loop stops at the next step
boundary, saves a checkpoint and ends its runs KILLED (stages/train.py, training/loop.py).

SIGTERM, Ctrl-C (SIGINT) and SIGHUP (the terminal or SSH session that started the stage closed)
are stop requests; SIGHUP not where it was ignored when the stage started (``nohup``: training
goes on, as nohup promises).

So is the end of the pipeline tool that started the stage (``dvc repro`` or ``make run``'s
``python -m ampbench.dvc_run``, killed with kill -9): its stage would otherwise train on as an
orphan that a re-run finds holding the variant; so is ``mlflow run`` (SIGTERM, or kill -9). Only
a pipeline tool is watched, known by the variable it sets for every stage command (DVC's
DVC_STAGE, dvc/stage/run.py; MLflow's MLFLOW_RUN_ID): a stage a user started from a shell,
``nohup ampbench train ... &`` included, outlives that shell as it always did.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from ampbench import interrupts
from ampbench.processes import is_ancestor, orphaned_by, setter_of, watch_process

log = logging.getLogger(__name__)

PIPELINE_STAGE_ENV = "DVC_STAGE"  # DVC sets it to the stage's name for each stage command
MLFLOW_RUN_ENV = "MLFLOW_RUN_ID"  # `mlflow run` sets it for its entry point's command
# set by this project's DDP launcher for its workers: it says a late stop itself (stages/launch.py)
LAUNCHED_ENV = "AMPBENCH_DDP_LAUNCHER"
# A stop too: Ctrl-\ (SIGQUIT), and SIGUSR1/2 and SIGALRM (a batch system's warning, `scancel
# --signal`, `timeout -s USR1`; hostile passes N and Q: they ended training without a line, its
# runs left RUNNING)
STOP_SIGNALS = (
    *(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT),
    *(signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM),
)


class StopFlag:
    """SIGTERM / Ctrl-C / SIGHUP only set a flag; the loop stops at the next step boundary.

    A second signal of the same kind a second or more later: the default behaviour (stop now).
    With ``watch_parent`` (DDP workers) the death of the parent process sets the flag too:
    torchrun starts workers in sessions of their own, so a kill -9 of the launcher's process
    group would otherwise leave them training on as orphans. Without it, a stage DVC started
    stops the same way when DVC is gone (``watch_launcher``).
    """

    def __init__(self, watch_parent: bool = False) -> None:
        self.signum, self.since = 0, 0.0
        self.watched = False  # the stop came from the launcher's death (``_launcher_gone``)
        # Until the loop first asks (after its first step), no step boundary may ever come: a model
        # factory that never returns (final pass I: "stopping at the next step boundary", then 105 s
        # of silence). A process of its own stops there and then; a DDP worker keeps to the flag,
        # as its peers must stop at the same step.
        self.asked = "RANK" in os.environ
        self.before: dict[int, object] = {}  # the handlers close() puts back
        self.deferred = False  # a stop before the first step that came inside an import: _stop_now
        self.hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        # a stop while the handlers go in comes again 50 ms later (_stop_now), where train_main takes
        # it (a warm stage Ctrl-C'd at its first instant: Stopped escaped it, exit 143 for SIGINT)
        self.installing = True
        # a Ctrl-C that something swallowed before these handlers were there (hostile pass Y: the
        # stage trained on, deaf to it)
        if interrupts.within and interrupts.came:
            self.signum = interrupts.signum or signal.SIGINT
            log.warning("%s received: stopping at the first step boundary", signal.Signals(self.signum).name)
        for sig in STOP_SIGNALS:
            # An inherited ignore is kept: nohup's SIGHUP; a script's background job's SIGINT (hostile
            # pass WARN: a Ctrl-C was dropped in its first second, then stopped it from here on)
            if (before := signal.getsignal(sig)) is not signal.SIG_IGN:
                self.before[sig] = before
                signal.signal(sig, self._handle)
        if watch_parent:
            parent = os.getppid()

            def parent_gone() -> None:
                log.warning("parent process %d is gone: stopping at the next step boundary", parent)
                self._launcher_gone()

            watch_process(parent, lambda: os.getppid() == parent, parent_gone, "parent-watch")
        else:
            watch_launcher(self._launcher_gone)
        self.installing = False

    def _launcher_gone(self) -> None:
        self.signum = self.signum or signal.SIGTERM  # as if the launcher had sent SIGTERM first
        # the job's own SIGTERM may reach the handler later, after a long step: the same stop, not
        # a second request (hostile pass J: "SIGTERM again", no checkpoint, runs left RUNNING)
        self.watched = True

    def _handle(self, signum, frame) -> None:
        if self.deferred:  # this stop again (_again): the import it came in may be over
            self._stop_now(frame)
            return
        name = signal.Signals(signum).name
        if self.signum == signum:
            # Within a second it is the same stop arriving twice (a SIGTERM to a whole job reaches a
            # warm stage directly and through its client), not a second request.
            if self.watched or time.monotonic() - self.since < 1.0:  # (and a key held or pressed
                self.since, self.watched = time.monotonic(), False  # again and again: hostile pass F,
                return  # a flood ended a stop under way hard)
            log.warning("%s again: stopping now, without a checkpoint of this step", name)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum, self.since = signum, time.monotonic()
        if not self.asked:
            log.warning("%s received before the first training step: stopping now", name)
            self._stop_now(frame)
            return
        # Once per node: every DDP worker gets the signal; its other workers' copies are noise
        say = log.warning if os.environ.get("LOCAL_RANK", "0") == "0" else log.debug
        say("%s received: stopping at the next step boundary", name)

    def _stop_now(self, frame) -> None:
        """Before the first step: raise Stopped where the main thread is, but not inside Python's
        import system, where the raise can leave the import lock held (hostile pass W: it landed in
        importlib's module-lock callback, "Exception ignored", and the stage hung for good with its
        runs RUNNING): there, the same stop again 50 ms later. The loop, once there, keeps to the flag."""
        from ampbench.training.stopping import Stopped

        self.deferred = not self.asked and (self.installing or _importing(frame))
        if self.deferred:
            self._again()
        elif not self.asked:
            raise Stopped("stopped before the first training step (nothing trained, nothing to save)")

    def _again(self) -> None:
        def deliver() -> None:
            if self.deferred and self.before:  # not closed meanwhile
                signal.pthread_kill(threading.main_thread().ident or 0, self.signum)

        timer = threading.Timer(0.05, deliver)
        timer.daemon = True
        timer.start()

    def _unraisable(self, unraisable) -> None:
        """A Stopped raised inside a finalizer, which Python drops with an "Exception ignored"
        traceback: the stop again, outside it."""
        from ampbench.training.stopping import Stopped

        if not isinstance(unraisable.exc_value, Stopped):
            self.hook(unraisable)
            return
        self.deferred = not self.asked
        if self.deferred:
            self._again()

    def __call__(self) -> bool:
        self.asked = True  # the loop is there: from now on a stop waits for its step boundary
        return bool(self.signum)

    def close(self, completed: bool = False) -> None:
        """The stage is over: what handled the signals before it does again (hostile pass O: in
        `ampbench variant` a Ctrl-C during the evaluation was only "stopping at the next step
        boundary"). ``completed``: training ended with no stop, so a signal heard meanwhile came
        after its last step boundary; said, and kept for what runs next here (``came_late``). One
        that comes from here to the command's end is said the same way (``interrupts.completed``)."""
        # once per node: by the launcher where this project's started the workers (hostile pass O:
        # rank 0 and the launcher each said it), else by the node's first worker
        say = os.environ.get("LOCAL_RANK", "0") == "0" and LAUNCHED_ENV not in os.environ
        if completed:
            interrupts.completed(LATE, say)
        for sig, before in self.before.items():
            signal.signal(sig, before)  # type: ignore[arg-type]
        self.before, self.deferred = {}, False
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self.hook
        if completed and self.signum and say:
            interrupts.came_after(self.signum, LATE)


LATE = "came after training's last step: every seed is trained and kept"


def _importing(frame) -> bool:
    """Whether ``frame`` (where a signal handler interrupted the main thread) is in Python's import
    system: an import under way, or its module-lock callbacks."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def came_late() -> int:
    """The stop signal a train stage of this process heard after its last step boundary (0: none):
    it stopped nothing there, so what follows in the same command (variant's evaluate) stops."""
    return interrupts.late


def watch_launcher(on_gone) -> int | None:
    """Call ``on_gone()`` (from a thread) once the pipeline tool that started this stage is gone;
    its pid, or None (nothing watched) where no pipeline tool started it."""
    launcher = pipeline_launcher()
    if launcher is None:
        if any(orphaned_by(variable) for variable in (PIPELINE_STAGE_ENV, MLFLOW_RUN_ENV)):
            # killed before this process could look (hostile re-run: `mlflow run` SIGTERMed 0.5 s in)
            log.warning("the pipeline that started this stage is gone already: stopping as on SIGTERM")
            on_gone()
        return None

    def gone() -> None:
        log.warning("the pipeline that started this stage (pid %d) is gone: stopping as on SIGTERM", launcher)
        on_gone()

    watch_process(launcher, lambda: is_ancestor(launcher), gone, "launcher-watch")
    return launcher


def pipeline_launcher() -> int | None:
    """The pid of the DVC (or ``mlflow run``) process that started this stage; None outside a DVC
    stage or an MLflow project run, or without /proc.

    DVC runs a stage's command as ``$SHELL -c CMD``; a shell that does not exec the command stays
    in between, so the launcher is the nearest ancestor whose environment lacks this stage's
    DVC_STAGE (a DVC nested in another stage has the outer stage's name). ``mlflow run`` runs the
    entry point's command the same way, with MLFLOW_RUN_ID set: killed (SIGTERM kills a Python
    process outright), it left `ampbench variant` training on as an orphan."""
    return setter_of(PIPELINE_STAGE_ENV) or setter_of(MLFLOW_RUN_ENV)


def launcher_command() -> str | None:
    """The ``mlflow run ...`` command line that started this process (what resumes it), else None."""
    pid = setter_of(MLFLOW_RUN_ENV)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except (OSError, TypeError):
        return None
    for i, arg in enumerate(argv[:2]):  # `mlflow ...`, or `python .../bin/mlflow ...`
        if Path(arg).name == "mlflow":
            return shlex.join(["mlflow", *argv[i + 1 :]])
    return None
