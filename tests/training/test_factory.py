"""The one model factory (training/factory.py): each form of model.name, bad names, the class
count checked against the data, the data's own normalisation, and that no command builds a model
anywhere else."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ampbench.config import Config, ConfigError, ModelConfig, load_config, replace
from ampbench.training import build, factory, loop, parallel, precision
from ampbench.training.model import AlexNet
from conftest import make_dataset

SRC = Path(__file__).resolve().parents[2] / "src" / "ampbench"


def test_alexnet_is_the_default_and_keeps_its_options():
    model = factory.build(ModelConfig(fc_dim=16), 7)
    assert isinstance(model, AlexNet) and model.classifier[-1].out_features == 7


def test_torchvision_model_by_name_untrained_with_the_class_count():
    torch.manual_seed(0)
    model = factory.build(ModelConfig(name="torchvision:resnet18"), 5)
    assert isinstance(model, factory.ImageInput) and type(model.net).__name__ == "ResNet"
    assert model.net.fc.out_features == 5
    # weights=None: two builds under different seeds differ (nothing pretrained was loaded)
    torch.manual_seed(1)
    other = factory.build(ModelConfig(name="torchvision:resnet18"), 5)
    assert not torch.equal(model.net.conv1.weight, other.net.conv1.weight)
    # a 32x32 CIFAR image through an ImageNet-shaped model: adaptive pooling takes it as is
    x = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert model.eval()(x).shape == (2, 5)


def test_own_factory_by_import_path():
    model = factory.build(ModelConfig(name="custom_net:make_model"), 3, image_size=20)
    assert isinstance(model, factory.ImageInput) and isinstance(model.net, nn.Sequential)
    assert model.net[-1].out_features == 3


def test_own_factory_from_the_folder_the_command_runs_in(tmp_path, monkeypatch):
    (tmp_path / "my_nets_here.py").write_text((Path(__file__).parents[1] / "custom_net.py").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    model = factory.build(ModelConfig(name="my_nets_here:make_model"), 4, image_size=16)
    assert model.net[-1].out_features == 4


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "torchvision:resnet19",
            r"'torchvision:resnet19': not a torchvision classification model.*"
            r"torchvision:resnet18",
        ),
        ("no_such_module_xyz:make", r"cannot import no_such_module_xyz.*torchvision:resnet18"),
        ("custom_net:missing", r"custom_net has no callable 'missing' \(its names: .*make_model"),
        ("custom_net:not_a_module", r"returned str, not a torch.nn.Module"),
        # hostile pass: any importable callable that is no factory was a 50-line traceback
        ("builtins:len", r"model.name: builtins:len\(10\) raised TypeError: object of type 'int'"),
        ("json:loads", r"json:loads\(10\) raised TypeError: .*returns a torch.nn.Module"),
        ("custom_net:forward_fails", r"forward of 2 blank 32x32 images raised TypeError: forward"),
        (
            "raises_on_import:make",
            r"importing raises_on_import raised RuntimeError at .*raises_on_import.py:3: boom",
        ),
        ("custom_net:forward_runtime_error", r"raised RuntimeError: the feature store is offline; fix the"),
        ("sys:exit", r"model.name: sys:exit\(10\) raised SystemExit: 10"),  # exit 10, no line at all
    ],
)
def test_unknown_models_are_named_with_the_choices(name, message):
    with pytest.raises(ConfigError, match=message) as err:
        factory.build(ModelConfig(name=name), 10)
    assert len(str(err.value)) < 500, len(str(err.value))  # final pass J: 2,301 characters, every model


def test_config_refuses_a_name_of_no_known_form(tmp_path):
    params = Path(__file__).resolve().parents[2] / "params.yaml"
    with pytest.raises(
        ConfigError, match=r"model.name: 'resnet 18' is not a model: choose alexnet, torchvision:"
    ):
        load_config(params, ["model.name=resnet 18"])
    with pytest.raises(ConfigError, match=r"data.image_size: 64 must be 32 with model.name alexnet"):
        load_config(params, ["data.image_size=64"])
    assert (
        load_config(params, ["data.image_size=64", "model.name=torchvision:resnet18"]).data.image_size == 64
    )
    for good in ("alexnet", "torchvision:convnext_tiny", "mypkg.nets:make_model"):
        assert load_config(params, [f"model.name={good}"]).model.name == good


def test_class_count_mismatch_names_the_model_and_the_data():
    with pytest.raises(
        ConfigError,
        match=r"custom_net:wrong_class_count gives \(2, 13\) for 2 images, not "
        r"\(2, 10\): the data set \(data.url\) has 10 classes",
    ):
        factory.build(ModelConfig(name="custom_net:wrong_class_count"), 10)


def test_a_model_with_more_outputs_when_training_is_named_before_any_step():
    """Hostile pass J: torchvision:googlenet (and a model of one's own returning a tuple only in
    training mode) passed the eval-mode check, then failed at the first step with a 65-line
    traceback ("cross_entropy_loss(): argument 'input' ... must be Tensor, not GoogLeNetOutputs")."""
    with pytest.raises(ConfigError, match=r"custom_net:aux_heads_when_training gives tuple in training mode"):
        factory.build(ModelConfig(name="custom_net:aux_heads_when_training"), 10, image_size=20)
    model = factory.build(ModelConfig(name="torchvision:googlenet"), 10, image_size=64)  # built without
    x = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    assert model.train()(x).shape == (2, 10)  # its auxiliary heads: the loss takes what it gives


def test_the_training_mode_check_leaves_the_model_and_the_seed_as_they_were():
    torch.manual_seed(3)
    model = factory.build(ModelConfig(name="torchvision:resnet18"), 5)  # batch norm: running statistics
    after = torch.rand(1)
    torch.manual_seed(3)
    fresh = factory.ImageInput(factory.resolve("torchvision:resnet18")(5), *factory.DEFAULT_STATS)
    assert torch.equal(torch.rand(1), after)  # the checks drew nothing from the seed
    for (key, value), (_, same) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(value, same), key  # the running statistics are untouched


def test_image_size_a_model_cannot_take_is_named():
    with pytest.raises(
        ConfigError, match=r"custom_net:fixed_size cannot take 24x24 images \(data.image_size\)"
    ):
        factory.build(ModelConfig(name="custom_net:fixed_size"), 10, image_size=24)
    with pytest.raises(ConfigError, match=r"alexnet takes 32x32 images, data.image_size is 64"):
        factory.build(ModelConfig(), 10, image_size=64)


def test_normalisation_comes_from_the_data_and_is_saved_with_the_weights():
    ds = make_dataset()
    mean, std = factory.channel_stats(ds["train_images"])
    x = ds["train_images"].double() / 255
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), x.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64), x.std(dim=(0, 2, 3), correction=0))
    assert factory.data_stats(ModelConfig(), ds["train_images"]) is None  # alexnet: CIFAR's constants
    assert factory.data_stats(ModelConfig(name="custom_net:make_model"), ds["train_images"]) == (mean, std)
    model = factory.build(ModelConfig(name="custom_net:make_model"), 10, stats=(mean, std))
    # evaluate rebuilds with the defaults, then the file's buffers restore the data's statistics
    again = factory.build(ModelConfig(name="custom_net:make_model"), 10)
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again.mean, model.mean)
    assert not torch.allclose(again.mean, factory.build(ModelConfig(name="custom_net:make_model"), 10).mean)


def test_custom_model_trains_a_seed_in_every_precision_kind(tmp_path):
    cfg = replace(
        Config(),
        model={"name": "custom_net:make_model"},
        train={"epochs": 2, "batch_size": 20, "seeds": (0,), "cuda_graph": False, "lr": 0.05},
    )
    for name in ("fp32", "autocast_gradscaler"):
        job = loop.Job(
            cfg, precision.REGISTRY[name], parallel.Single(), make_dataset(), 0, tmp_path / f"{name}.pt"
        )
        out = loop.train_seed(job)
        assert out["result"].epochs_completed == 2 and "net.5.weight" in out["state_dict"]
        assert out["result"].replica_dtypes == ("cpu=float32" if name == "fp32" else "cpu=bfloat16")


def test_model_is_built_only_in_the_factory():
    """Every command builds its network through factory.build: AlexNet( and torchvision's model
    constructors appear nowhere else in the package."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("AlexNet", "get_model") or name.startswith(("resnet", "mobilenet")):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert found and all(f.startswith("training/factory.py:") for f in found), found
    calls = [f for f in found if f.endswith(" AlexNet")]
    assert len(calls) == 1, calls


# ------------------------------------------------------------------------------ tf32
def test_tf32_sets_and_records_the_flags_and_fp32_restores_true_fp32(caplog):
    model, cuda = nn.Linear(2, 2), torch.device("cuda")  # setup touches no GPU: the flags only
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        run = precision.REGISTRY["tf32"].setup(model, cuda)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        assert run.facts == {
            "autocast_used": False,
            "amp_dtype": "float32",
            "grad_scaler_used": False,
            "tf32_matmul": True,
            "tf32_cudnn": True,
        }
        assert run.wrap(model) is model  # fp32 activations: no autocast
        for name in ("fp32", "autocast"):  # every other precision: true fp32 for what runs in fp32
            facts = precision.REGISTRY[name].setup(model, cuda).facts
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
            assert (facts["tf32_matmul"], facts["tf32_cudnn"]) == (False, False)
            precision.REGISTRY["tf32"].setup(model, cuda)
        # a CPU has no TF32: true fp32, said and recorded (the flag would slow CPU matmuls)
        precision._say_once.cache_clear()
        facts = precision.REGISTRY["tf32"].setup(model, torch.device("cpu")).facts
        assert (facts["tf32_matmul"], facts["tf32_cudnn"]) == (False, False)
        assert torch.get_float32_matmul_precision() == "highest"
        precision.REGISTRY["tf32"].setup(model, torch.device("cpu"))  # the next seed: said once (pass Z)
        assert caplog.text.count("TF32 is a CUDA tensor-core mode; on cpu this runs true fp32") == 1
    finally:
        precision.set_tf32(False)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_build_wraps_inside_out_precision_then_strategy():
    cfg = replace(Config(), model={"fc_dim": 16}, train={"cuda_graph": False})
    strategy = parallel.make("single")
    strategy.setup()
    trainer = build.setup(cfg, precision.REGISTRY["autocast"], strategy, 10, 100)
    assert isinstance(trainer.model, precision.AutocastForward) and trainer.model.net is trainer.raw_model
    tf32 = build.setup(cfg, precision.REGISTRY["tf32"], strategy, 10, 100)
    assert tf32.model is tf32.raw_model and tf32.facts["amp_dtype"] == "float32"


# ------------------------------------------------------------------------------ CUDA graphs
class _Uncapturable:
    """Stands in for torch.cuda.graph around a model that syncs the host: capture raises."""

    def __init__(self, graph, capture_error_mode: str, opt) -> None:
        self.opt = opt

    def __enter__(self):
        self.opt.param_groups[0]["lr"] = 0.01  # eager CPU SGD after the fallback takes a float
        raise RuntimeError("operation not permitted when stream is capturing")

    def __exit__(self, *exc) -> bool:
        return False


def test_a_model_that_cannot_be_captured_trains_eagerly_with_a_note(monkeypatch, caplog):
    cfg = replace(Config(), model={"name": "custom_net:make_model"}, train={"cuda_graph": False})
    strategy = parallel.make("single")
    strategy.setup()
    trainer = build.setup(cfg, precision.REGISTRY["fp32"], strategy, 10, 100)
    step = build.make_step(trainer, cfg, strategy)
    step.use_graph, step.warmup_steps = True, 0
    trainer.opt.param_groups[0]["lr"] = torch.tensor(0.01)  # what a capturable setup gives
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a: None)  # the capture's stream, on no GPU
    monkeypatch.setattr(sys.modules[type(step).__module__], "_SIDE_STREAMS", {})
    monkeypatch.setattr(
        torch.cuda, "graph", lambda g, **kw: _Uncapturable(g, kw["capture_error_mode"], trainer.opt)
    )
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    before = [p.detach().clone() for p in trainer.raw_model.parameters()]
    x, y = torch.randint(0, 255, (8, 3, 32, 32), dtype=torch.uint8), torch.arange(8) % 10
    step(x, y)
    assert step.graph is None and not step.use_graph
    assert step.graph_facts() == {
        "cuda_graph_used": False,
        "cuda_graph_fallback": "operation not permitted when stream is capturing",
    }
    assert "cannot be captured in a CUDA graph" in caplog.text
    after = list(trainer.raw_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the step ran eagerly"
    step(x, y)  # later steps: eager, no second capture
    assert step.calls == 2 and step.graph is None


def test_a_syntax_error_in_the_users_module_names_its_file_and_line(tmp_path, monkeypatch):
    """Final pass J: the line named "<frozen importlib._bootstrap>:241", not the user's file."""
    (tmp_path / "broken_net.py").write_text("def make(n):\n    return (\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        factory.build(ModelConfig(name="broken_net:make"), 10)
    assert f"raised SyntaxError at {tmp_path / 'broken_net.py'}:2: " in str(err.value), err.value
