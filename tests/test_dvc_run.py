"""ampbench.dvc_run: a Ctrl-C that breaks one of DVC's imports half-way is a stop, told in one
line, not the traceback of DVC's clean-up tripping over the partially initialised module."""

from __future__ import annotations

import contextlib
import signal

import pytest

from ampbench import dvc_run


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
