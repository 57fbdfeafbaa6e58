"""Lines between measured pieces (measuring/pace.py): bench and explain on a slow machine say
where they are between windows, never inside one (hostile re-run: a loaded 2-core CPU was
silent 38-54 s in bench and 31-44 s in explain)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ampbench import cli
from ampbench.measuring import kit, pace, throughput


def test_a_line_only_after_a_silence(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    clock = [100.0]
    monkeypatch.setattr(pace.time, "monotonic", lambda: clock[0])
    with pace.watching():
        pace.between("too soon")
        clock[0] += pace.EVERY_S + 1
        logging.getLogger("ampbench.elsewhere").info("a result line")  # counts as a line
        pace.between("still too soon")
        clock[0] += pace.EVERY_S + 1
        pace.between("where it is")
        pace.between("just said")
    said = [r.getMessage() for r in caplog.records if r.name == pace.__name__]
    assert said == ["where it is"]


def _timed_regions(monkeypatch) -> list[bool]:
    """Wrap every timer of bench and explain; the list holds True while one runs."""
    inside = [False]

    def wrap(seconds):
        def timed(*args, **kwargs):
            inside[0] = True
            try:
                return seconds(*args, **kwargs)
            finally:
                inside[0] = False

        return timed

    monkeypatch.setattr(throughput, "seconds", wrap(throughput.seconds))
    monkeypatch.setattr(kit, "seconds", wrap(kit.seconds))
    return inside


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "--variants", "single-fp32", "--batch-size", "20", "--steps", "2", "--windows", "2"],
        ["explain", "--rungs", "R0", "--steps", "1", "--windows", "2", "--profile-steps", "1"],
    ],
    ids=["bench", "explain"],
)
def test_lines_come_between_timed_windows_only(project: Path, monkeypatch, caplog, command):
    monkeypatch.chdir(project)
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(pace, "EVERY_S", 0.0)  # a slow machine: every gap between pieces is long
    inside, during = _timed_regions(monkeypatch), []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            during.append((inside[0], record.getMessage()))

    watch = Watch(logging.INFO)
    logging.getLogger().addHandler(watch)
    try:
        code = cli.main([*command, "--max-images", "80", "--out", str(project / "reports" / "x")])
    finally:
        logging.getLogger().removeHandler(watch)
    assert code == 0, during
    assert not [m for i, m in during if i], "a line inside a timed window"
    window_lines = [m for _, m in during if "window 1 of 2" in m]
    assert window_lines, [m for _, m in during]


@pytest.mark.parametrize("command", [["bench"], ["explain"]])
def test_too_few_images_are_refused_before_the_mlflow_store_is_opened(
    project: Path, monkeypatch, caplog, command
):
    """The refusal used to wait for MLflow's import (hostile re-run: 33-42 s of silence on a loaded
    CPU before `--max-images 10` was refused)."""
    from ampbench.tracking import measurement_runs

    def too_early(*args, **kwargs):
        raise AssertionError("the MLflow store was opened before the data set was checked")

    monkeypatch.chdir(project)
    monkeypatch.setattr(measurement_runs, "check_store", too_early)
    caplog.set_level(logging.ERROR)
    assert cli.main([*command, "--max-images", "10"]) == cli.EXIT_USAGE
    assert "--max-images" in caplog.records[-1].getMessage(), caplog.records[-1].getMessage()  # its cause
