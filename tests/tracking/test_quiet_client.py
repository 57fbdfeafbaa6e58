"""MLflow's own prints to the terminal that the tool's lines already say (hostile pass WARN: with a
tracking server, "View run <name> at: <url>" and "View experiment at: <url>" as each run ended,
four lines a variant, between the stage's own)."""

from __future__ import annotations

import os

from conftest import empty_store


def test_a_tracker_keeps_mlflows_run_links_off_stdout_unless_the_user_asked(tmp_path, monkeypatch):
    from ampbench.tracking.tracker import Tracker

    store = empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    Tracker("quiet")
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")  # the user's own choice
    Tracker("quiet")
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "false"
