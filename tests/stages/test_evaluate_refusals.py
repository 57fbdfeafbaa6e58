"""The evaluate stage scores only the model it was asked for: a model.pt of another variant or
seed, weights that do not fit their config, or a run missing from the store are refused; a
model it scores is logged to MLflow as a reference to the file, with its scores.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ampbench import config
from ampbench.checkpoints.state import ModelFile
from ampbench.seed_result import CARRIED, SeedResult
from conftest import SEED0, make_dataset


def _fake_model(
    project: Path, variant: str, seed: int, run_id: str = "0" * 32, weights_fc_dim: int = 32
) -> ModelFile:
    """A model.pt as training writes it (no training needed), weights from an AlexNet of `weights_fc_dim`."""
    from ampbench.training.model import AlexNet

    cfg = config.load_config(project / "params.yaml")
    net = AlexNet(config.replace(cfg, model={"fc_dim": weights_fc_dim}).model, 10)
    return ModelFile(
        state_dict=net.state_dict(),
        config=dataclasses.asdict(cfg),
        variant=variant,
        seed=seed,
        run_id=run_id,
        variant_run_id=None,  # no variant run: evaluate logs no aggregates
        config_digest=cfg.digest(),
        classes=list(make_dataset()["classes"]),
        result=SeedResult.from_dict(dict.fromkeys(CARRIED)),  # nothing measured
        history=[{"epoch": 1}],
        pending_metrics=None,
    )


def _evaluate(project: Path, variant: str, tracker=None) -> dict:
    from ampbench.data import prepared
    from ampbench.stages import evaluate

    dataset = prepared.load_dataset(project / "data" / "prepared" / "cifar10.pt")
    return evaluate.evaluate_variant(variant, (0,), project / "models", dataset, project / "reports", tracker)


@pytest.mark.parametrize(("variant", "seed"), [("single-autocast", 0), ("single-fp32", 1)])
def test_model_of_another_variant_or_seed_is_refused(project, variant, seed):
    """A model.pt copied into another variant's (or seed's) folder must not be scored as that one."""
    from ampbench.stages.evaluate import ModelFileError

    _fake_model(project, variant, seed).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32")
    message = str(err.value)
    assert f"{variant!r} seed {seed}" in message and "'single-fp32' seed 0" in message, message
    assert str(project / SEED0 / "model.pt") in message
    assert not (project / "reports" / "metrics").exists()
    _fake_model(project, "single-fp32", 0).save(project / SEED0 / "model.pt")
    assert _evaluate(project, "single-fp32")["seeds"][0]["run_id"] == "0" * 32  # the right file passes


def test_model_whose_weights_do_not_match_its_config_is_refused(project):
    from ampbench.stages.evaluate import ModelFileError

    _fake_model(project, "single-fp32", 0, weights_fc_dim=16).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32")
    message = str(err.value)
    assert "weights do not match the model config stored with them" in message
    assert "size mismatch" in message and "dvc repro -f train@single-fp32" in message, message


def test_model_whose_run_is_not_in_the_store_is_refused(project, monkeypatch):
    from ampbench.stages.evaluate import ModelFileError
    from ampbench.tracking.tracker import Tracker

    uri = f"sqlite:///{project / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_id = "f" * 32
    _fake_model(project, "single-fp32", 0, run_id=run_id).save(project / SEED0 / "model.pt")
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32", Tracker("cifar10-amp"))
    message = str(err.value)
    assert run_id in message and uri in message and "MLFLOW_TRACKING_URI" in message, message
    assert not (project / "reports" / "metrics").exists()


def test_a_model_whose_seed_or_variant_run_is_deleted_is_refused_with_the_restore(project, monkeypatch):
    """Hostile pass T: with the variant run deleted in MLflow, evaluate said "MLflow store ... failed
    (... must be in the 'active' state ...); check the store"; compare then sent the user back to
    evaluate, which failed the same way."""
    from ampbench.stages.evaluate import ModelFileError
    from ampbench.tracking.tracker import Tracker

    uri = f"sqlite:///{project / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(project)
    tracker = Tracker("cifar10-amp")
    variant_run = tracker.start("single-fp32", {"ampbench.kind": "variant"})
    seed_run = tracker.start("single-fp32/seed-0", {"ampbench.kind": "seed"}, parent=variant_run)
    model = dataclasses.replace(
        _fake_model(project, "single-fp32", 0, run_id=seed_run), variant_run_id=variant_run
    )
    model.save(project / SEED0 / "model.pt")
    tracker.client.delete_run(variant_run)
    with pytest.raises(ModelFileError) as err:
        _evaluate(project, "single-fp32", tracker)
    restore = f"`MLFLOW_TRACKING_URI={uri} mlflow runs restore --run-id {variant_run}`"
    assert str(err.value).startswith(
        f"{project / SEED0 / 'model.pt'} was trained in MLflow run {variant_run}, deleted in store {uri} "
        f"(in its trash): restore it ({restore}) and re-run"
    ), err.value
    assert not (project / "reports" / "metrics").exists()


def test_evaluate_logs_each_model_as_a_reference_with_its_scores(project, monkeypatch):
    """tracking.log_model: reference (the default): one external MLflow model per seed, pointing at
    the model file, the seed's test scores linked to it, and no copy of the weights in the store."""
    from ampbench.data import prepared
    from ampbench.stages import evaluate
    from ampbench.tracking.tracker import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.chdir(project)
    tracker = Tracker("cifar10-amp")
    run_id = tracker.start("single-fp32/seed-0", {"ampbench.kind": "seed"})
    _fake_model(project, "single-fp32", 0, run_id=run_id).save(project / SEED0 / "model.pt")
    dataset = prepared.load_dataset(project / "data" / "prepared" / "cifar10.pt")
    summary = evaluate.evaluate_variant(
        "single-fp32", (0,), project / "models", dataset, project / "reports", tracker, log_model="reference"
    )
    models = tracker.client.search_logged_models([tracker.experiment_id()])
    assert [(m.name, m.source_run_id) for m in models] == [("single-fp32-seed-0", run_id)]
    model = models[0]
    assert model.tags["mlflow.model.isExternal"] == "true"
    assert (project / model.tags["ampbench.model_file"]).resolve() == (project / SEED0 / "model.pt").resolve()
    linked = {m.key: m.value for m in model.metrics}
    assert linked["test/accuracy"] == summary["seeds"][0]["test_accuracy"]
    assert tracker.client.get_run(run_id).data.metrics["test/accuracy"] == linked["test/accuracy"]
    stored = [f for f in (project / "mlruns").rglob("*") if f.is_file()]
    assert stored and all(f.stat().st_size < 1_000_000 for f in stored)  # stubs and PNGs, no weights


def test_a_model_of_other_classes_than_the_test_set_is_refused(tmp_path):
    """Final pass L: `evaluate --set data.url=<2 classes>` under 10-class models: an IndexError
    traceback after 10 s."""
    from types import SimpleNamespace

    from ampbench.stages.evaluate import check_classes

    saved = SimpleNamespace(classes=[f"c{i}" for i in range(10)])
    check_classes(saved, [f"c{i}" for i in range(10)], tmp_path / "model.pt")  # the same: no error
    with pytest.raises(
        Exception, match=r"was trained on 10 classes .* the prepared test set has 2 \(cat, dog\)"
    ):
        check_classes(saved, ["cat", "dog"], tmp_path / "model.pt")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"parallel": "single"}, "--parallel names one variant with --precision: give both, or neither"),
        ({"precision": "autocast"}, "--precision names one variant with --parallel: give both, or neither"),
        (
            {"variants": "single-fp32,single-fp32"},
            "--variants: single-fp32 named twice; name each variant once",
        ),
    ],
)
def test_half_a_variant_or_a_variant_twice_is_refused(given, said):
    """Hostile pass P: `evaluate --parallel single` quietly meant single-fp32 only; a variant named
    twice was scored twice, exit 0 (compare refuses it)."""
    import argparse

    from ampbench.stages.evaluate_main import chosen_variants

    args = argparse.Namespace(**{"parallel": None, "precision": None, "variants": "", **given})
    with pytest.raises(config.ConfigError, match=said):
        chosen_variants(args)
    both = argparse.Namespace(parallel="dp", precision="autocast", variants="")
    assert chosen_variants(both) == ["dp-autocast"]
