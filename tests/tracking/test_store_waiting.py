"""A seed's records wait for a locked store with a line every 20 s, not in silence (final pass L:
a lock taken mid-training, then 67 s without a line before the stage's one-line error)."""

from __future__ import annotations

import logging
import time

from ampbench.tracking import waiting


def test_a_wait_on_the_store_says_so_and_stops_saying_it_when_done(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(waiting, "FIRST_S", 0.1)
    monkeypatch.setattr(waiting, "EVERY_S", 0.1)
    with waiting.said_while_waiting("seed 0", "sqlite:///mlflow.db"):
        time.sleep(0.35)  # the store holds the call
    said = [r.getMessage() for r in caplog.records if r.name == waiting.__name__]
    time.sleep(0.3)
    assert 2 <= len(said) <= 3, said
    assert said[0].startswith("seed 0: waiting for MLflow store sqlite:///mlflow.db (0 s so far)"), said
    assert len([r for r in caplog.records if r.name == waiting.__name__]) == len(said)  # none after
