"""A train stage says something within seconds of starting, even where its first progress line
takes half a minute (stages/starting.py)."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from ampbench.stages import starting
from ampbench.stages.starting import StartingLine


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ampbench.stages.starting"]


def test_a_stage_silent_for_its_first_seconds_says_it_is_starting(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with StartingLine("single-fp32", seconds=0.2):
        time.sleep(0.6)
    said = _lines(caplog)
    assert len(said) == 1 and said[0].startswith("single-fp32: starting ("), said


def test_a_start_that_never_ends_is_said_again_until_the_stage_speaks(caplog, monkeypatch):
    """Final pass H: a model factory that hung gave one starting line, then 78 s of silence."""
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    monkeypatch.setattr(starting, "AGAIN_S", 0.2)
    with StartingLine("single-fp32", seconds=0.1) as line:
        time.sleep(0.75)  # lines at 0.1, 0.3, 0.5, 0.7 s
        logging.getLogger("ampbench.training.progress").info("single-fp32: 0.1 s per step")
        time.sleep(0.5)  # none after the stage's own line
    line.thread.join(timeout=1)
    assert 3 <= len(_lines(caplog)) <= 4 and not line.thread.is_alive(), _lines(caplog)


def test_a_stage_that_spoke_first_gets_no_starting_line(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with StartingLine("single-fp32", seconds=0.3) as starting:
        logging.getLogger("ampbench.training.progress").info("single-fp32: 0.1 s per step")
        time.sleep(0.6)
    starting.thread.join(timeout=1)
    assert _lines(caplog) == [] and not starting.thread.is_alive()


def test_a_worker_of_rank_above_0_says_nothing(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with StartingLine("ddp-fp32", seconds=0.1, on=False):
        time.sleep(0.3)
    assert _lines(caplog) == []


class SlowArgs:
    """What the stage reads first, slow to come (a loaded machine), then refused."""

    params, overrides, allow_mixed = "params.yaml", [], False

    @property
    def variants(self) -> str:
        time.sleep(0.6)
        return "no-such-variant"

    parallel = precision = None


@pytest.mark.parametrize("stage", ["evaluate", "compare"])
def test_evaluate_and_compare_say_it_too(stage, caplog, monkeypatch):
    """Hostile re-run: under load, 31-32 s from DVC's "Running stage 'evaluate'" (and 'compare')
    to their first line. Their work runs inside a StartingLine that says what they do."""
    from ampbench.config import ConfigError
    from ampbench.stages import compare, evaluate_main

    module = {"evaluate": evaluate_main, "compare": compare}[stage]
    monkeypatch.setattr(starting, "STARTING_S", 0.2)
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with pytest.raises((ConfigError, ValueError)):
        module.main(None, SlowArgs(), [])
    said = _lines(caplog)
    assert len(said) == 1 and said[0].startswith(f"{stage}: starting ("), said
    assert "opening the MLflow store" in said[0], said


def test_the_line_counts_from_the_commands_start(caplog, monkeypatch):
    """Hostile re-run: "starting (15 s so far)" came 23-25 s after the command started (its imports
    were not counted)."""
    from ampbench import timing

    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    monkeypatch.setattr(timing, "_command_start", [time.perf_counter() - 23.0])  # began 23 s ago
    with StartingLine("evaluate", seconds=0.1):
        time.sleep(0.4)
    assert _lines(caplog) and _lines(caplog)[0].startswith("evaluate: starting (23 s so far)"), _lines(caplog)


def _filter_with_a_line_inside(line: StartingLine, at: int) -> list[int]:
    """Run ``line.filter`` on a stage line; at its `at`-th traced line event (inside the filter, or
    anything it calls), filter a second line first, as a signal handler's line would be: a stop's
    "SIGHUP received" logged by the stop handler. The count of line events seen, in a list."""
    record = logging.LogRecord("ampbench.training.progress", logging.INFO, __file__, 1, "epoch 1", None, None)
    seen = [0]

    def trace(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == at:
                sys.settrace(None)
                line.filter(record)  # the handler's line, untraced
        return trace

    sys.settrace(trace)
    try:
        line.filter(record)
    finally:
        sys.settrace(None)
    return seen


def test_a_line_logged_by_a_signal_handler_inside_the_filter_never_hangs():
    """CI (stop 42): SIGHUP's "received" line, logged by the stop handler while the loop's own line
    was inside StartingLine.filter, waited forever for the lock of the threading.Event that the
    interrupted line held; the stage trained on, deaf to the stop. Here a nested line comes at each
    traced line of the filter's run in turn."""
    with StartingLine("single-fp32", seconds=60) as line:
        lines = _filter_with_a_line_inside(line, at=0)[0]
    assert lines > 0
    for at in range(1, lines + 1):
        line = StartingLine("single-fp32", seconds=60).__enter__()
        run = threading.Thread(target=_filter_with_a_line_inside, args=(line, at), daemon=True)
        run.start()
        run.join(5)
        if run.is_alive():  # its lock is held for good: leaving the block would wait for it too
            for handler in line.handlers:
                handler.removeFilter(line)
            pytest.fail(f"a line at traced line {at} of {lines} of the filter's run: stuck for good")
        line.__exit__(None, None, None)
        line.thread.join(1)
        assert not line.thread.is_alive()  # the watch ended with the stage's first line
