"""A log line is never glued to a progress bar: while a tqdm bar is drawn on the same stream, the
stages' handler (output.BarSafeHandler) clears the bar, writes the line whole and draws the bar again."""

from __future__ import annotations

import io
import logging
import re

from tqdm import tqdm

from ampbench.output import BarSafeHandler
from conftest import REPO


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


def test_a_ctrl_c_outside_a_train_stage_says_which_command_stopped_and_what_to_do(
    tmp_path, monkeypatch, caplog
):
    """Hostile re-run WARN: a Ctrl-C while a stage started (or during `make run`'s estimate)
    printed "ERROR ampbench: interrupted", naming neither the command nor what to do."""
    import types

    from ampbench import cli

    def interrupted(cfg, args, argv):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    monkeypatch.setattr(cli, "command_module", lambda name: types.SimpleNamespace(main=interrupted))
    assert cli.main(["evaluate"]) == cli.EXIT_INTERRUPTED
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "interrupted (Ctrl-C): `ampbench evaluate` stopped before it finished; run the same command again"
    ]
    assert logging.getLogger("torch").level == logging.WARNING  # torch's INFO lines at exit: not ours
    assert logging.getLogger("matplotlib").level == logging.ERROR  # a read-only HOME: 3 lines (hostile pass)
    assert logging.getLogger("urllib3").level == logging.ERROR  # a lost tracking server: its retries


def test_a_notebooks_mplbackend_does_not_stop_the_charts():
    """Hostile pass P: with Jupyter's MPLBACKEND (module://matplotlib_inline.backend_inline, not
    installed here) evaluate and compare failed with matplotlib's list of backends, exit 1. Every
    command drops it before matplotlib reads it (also ampbench.warm.server, before it compares
    environments with the stages)."""
    import subprocess
    import sys

    from conftest import venv_env

    env = {**venv_env(), "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    draw = "import matplotlib.pyplot as plt; plt.figure(); print('drawn')"
    for setup, ok in (("", False), ("from ampbench import output; output.charts_to_files(); ", True)):
        proc = subprocess.run([sys.executable, "-c", setup + draw], env=env, capture_output=True, text=True)
        assert (proc.returncode == 0 and "drawn" in proc.stdout) is ok, proc.stderr[-500:]


def test_no_line_shows_a_urls_password(capsys):
    """Hostile pass T: `MLFLOW_TRACKING_URI=postgresql://u:pw@localhost/db` without its driver: the
    one line printed the password in clear."""
    from ampbench import output

    root = logging.getLogger()
    before = root.handlers[:]
    root.handlers = []
    try:
        output.logging_to_stderr(verbose=False)
        logging.getLogger("ampbench").error("store %s failed", "postgresql://u:s3cret@localhost/db")
    finally:
        root.handlers = before
    said = capsys.readouterr().err
    assert "store postgresql://***@localhost/db failed" in said and "s3cret" not in said
