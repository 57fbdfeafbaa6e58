"""`ampbench estimate` (make run's first line) counts the images the study will train on: the
prepared data's where it was made with these settings (hostile re-runs: an image folder of 240
images was estimated as CIFAR-10's 50,000, "about 1 d 10 h" for a study of minutes)."""

from __future__ import annotations

import json

from ampbench import config
from ampbench.commands import estimate
from ampbench.data.fetch import CIFAR10_URL
from ampbench.stages.download import data_source
from conftest import new_project


def test_the_prepared_datas_sizes_are_counted_when_they_match_the_settings(tmp_path, monkeypatch):
    project = new_project(tmp_path / "p", per_class=6, store=False)
    monkeypatch.chdir(project)
    cfg = config.load_config("params.yaml")
    assert estimate.prepared_sizes(cfg) is None  # no record of the settings it was made with
    source = project / "data" / "prepared" / "source.json"
    source.write_text(json.dumps(data_source(cfg)))
    assert estimate.prepared_sizes(cfg) == (60, 20)  # 6 train and 2 test images a class
    other = config.replace(cfg, data={"url": "/elsewhere.tar.gz"})
    assert estimate.prepared_sizes(other) is None  # the study will download other data first


def test_an_estimate_before_the_users_data_is_prepared_says_what_it_counted(tmp_path, monkeypatch, capsys):
    """Hostile pass G: `make run DATA=<300 images>` first said "about 11 h" for a study of 4 min,
    counting CIFAR-10's 50,000 images without a word."""
    from types import SimpleNamespace

    from ampbench.training import progress

    project = new_project(tmp_path / "p", per_class=6, store=False)
    monkeypatch.chdir(project)
    monkeypatch.setattr(progress, "preflight", lambda *a, **k: {"study_seconds": 40_000.0})
    args = SimpleNamespace(params="params.yaml", force=False, overrides=[])
    estimate.main(config.load_config("params.yaml", ["data.url=/elsewhere/mine.tar.gz"]), args, [])
    assert "Your data set (data.url) is not prepared yet: this counts CIFAR-10's" in capsys.readouterr().out
    estimate.main(config.load_config("params.yaml", [f"data.url={CIFAR10_URL}"]), args, [])
    assert "not prepared yet" not in capsys.readouterr().out  # CIFAR-10 itself: the count is right
