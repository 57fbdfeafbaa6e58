"""params.yaml is validated on load: every problem reported at once, by dotted key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ampbench.config import Config, ConfigError, load_config
from conftest import REPO, run_cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_match_the_dataclass_defaults():
    """params.yaml is the one source of defaults; the dataclasses must not drift from it."""
    cfg = load_config(REPO / "params.yaml")
    assert cfg == Config()
    assert dataclasses.asdict(cfg)["train"]["seeds"] == (0, 1, 2)


def test_every_bad_key_is_named_in_one_message(tmp_path: Path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["epochs"] = -1
    params["train"]["colour"] = "blue"
    params["data"]["url"] = 42
    params["train"]["amp_dtype"] = "float8"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, yaml.safe_dump(params)))
    message = str(err.value)
    # Type errors are reported first (range checks need well-typed values).
    for key in ("train.colour: unknown key", "data.url: expected str, got int 42"):
        assert key in message
    params["train"].pop("colour")
    params["data"]["url"] = "x"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, yaml.safe_dump(params)))
    assert "train.epochs: -1 must be >= 1" in str(err.value)
    assert "train.amp_dtype: 'float8' must be one of auto, float16, bfloat16" in str(err.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.batch_size=0", "train.batch_size: 0 must be >= 1"),
        ("train.seeds=[]", "train.seeds: expected a non-empty list"),
        ("train.seeds=[1, 1]", "train.seeds: (1, 1) must not repeat a seed"),
        ("train.lr=fast", "train.lr: expected float, got str 'fast'"),
        ("train.eval_flip=maybe", "train.eval_flip: expected true or false"),
        ("model.dropout=1.5", "model.dropout: 1.5 must be in [0, 1)"),
        ("nosection.key=1", "nosection: unknown key"),
        ("epochs=3", "expected section.key=value"),
    ],
)
def test_bad_overrides_fail(override: str, expected: str):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(REPO / "params.yaml", [override])
    assert expected in str(err.value)


def test_overrides_apply_and_config_is_frozen():
    cfg = load_config(REPO / "params.yaml", ["train.epochs=3", "data.url=/tmp/x.tar.gz", "train.lr=1"])
    assert (cfg.train.epochs, cfg.data.url, cfg.train.lr) == (3, "/tmp/x.tar.gz", 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.epochs = 4  # type: ignore[misc]
    assert cfg.digest() != load_config(REPO / "params.yaml").digest()


def test_cli_rejects_bad_params_before_any_side_effect(project: Path):
    (project / "params.yaml").write_text(
        (project / "params.yaml").read_text().replace("epochs: 2", "epochs: -1")
    )
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 2
    assert "train.epochs: -1 must be >= 1" in proc.stderr
    assert not (project / "mlflow.db").exists()
    assert not (project / "models").exists()


def test_every_stage_has_help(project: Path):
    for stage in ("download", "train", "evaluate", "compare", "variant", "bench"):
        out = run_cli(project, stage, "--help").stdout
        assert "--set KEY=VALUE" in out, stage


def test_training_refuses_data_prepared_from_other_settings(project: Path):
    """Runs must not log data params that did not make the data they trained on."""
    import json

    made = {"data.url": "/elsewhere/cifar.tar.gz", "data.sha256": "", "data.train_per_class": 0,
            "data.test_per_class": 0}  # fmt: skip
    (project / "data" / "prepared" / "source.json").write_text(json.dumps(made))
    for stage in ("train", "evaluate"):
        proc = run_cli(project, stage, "--parallel", "single", "--precision", "fp32", check=False)
        assert proc.returncode == 2, stage
        assert "data.url: prepared from '/elsewhere/cifar.tar.gz', configured 'https://" in proc.stderr
    assert not (project / "models").exists()
    assert not (project / "mlflow.db").exists()
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32",
                   "--set", "data.url=/elsewhere/cifar.tar.gz")  # fmt: skip
    assert (project / "models" / "single-fp32" / "seed-0" / "model.pt").exists()
