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


def test_a_warning_raised_as_an_error_is_not_called_a_broken_store():
    """Hostile pass F: `PYTHONWARNINGS=error ampbench train` said "MLflow store ... failed
    (SADeprecationWarning: ...); check the store", of a store that was fine."""
    from ampbench import cli
    from ampbench.tracking import store

    class SADeprecationWarning(DeprecationWarning):
        pass

    try:
        try:
            raise SADeprecationWarning("The ``noload`` loader strategy is deprecated. It goes on.")
        except Warning as warning:
            raise RuntimeError("(sqlite3) query failed") from warning
    except RuntimeError as err:
        line = str(store.store_fault(err, "sqlite:///mlflow.db"))
        assert cli._fault_line(err) == line  # noqa: SLF001 - any other stage says the same
    assert line == (
        "a Python warning was raised as an error (SADeprecationWarning: The ``noload`` loader strategy is "
        "deprecated.), as PYTHONWARNINGS=error or -W error asks: a library's warning, not a fault of this "
        "run; unset PYTHONWARNINGS (or -W error), then re-run"
    )
