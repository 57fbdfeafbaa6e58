"""A train stage says something within seconds of starting, even where its first progress line
takes half a minute (stages/starting.py)."""

from __future__ import annotations

import logging
import time

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


def test_a_stage_that_spoke_first_gets_no_starting_line(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with StartingLine("single-fp32", seconds=0.3) as starting:
        logging.getLogger("ampbench.training.progress").info("single-fp32: 0.1 s per step")
        time.sleep(0.6)
    assert _lines(caplog) == [] and not starting.timer.is_alive()


def test_a_worker_of_rank_above_0_says_nothing(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger().addHandler(caplog.handler)
    with StartingLine("ddp-fp32", seconds=0.1, on=False):
        time.sleep(0.3)
    assert _lines(caplog) == []
