"""Typed, frozen configuration loaded once from ``params.yaml``.

``params.yaml`` is the one source of defaults. ``load_config`` reads it, applies ``--set key=value``
overrides from the command line, and validates everything before any side effect: unknown keys,
wrong types and out-of-range values are collected and reported together, each by its dotted key.

    cfg = load_config("params.yaml", overrides=["train.epochs=1"])

Why ~370 lines: every setting's docstring sits beside its field and its range check in one place
(what a setting means and what it accepts are read together); the rest is the loader that reports
every problem at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from ampbench.training.parallel import STRATEGIES
from ampbench.training.precision import PRECISIONS as _PRECISIONS

# The registries' names, in registry order (what the CLI offers and the matrix may hold).
PRECISIONS = tuple(_PRECISIONS)
PARALLELS = tuple(STRATEGIES)
LOADERS = ("device", "dataloader")
SWITCHES = ("auto", "always", "never")  # not on/off: YAML reads those as booleans
CONDITIONS = ("project", "tutorial", "demo")  # which study a run belongs to (tracking.conditions)
MODEL_LOGGING = ("reference", "export", "none")  # tracking.log_model
VARIANT_AXES = {"parallel": PARALLELS, "precision": PRECISIONS}  # params.yaml `variants:` (DVC's matrix)
# engine seeds torch with (seed * 100_003 + epoch) * 4099 + rank, which must stay below 2**64
# (torch.manual_seed / Generator.manual_seed overflow beyond): seeds below 2**31 leave room for
# over 10**15 epochs. Seeds index repetitions of a run: 0 is the floor.
SEED_LIMIT = 2**31
# Keys whose value is text even when YAML reads it as a number (an all-digit checksum).
_TEXT_KEYS = ("data.sha256",)
_SHA256_RULE = 'must be 64 hexadecimal characters or empty (all digits or a leading 0: quote it, "0123...")'


# Keys earlier versions had, with what replaced them (an old params.yaml gets told, not just refused).
_REMOVED = {
    "train.amp_dtype": "removed: each precision carries its dtype (autocast and autocast_gradscaler: "
    "float16 on CUDA; autocast_bf16: bfloat16); delete the line and add autocast_bf16 to "
    "variants.precision (or pass --precision autocast_bf16) for bfloat16",
}


# Keys that were true/false in earlier versions, with what each boolean became.
_WERE_BOOLEAN = {
    "tracking.log_model": "is no longer true/false: write export (what true logged: a servable "
    "torch.export program), reference (the default: the Models tab points at "
    "models/<variant>/seed-<s>/model.pt, no copy of the weights) or none (what false did)",
}


class ConfigError(ValueError):
    """One or more invalid settings; the message lists every problem by dotted key."""


@dataclass(frozen=True)
class DataConfig:
    url: str = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    """Source: http(s) URL, file:// URL, local archive or ImageFolder folder."""
    sha256: str = ""
    """Optional sha256 of the source archive (the official URL is always MD5-checked)."""
    train_per_class: int = 0
    """Class-balanced train subset for quick runs; 0 keeps all 5,000 per class."""
    test_per_class: int = 0
    """Class-balanced test subset; 0 keeps all 1,000 per class."""
    retries: int = 3
    """Download attempts before giving up."""
    timeout_s: float = 60.0
    """Network timeout of one download attempt, seconds."""


@dataclass(frozen=True)
class ModelConfig:
    fc_dim: int = 4096
    """Width of AlexNet's two hidden fully connected layers (tests shrink it)."""
    batch_norm: bool = True
    """BatchNorm after each convolution (stabilises large-batch and fp16 training)."""
    dropout: float = 0.0
    """Dropout before the fully connected layers; 0 disables it."""


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    """Passes over the train set."""
    batch_size: int = 512
    """Global batch size, identical for every variant; DDP splits it across processes."""
    lr: float = 0.2
    """Peak learning rate of the one-cycle schedule."""
    momentum: float = 0.9
    """SGD (Nesterov) momentum."""
    weight_decay: float = 5.0e-4
    """L2 weight decay."""
    label_smoothing: float = 0.1
    """Cross-entropy label smoothing."""
    warmup_fraction: float = 0.2
    """Fraction of steps spent warming the learning rate up."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Each variant trains once per seed; results are reported as mean and std."""
    loader: str = "device"
    """device: uint8 data resident on the device, augmented there; dataloader: torch DataLoader."""
    workers: int = 8
    """DataLoader worker processes (loader: dataloader only)."""
    eval_each_epoch: bool = True
    """Measure test accuracy after every epoch (cheap with data on the device)."""
    cuda_graph: bool = True
    """Replay the training step from a CUDA graph where the strategy allows it (CUDA: single, dp
    on one GPU, ddp over NCCL; not dp over several GPUs, whose replicas run in threads)."""
    cudnn_benchmark: bool = True
    """Let cuDNN time its convolution algorithms for each shape once, then use the fastest (the
    search runs in the first eager steps, never inside a CUDA-graph capture or a timed window)."""
    channels_last: bool = True
    """Use channels_last memory format on CUDA (faster convolutions on tensor cores)."""
    ddp_cpu_workers: int = 2
    """Processes a plain `--parallel ddp` start launches when no GPU is present."""
    scale_floor: float = 1.0e-6
    """A GradScaler scale below this counts as divergence (no learning happens any more)."""
    checkpoint_every_s: float = 0.0
    """Checkpoint at an epoch end once this many seconds passed since the last one; 0: every epoch."""
    eval_flip: bool = True
    """Test accuracy averages the logits of each image and its mirror image (flip test-time aug)."""
    stop_check_every: int = 20
    """Steps between checks that all DDP ranks still want to run (SIGTERM handling)."""
    collective_timeout_s: float = 300.0
    """A hung DDP collective fails after this many seconds."""
    dp_autocast_outside_forward: bool = False
    """Only to demonstrate the tutorial's claim 4 (docs/FINDINGS.md); never set it otherwise. True
    disables the model's in-forward autocast and wraps the step's forward and loss in an outer
    ``torch.autocast`` instead (the naive placement); ``replica_dtypes`` records what ran."""


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str = "cifar10-amp"
    """MLflow experiment name."""
    log_model: str = "reference"
    """Each seed's model in MLflow's Models tab (evaluate stage): reference (an external model that
    points at models/<variant>/seed-<s>/model.pt: no copy of the weights, milliseconds), export (a
    servable torch.export program, weights copied into the store: 12-16 s per evaluate stage on an
    H200 host) or none."""
    preflight_timeout_s: float = 5.0
    """How long to wait for a remote tracking server before failing."""
    request_timeout_s: float = 10.0
    """Timeout of one tracking call during training (one retry): a dead server costs seconds."""
    system_metrics: str = "auto"
    """CPU/GPU utilisation and memory charts (MLflow system metrics) on the train runs:
    auto (with CUDA only), always or never."""
    conditions: str = "project"
    """Which study the runs belong to: project (params.yaml), tutorial (tutorial/) or demo (demo/);
    tagged on every variant and seed run (ampbench.conditions) so `ampbench findings` can tell them apart."""


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def flat(self) -> dict[str, object]:
        """The whole config as {dotted.key: value}, for logging as MLflow params."""
        return {
            f"{s.name}.{f.name}": getattr(getattr(self, s.name), f.name)
            for s in fields(self)
            for f in fields(getattr(self, s.name))
        }

    def digest(self, exclude: tuple[str, ...] = ("tracking.", "data.retries", "data.timeout_s")) -> str:
        """Hash of everything that changes what training computes (for safe resume)."""
        flat = {k: v for k, v in self.flat().items() if not k.startswith(exclude)}
        return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_value(key: str, value: object, hint: object, problems: list[str]) -> object:
    """Coerce/validate one value against its annotation; append a message on failure."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or not value:
            problems.append(f"{key}: expected a non-empty list, got {value!r}")
            return value
        return tuple(_check_value(f"{key}[{i}]", v, int, problems) for i, v in enumerate(value))
    if key in _WERE_BOOLEAN and isinstance(value, bool):
        problems.append(f"{key}: {value!r} {_WERE_BOOLEAN[key]}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            problems.append(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is float:
        value = _as_float(value)
        if isinstance(value, float) and not math.isfinite(value):
            # inf passes every `> 0` check, then overflows timers or means "never" without a word
            problems.append(f"{key}: expected a finite number, got {value!r}")
            return value
    if key in _TEXT_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML read an all-digit checksum as a number
    if not isinstance(value, hint) or isinstance(value, bool) and hint is not bool:
        problems.append(f"{key}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _as_float(value: object) -> object:
    """Ints and numeric strings as float (YAML 1.1 reads `1e6`, without a dot, as a string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _build(cls: type, raw: object, prefix: str, problems: list[str]):
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or 'params'}: expected a mapping, got {raw!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if f"{prefix}{key}" in _REMOVED:
            problems.append(f"{prefix}{key}: {_REMOVED[prefix + key]}")
        elif key not in known:
            problems.append(f"{prefix}{key}: unknown key (known: {', '.join(sorted(known))})")
    values = {}
    for f in fields(cls):
        if f.name in raw:
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                values[f.name] = _build(hint, raw[f.name], f"{prefix}{f.name}.", problems)
            else:
                before = len(problems)
                value = _check_value(prefix + f.name, raw[f.name], hint, problems)
                if len(problems) == before:  # a mistyped value keeps the default: ranges still run
                    values[f.name] = value
    return cls(**values)


def _ranges(cfg: Config) -> list[str]:
    t, d, m = cfg.train, cfg.data, cfg.model
    rules = [
        ("train.epochs", t.epochs >= 1, "must be >= 1"),
        ("train.batch_size", t.batch_size >= 1, "must be >= 1"),
        ("train.lr", t.lr > 0, "must be > 0"),
        ("train.momentum", 0 <= t.momentum < 1, "must be in [0, 1)"),
        ("train.weight_decay", t.weight_decay >= 0, "must be >= 0"),
        ("train.label_smoothing", 0 <= t.label_smoothing < 1, "must be in [0, 1)"),
        ("train.warmup_fraction", 0 < t.warmup_fraction < 1, "must be in (0, 1)"),
        ("train.seeds", len(set(t.seeds)) == len(t.seeds), "must not repeat a seed"),
        ("data.sha256", d.sha256 == "" or bool(re.fullmatch(r"[0-9a-fA-F]{64}", d.sha256)), _SHA256_RULE),
        ("train.loader", t.loader in LOADERS, f"must be one of {', '.join(LOADERS)}"),
        ("train.workers", t.workers >= 0, "must be >= 0"),
        ("train.ddp_cpu_workers", t.ddp_cpu_workers >= 1, "must be >= 1"),
        ("train.scale_floor", t.scale_floor > 0, "must be > 0"),
        ("train.checkpoint_every_s", t.checkpoint_every_s >= 0, "must be >= 0 (0 = every epoch)"),
        ("train.stop_check_every", t.stop_check_every >= 1, "must be >= 1"),
        ("train.collective_timeout_s", t.collective_timeout_s > 0, "must be > 0"),
        ("data.url", bool(d.url.strip()), "must not be empty"),
        ("data.train_per_class", d.train_per_class >= 0, "must be >= 0 (0 = all)"),
        ("data.test_per_class", d.test_per_class >= 0, "must be >= 0 (0 = all)"),
        ("data.retries", d.retries >= 1, "must be >= 1"),
        ("data.timeout_s", d.timeout_s > 0, "must be > 0"),
        ("model.fc_dim", m.fc_dim >= 1, "must be >= 1"),
        ("model.dropout", 0 <= m.dropout < 1, "must be in [0, 1)"),
        ("tracking.experiment", bool(cfg.tracking.experiment.strip()), "must not be empty"),
        ("tracking.preflight_timeout_s", cfg.tracking.preflight_timeout_s > 0, "must be > 0"),
        ("tracking.request_timeout_s", cfg.tracking.request_timeout_s > 0, "must be > 0"),
        (
            "tracking.system_metrics",
            cfg.tracking.system_metrics in SWITCHES,
            f"must be one of {', '.join(SWITCHES)}",
        ),
        (
            "tracking.log_model",
            cfg.tracking.log_model in MODEL_LOGGING,
            f"must be one of {', '.join(MODEL_LOGGING)}",
        ),
        (
            "tracking.conditions",
            cfg.tracking.conditions in CONDITIONS,
            f"must be one of {', '.join(CONDITIONS)}",
        ),
    ]
    problems = [f"{key}: {value!r} {why}" for key, ok, why in rules if not ok for value in [_get(cfg, key)]]
    return problems + _seed_ranges(t.seeds)


def _seed_ranges(seeds: tuple[int, ...]) -> list[str]:
    """Seeds the RNG arithmetic can take (see SEED_LIMIT); checked here, before any run exists."""
    return [f"train.seeds: {s} must be in [0, {SEED_LIMIT - 1}]" for s in seeds if not 0 <= s < SEED_LIMIT]


def _check_variants(raw: object, problems: list[str]) -> None:
    """params.yaml's `variants:` section: DVC's matrix axes, not part of Config, but still checked."""
    if not isinstance(raw, dict):
        problems.append(f"variants: expected a mapping, got {raw!r}")
        return
    for key in raw:
        if key not in VARIANT_AXES:
            problems.append(f"variants.{key}: unknown key (known: {', '.join(VARIANT_AXES)})")
    for axis, known in VARIANT_AXES.items():
        values, names = raw.get(axis, list(known)), ", ".join(known)
        if not isinstance(values, list) or not values:
            problems.append(f"variants.{axis}: expected a non-empty list of {names}, got {values!r}")
            continue
        problems += [f"variants.{axis}: unknown {v!r} (known: {names})" for v in values if v not in known]
        problems += [f"variants.{axis}: repeats {v!r}" for v in dict.fromkeys(values) if values.count(v) > 1]


def _get(cfg: Config, dotted: str) -> object:
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


def _apply_override(raw: dict, item: str, problems: list[str]) -> None:
    key, sep, text = item.partition("=")
    if not sep or "." not in key:
        problems.append(f"--set {item!r}: expected section.key=value, e.g. train.epochs=1")
        return
    section, name = key.strip().split(".", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or type(err).__name__  # e.g. "expected ',' or ']'"
        problems.append(
            f"{key.strip()}: {text!r} is not valid YAML ({problem}); write a list as [0, 1], "
            f"quote text that starts with @, `, [ or {{ (from --set {item!r} or a command-line option)"
        )
        return
    raw.setdefault(section, {})
    if isinstance(raw[section], dict):
        raw[section][name] = value


def load_config(path: str | Path = "params.yaml", overrides: typing.Iterable[str] = ()) -> Config:
    """Read params.yaml, apply `section.key=value` overrides, validate; raise ConfigError."""
    path = Path(path)
    raw = _read_params(path)
    problems: list[str] = []
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        _apply_override(raw, item, problems)
    if "variants" in raw:  # the DVC matrix axes, read by dvc.yaml only: validated, then dropped
        _check_variants(raw.pop("variants"), problems)
    cfg = _build(Config, raw, "", problems)
    problems += _ranges(cfg)  # every field is well typed here, so all problems come out together
    if problems:
        lines = "\n  ".join(problems)
        raise ConfigError(f"invalid configuration ({path} and --set overrides):\n  {lines}")
    return cfg


def _read_params(path: Path) -> dict:
    """The parsed params file as a non-empty mapping, or a ConfigError saying what is wrong with it."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found; run from the repo root or pass --params") from None
    except IsADirectoryError:
        raise ConfigError(f"--params {path}: is a folder, not a file; pass the params.yaml in it") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"--params {path}: not UTF-8 text (byte {err.start}: {err.object[err.start : err.start + 1]!r}); "
            "save it as UTF-8 or pass the right file"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if raw is None or raw == {}:
        # Running on code defaults would silently train the full study (and download CIFAR-10).
        raise ConfigError(
            f"{path}: holds no settings (empty or only comments); restore it, e.g. `git checkout {path.name}`"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return raw


def replace(cfg: Config, **sections: dict) -> Config:
    """A copy of cfg with some fields of some sections changed: replace(cfg, train={'epochs': 1})."""
    return dataclasses.replace(
        cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sections.items()}
    )
