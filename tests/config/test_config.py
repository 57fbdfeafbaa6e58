"""params.yaml is validated on load: every problem reported at once, by dotted key."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from ampbench import cli, variants
from ampbench.config import Config, ConfigError, load_config
from ampbench.config import rules as config_rules
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
    params["train"]["loader"] = "pil"
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
    assert "train.loader: 'pil' must be one of device, dataloader" in str(err.value)


def test_removed_amp_dtype_key_says_what_replaced_it(tmp_path: Path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["amp_dtype"] = "bfloat16"
    with pytest.raises(ConfigError, match="train.amp_dtype: removed: each precision carries its dtype"):
        load_config(write(tmp_path, yaml.safe_dump(params)))


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


@pytest.mark.no_store
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
    for stage in ("download", "train", "evaluate", "compare", "variant", "bench", "estimate", "findings"):
        out = run_cli(project, stage, "--help").stdout
        assert "--set KEY=VALUE" in out, stage


def _prepared_elsewhere(project: Path) -> None:
    """source.json of data prepared from another data.url than params.yaml's."""
    made = {
        "data.url": "/elsewhere/cifar.tar.gz",
        "data.sha256": "",
        "data.train_per_class": 0,
        "data.test_per_class": 0,
    }
    (project / "data" / "prepared" / "source.json").write_text(json.dumps(made))


@pytest.mark.no_store
def test_training_refuses_data_prepared_from_other_settings(project: Path):
    """Runs must not log data params that did not make the data they trained on."""
    _prepared_elsewhere(project)
    for stage in ("train", "evaluate"):
        proc = run_cli(project, stage, "--parallel", "single", "--precision", "fp32", check=False)
        assert proc.returncode == 2, stage
        assert "data.url: prepared from '/elsewhere/cifar.tar.gz', configured 'https://" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, the fix in it
        assert proc.stderr.rstrip().endswith(
            "run `ampbench download` (or `dvc repro`) with these settings first"
        )
    assert not (project / "models").exists()
    assert not (project / "mlflow.db").exists()


@pytest.mark.slow
def test_training_accepts_data_prepared_from_the_configured_settings(project: Path):
    _prepared_elsewhere(project)
    run_cli(
        project,
        "train",
        "--parallel",
        "single",
        "--precision",
        "fp32",
        "--set",
        "data.url=/elsewhere/cifar.tar.gz",
    )
    assert (project / "models" / "single-fp32" / "seed-0" / "model.pt").exists()


# ---------------------------------------------------------------- issue #13 items 9 and 10
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.seeds=[0,1", "train.seeds: '[0,1' is not valid YAML"),
        ("train.epochs=@2", "train.epochs: '@2' is not valid YAML"),
        ("train.lr=inf", "train.lr: expected a finite number, got inf"),
        ("train.lr=.nan", "train.lr: expected a finite number, got nan"),
        ("train.scale_floor=.inf", "train.scale_floor: expected a finite number"),
        ("train.checkpoint_every_s=inf", "train.checkpoint_every_s: expected a finite number"),
        ("train.collective_timeout_s=1e999", "train.collective_timeout_s: expected a finite number"),
        ("tracking.preflight_timeout_s=inf", "tracking.preflight_timeout_s: expected a finite number"),
        ("data.timeout_s=inf", "data.timeout_s: expected a finite number"),
        ("train.seeds=[0, 1000000000000000]", "train.seeds: 1000000000000000 must be in [0, 2147483647]"),
        ("train.seeds=[-1]", "train.seeds: -1 must be in [0, 2147483647]"),
        ("variants.parallel=[single, tpu]", "variants.parallel: unknown 'tpu' (known: single, dp, ddp)"),
        ("variants.precision=[]", "variants.precision: expected a non-empty list"),
        ("variants.precision=[fp32, fp32]", "variants.precision: repeats 'fp32'"),
        ("variants.colour=[red]", "variants.colour: unknown key (known: parallel, precision)"),
        # final pass H: the sections listed left out `variants`, which is one
        ("nosuch.key=1", "nosuch: unknown key (known: data, model, report, tracking, train, variants)"),
        ("data.sha256=abc", "data.sha256: 'abc' must be 64 hexadecimal characters"),
    ],
)
def test_more_bad_overrides_are_config_errors(override: str, expected: str):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "params.yaml", [override])
    assert expected in str(err.value)


def test_null_section_is_named_without_a_trailing_dot(tmp_path: Path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["model"] = None
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, yaml.safe_dump(params)))
    assert "model: expected a mapping, got None" in str(err.value)
    assert "model.:" not in str(err.value)


def test_largest_seed_is_usable_by_the_rng_arithmetic():
    """The bound on seeds must keep engine's (seed*100_003+epoch)*4099+rank a valid torch seed."""
    import torch

    cfg = load_config(REPO / "params.yaml", ["train.seeds=[2147483647]"])
    (seed,) = cfg.train.seeds
    assert seed == 2**31 - 1
    largest = (seed * 100_003 + 10_000) * 4099 + 63
    assert torch.Generator().manual_seed(largest).initial_seed() == largest  # raises if out of range


def test_variants_are_accepted_and_validated(tmp_path: Path):
    cfg = load_config(REPO / "params.yaml", ["variants.parallel=[single]", "variants.precision=[fp32]"])
    assert cfg == Config()  # the axes are DVC's: they change neither the config nor its digest


def test_all_digit_sha256_is_read_as_text(tmp_path: Path):
    digits = "1" * 64
    params = (REPO / "params.yaml").read_text().replace('sha256: ""', f"sha256: {digits}")
    cfg = load_config(write(tmp_path, params))
    assert cfg.data.sha256 == digits
    # A leading zero makes YAML read octal: the value cannot be recovered, so say to quote it.
    octal = "0" + "1" * 63
    with pytest.raises(ConfigError, match="quote it"):
        load_config(write(tmp_path, params.replace(digits, octal)))
    assert load_config(write(tmp_path, params.replace(digits, f'"{octal}"'))).data.sha256 == octal


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_empty_params_file_is_refused(tmp_path: Path, text: str):
    with pytest.raises(ConfigError, match="holds no settings"):
        load_config(write(tmp_path, text))


def test_params_that_is_a_folder_or_not_utf8_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        load_config(tmp_path)
    path = tmp_path / "latin1.yaml"
    path.write_bytes("train:\n  loader: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path)


def test_text_ending_in_a_colon_is_told_as_yaml_not_as_a_type():
    """Hostile pass WARN: `--set model.name=torchvision:` said "expected str, got dict"."""
    with pytest.raises(ConfigError, match=r"'torchvision:' reads as a YAML mapping.*torchvision:resnet18"):
        load_config(REPO / "params.yaml", ["model.name=torchvision:"])


def test_a_missing_params_file_given_by_path_is_not_told_to_run_from_the_repo_root(tmp_path: Path):
    """Hostile pass WARN: `--params /tmp/nope.yaml` got "run from the repo root or pass --params"."""
    with pytest.raises(ConfigError, match=r"nope\.yaml: not found; check the path given to --params$"):
        load_config(tmp_path / "nope.yaml")


def test_a_problem_names_the_set_it_came_from_and_a_typo_its_likely_key(tmp_path: Path):
    """Hostile pass WARNs: `train.epocs: unknown key (known: ...22 names)` with no guess; a bad
    `--set train.epochs=ten` said exactly what the same value in params.yaml says."""
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "params.yaml", ["train.epocs=3", "train.lr=1", "train.lr=-1"])
    text = str(err.value)
    assert "train.epocs: unknown key (did you mean train.epochs? known: " in text
    assert text.endswith("train.lr: -1.0 must be > 0 (from --set 'train.lr=-1')"), text
    params = (REPO / "params.yaml").read_text(encoding="utf-8").replace("  epochs: 20", "  epochs: ten")
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, params))
    assert "train.epochs: expected int, got str 'ten'" in str(err.value) and "--set '" not in str(err.value)


def test_a_params_file_that_is_not_yaml_names_the_line_and_a_tab_is_told(tmp_path: Path):
    """Hostile pass WARN: PyYAML's scanner text ("while scanning for the next token found
    character '\\t' that cannot start any token in "<unicode string>" ...") and no fix."""
    params = (REPO / "params.yaml").read_text(encoding="utf-8")
    line = params[: params.index("  epochs:")].count("\n") + 1
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, params.replace("  epochs:", "\tepochs:", 1)))
    assert str(err.value).startswith(
        f"{tmp_path / 'params.yaml'}: line {line}, column 1: not valid YAML (found character '\\t' that "
        "cannot start any token); indent with spaces, not tabs, or restore params.yaml"
    ), err.value


def test_a_params_file_of_the_users_own_is_not_told_to_git_checkout_params_yaml(tmp_path: Path):
    """Hostile pass D: a broken `--params mine.yaml` was told "restore params.yaml (`git checkout
    params.yaml`)", a file the user had not named."""
    mine = tmp_path / "mine.yaml"
    mine.symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ConfigError) as err:
        load_config(mine)
    assert str(err.value).endswith(f"which does not exist; fix {mine}, or point --params at another file")


def test_a_params_yaml_gone_from_the_project_folder_is_told_to_be_restored(tmp_path: Path, monkeypatch):
    """Hostile pass F: params.yaml deleted, run from the project's folder: "run from the repo root
    or pass --params", where the user was, and no `git checkout params.yaml`."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"not found in .*; run ampbench from the project's folder \("):
        load_config("params.yaml")  # elsewhere: the folder is the question
    (tmp_path / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not found beside dvc.yaml; restore params.yaml \(`git checkout"):
        load_config("params.yaml")


def test_a_subfolder_of_the_project_is_told_to_cd_to_its_root_even_with_params(tmp_path: Path, monkeypatch):
    """Hostile pass H: in docs/, "params.yaml: not found; run from the repo root or pass --params";
    with `--params ../params.yaml`, "data/prepared/cifar10.pt not found; run `ampbench download`
    first", which would build a second project inside docs/."""
    root = tmp_path / "project"
    (root / "docs").mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    monkeypatch.chdir(root / "docs")
    with pytest.raises(ConfigError) as err:
        load_config("params.yaml")
    assert str(err.value) == (
        f"params.yaml: not found in {root / 'docs'}, a folder inside the project at {root}; run ampbench "
        f"from there (`cd {root}`)"
    )
    with pytest.raises(ConfigError, match=rf"run it from {root} \(`cd {root}`\)$"):
        load_config("../params.yaml")
    monkeypatch.chdir(root)
    assert load_config("params.yaml").train.seeds  # from the project's folder: read


def test_a_dangling_params_link_names_where_it_points(tmp_path: Path):
    """Hostile pass WARN: "link.yaml: not found" for a file that `ls` lists."""
    link = tmp_path / "params.yaml"
    link.symlink_to(tmp_path / "gone" / "params.yaml")
    with pytest.raises(ConfigError, match=r"a link to .*gone/params\.yaml, which does not exist; restore"):
        load_config(link)


@pytest.mark.no_store
@pytest.mark.parametrize(
    "args",
    [
        ("train", "--set", "train.seeds=[0,1"),
        ("train", "--set", "train.epochs=@2"),
        ("variant", "--seeds", ","),
        ("train", "--params", "."),
    ],
)
def test_cli_reports_unparsable_input_as_usage_error(project: Path, args):
    proc = run_cli(project, *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "invalid configuration" in proc.stderr or "is a folder" in proc.stderr
    assert not (project / "mlflow.db").exists()


# ---------------------------------------------------------------- issue #23 items 7-8, #28 item 5
def test_cli_and_config_import_nothing_heavy():
    """`ampbench --help` and a configuration error are answered without torch, MLflow, numpy or sklearn."""
    code = (
        "import sys\n"
        "import ampbench.cli, ampbench.config\n"
        "from ampbench.config import load_config\n"
        "ampbench.cli._parser()\n"
        f"load_config({str(REPO / 'params.yaml')!r}, ['train.epochs=2'])\n"
        "heavy = ('torch', 'mlflow', 'sklearn', 'numpy', 'matplotlib')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_variant_names_match_the_registries():
    """variants.py names, without torch, what the training registries implement, in the same order."""
    from ampbench.training import parallel, precision

    assert tuple(parallel.STRATEGIES) == variants.PARALLELS
    assert tuple(precision.REGISTRY) == variants.PRECISIONS
    assert variants.VARIANTS[:3] == ("single-fp32", "single-tf32", "single-autocast")
    assert variants.split_name(variants.variant_name("ddp", "autocast_bf16")) == ("ddp", "autocast_bf16")


def test_expected_errors_name_classes_that_exist():
    """cli.py matches these errors by name (so it imports nothing); each name must still be a class."""
    from ampbench.checkpoints import files, work
    from ampbench.data import prepared
    from ampbench.tracking import tracker
    from ampbench.training import loop

    for cls in (prepared.DataError, tracker.TrackingError, work.ResumeError, files.CheckpointError):
        assert (cls.__module__.split(".")[0], cls.__name__) in cli.EXPECTED_ERRORS, cls
    assert (loop.Stopped.__module__.split(".")[0], loop.Stopped.__name__) == cli.STOPPED


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("ampbench.data.prepared:DataError", 1),
        ("ampbench.checkpoints.work:ResumeError", 1),
        ("builtins:FileNotFoundError", 1),
        ("ampbench.training.loop:Stopped", 143),
        ("builtins:RuntimeError", None),  # unexpected: the traceback
    ],
)
def test_errors_map_to_exit_codes(monkeypatch, tmp_path: Path, error: str, code: int | None):
    module, name = error.split(":")
    cls = getattr(importlib.import_module(module), name)

    def fail(cfg, args, argv):
        raise cls("boom")

    monkeypatch.setattr(cli, "command_module", lambda name: types.SimpleNamespace(main=fail))
    argv = ["download", "--params", str(REPO / "params.yaml")]
    if code is None:
        with pytest.raises(cls):
            cli.main(argv)
    else:
        assert cli.main(argv) == code


def test_alexnet_parameters_are_counted_without_torch():
    """config_rules counts the model's parameters from fc_dim; it must agree with training/model.py."""
    from ampbench.config import ModelConfig
    from ampbench.training.model import AlexNet

    for fc_dim, batch_norm in ((4096, True), (32, False), (7, True)):
        model = AlexNet(ModelConfig(fc_dim=fc_dim, batch_norm=batch_norm), 10)
        expected = sum(p.numel() for p in model.parameters())
        assert config_rules.alexnet_parameters(fc_dim, batch_norm) == expected, (fc_dim, batch_norm)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.fc_dim=1000000"], "model.fc_dim: 1000000 makes a model of 1,001,038,252,746 parameters"),
        (["model.fc_dim=1000000"], "needs 14.57 TiB (weights, gradients, momentum and a copy"),
        (["train.epochs=100001"], "train.epochs: 100001 must be <= 100000: epoch e of seed s draws"),
        (
            ["train.epochs=100000", "train.batch_size=1", "data.train_per_class=1000000"],
            "are 1,000,000,000,000 steps per seed, more than 10,000,000,000: even at 10,000 steps a second",
        ),
    ],
)
def test_absurd_sizes_are_refused_with_the_reason(overrides: list[str], expected: str):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "params.yaml", overrides)
    assert expected in str(err.value)


def test_largest_sizes_within_the_bounds_are_accepted():
    cfg = load_config(REPO / "params.yaml", ["model.fc_dim=200000", "train.epochs=100000"])
    assert (cfg.model.fc_dim, cfg.train.epochs) == (200000, 100000)
    assert config_rules.alexnet_parameters(200000) * 16 < config_rules.MODEL_MEMORY_LIMIT


@pytest.mark.serial  # times the command: alone on the machine
@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("train", "--help"),
        ("train", "--set", "train.epochs=-1"),
        ("train", "--set", "train.colour=blue"),
    ],
)
def test_help_and_config_errors_answer_at_once(tmp_path: Path, args):
    """No torch import before the answer: well under a second (about 0.15 s on 2 CPU cores)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ampbench", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == (0 if "--help" in args else 2), proc.stderr
    assert seconds < 1.5, f"{seconds:.2f} s"  # generous: a busy CI machine; torch alone takes ~2 s


def test_variant_options_make_a_small_run():
    """`mlflow run . -P per_class=100 -P fc_dim=256` (MLproject) reaches the config as overrides:
    MLflow passes an undeclared parameter as `--per_class 100`, its own spelling."""
    from ampbench import cli, config

    args = cli._parser().parse_args(["variant", "--per_class", "100", "--fc-dim", "256", "--epochs", ""])
    overrides = cli.all_overrides(args)
    assert overrides == ["data.train_per_class=100", "model.fc_dim=256"]
    cfg = config.load_config(REPO / "params.yaml", overrides)
    assert (cfg.data.train_per_class, cfg.model.fc_dim) == (100, 256)


def test_the_quick_run_is_one_parameter_that_the_others_override():
    """`mlflow run . -P quick=yes`: a subset, 2 epochs, one seed, the test accuracy at the end only
    on a test subset; a parameter given beside it wins; the echoed command has no empty values."""
    from ampbench import cli, config

    args = cli._parser().parse_args(
        ["variant", "--quick", "yes", "--epochs", "3", "--set", "train.seeds=[1]"]
    )
    cfg = config.load_config(REPO / "params.yaml", cli.all_overrides(args))
    assert (cfg.data.train_per_class, cfg.data.test_per_class, cfg.train.batch_size) == (100, 100, 128)
    assert (cfg.train.epochs, cfg.train.seeds, cfg.train.eval_each_epoch) == (3, (1,), False)
    assert cli.all_overrides(cli._parser().parse_args(["variant", "--quick", "no"])) == []
    mlproject = yaml.safe_load((REPO / "MLproject").read_text())["entry_points"]["main"]
    assert all(str(p.get("default")) != "" for p in mlproject["parameters"].values()), mlproject
    assert "--quick {quick}" in mlproject["command"]
    quick_form = "mlflow run . -P precision=autocast -P quick=yes --env-manager local"
    for doc in ("README.md", "docs/MLFLOW.md", "MLproject"):
        assert quick_form in (REPO / doc).read_text(), f"{doc}: not the one quick form"


def test_mlflow_run_takes_the_model_name():
    """`mlflow run . -P model=torchvision:resnet18` (MLproject) reaches model.name."""
    from ampbench import cli, config

    args = cli._parser().parse_args(["variant", "--model", "torchvision:resnet18"])
    assert cli.all_overrides(args) == ["model.name=torchvision:resnet18"]
    assert (
        config.load_config(REPO / "params.yaml", cli.all_overrides(args)).model.name == "torchvision:resnet18"
    )
    assert "model (model.name" in (REPO / "MLproject").read_text()  # passed on as `--model <name>`


def test_a_huge_data_setting_is_shortened_in_the_mismatch_line(tmp_path, monkeypatch):
    """Hostile pass: `--set data.url=<100,000 characters>` gave one line of 100,243 bytes."""
    from ampbench.stages import download

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    _prepared_elsewhere(tmp_path)
    cfg = load_config(Path(__file__).resolve().parents[2] / "params.yaml", ["data.url=/" + "a" * 100_000])
    with pytest.raises(ConfigError) as err:
        download.check_prepared(cfg)
    assert "configured '/aaaa" in str(err.value) and len(str(err.value)) < 500, len(str(err.value))
