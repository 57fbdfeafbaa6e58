"""`dvc` as `make run` starts it: the same command, its output without two kinds of noise.

    python -m ampbench.dvc_run repro
    python -m ampbench.dvc_run exp run -S data.url=/path/to/cifar10.tar.gz

1. ``dvc exp run``'s "No file hash info found for '<out>'. It won't be created." for every output
   without a hash yet (all of them on a first run, the unfinished ones after a stop) is dropped:
   nothing is wrong and nothing is to be done, the stages create them.
2. A stop (Ctrl-C, SIGTERM) is not a crash: the stage saves, prints what it saved and how to
   resume, and exits 130 / 143, where DVC would print "ERROR: failed to reproduce ... exited with
   130" and exit 255. Here DVC's error becomes one line (only where the stage printed none) and
   the exit status 128 + signal. SIGTERM (or SIGHUP, unless nohup ignored it) while a stage runs
   is passed on to the stage, which saves, as DVC does for SIGINT; outside a stage it interrupts
   DVC as Ctrl-C would; a stop the stage ended nothing with (it came as its work was done) stops
   DVC before its next stage. ``AMPBENCH_RESUME_COMMAND`` (set by the Makefile) is the command
   the stop line names; default: this dvc command.
3. DVC's bookkeeping ("> ampbench ...", the blank line after it, "Updating lock file", git tips,
   "Use `dvc push` ...") is dropped (AMPBENCH_DEBUG=1 keeps it): the run ends on the compare
   stage's answer; with nothing to run, "Data and pipelines are up to date." says where it is.
4. A Ctrl-C outside a stage (DVC or the warm server starting or ending) is one line, never a traceback.
5. The stages DVC starts run warm: in forks of a server, started here and ended with this
   command, that has imported torch, MLflow and scikit-learn once (``ampbench.warm``).
6. Before DVC runs: a params file DVC would choke on, a project another pipeline command is
   running, and a data path DVC's override grammar would misread (``ampbench.dvc_guard``).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import sys

from ampbench import dvc_guard, processes
from ampbench.chains import chain
from ampbench.warm import scope

HASH_WARNING = "No file hash info found for"
NEXT_STAGE = "Running stage "  # DVC's line as it starts a stage's command
# a stage's exit status after a stop: 128 + signal (it saved and exited), or -signal (it died of it)
# Ctrl-\, a batch system's warnings and `timeout -s ...` too (hostile pass S: a job-wide SIGUSR1
# killed this command, its DVC locks left behind, while its stage saved and said so)
STOPS = (
    *(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT),
    *(signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM),
)
STOP_STATUS = {code: sig for sig in STOPS for code in (128 + sig, -sig)}
# died of SIGKILL: -9 when the shell execs the command (bash), 137 when it waits on it (dash)
KILLED_STATUS = (-signal.SIGKILL, 128 + signal.SIGKILL)
# an ampbench stage that exits 1 or 2 has said why, in one line (or, for a bug, a traceback)
SAID, SAID_BY = (1, 2), "ampbench "
INTERRUPTED = 252  # dvc's status for KeyboardInterrupt ("interrupted by the user")
FAILED = re.compile(r"failed to reproduce '(?P<stage>[^']+)'.*exited with (?P<status>-?\d+)", re.S)
RESUME_ENV = "AMPBENCH_RESUME_COMMAND"
MAKE_JOB_ENV = "AMPBENCH_MAKE_JOB"  # set by the Makefile's STOPPABLE: see main
# DVC's INFO lines that say nothing to the user (see 3. above), as their message starts
BOOKKEEPING = (
    "> ",
    "Updating lock file",
    "Generating lock file",
    "To track the changes with git",
    "To enable auto staging",
)
PUSH_TIP = "Use `dvc push`"
UP_TO_DATE = "Data and pipelines are up to date."


def _messages(record: logging.LogRecord) -> str:
    """The record's message and its exception chain, as DVC prints them joined."""
    parts = [record.getMessage(), *map(str, chain(record.exc_info[1] if record.exc_info else None))]
    return ": ".join(p for p in parts if p)


class Quiet(logging.Filter):
    """Drops the hash warnings and DVC's repetition of a stage's own error line, and remembers
    (and drops) the error a stop or a SIGKILL causes."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped_stage: str | None = None
        self.killed_stage: str | None = None  # died of SIGKILL (the OOM killer, kill -9)
        self.stage_said_it = False
        self.signum = 0
        self.after_stage = False  # the stop came as DVC recorded a finished stage (noted_after_stage)
        self.verbose = os.environ.get("AMPBENCH_DEBUG", "").lower() not in ("", "0", "no", "off")

    def filter(self, record: logging.LogRecord) -> bool:
        if self.signum and record.getMessage().startswith(NEXT_STAGE):
            # a stop during the stage before, which ended nothing there (its work was done: hostile
            # pass J, the pipeline then ran its every other stage, exit 0): DVC stops before this one
            raise KeyboardInterrupt
        if record.levelno == logging.WARNING and record.getMessage().startswith(HASH_WARNING):
            return False
        if record.levelno == logging.INFO and not self.verbose:
            message = record.getMessage().strip()
            return bool(message) and not message.startswith(BOOKKEEPING)
        if record.levelno < logging.ERROR:
            return True
        text = _messages(record)
        if "interrupted by the user" in text:
            self.signum = self.signum or signal.SIGINT
            return False
        failed = FAILED.search(text)
        if failed and int(failed["status"]) in SAID and f"failed to run: {SAID_BY}" in text:
            return False  # the stage said what failed, and the fix, above: DVC's line repeats it
        if failed and int(failed["status"]) in KILLED_STATUS:
            self.killed_stage = failed["stage"]
            return False
        if failed and int(failed["status"]) in STOP_STATUS:
            self.stopped_stage = failed["stage"]
            self.signum = STOP_STATUS[int(failed["status"])]
            # a stage that exited (not died) said so, with the resume command: train's stop, or
            # any command's "interrupted" line, which names the pipeline's command where it is set
            self.stage_said_it = int(failed["status"]) > 0 and (
                self.stopped_stage.startswith("train@") or bool(os.environ.get(RESUME_ENV))
            )
            return False
        return True

    def noted_sigint(self, signum, frame) -> None:
        """Ctrl-C while a stage runs, where DVC ignores it (the stage takes it, unless it is ending:
        then as after the stage): noted, so that ``filter`` stops DVC before its next stage."""
        self.signum, self.after_stage = self.signum or signal.SIGINT, processes.stage_commands_ended()

    def noted_after_stage(self, signum, frame) -> None:
        """Ctrl-C after a stage's command ended, until the next starts: DVC records the stage."""
        self.signum, self.after_stage = self.signum or signal.SIGINT, True

    def on_sigint(self, signum, frame) -> None:
        """Ctrl-C, as Python's own handler, remembered: DVC may swallow the KeyboardInterrupt
        half-way through an import and fail later on the half-made module, unchained to it."""
        self.signum = self.signum or signal.SIGINT
        raise KeyboardInterrupt

    def finalizer_failed(self, unraisable) -> None:
        """sys.unraisablehook: a Ctrl-C that lands in a finalizer (a DVC progress bar's
        ``__del__`` while the command stops) is the stop already under way, and so is any failure
        of a finalizer once a stop signal came (a progress bar whose ``__init__`` the interrupt cut
        short fails in ``__del__`` on attributes it never set): no traceback for either. Anything
        else is printed as Python does."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt) or self.signum:
            return
        sys.__unraisablehook__(unraisable)

    def on_sigterm(self, signum, frame) -> None:
        """SIGTERM, SIGHUP (the terminal or SSH session of `make run` closed) and the other STOPS
        but SIGINT: a stop."""
        if self.signum == signum:  # the same stop again (a whole job's, then make's forward)
            return
        self.signum = signum
        # A SIGTERM to this process alone (make's, forwarded by its recipe; a kill of this pid)
        # reaches no stage: pass it on. A stage that got it from its job too within a second
        # takes both as one stop (stages/stop.py).
        processes.signal_own_group(signum)
        # DVC ignores SIGINT exactly while a stage's command runs: then the stage stops and saves,
        # and its exit status ends the run; after it, DVC records the stage, then stops before the
        # next (filter). Otherwise stop DVC now.
        handler = signal.getsignal(signal.SIGINT)
        self.after_stage = handler == self.noted_after_stage  # (== for methods)
        if handler not in (signal.SIG_IGN, self.noted_sigint, self.noted_after_stage):
            raise KeyboardInterrupt


def stop_line(quiet: Quiet, argv: list[str]) -> str:
    """What a stop says where the stage said nothing (every stage but train's)."""
    resume = os.environ.get(RESUME_ENV) or resume_command(argv)
    where = f" during stage '{quiet.stopped_stage}'" if quiet.stopped_stage else ""
    name = signal.Signals(quiet.signum).name
    return f"Stopped by {name}{where}; the stages that finished are kept. To resume: {resume}"


def resume_command(argv: list[str]) -> str:
    """This dvc command without -f/--force, which would run the finished stages again (pass J), but
    with it for the stages it names alone (-s: pass U, DVC checked the old outputs out instead)."""
    single = any(a in ("-s", "--single-item") or re.fullmatch(r"-\w*s\w*", a) for a in argv)
    return shlex.join(["dvc", *(a for a in argv if single or a not in ("-f", "--force"))])


def killed_line(stage: str, argv: list[str]) -> str:
    """What a stage killed outright (no chance to save or say anything) leaves, and the way on."""
    resume = os.environ.get(RESUME_ENV) or resume_command(argv)
    kept = (
        "its last checkpoint (at most train.checkpoint_every_s of training old) is kept, its MLflow runs "
        "stay RUNNING until the re-run resumes them"
        if stage.startswith("train@")
        else "the stages that finished are kept"
    )
    return (
        f"ERROR: stage '{stage}' was killed (SIGKILL: the kernel's out-of-memory killer, or kill -9); "
        f"{kept}. To resume: {resume}"
    )


def _answer_where() -> str:
    """After "up to date": where the last run's answer is, from the folder the user is in."""
    table = os.path.join(os.getcwd(), "reports", "comparison.md")
    if not os.path.exists(table):
        return ""
    return f"The answer, unchanged: {os.path.relpath(table, os.environ.get('DVC_ROOT') or os.getcwd())}"


def _quiet_ui() -> None:
    """DVC's last words through its ui: the push tip dropped, "up to date" told where the answer is."""
    from dvc.ui import ui

    write = ui.write

    def filtered(*objects, **kwargs) -> None:
        text = " ".join(str(o) for o in objects)
        if text.startswith(PUSH_TIP):
            return
        write(*objects, **kwargs)
        if text == UP_TO_DATE and (where := _answer_where()):
            write(where, **kwargs)

    ui.write = filtered  # type: ignore[method-assign]


def _interrupted(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in err's chain (its cause or the exception it interrupted)."""
    return any(isinstance(e, KeyboardInterrupt) for e in chain(err))


def _stop_when_make_is_gone() -> None:
    """Under `make run` (make sets MAKELEVEL for its recipes): once make is gone (kill -9 of make
    or of its recipe's shell), stop as a SIGTERM to make's job would, stage first (checkpoint,
    runs KILLED), instead of training on with nobody waiting for the answer."""
    make = processes.setter_of("MAKELEVEL")
    if make is None:
        return

    def gone() -> None:
        print(f"make (pid {make}) is gone: stopping as on SIGTERM", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # what a SIGTERM to make's job does (on_sigterm)

    processes.watch_process(make, lambda: processes.is_ancestor(make), gone, "make-watch")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not {"-h", "--help"} & set(argv) and (refused := dvc_guard.main()):  # pass B7: help, busy or not
        return refused
    os.environ.setdefault(RESUME_ENV, resume_command(argv))  # each stage's stop names it (pass O: not two)
    # DVC ends each command by forking a daemon that sends a usage report: a fork that a Ctrl-C
    # at that moment turns into the child's traceback, and a network call this offline-capable
    # tool does not need. Exporting DVC_NO_ANALYTICS= (empty) turns the reports back on.
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    quiet = Quiet()
    sys.unraisablehook = quiet.finalizer_failed
    if os.environ.pop(MAKE_JOB_ENV, "") and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # make's recipe started this command in the background, to pass make's SIGTERM on to it
        # (the Makefile's STOPPABLE); a POSIX shell ignores SIGINT for a background command, but
        # this one is the user's foreground work: Ctrl-C stops it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored
        signal.signal(signal.SIGINT, quiet.on_sigint)
    try:
        import dvc  # noqa: F401  (sets DVC's log handlers up)
        from dvc.cli import main as dvc_main

        dvc_guard.filter_dvc_logs(quiet)
        _quiet_ui()
        dvc_guard.note_ctrl_c_in_stages(quiet.noted_sigint, quiet.noted_after_stage)
        for sig in STOPS[1:]:  # SIGINT's is above
            if sig == signal.SIGTERM or signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's kept
                signal.signal(sig, quiet.on_sigterm)  # else this died at once, and make said so
        _stop_when_make_is_gone()
        with scope.serving():
            status = dvc_main(dvc_guard.quoted_overrides(argv))
    except KeyboardInterrupt:  # outside DVC's own handling: while it or the warm server starts
        quiet.signum, status = quiet.signum or signal.SIGINT, INTERRUPTED
    except Exception as err:
        # A Ctrl-C that broke one of DVC's imports half-way leaves a partially initialised module;
        # DVC then fails on it (AttributeError, ImportError, NameError), with the interrupt as its
        # context or, where DVC swallowed that, after it: a stop, not a fault.
        if not (_interrupted(err) or quiet.signum):
            raise
        quiet.signum, status = quiet.signum or signal.SIGINT, INTERRUPTED
    # The work is over, stopped or not: another Ctrl-C has nothing left to stop (and would only
    # break the last line, or the interpreter's exit, with a traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if quiet.killed_stage and status == 255:
        print(killed_line(quiet.killed_stage, argv), file=sys.stderr, flush=True)
        return 128 + signal.SIGKILL
    if quiet.signum and quiet.after_stage and status == 0:  # as DVC recorded the last stage
        name = signal.Signals(quiet.signum).name
        print(f"{name} came after the pipeline's last stage: every stage is done and kept", file=sys.stderr)
    if not quiet.signum or status not in (255, INTERRUPTED):
        return status
    if not quiet.stage_said_it:
        print(stop_line(quiet, argv), file=sys.stderr, flush=True)
    return 128 + quiet.signum


if __name__ == "__main__":
    sys.exit(main())
