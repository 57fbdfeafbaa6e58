"""Offline, the fix an unreachable data source names is the command the user typed, with DATA=:
`make demo` must not send a user to `make run` (days on a CPU) or `dvc exp run` (the study)."""

from __future__ import annotations

import pytest

from ampbench.data import fetch, prepared
from conftest import free_port


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(fetch, "_BACKOFF_S", 0.0)
    # a closed local port stands for an unreachable remote host (the tests reach none): the advice
    # of a remote one, not "the server at 127.0.0.1 runs on this machine"
    monkeypatch.setattr(fetch, "_network_fix", lambda url: fetch.no_network_fix())


def _offline_error(tmp_path) -> str:
    url = f"http://127.0.0.1:{free_port()}/cifar-10-python.tar.gz"  # nothing listens there
    with pytest.raises(prepared.DataError) as err:
        fetch.fetch(url, tmp_path / "cache", retries=1, timeout_s=5)
    assert url in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("started", ["make demo", "make demo DATA='/old/path.tar.gz'", "make tutorial"])
def test_a_make_target_offline_is_told_its_own_data_option(tmp_path, monkeypatch, started):
    monkeypatch.setenv(fetch.RESUME_ENV, started)  # what the Makefile sets for the pipeline it runs
    message = _offline_error(tmp_path)
    target = started.split()[1]
    assert f"`make {target} DATA=/path/to/cifar-10-python.tar.gz`" in message, message
    assert "dvc exp run" not in message and ("make run" not in message or target == "run"), message


def test_outside_make_every_way_to_point_at_a_local_file_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(fetch.RESUME_ENV, raising=False)
    message = _offline_error(tmp_path)
    assert "dvc exp run -S data.url=" in message and "mlflow run . -P data_url=" in message, message
