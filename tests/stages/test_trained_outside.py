"""A variant trained by hand (`ampbench train`) over the models the pipeline recorded says so."""

from __future__ import annotations

import logging

from ampbench.stages import train_main

LOCK = "stages:\n  train@single-fp32:\n    outs:\n    - path: models/single-fp32\n      md5: ab.dir\n"
SAID = (
    "models/single-fp32/ is also the pipeline's output: the next `dvc repro` (or `make run`) replaces "
    "these models, with those dvc.lock records or, where params.yaml or the code changed since, by "
    "training again; `dvc commit -f train@single-fp32` makes these the pipeline's instead"
)
GIVEN = "trained with settings given here, not params.yaml's: copy them elsewhere to keep them"


def test_a_hand_trained_variant_says_the_pipeline_would_put_its_own_models_back(
    tmp_path, monkeypatch, caplog
):
    """Hostile pass A7: `ampbench train` after `dvc repro`, then `dvc repro` again: DVC's run cache
    put its own models back over the hand-trained ones without a word (their MLflow run's model
    reference then pointed at another run's weights)."""
    monkeypatch.chdir(tmp_path)
    for name in ("DVC_STAGE", "AMPBENCH_SCOPE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.WARNING)
    train_main._say_the_pipeline_replaces("single-fp32", True)  # no dvc.lock: no pipeline to speak of
    assert SAID not in caplog.text
    (tmp_path / "dvc.lock").write_text(LOCK, encoding="utf-8")
    train_main._say_the_pipeline_replaces("single-fp32", True)
    assert caplog.text.count(SAID) == 1
    caplog.clear()  # pass C8: trained with --set, a `dvc commit` would file them under params.yaml's settings
    train_main._say_the_pipeline_replaces("single-fp32", False)
    assert "dvc commit" not in caplog.text and caplog.text.rstrip().endswith(GIVEN)
    for name, value in (("DVC_STAGE", "train@single-fp32"), ("AMPBENCH_SCOPE", "variant"), ("RANK", "1")):
        caplog.clear()
        monkeypatch.setenv(name, value)  # the pipeline's own stage; `mlflow run` (says it); a worker
        train_main._say_the_pipeline_replaces("single-fp32", True)
        assert SAID not in caplog.text, name
        monkeypatch.delenv(name)
