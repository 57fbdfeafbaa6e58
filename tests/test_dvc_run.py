"""ampbench.dvc_run: a Ctrl-C that breaks one of DVC's imports half-way is a stop, told in one
line, not the traceback of DVC's clean-up tripping over the partially initialised module."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time

import pytest

from ampbench import dvc_run


@pytest.fixture(autouse=True)
def _process_hooks(monkeypatch):
    """main() sets the process's unraisable hook and DVC's analytics switch: put them back."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv(dvc_run.RESUME_ENV, "")  # recorded, so that what main sets goes after
    monkeypatch.delenv(dvc_run.RESUME_ENV)


def _broken_by_ctrl_c(argv):
    try:
        raise KeyboardInterrupt  # arrives while DVC imports fsspec
    except KeyboardInterrupt:
        raise AttributeError("partially initialized module 'fsspec' has no attribute 'utils'") from None


def test_an_import_broken_by_ctrl_c_is_a_stop(monkeypatch, capsys):
    import dvc.cli

    monkeypatch.setattr(dvc.cli, "main", _broken_by_ctrl_c)
    monkeypatch.setattr(dvc_run.scope, "serving", contextlib.nullcontext)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # leave the test process's handlers be
    assert dvc_run.main(["repro"]) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_any_other_error_keeps_its_traceback(monkeypatch):
    import dvc.cli

    def fails(argv):
        raise AttributeError("a real bug")

    monkeypatch.setattr(dvc.cli, "main", fails)
    monkeypatch.setattr(dvc_run.scope, "serving", contextlib.nullcontext)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    with pytest.raises(AttributeError, match="a real bug"):
        dvc_run.main(["repro"])


def test_a_ctrl_c_that_dvc_swallowed_before_failing_is_a_stop(monkeypatch, capsys):
    """Seen in CI: a Ctrl-C during DVC's imports was swallowed, and a later import of the half-made
    module failed unchained to it (NameError: name 'coroutines' is not defined in asyncio)."""
    import dvc.cli

    def swallows_then_fails(argv):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the terminal's Ctrl-C, to this process
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            pass  # swallowed by an import's clean-up
        raise NameError("name 'coroutines' is not defined")

    monkeypatch.setattr(dvc.cli, "main", swallows_then_fails)
    monkeypatch.setattr(dvc_run.scope, "serving", contextlib.nullcontext)
    before = signal.getsignal(signal.SIGINT)
    try:
        assert dvc_run.main(["repro"]) == 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Stopped by SIGINT" in err, err


@pytest.mark.slow  # dvc as a subprocess
@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
def test_a_stage_killed_outright_says_what_is_kept_and_how_to_resume(tmp_path, shell):
    """Hostile re-run: kill -9 (or the OOM killer) of a train stage under `make run` left only
    DVC's "failed to run ... exited with -9" and make's error: no word of what is kept. DVC runs
    the stage through $SHELL: bash execs it (status -9), dash waits on it (137, as in CI)."""
    import subprocess

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  train:\n    foreach: [single-fp32]\n    do:\n"
        f'      cmd: {sys.executable} -c "import os; os.kill(os.getpid(), 9)"\n'
    )
    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, timeout=120
    )
    env = {**os.environ, "AMPBENCH_WARM": "0", "AMPBENCH_RESUME_COMMAND": "make run", "SHELL": shell}
    done = subprocess.run([sys.executable, "-m", "ampbench.dvc_run", "repro"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert errors == [
        "ERROR: stage 'train@single-fp32' was killed (SIGKILL: the kernel's out-of-memory killer, "
        "or kill -9); its last checkpoint (at most train.checkpoint_every_s of training old) is kept, "
        "its MLflow runs stay RUNNING until the re-run resumes them. To resume: make run"
    ], done.stderr


@pytest.mark.parametrize("resume", ["make run", ""])
def test_a_stage_interrupted_under_make_run_is_said_once(monkeypatch, caplog, resume):
    """Final pass G: a Ctrl-C in evaluate under `make run` gave two lines with two resume commands
    ("run the same command again", then the pipeline's "To resume: make run")."""
    import logging

    from ampbench import cli

    monkeypatch.setenv(dvc_run.RESUME_ENV, resume)
    caplog.set_level(logging.ERROR)
    assert cli._interrupted("evaluate") == 130
    stage_line = caplog.records[-1].getMessage()
    dvc_error = logging.LogRecord(
        "dvc", logging.ERROR, __file__, 1, "failed to reproduce 'evaluate': failed to run: ampbench "
        "evaluate, exited with 130", None, None,
    )  # fmt: skip
    quiet = dvc_run.Quiet()
    quiet.filter(dvc_error)
    if resume:
        assert stage_line.endswith("the stages that finished are kept. To resume: make run"), stage_line
        assert quiet.stage_said_it  # so the pipeline adds no second line
    else:
        assert stage_line.endswith("run the same command again") and not quiet.stage_said_it


def test_a_stop_a_stage_ended_nothing_with_stops_dvc_before_its_next_stage(monkeypatch):
    """Hostile pass J: Ctrl-C or SIGTERM as the download stage's work was done ("came as `ampbench
    download` ended: its work is done and kept", exit 0): DVC, which ignores SIGINT while a stage
    runs, went on to train, evaluate and compare, and the pipeline ended 0."""
    import logging

    from dvc.stage import run

    from ampbench import dvc_guard

    quiet = dvc_run.Quiet()
    monkeypatch.setattr(run, "signal", run.signal)  # put back after
    dvc_guard.note_ctrl_c_in_stages(quiet.noted_sigint, quiet.noted_after_stage)
    saved = signal.getsignal(signal.SIGINT)
    try:
        before = run.signal.signal(signal.SIGINT, signal.SIG_IGN)  # as dvc.stage.run._run does
        os.kill(os.getpid(), signal.SIGINT)  # the stage takes it; here it is noted, not raised
        time.sleep(0.05)
        run.signal.signal(signal.SIGINT, before)
    finally:
        signal.signal(signal.SIGINT, saved)
    assert quiet.signum == signal.SIGINT
    starting = logging.LogRecord("dvc", logging.INFO, __file__, 1, "Running stage '%s':", ("train@x",), None)
    with pytest.raises(KeyboardInterrupt):  # DVC's own "interrupted by the user": no stage starts
        quiet.filter(starting)
    assert dvc_run.Quiet().filter(starting)  # without a stop: said as ever


def _stage_then_ctrl_c(argv):
    """DVC's own stage runner (SIGINT ignored while the command runs, then put back), and a Ctrl-C
    as DVC records the finished stage in dvc.lock: a KeyboardInterrupt would land in the sleep."""
    from dvc.stage import run

    run._run(run.get_executable(), "true")
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    return 0


@pytest.fixture
def _handlers_kept(monkeypatch):
    """main() sets the stop signals' handlers and patches dvc.stage.run's signal: put them back."""
    from dvc.stage import run

    monkeypatch.setattr(run, "signal", run.signal)
    monkeypatch.setattr(dvc_run, "_stop_when_make_is_gone", lambda: None)
    monkeypatch.setattr(dvc_run.scope, "serving", contextlib.nullcontext)
    saved = {sig: signal.getsignal(sig) for sig in dvc_run.STOPS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    for name in ("dvc", "dvc_data", "dvc_objects"):  # main's filters, which hold its stop
        for handler in logging.getLogger(name).handlers:
            for quiet in [f for f in handler.filters if isinstance(f, dvc_run.Quiet)]:
                handler.removeFilter(quiet)


@pytest.mark.usefixtures("_handlers_kept")
def test_a_stop_as_dvc_records_a_finished_stage_lets_it_record_it(monkeypatch, capsys):
    """Hostile pass O: a Ctrl-C 0.15 s after a train stage's last line reached DVC as it hashed the
    stage's outputs: the KeyboardInterrupt there left the stage out of dvc.lock ("the stages that
    finished are kept"), and the resume trained the variant again. Now DVC records it, and stops
    before its next stage; after the last, the pipeline is done and says so."""
    import dvc.cli

    monkeypatch.setattr(dvc.cli, "main", _stage_then_ctrl_c)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's foreground command
    assert dvc_run.main(["repro"]) == 0
    err = capsys.readouterr().err
    assert err == "SIGINT came after the pipeline's last stage: every stage is done and kept\n", err


def _next_stage_starts(argv):
    import logging

    starting = logging.LogRecord("dvc", logging.INFO, __file__, 1, "Running stage '%s':", ("compare",), None)
    for handler in logging.getLogger("dvc").handlers:
        handler.filter(starting)  # what DVC's next stage's first line passes through
    return 0


def _ctrl_c_in_stage_then_next_stage(argv):
    from dvc.stage import run

    run._run(run.get_executable(), f"kill -INT {os.getpid()}; sleep 0.2")  # the job's Ctrl-C
    return _next_stage_starts(argv)


@pytest.mark.usefixtures("_handlers_kept")
def test_an_inherited_ignore_of_ctrl_c_is_kept_through_a_stage(monkeypatch, capsys):
    """Hostile pass O: under `cmd &` (SIGINT ignored: the stage trained on), dvc_run took the
    Ctrl-C all the same and stopped before the next stage, "Stopped by SIGINT"."""
    import dvc.cli

    monkeypatch.setattr(dvc.cli, "main", _ctrl_c_in_stage_then_next_stage)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert dvc_run.main(["repro"]) == 0 and "SIGINT" not in capsys.readouterr().err


@pytest.mark.usefixtures("_handlers_kept")
def test_a_pipeline_is_stopped_by_its_own_stops_alone(monkeypatch, capsys):
    """CI: the filter of an earlier pipeline in this process, which had noted a stop, stayed on
    DVC's log handlers and stopped the next pipeline at its next stage ("Stopped by SIGINT")."""
    import logging

    import dvc.cli

    earlier = dvc_run.Quiet()
    earlier.signum = signal.SIGINT
    handlers = logging.getLogger("dvc").handlers
    for handler in handlers:
        handler.addFilter(earlier)
    monkeypatch.setattr(dvc.cli, "main", _next_stage_starts)
    assert dvc_run.main(["repro"]) == 0 and "SIGINT" not in capsys.readouterr().err
    assert handlers and not any(earlier in handler.filters for handler in handlers)


def test_every_stage_of_a_plain_pipeline_names_the_same_resume_command(monkeypatch):
    """Hostile pass O: SIGTERM mid-evaluate under `python -m ampbench.dvc_run repro` said two resume
    commands, the stage's "run the same command again", then the pipeline's "To resume: dvc repro"."""
    import dvc.cli

    seen = []
    monkeypatch.setattr(dvc.cli, "main", lambda argv: seen.append(os.environ.get(dvc_run.RESUME_ENV)) or 0)
    monkeypatch.setattr(dvc_run.scope, "serving", contextlib.nullcontext)
    monkeypatch.setattr(dvc_run, "_stop_when_make_is_gone", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # leave the test process's handlers be
    assert dvc_run.main(["repro", "-f", "evaluate"]) == 0
    assert seen == ["dvc repro evaluate"]  # what the stages inherit (without -f)
    monkeypatch.setenv(dvc_run.RESUME_ENV, "make run")
    assert dvc_run.main(["repro"]) == 0 and seen[-1] == "make run"  # the Makefile's stands


def test_a_ctrl_c_as_the_stage_exits_is_taken_as_after_it(monkeypatch):
    """Hostile pass S: Ctrl-C 0.05-0.2 s after a pipeline's last training line reached the stage's
    process after its exit call (the kernel still freeing its memory: no handler runs), and DVC's
    SIGINT handler, noting it as the stage's, said nothing: exit 0 without a word."""
    import subprocess

    from ampbench import processes

    env = {**os.environ, "DVC_STAGE": "train@single-fp32"}
    live = subprocess.Popen(["sleep", "30"], env=env)
    try:
        quiet = dvc_run.Quiet()
        quiet.noted_sigint(signal.SIGINT, None)
        assert quiet.signum == signal.SIGINT and not quiet.after_stage  # the stage takes it
    finally:
        live.kill()
        live.wait()
    ended = subprocess.Popen(["true"], env=env)
    deadline = time.monotonic() + 10
    while not processes.exiting(ended.pid):  # a zombie, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    quiet = dvc_run.Quiet()
    quiet.noted_sigint(signal.SIGINT, None)  # the stage has ended: none takes it but the pipeline
    ended.wait()
    assert quiet.signum == signal.SIGINT and quiet.after_stage


@pytest.mark.usefixtures("_handlers_kept")
def test_help_is_shown_where_the_pipeline_would_be_refused(monkeypatch):
    """Hostile pass B7: `python -m ampbench.dvc_run --help` while a variant trained outside the
    pipeline said "single-autocast is being trained by pid N" instead of the help."""
    import dvc.cli

    monkeypatch.setattr(dvc_run.dvc_guard, "main", lambda: 1)  # a refusal, whichever
    monkeypatch.setattr(dvc.cli, "main", lambda argv: 0)
    monkeypatch.setenv(dvc_run.RESUME_ENV, "")
    monkeypatch.delenv(dvc_run.RESUME_ENV)
    assert dvc_run.main(["repro"]) == 1
    assert dvc_run.main(["repro", "--help"]) == 0 and dvc_run.main(["-h"]) == 0
