"""A log line is never glued to a progress bar: while a tqdm bar is drawn on the same stream, the
stages' handler (cli.BarSafeHandler) clears the bar, writes the line whole and draws the bar again."""

from __future__ import annotations

import io
import logging
import re

from tqdm import tqdm

from ampbench.cli import BarSafeHandler


def _drawn(handler_type) -> list[str]:
    """What a terminal gets: a bar half done, then a log line; the text between \\r and \\n."""
    stream = io.StringIO()
    handler = handler_type(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger(f"test_log_lines.{handler_type.__name__}")
    log.addHandler(handler)
    log.propagate, log.level = False, logging.INFO
    with tqdm(total=4, file=stream, desc="train", disable=False, mininterval=0) as bar:
        bar.update(2)
        log.info("seed 0: test accuracy 10.00%")
        bar.update(2)
    log.info("after the bar")
    return re.split(r"[\r\n]", stream.getvalue())


def test_a_log_line_while_a_bar_is_drawn_stands_on_its_own():
    pieces = _drawn(BarSafeHandler)
    assert "INFO seed 0: test accuracy 10.00%" in pieces, pieces
    assert "INFO after the bar" in pieces, pieces
    assert any(p.startswith("train: 100%") for p in pieces), pieces  # the bar drawn again, finished


def test_a_plain_handler_glues_it_to_the_bar():  # what the terminal showed before
    pieces = _drawn(logging.StreamHandler)
    assert "INFO seed 0: test accuracy 10.00%" not in pieces
    assert any(p.startswith("train:") and p.endswith("INFO seed 0: test accuracy 10.00%") for p in pieces), (
        pieces
    )
