"""The one model factory: every command (train, evaluate, bench, explain, estimate, `mlflow run`)
builds its network here, from ``model.name``.

- ``alexnet``: the study's AlexNet (training/model.py) and its options (``model.fc_dim``, ...).
- ``torchvision:<name>``: any torchvision classification model (``torchvision:resnet18``),
  built with ``weights=None`` (nothing is downloaded) and the data set's class count.
- ``<module.path>:<factory>``: your own. The contract: ``factory(num_classes)`` returns an
  ``nn.Module`` that maps float images (N, 3, H, W), already normalised per channel, to logits
  (N, num_classes), H = W = ``data.image_size``. It knows nothing of precision or parallelism: the
  precision wraps it (``precision.AutocastForward``) and the strategy wraps that. The module is
  imported as Python imports it (PYTHONPATH), or from the folder the command runs in.

Every model takes what the data holds, uint8 images: AlexNet normalises them itself (CIFAR's
statistics); any other model sits in ``ImageInput``, which normalises by the train split's own
per-channel statistics (saved with the weights, so evaluation normalises as training did).
torchvision's classifiers end in adaptive pooling, so a 32x32 CIFAR image runs through an
ImageNet-shaped model as is (a ResNet's last feature map is then 1x1); a model with a fixed input
(ViTs) needs ``data.image_size: 224``. A dry forward checks the model's output against the class
count before anything trains.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

from ampbench.config import ConfigError, ModelConfig
from ampbench.training.model import AlexNet
from ampbench.training.stopping import Stopped

TORCHVISION = "torchvision:"
ALEXNET_SIZE = 32  # AlexNet's classifier takes the 2x2 map a 32x32 image leaves
# Used only before training has seen the data (bench on random images, a model file's placeholder
# before its saved statistics load): ImageNet's, in [0, 1] units.
DEFAULT_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class ImageInput(nn.Module):
    """uint8 images (N, 3, H, W) -> float, normalised per channel -> the network."""

    mean: torch.Tensor
    inv_std: torch.Tensor

    def __init__(self, net: nn.Module, mean=DEFAULT_STATS[0], std=DEFAULT_STATS[1]) -> None:
        super().__init__()
        self.net = net
        # Persistent: a model file carries the statistics it was trained with.
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255)
        self.register_buffer("inv_std", 1 / (torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net((images.float() - self.mean) * self.inv_std)


def build(cfg: ModelConfig, num_classes: int, image_size: int = ALEXNET_SIZE, stats=None) -> nn.Module:
    """The configured model for `num_classes` classes and `image_size` images, on the CPU, checked
    by one dry forward. `stats`: the train split's (mean, std) per channel, else DEFAULT_STATS."""
    if cfg.name == "alexnet":
        if image_size != ALEXNET_SIZE:
            raise ConfigError(
                f"model.name: alexnet takes {ALEXNET_SIZE}x{ALEXNET_SIZE} images, data.image_size is "
                f"{image_size}: set data.image_size: {ALEXNET_SIZE}, or choose a model that takes "
                f"{image_size}x{image_size} (e.g. torchvision:resnet18)"
            )
        model: nn.Module = AlexNet(cfg, num_classes)
    else:
        model = ImageInput(_network(resolve(cfg.name), cfg.name, num_classes), *(stats or DEFAULT_STATS))
    check_outputs(model, cfg.name, num_classes, image_size)
    return model


def _network(factory: Callable[[int], nn.Module], name: str, num_classes: int) -> nn.Module:
    try:
        net = factory(num_classes)
    except Stopped:  # a Ctrl-C while the user's factory ran (final pass I: one that never returns)
        raise
    except (Exception, SystemExit) as err:  # the user's code (sys:exit too), named in one line
        raise ConfigError(
            f"model.name: {name}({num_classes}) raised {type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}; a factory takes the class count and returns a "
            "torch.nn.Module (README: Your model, your images)"
        ) from err
    if not isinstance(net, nn.Module):
        raise ConfigError(
            f"model.name: {name} returned {type(net).__name__}, not a torch.nn.Module; a factory "
            "returns the network for the class count it is called with"
        )
    return net


# What torch's errors of a shape that does not fit say ("mat1 and mat2 shapes cannot be multiplied",
# "Output size is too small", "Kernel size can't be greater than actual input size"): only these
# blame the image size (hostile re-run: a forward's own RuntimeError was blamed on it).
SHAPE_WORDS = ("shape", "size", "dimension")
AUXILIARY_HEADS = ("googlenet", "inception_v3")  # torchvision's with aux_logits


def _forward_fault(name: str, image_size: int, err: BaseException) -> str:
    return (
        f"model.name: {name}: its forward of 2 blank {image_size}x{image_size} images raised "
        f"{type(err).__name__}: {' '.join(str(err).split())[:200]}; fix the model's forward"
    )


def check_outputs(model: nn.Module, name: str, num_classes: int, image_size: int) -> None:
    """One forward of two blank images (eval mode, no RNG drawn): logits (2, num_classes) or a
    ConfigError naming the model, the data's class count and image size."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8))
    except Stopped:
        raise
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:300]
        if not any(word in detail.lower() for word in SHAPE_WORDS):  # the user's own RuntimeError
            raise ConfigError(_forward_fault(name, image_size, err)) from err
        raise ConfigError(
            f"model.name: {name} cannot take {image_size}x{image_size} images (data.image_size): "
            f"{detail}; set data.image_size to a size it takes (224 for ImageNet-shaped models)"
        ) from None
    except Exception as err:  # noqa: BLE001 - a fault in the user's forward, named in one line
        raise ConfigError(_forward_fault(name, image_size, err)) from err
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"model.name: {name} gives {shape} for 2 images, not (2, {num_classes}): the data set "
            f"(data.url) has {num_classes} classes; the model must return one logit per class"
        )
    _check_training_output(model, name, image_size)


def _check_training_output(model: nn.Module, name: str, image_size: int) -> None:
    """The same forward in training mode, on a copy (its batch statistics and dropout draws leave
    the model and the seeds as they were): a model that returns more than its logits only when
    training (auxiliary heads) failed at the first step with a 65-line traceback (hostile pass J)."""
    import copy

    probe = copy.deepcopy(model).train()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = probe(torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8))
    except Stopped:
        raise
    except Exception as err:  # noqa: BLE001 - a fault of the user's forward in training mode
        raise ConfigError(_forward_fault(name, image_size, err)) from err
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"model.name: {name} gives {type(out).__name__} in training mode (a tensor when evaluating): "
            "the loss takes the logits alone in both modes; return only them (a model with auxiliary "
            "heads: build it without them, e.g. aux_logits=False, in a factory of your own)"
        )


def resolve(name: str) -> Callable[[int], nn.Module]:
    """`model.name` as a function of the class count; a ConfigError listing the choices if unknown."""
    if name.startswith(TORCHVISION):
        return _torchvision(name.removeprefix(TORCHVISION))
    module_name, _, attr = name.partition(":")
    module = _import(module_name, name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(
            f"model.name: {name}: {module_name} has no callable {attr!r} "
            f"(its names: {', '.join(n for n in dir(module) if not n.startswith('_'))[:300]})"
        )
    return factory


def _import(module_name: str, name: str):
    try:
        return _run_module(module_name, name)
    except ModuleNotFoundError as err:
        if os.getcwd() in sys.path or err.name != module_name.split(".")[0]:
            raise _unknown(name, f"cannot import {module_name} ({err})") from None
    sys.path.append(os.getcwd())  # a file in the folder the command runs in
    importlib.invalidate_caches()
    try:
        return _run_module(module_name, name)
    except ModuleNotFoundError as err:
        raise _unknown(name, f"cannot import {module_name} ({err}; add its folder to PYTHONPATH)") from None


def _run_module(module_name: str, name: str):
    """The module imported; an error its own code raises on import is one line naming its file and
    line (hostile re-run: a module that raised at import gave a 40-line traceback)."""
    try:
        return importlib.import_module(module_name)
    except (ModuleNotFoundError, Stopped):
        raise
    except (Exception, SystemExit) as err:
        import traceback

        frame = traceback.extract_tb(err.__traceback__)[-1]  # a SyntaxError's: importlib's (pass J)
        where = (
            f"{err.filename}:{err.lineno}"
            if isinstance(err, SyntaxError)
            else f"{frame.filename}:{frame.lineno}"
        )
        what = err.msg if isinstance(err, SyntaxError) else " ".join(str(err).split())[:200]
        raise ConfigError(
            f"model.name: {name}: importing {module_name} raised {type(err).__name__} at {where}: {what}; "
            "fix the module"
        ) from err


def _torchvision(arch: str) -> Callable[[int], nn.Module]:
    import torchvision

    choices = torchvision_choices()
    if arch not in choices:
        raise _unknown(f"{TORCHVISION}{arch}", "not a torchvision classification model")

    def make(num_classes: int) -> nn.Module:
        # without auxiliary heads: they add outputs in training mode, which the loss cannot take
        heads = {"aux_logits": False, "init_weights": True} if arch in AUXILIARY_HEADS else {}
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **heads)

    return make


def torchvision_choices() -> list[str]:
    """torchvision's classification models (its top-level `models` namespace), sorted."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


LIST_MODELS = (
    'python -c "import torchvision; print(torchvision.models.list_models(module=torchvision.models))"'
)


def _unknown(name: str, why: str) -> ConfigError:
    """The choices, the nearest torchvision names first, not all of them (final pass J: one line of
    2,301 characters listing every torchvision model)."""
    import difflib

    choices, arch = torchvision_choices(), name.removeprefix(TORCHVISION)
    near = [c for c in choices if c.startswith(arch)] or difflib.get_close_matches(arch, choices, n=3)
    if not (name.startswith(TORCHVISION) and near):
        near = ["resnet18"]
    return ConfigError(
        f"model.name: {name!r}: {why}. Choose alexnet, <module.path>:<factory> (your own) or "
        f"{TORCHVISION}<model>, one of torchvision's {len(choices)} classification models ("
        f"{'closest' if near != ['resnet18'] else 'e.g.'} {', '.join(TORCHVISION + c for c in near[:3])}; "
        f"all: {LIST_MODELS})"
    )


def data_stats(cfg: ModelConfig, images: torch.Tensor, most: int = 10_000):
    """The normalisation `build` takes for this model: the train split's per-channel statistics
    over its first `most` images (plenty for a mean and a std, and under a second per seed on a
    CPU for any data set), or None for alexnet, which keeps CIFAR-10's constants."""
    return None if cfg.name == "alexnet" else channel_stats(images[:most])


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images (N, 3, H, W), in [0, 1] units, chunk by chunk."""
    total = torch.zeros(3, dtype=torch.float64, device=images.device)
    squares = torch.zeros_like(total)
    for part in images.split(chunk):
        x = part.double() / 255
        total += x.sum(dim=(0, 2, 3))
        squares += (x * x).sum(dim=(0, 2, 3))
    n = max(1, images.numel() // 3)
    mean = total / n
    std = (squares / n - mean * mean).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())
